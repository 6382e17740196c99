"""Packed Paillier: homomorphic correctness, packing limits, wire validation, key policy,
DJN and textbook obfuscators.

Small keys (512 bits) only through the explicit ``allow_insecure_key_bits=True`` test
setting; one test uses a real 2048-bit key.
"""

from __future__ import annotations

import multiprocessing
import secrets
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import gmpy2
import numpy as np
import phe
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cels.crypto.obfuscators import (
    OBFUSCATOR_MODES,
    FixedBaseTable,
    InlineObfuscators,
    djn_exponent_bits,
    obfuscators,
)
from cels.crypto.paillier import CiphertextError, KeySizeError, generate_keypair
from cels.crypto.packing import DECRYPT_CHUNK, Packing, PackingOverflowError, decrypt, decrypt_raw_many, encrypt
from cels.node.obfuscator_stock import ObfuscatorPool
from cels.protocol.wire import codec

SMALL = dict(allow_insecure_key_bits=True)


@pytest.fixture(scope="module")
def keys():
    public_key, private_key = generate_keypair(512, **SMALL)
    return public_key, private_key, InlineObfuscators(public_key.n)


def test_key_size_policy() -> None:
    with pytest.raises(KeySizeError, match="refused"):
        generate_keypair(1024)
    with pytest.raises(KeySizeError):
        generate_keypair(100, **SMALL)
    public_key, _ = generate_keypair(512, **SMALL)
    with pytest.raises(KeySizeError):
        codec.public_key_of(codec.public_key_message(public_key))
    assert codec.public_key_of(codec.public_key_message(public_key), **SMALL) == public_key


def test_crt_decryption_matches_phe(keys) -> None:
    public_key, private_key, _ = keys
    phe_key = phe.PaillierPublicKey(int(public_key.n))
    for m in (0, 1, 12345, int(public_key.n) - 1):
        assert private_key.decrypt_raw(gmpy2.mpz(phe_key.raw_encrypt(m))) == m


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(1, 40),
    cols=st.integers(1, 4),
    summands=st.integers(1, 4),
    bound=st.integers(1, 2**40),
)
def test_integer_sums_are_exact(keys, data, rows, cols, summands, bound) -> None:
    public_key, private_key, obf = keys
    packing = Packing.for_values(public_key, bound, summands)
    terms = [data.draw(arrays(np.int64, (rows, cols), elements=st.integers(-bound, bound))) for _ in range(summands)]
    enc = encrypt(public_key, terms[0], packing, obf)
    for k, m in enumerate(terms[1:]):
        enc = enc.add_plain(m) if k % 2 else enc.add(encrypt(public_key, m, packing, obf))
    np.testing.assert_array_equal(decrypt(private_key, enc), np.sum(terms, axis=0))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), rows=st.integers(1, 30), cols=st.integers(1, 3), scale_bits=st.integers(0, 40))
def test_fixed_point_matrix_sums(keys, data, rows, cols, scale_bits) -> None:
    public_key, private_key, obf = keys
    packing = Packing.for_values(public_key, 1000.0, 3, scale_bits)
    floats = st.floats(-1000, 1000, allow_nan=False)
    a, b, c = (data.draw(arrays(np.float64, (rows, cols), elements=floats)) for _ in range(3))
    enc = encrypt(public_key, a, packing, obf).add(encrypt(public_key, b, packing, obf)).add_plain(c)
    # each term is rounded to a multiple of 2^-scale_bits: error <= 3 * 2^-(scale_bits+1)
    np.testing.assert_allclose(decrypt(private_key, enc), a + b + c, rtol=0, atol=1.5 * 2.0**-scale_bits + 1e-9)


