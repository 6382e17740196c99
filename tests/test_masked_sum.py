"""The private mode's secure sums by pairwise masks (cels.protocol.masked_sum): totals, what
travels, refusals."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from cels.crypto.packing import PackingOverflowError
from cels.crypto.secure_aggregation import PairwiseMasks
from cels.inprocess import InMemoryNetwork
from cels.protocol import masked_sum
from cels.protocol.masked_sum import MaskedSum
from cels.protocol.secure_sum import Summand
from cels.protocol.roles import ProtocolError, take_ready


def make(ring, values, bound=2**31 - 1, round_number=0):
    masks = {p: PairwiseMasks(k, len(ring), b"s1") for k, p in enumerate(ring)}
    for p in ring:
        for k, q in enumerate(ring):
            if p != q:
                masks[p].add_peer(k, masks[q].public_key)
    return {
        p: MaskedSum(Summand(p, "s1", "counts", ring, values[p], bound), masks=masks[p], round_number=round_number)
        for p in ring
    }


def ready(out) -> list:
    """The messages of a start or receive that are ready now (a Stream's as far as it is made)."""
    return take_ready(deque(out))


def run(roles):
    net = InMemoryNetwork(roles)
    for p, role in roles.items():
        net.run(role.start(), sender=p)
    return net


@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_every_party_learns_the_sum_and_p1_sees_masked_vectors_only(r) -> None:
    ring = [f"party-{k}" for k in range(1, r + 1)]
    rng = np.random.default_rng(r)
    values = {p: rng.integers(0, 10**6, size=500) for p in ring}
    roles = make(ring, values)
    net = run(roles)
    total = sum(values.values())
    for p in ring:
        assert roles[p].done
        np.testing.assert_array_equal(roles[p].result, total)
    steps = [(src, dst, step) for src, dst, step, _ in net.log]
    assert sorted(s for s in steps if s[2] == "masked_sum_share") == [(p, ring[0], "masked_sum_share") for p in ring[1:]]
    assert sorted(s for s in steps if s[2] == "sum_result") == [(ring[0], p, "sum_result") for p in ring[1:]]
    if r >= 3:  # a share is not the vector (it is uniform mod 2^64 without the other seeds)
        share = roles[ring[1]].masks.masked_values(values[ring[1]], 2, 0).view(np.int64)
        assert np.count_nonzero(share == values[ring[1]]) == 0


def test_each_sum_has_its_own_masks() -> None:
    ring = ["a", "b", "c"]
    masks = PairwiseMasks(ring.index("b"), len(ring), b"s1")
    for q in ("a", "c"):
        masks.add_peer(ring.index(q), PairwiseMasks(ring.index(q), len(ring), b"s1").public_key)
    zeros = np.zeros(64, dtype=np.int64)
    assert not np.array_equal(masks.masked_values(zeros, 2, 0), masks.masked_values(zeros, 2, 1))


def test_refusals() -> None:
    ring = ["a", "b", "c"]
    values = {p: np.arange(10) for p in ring}
    with pytest.raises(PackingOverflowError, match="outside"):
        make(ring, {**values, "b": np.array([-1, 2])})
    roles = make(ring, values)
    a_stream = deque(roles["a"].start())
    assert take_ready(a_stream) == [] and a_stream  # P_1's total waits for the shares
    ((dst, env),) = ready(roles["b"].start())  # a Stream: its one chunk made as it is taken
    assert dst == "a"
    short = type(env)()
    short.CopyFrom(env)
    short.masked_sum_share.words = env.masked_sum_share.words[:-8]
    with pytest.raises(ProtocolError) as err:
        roles["a"].receive("b", short)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT
    roles["a"].receive("b", env)
    with pytest.raises(ProtocolError) as err:  # the same party twice
        roles["a"].receive("b", env)
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    ((_, env_c),) = ready(roles["c"].start())
    words = bytearray(env_c.masked_sum_share.words)
    words[7] ^= 0x40  # not c's masked vector: the masks no longer cancel (entry 0 off by 2^62)
    env_c.masked_sum_share.words = bytes(words)
    with pytest.raises(ProtocolError) as err:
        roles["a"].receive("c", env_c)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT and "outside [0, r * bound]" in str(err.value)


def test_a_sum_streams_in_chunks_and_totals_as_whole(monkeypatch) -> None:
    """With chunks of 16 entries, a 50-entry sum of 3 parties goes as 4 MaskedSumShares per
    party and 4 SumResults per receiver, each chunk at its place (first, more); P_1 sends a
    chunk of the total once all three shares of it are in; the totals are the whole vectors'."""
    monkeypatch.setattr(masked_sum, "SUM_CHUNK", 16)
    ring = ["a", "b", "c"]
    rng = np.random.default_rng(5)
    values = {p: rng.integers(0, 1000, size=50) for p in ring}
    roles = make(ring, values)
    held = {p: deque(roles[p].start()) for p in ring}  # P_1's total: a Stream of chunks made as their shares are in
    sent, queue = [], [(p, dst, env) for p in ring for dst, env in take_ready(held[p])]
    while queue:  # delivered in the order sent (one sender's chunks stay in order)
        src, dst, env = queue.pop(0)
        sent.append((src, dst, env.WhichOneof("step"), env))
        held[dst].extend(roles[dst].receive(src, env))
        queue += [(dst, to, out) for to, out in take_ready(held[dst])]
    for p in ring:
        np.testing.assert_array_equal(roles[p].result, sum(values.values()))
    shares = [env.masked_sum_share for src, dst, step, env in sent if step == "masked_sum_share" and src == "b"]
    assert [(m.first, len(m.words) // 8, m.more) for m in shares] == [(0, 16, True), (16, 16, True), (32, 16, True), (48, 2, False)]
    np.testing.assert_array_equal(
        np.frombuffer(b"".join(m.words for m in shares), dtype="<u8"), roles["b"].masks.masked_values(values["b"], 2, 0)
    )
    results = [env.sum_result for src, dst, step, env in sent if step == "sum_result" and dst == "c"]
    assert [(m.first, m.more, m.rows, len(m.words) // m.word_bytes) for m in results] == [(0, True, 50, 16), (16, True, 50, 16), (32, True, 50, 16), (48, False, 50, 2)]
    total = sum(values.values())
    for m in results:  # each chunk of the total in the smallest words that hold it, not 8 bytes a varint entry
        chunk = total[m.first : m.first + len(m.words) // m.word_bytes]
        assert not m.values and m.word_bytes == np.min_scalar_type(int(chunk.max())).itemsize
        np.testing.assert_array_equal(np.frombuffer(m.words, dtype=f"<u{m.word_bytes}"), chunk)


def test_chunks_out_of_place_are_refused(monkeypatch) -> None:
    """A chunk that skips one, repeats one, has the wrong length or says more after the end is
    refused (FAILED_PRECONDITION out of place, INVALID_ARGUMENT malformed), at P_1 and at the
    receivers of the total."""
    monkeypatch.setattr(masked_sum, "SUM_CHUNK", 16)
    ring = ["a", "b", "c"]
    values = {p: np.arange(40) for p in ring}
    roles = make(ring, values)
    totals = deque(roles["a"].start())
    chunks_b = ready(roles["b"].start())
    assert len(chunks_b) == 3
    with pytest.raises(ProtocolError) as err:  # skips the first chunk
        roles["a"].receive("b", chunks_b[1][1])
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    roles["a"].receive("b", chunks_b[0][1])
    with pytest.raises(ProtocolError) as err:  # the same chunk again
        roles["a"].receive("b", chunks_b[0][1])
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    bad = type(chunks_b[2][1])()
    bad.CopyFrom(chunks_b[2][1])
    bad.masked_sum_share.more = True  # the last chunk claims more
    with pytest.raises(ProtocolError) as err:
        roles["a"].receive("b", bad)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT
    roles["a"].receive("b", chunks_b[1][1])
    roles["a"].receive("b", chunks_b[2][1])
    out = [o for _, env in ready(roles["c"].start()) for o in [*roles["a"].receive("c", env), *take_ready(totals)]]
    to_b = [env for dst, env in out if dst == "b"]
    assert len(to_b) == 3 and roles["a"].done
    for spoil in (
        lambda m: setattr(m, "words", m.words[: -m.word_bytes]),  # a word short
        lambda m: setattr(m, "words", m.words[:-1]),  # not a whole number of words
        lambda m: setattr(m, "word_bytes", 3),  # no such word
        lambda m: m.values.append(1),  # values beside the words
        lambda m: setattr(m, "words", b"\xff" * (16 * 8)) or setattr(m, "word_bytes", 8),  # above r * bound
    ):
        bad = type(to_b[0])()
        bad.CopyFrom(to_b[0])
        spoil(bad.sum_result)
        with pytest.raises(ProtocolError) as err:
            roles["b"].receive("a", bad)
        assert err.value.code == ProtocolError.INVALID_ARGUMENT
    with pytest.raises(ProtocolError) as err:  # the second chunk first
        roles["b"].receive("a", to_b[1])
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    for env in to_b:
        roles["b"].receive("a", env)
    np.testing.assert_array_equal(roles["b"].result, 3 * np.arange(40))


def test_a_sum_goes_in_the_smallest_ring_that_holds_its_total() -> None:
    """The ring Z_{2^w} of a masked sum is the smallest of 8, 16, 32 and 64 bits holding
    r * bound (public): r = 3 parties' indicators (bound 1) go as a byte an entry, masked mod
    2^8, and total exactly; counts (bound 2^53) as 8 bytes."""
    assert [masked_sum.ring_bits(3, 1), masked_sum.ring_bits(255, 1), masked_sum.ring_bits(256, 1)] == [8, 8, 16]
    assert [masked_sum.ring_bits(2, 2**31 - 1), masked_sum.ring_bits(3, 2**31 - 1), masked_sum.ring_bits(3, 2**53)] == [32, 64, 64]
    ring = ["a", "b", "c"]
    rng = np.random.default_rng(9)
    values = {p: rng.integers(0, 2, size=300) for p in ring}
    roles = make(ring, values, bound=1)
    net = run(roles)
    for p in ring:
        np.testing.assert_array_equal(roles[p].result, sum(values.values()))
    shares = [size for src, dst, step, size in net.log if step == "masked_sum_share"]
    assert len(shares) == 2 and all(300 <= size < 400 for size in shares)  # 300 one-byte words and the envelope
