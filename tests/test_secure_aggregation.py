"""Pairwise masks (secure aggregation): they cancel, a masked vector looks uniform, and the
OR-aggregation is 0 exactly when every party said 0."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy import stats

from cels.crypto.secure_aggregation import NOISE, SUMS, VERDICTS, MaskError, PairwiseMasks, aggregate, prg_words, signed


def parties_with_keys(r: int, context: bytes = b"s1") -> dict[str, PairwiseMasks]:
    names = [f"party-{k}" for k in range(1, r + 1)]
    masks = {n: PairwiseMasks(k, r, context) for k, n in enumerate(names)}
    for n, m in masks.items():
        for k, (other, o) in enumerate(masks.items()):
            if other != n:
                m.add_peer(k, o.public_key)
    return masks


@pytest.mark.parametrize("r", [2, 3, 5])
def test_masks_cancel_in_the_sum(r) -> None:
    masks = parties_with_keys(r)
    for round_number in (0, 1, 77):
        assert not np.any(aggregate({n: m.mask(round_number, 257) for n, m in masks.items()}))


@pytest.mark.parametrize("r", [2, 3, 5])
def test_or_aggregation_is_zero_iff_nobody_rejects(r) -> None:
    masks = parties_with_keys(r)
    rng = np.random.default_rng(4)
    for round_number in range(40):
        verdicts = {n: rng.integers(0, 2, size=64) * (rng.random(64) < 0.3) for n in masks}
        total = aggregate({n: masks[n].masked_or_shares(round_number, verdicts[n]) for n in masks})
        anyone = np.any(np.vstack(list(verdicts.values())), axis=0)
        np.testing.assert_array_equal(total != 0, anyone)


def test_a_masked_vector_looks_uniform() -> None:
    """Each byte of one party's masked all-zero and all-one verdict vectors: chi-square against
    uniform over 256 values, 2**16 bytes each, p > 0.001 (fails by chance 1 in 1000)."""
    masks = parties_with_keys(3)
    for verdict in (0, 1):
        w = masks["party-2"].masked_or_shares(5, [verdict] * 8192)
        counts = np.bincount(np.frombuffer(w.tobytes(), dtype=np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-3
        bits = np.unpackbits(np.frombuffer(w.tobytes(), dtype=np.uint8))
        assert abs(bits.mean() - 0.5) < 4 * 0.5 / np.sqrt(bits.size)  # 4 sigma


def test_a_vector_made_in_pieces_is_the_vector_made_whole() -> None:
    """The masked sums mask each chunk from its own position (cels.protocol.masked_sum): words
    from an offset (a multiple of the 8-word ChaCha20 block) are the whole vector's there, and
    a party's masked pieces are its whole masked vector's; an offset inside a block is refused."""
    seed = bytes(range(32))
    whole = prg_words(seed, 3, 200, SUMS)
    for offset, length in ((0, 8), (8, 24), (64, 136), (192, 8)):
        np.testing.assert_array_equal(prg_words(seed, 3, length, SUMS, offset), whole[offset : offset + length])
    masks = parties_with_keys(3)["party-2"]
    values = np.arange(200, dtype=np.int64)
    pieces = [masks.masked_values(values[lo : lo + 16], SUMS, 2, offset=lo) for lo in range(0, 200, 16)]
    np.testing.assert_array_equal(np.concatenate(pieces), masks.masked_values(values, SUMS, 2))
    with pytest.raises(MaskError, match="multiple of 8"):
        prg_words(seed, 3, 8, SUMS, offset=4)


def test_rounds_and_streams_use_independent_words() -> None:
    seed = bytes(range(32))
    a, b, c = prg_words(seed, 0, 64), prg_words(seed, 1, 64), prg_words(seed, 0, 64, NOISE)
    assert not np.any(np.isin(a, b)), "round 1 repeats words of round 0"
    assert not np.any(np.isin(a, c)), "the noise stream repeats words of the verdict stream"


@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_masked_signed_values_sum_exactly(r) -> None:
    """Noise shares: negative and large values come back exactly as the int64 sum."""
    masks = parties_with_keys(r)
    rng = np.random.default_rng(r)
    values = {n: rng.integers(-(2**40), 2**40, size=33) for n in masks}
    total = signed(aggregate({n: masks[n].masked_values(values[n]) for n in masks}))
    np.testing.assert_array_equal(total, np.sum(list(values.values()), axis=0))
    if r > 1:  # masked, one party's vector is not its values
        some = next(iter(masks))
        assert not np.any(signed(masks[some].masked_values(values[some])) == values[some])


def test_a_single_party_has_a_zero_mask() -> None:
    (only,) = parties_with_keys(1).values()
    assert only.complete and not np.any(only.mask(3, 10, VERDICTS))


def test_bad_peer_keys_are_refused() -> None:
    m = PairwiseMasks(0, 2, b"s")
    with pytest.raises(MaskError, match="bytes"):
        m.add_peer(1, b"short")
    with pytest.raises(MaskError, match="no mask seed"):
        m.add_peer(2, bytes(32))
    with pytest.raises(MaskError, match="no mask seed"):
        m.add_peer(0, bytes(32))  # itself
    with pytest.raises(MaskError):
        m.add_peer(1, bytes(32))  # the zero point has small order
    with pytest.raises(MaskError, match="missing"):
        m.mask(0, 3)


def ring_with_keys(context: bytes) -> list[PairwiseMasks]:
    """Three parties at ring indices 0, 1, 2 with fixed X25519 keys; every key arrives in
    reverse ring order (the order must not matter)."""
    keys = [X25519PrivateKey.from_private_bytes(bytes([k + 1]) * 32) for k in range(3)]
    masks = [PairwiseMasks(k, 3, context, private_key=key) for k, key in enumerate(keys)]
    for k, m in enumerate(masks):
        for peer in reversed(range(3)):
            if peer != k:
                m.add_peer(peer, masks[peer].public_key)
    return masks


def test_masks_are_pinned_by_keys_context_and_ring_order() -> None:
    """Known answer: the SUMS masks of round 3 under the context b"session-7" (HKDF info =
    SEED_LABEL || context) are the words these keys gave when PairwiseMasks still took the
    party names ["a", "b", "c"] and the session id "session-7"; another context, other masks."""
    expected = [
        [0xD70A29848509FE74, 0x3945AFC5FDC16154],
        [0x2729CB9C957C1EE9, 0x5AE35F88ABE1FCD1],
        [0x01CC0ADEE579E2A3, 0x6BD6F0B1565CA1DB],
    ]
    assert [[int(w) for w in m.mask(3, 2, SUMS)] for m in ring_with_keys(b"session-7")] == expected
    assert [int(w) for w in ring_with_keys(b"session-8")[0].mask(3, 2, SUMS)] != expected[0]


def test_keyed_masks_replay_their_key_and_their_rho() -> None:
    """The same secret and stream give the same public key and the same masked OR shares; the
    rho are uniform on [1, 2^64 - 1] (no zero; the top bit set half the time, within 5 sigma)."""
    from cels.crypto.streams import cipher_generator

    def masks(k: int, seed: int) -> PairwiseMasks:
        return PairwiseMasks.keyed(k, 2, b"s", bytes([k + 1]) * 32, cipher_generator(seed))

    first, again = [masks(0, 3), masks(1, 4)], [masks(0, 3), masks(1, 4)]
    for group in (first, again):
        group[0].add_peer(1, group[1].public_key)
    assert first[0].public_key == again[0].public_key != first[1].public_key
    verdicts = [1] * 20_000
    shares = first[0].masked_or_shares(0, verdicts)
    assert np.array_equal(shares, again[0].masked_or_shares(0, verdicts))
    rho = shares - first[0].mask(0, len(verdicts))
    assert np.all(rho != 0)
    assert abs(float(np.mean(rho >> np.uint64(63))) - 0.5) < 5 * 0.5 / np.sqrt(len(rho))