def test_slot_boundaries_and_overflow(keys) -> None:
    public_key, private_key, obf = keys
    bound, r = 1000, 3
    packing = Packing.for_values(public_key, bound, r)
    assert packing.slot_bits == 16 and (2 * bound * r).bit_length() <= 16  # 6000 < 2^13, whole bytes
    for rows in (packing.slots - 1, packing.slots, packing.slots + 1, 2 * packing.slots):
        extreme = np.where(np.arange(rows) % 2 == 0, bound, -bound).reshape(-1, 1)
        enc = encrypt(public_key, extreme, packing, obf)
        assert len(enc.ciphertexts) == -(-rows // packing.slots)
        for _ in range(r - 1):  # every slot at +-r*bound: no carry into the neighbouring slot
            enc = enc.add_plain(extreme)
        np.testing.assert_array_equal(decrypt(private_key, enc), r * extreme)
    with pytest.raises(PackingOverflowError, match="exceeds the packing bound"):
        encrypt(public_key, np.array([0, bound + 1]), packing, obf)
    with pytest.raises(PackingOverflowError, match="not finite"):
        encrypt(public_key, np.array([0.0, np.nan]), packing, obf)
    full = encrypt(public_key, np.ones(5), packing, obf).add_plain(np.ones(5)).add_plain(np.ones(5))
    with pytest.raises(PackingOverflowError, match="headroom"):
        full.add_plain(np.ones(5))
    with pytest.raises(PackingOverflowError, match="headroom"):
        full.add(encrypt(public_key, np.ones(5), packing, obf))
    with pytest.raises(PackingOverflowError):
        Packing.for_values(public_key, 2.0**600, 3)


def test_column_permutation_moves_whole_ciphertexts(keys) -> None:
    public_key, private_key, obf = keys
    rng = np.random.default_rng(7)
    matrix = rng.integers(-50, 50, size=(150, 9))  # 63 slots: 3 ciphertexts per column
    packing = Packing.for_values(public_key, 50, 2)
    enc = encrypt(public_key, matrix, packing, obf)
    perm = rng.permutation(9)
    permuted = enc.permute_columns(perm)
    b = enc.blocks
    assert b == 3
    assert permuted.ciphertexts[:b] == enc.ciphertexts[perm[0] * b : (perm[0] + 1) * b]
    np.testing.assert_array_equal(decrypt(private_key, permuted), matrix[:, perm])
    np.testing.assert_array_equal(decrypt(private_key, permuted.permute_columns(np.argsort(perm))), matrix)
    with pytest.raises(ValueError, match="permutation"):
        enc.permute_columns([0] * 9)


@pytest.mark.parametrize("mode", OBFUSCATOR_MODES)
def test_rerandomised_ciphertexts_differ_but_decrypt_equal(keys, mode) -> None:
    public_key, private_key, _ = keys
    obf = InlineObfuscators(public_key.n, mode)
    values = np.arange(-20, 20)
    enc = encrypt(public_key, values, Packing.for_values(public_key, 20, 1), obf)
    fresh = enc.rerandomize(obf)
    assert all(a != b for a, b in zip(enc.ciphertexts, fresh.ciphertexts))
    np.testing.assert_array_equal(decrypt(private_key, fresh), decrypt(private_key, enc))


def test_djn_and_textbook_encryptions_decrypt_the_same(keys) -> None:
    public_key, private_key, _ = keys
    djn, textbook = InlineObfuscators(public_key.n, "djn"), InlineObfuscators(public_key.n, "textbook")
    values = np.arange(-300, 300).reshape(-1, 3) * 7
    packing = Packing.for_values(public_key, 2100, 3)
    a, b = encrypt(public_key, values, packing, djn), encrypt(public_key, values, packing, textbook)
    assert all(x != y for x, y in zip(a.ciphertexts, b.ciphertexts))
    np.testing.assert_array_equal(decrypt(private_key, a), values)
    np.testing.assert_array_equal(decrypt(private_key, b), values)
    # a ring may mix the modes: each party's obfuscators only multiply in encryptions of zero
    mixed = a.add(b).rerandomize(textbook).add_plain(values).rerandomize(djn)
    np.testing.assert_array_equal(decrypt(private_key, mixed), 3 * values)


def lam(private_key):
    return gmpy2.lcm(private_key.p - 1, private_key.q - 1)


@pytest.mark.parametrize("mode", OBFUSCATOR_MODES)
def test_obfuscators_are_fresh_nth_residues(keys, mode) -> None:
    """Each obfuscator encrypts 0 and is an N-th residue: s^lambda = 1 mod N^2 (h_s = h^N is
    one, so every h_s^a is one too)."""
    public_key, private_key, _ = keys
    got = obfuscators(public_key.n, public_key.hs, 40, mode)
    assert len(set(got)) == 40
    assert all(private_key.decrypt_raw(s) == 0 and gmpy2.powmod(s, lam(private_key), public_key.nsquare) == 1 for s in got)
    assert gmpy2.powmod(public_key.hs, lam(private_key), public_key.nsquare) == 1


def test_djn_key_and_fixed_base_table(keys) -> None:
    public_key, private_key, _ = keys
    p, q = int(private_key.p), int(private_key.q)
    assert p % 4 == 3 and q % 4 == 3 and gmpy2.gcd(p - 1, q - 1) == 2  # DJN's admissible modulus
    bits = djn_exponent_bits(public_key.n)
    assert bits == 256  # ceil(|N| / 2) for the 512-bit test key
    table = FixedBaseTable(public_key.hs, public_key.nsquare, bits)
    assert table.windows == 32 and table.nbytes == 32 * 256 * public_key.ciphertext_bytes
    for e in (0, 1, 255, 256, 2**bits - 1, *(secrets.randbits(bits) for _ in range(20))):
        assert table.pow(e) == gmpy2.powmod(public_key.hs, e, public_key.nsquare)


def test_malformed_hs_is_refused(keys) -> None:
    public_key, private_key, _ = keys
    n, nsq = int(public_key.n), int(public_key.nsquare)
    width = public_key.ciphertext_bytes
    minus_one = next(y for y in range(2, 1000) if gmpy2.jacobi(y, n) == -1)

    def refused(hs: bytes, match: str, n_bytes: bytes | None = None) -> None:
        msg = codec.public_key_message(public_key)
        msg.hs = hs
        if n_bytes is not None:
            msg.n = n_bytes
        with pytest.raises(CiphertextError, match=match):
            codec.public_key_of(msg, **SMALL)

    refused(b"", "h_s is missing")
    refused(bytes(width), "2..N")
    refused((1).to_bytes(width, "big"), "2..N")
    refused(b"\xff" * width, "2..N")
    refused(int(private_key.p).to_bytes(width, "big"), "not invertible")
    refused((1 + 5 * n).to_bytes(width, "big"), r"\+-1 mod N")  # an encryption of 5 with r = 1
    refused((nsq - 1).to_bytes(width, "big"), r"\+-1 mod N")
    refused(minus_one.to_bytes(width, "big"), "Jacobi")
    refused(public_key.hs_bytes(), "not 1 mod 4", (n + 2).to_bytes(len(public_key.modulus_bytes()), "big"))
    assert codec.public_key_of(codec.public_key_message(public_key), **SMALL) == public_key


def test_wire_round_trip_and_corrupt_ciphertexts(keys) -> None:
    public_key, private_key, obf = keys
    matrix = np.arange(12).reshape(4, 3) - 6
    enc = encrypt(public_key, matrix, Packing.for_values(public_key, 10, 2), obf)
    msg = codec.matrix_message(enc)
    np.testing.assert_array_equal(decrypt(private_key, codec.matrix_of(msg, public_key)), matrix)
    width = public_key.ciphertext_bytes

    def corrupt(raw: bytes, match: str) -> None:
        bad = type(msg)()
        bad.CopyFrom(msg)
        bad.ciphertexts[1] = raw
        with pytest.raises(CiphertextError, match=match):
            codec.matrix_of(bad, public_key)

    corrupt(msg.ciphertexts[1][1:], f"ciphertext 1: {width - 1} bytes, expected {width}")
    corrupt(b"\xff" * width, "not below N")
    corrupt(int(private_key.p).to_bytes(width, "big"), "not invertible")
    corrupt(bytes(width), "not invertible")
    short = type(msg)()
    short.CopyFrom(msg)
    del short.ciphertexts[-1]
    with pytest.raises(CiphertextError, match="needs 3 ciphertexts, got 2"):
        codec.matrix_of(short, public_key)
    other, _ = generate_keypair(256, **SMALL)
    with pytest.raises(CiphertextError, match="exceed"):
        codec.matrix_of(msg, other)  # the packing does not fit a smaller key


@pytest.mark.parametrize("mode", OBFUSCATOR_MODES)
def test_obfuscator_pool_gives_fresh_encryptions_of_zero(keys, mode) -> None:
    public_key, private_key, _ = keys
    with ObfuscatorPool(int(public_key.n), hs=int(public_key.hs), mode=mode, workers=2, batch=3) as pool:
        pool.prefetch(4)
        got = pool.take(public_key.hs, 7)  # 4 prefetched + 3 computed on demand
    assert len(set(got)) == 7
    assert all(private_key.decrypt_raw(r) == 0 for r in got)


def test_concurrent_takers_on_one_pool_both_get_obfuscators(keys) -> None:
    """Issue 13 item 7: the second taker saw the first one's queued batch as its own and
    waited for a prefetch that nobody made.  Both threads start while the worker process
    is still spawning, so both find the first taker's batch queued and not ready."""
    public_key, private_key, _ = keys
    got: dict[int, list] = {}
    with ObfuscatorPool(int(public_key.n), workers=1, batch=5) as pool:
        start = threading.Barrier(2)

        def taker(k: int) -> None:
            start.wait()
            got[k] = pool.take(public_key.hs, 5)

        threads = [threading.Thread(target=taker, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a taker is still waiting for obfuscators"
        assert pool.handed_out == 10 and pool.available == 0
    values = got[0] + got[1]
    assert len(set(values)) == 10 and all(private_key.decrypt_raw(s) == 0 for s in values)


@pytest.mark.parametrize("pool_kind", ["process", "thread"])
def test_decryption_in_a_pool_equals_in_process(keys, pool_kind) -> None:
    """A process pool, or threads (the exponentiations release the GIL): the same plaintexts."""
    public_key, private_key, obf = keys
    values = np.arange(-700, 700).reshape(-1, 2) * 7919  # 700 x 2 at one value per ciphertext
    packing = Packing.for_values(public_key, float(np.abs(values).max()), 1)
    enc = encrypt(public_key, values, Packing(packing.slot_bits, 1, 0, packing.offset, 1), obf)
    assert len(enc.ciphertexts) == 1400 >= 2 * DECRYPT_CHUNK  # large enough to go to the pool
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) if pool_kind == "process" else ThreadPoolExecutor(2)
    with pool:
        np.testing.assert_array_equal(decrypt(private_key, enc, pool), values)
        assert decrypt_raw_many(private_key, enc.ciphertexts[:5], pool) == [private_key.decrypt_raw(c) for c in enc.ciphertexts[:5]]


def test_real_2048_bit_key() -> None:
    public_key, private_key = generate_keypair()
    assert public_key.bits == 2048 and public_key.ciphertext_bytes == 512
    obf = InlineObfuscators(public_key.n)
    packing = Packing.for_values(public_key, 2**32, 3)
    assert packing.slots == 2047 // packing.slot_bits == 51
    values = np.arange(-60, 60) * 1_000_003
    enc = encrypt(public_key, values, packing, obf).add_plain(values).rerandomize(obf)
    assert len(enc.ciphertexts) == 3
    np.testing.assert_array_equal(decrypt(private_key, codec.matrix_of(codec.matrix_message(enc), public_key)).ravel(), 2 * values)
