"""The private mode's secure sums by pairwise masks (cels.protocol.masked_sum): totals, what
travels, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from cels.crypto.paillier import PackingOverflowError
from cels.crypto.secure_aggregation import PairwiseMasks
from cels.inprocess import InMemoryNetwork
from cels.protocol.masked_sum import MaskedSum
from cels.protocol.roles import ProtocolError


def make(ring, values, bound=2**31 - 1, round_number=0):
    masks = {p: PairwiseMasks(k, len(ring), b"s1") for k, p in enumerate(ring)}
    for p in ring:
        for k, q in enumerate(ring):
            if p != q:
                masks[p].add_peer(k, masks[q].public_key)
    return {
        p: MaskedSum(name=p, session_id="s1", sum_id="counts", ring=ring, values=values[p], bound=bound, masks=masks[p], round_number=round_number)
        for p in ring
    }


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
    a_out = roles["a"].start()
    assert a_out == []
    (dst, env), = roles["b"].start()
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
    (_, env_c), = roles["c"].start()
    words = bytearray(env_c.masked_sum_share.words)
    words[7] ^= 0x40  # not c's masked vector: the masks no longer cancel (entry 0 off by 2^62)
    env_c.masked_sum_share.words = bytes(words)
    with pytest.raises(ProtocolError) as err:
        roles["a"].receive("c", env_c)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT and "outside [0, r * bound]" in str(err.value)
