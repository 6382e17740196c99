"""Pohlig-Hellman commutative cipher, QR encoding, RFC groups, X25519 commutative hash."""

from __future__ import annotations

import gmpy2
import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cels.crypto.commutative_cipher import (
    CommutativeCipherError,
    PohligHellman,
    PohligHellmanHash,
    chunk_bytes,
    decode_record,
    element_from_bytes,
    element_to_bytes,
    encode_record,
)
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.groups import GROUPS, group_for_bits

G2048 = group_for_bits(2048)
KEYS = (PohligHellman(G2048), PohligHellman(G2048), PohligHellman(G2048))


@pytest.mark.parametrize(
    "name, constant, addend",
    [
        ("modp1024", "pi", 129093),  # RFC 2409 section 6.2
        ("modp2048", "pi", 124476),  # RFC 3526 section 3
        ("modp3072", "pi", 1690314),  # RFC 3526 section 4
        ("ffdhe2048", "e", 560316),  # RFC 7919 appendix A.1
        ("ffdhe3072", "e", 2625351),  # RFC 7919 appendix A.2
    ],
)
def test_groups_are_the_rfc_safe_primes(name, constant, addend) -> None:
    group = GROUPS[name]
    bits = group.bits
    mpmath.mp.prec = bits + 64
    c = int(mpmath.floor(mpmath.mpf(2) ** (bits - 130) * getattr(mpmath, constant)))
    assert group.p == 2**bits - 2 ** (bits - 64) - 1 + 2**64 * (c + addend)
    assert gmpy2.is_prime(group.p, 25) and gmpy2.is_prime(group.q, 25)
    assert group.p % 4 == 3


def test_group_size_policy() -> None:
    with pytest.raises(ValueError, match="insecure"):
        group_for_bits(1024)
    assert group_for_bits(1024, allow_paper_bits=True).bits == 1024
    with pytest.raises(ValueError, match="not offered"):
        group_for_bits(4096)


def test_keys_are_odd_and_invertible() -> None:
    for key in KEYS:
        assert key._e % 2 == 1 and gmpy2.gcd(key._e, G2048.p - 1) == 1
        assert key._e * key._d % (G2048.p - 1) == 1
    assert len({int(k._e) for k in KEYS}) == 3


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(max_size=600), st.sampled_from([b"", b"\x00", b"\x00" * 251, b"\xff" * 252, "é€".encode("utf-16")])))
def test_encoding_round_trips_into_the_qr_subgroup(data: bytes) -> None:
    chunks = encode_record(G2048, data)
    assert len(chunks) == -(-(len(data) + 4) // chunk_bytes(G2048))
    assert all(1 <= c < G2048.p and gmpy2.legendre(c, G2048.p) == 1 for c in chunks)
    assert decode_record(G2048, chunks) == data


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_encoding_is_injective(a: bytes, b: bytes) -> None:
    if a != b:
        assert encode_record(G2048, a) != encode_record(G2048, b)


@settings(max_examples=10, deadline=None)
@given(st.binary(max_size=400))
def test_encryption_commutes_and_decrypts(data: bytes) -> None:
    a, b, c = KEYS
    chunks = encode_record(G2048, data)
    abc = a.encrypt_record(b.encrypt_record(c.encrypt_record(chunks)))
    cab = c.encrypt_record(a.encrypt_record(b.encrypt_record(chunks)))
    assert abc == cab
    assert all(x != y for x, y in zip(abc, chunks))  # no fixed points, even for b"" (zero chunk)
    assert all(gmpy2.legendre(x, G2048.p) == 1 for x in abc)
    assert decode_record(G2048, b.decrypt_record(c.decrypt_record(a.decrypt_record(abc)))) == data


def test_received_elements_are_validated() -> None:
    good = encode_record(G2048, b"record")[0]
    assert element_from_bytes(G2048, element_to_bytes(G2048, good)) == good
    width = G2048.element_bytes
    non_residue = G2048.p - good  # -1 is a non-residue, so -x is one when x is a residue
    for raw, match in [
        (element_to_bytes(G2048, good)[1:], "255 bytes, expected 256"),
        (bytes(width), "outside"),
        (element_to_bytes(G2048, 1), "outside"),  # the identity: fixed by every key
        (element_to_bytes(G2048, G2048.p), "outside"),
        (element_to_bytes(G2048, non_residue), "outside"),
    ]:
        with pytest.raises(CommutativeCipherError, match=match):
            element_from_bytes(G2048, raw)


def test_undecodable_records_are_rejected() -> None:
    chunks = encode_record(G2048, b"abc")
    with pytest.raises(CommutativeCipherError, match="length prefix"):
        decode_record(G2048, encode_record(G2048, b"x" * 300)[:1])  # a chunk lost
    with pytest.raises(CommutativeCipherError, match="no chunks"):
        decode_record(G2048, [])
    with pytest.raises(CommutativeCipherError, match="length prefix"):
        decode_record(G2048, chunks + chunks)  # padding must be zero and shorter than a chunk


@pytest.mark.parametrize("make", [X25519Hash, lambda: PohligHellmanHash(G2048)])
def test_commutative_hashes_commute_and_separate_ids(make) -> None:
    a, b, c = make(), make(), make()
    ids = [b"", b"q\tu", b"q\tv", "caf\u00e9".encode()]
    abc = c.apply(b.apply(a.hash(ids)))
    bca = a.apply(c.apply(b.hash(ids)))
    assert abc == bca
    assert len(set(abc)) == len(ids)
    assert a.hash(ids) != b.hash(ids)  # keyed: a party cannot compute another's layer
    with pytest.raises(CommutativeCipherError):
        a.apply([b"\x01\x02"])


def test_x25519_refusal_names_the_bad_element() -> None:
    key = X25519Hash()
    good = key.hash([b"a", b"b"])
    with pytest.raises(CommutativeCipherError, match=r"element 2: 31 bytes"):
        key.apply([*good, b"\x05" * 31])
    with pytest.raises(CommutativeCipherError, match=r"element 1: "):  # u = 0: a small-order point
        key.apply([good[0], bytes(32), good[1]])
    assert key.apply(good) == [key.apply([u])[0] for u in good]
