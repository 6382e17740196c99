"""Secure union (Algorithm 3 with shuffling at every hop) run by the in-memory network."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency

import cels.protocol.secure_union as secure_union
from cels.crypto.commutative_cipher import CommutativeCipherError
from cels.crypto.groups import group_for_bits
from cels.crypto.streams import cipher_generator
from cels.inprocess import InMemoryNetwork
from cels.protocol.roles import ProtocolError
from cels.protocol.secure_union import SecureUnion
from cels.protocol.wire import cels_pb2

PAPER_GROUP = group_for_bits(1024, allow_paper_bits=True)  # fast group for the repeated runs
ALPHA = 0.001  # significance level of the origin-independence test


class RecordingNetwork(InMemoryNetwork):
    """Keeps every encrypted record that crosses the wire."""

    def __init__(self, roles) -> None:
        super().__init__(roles)
        self.sent_records = []

    def _enqueue(self, queue, src, messages):
        messages = list(messages)
        for _dst, envelope in messages:
            step = envelope.WhichOneof("step")
            if step in ("union_encrypt_hop", "union_decrypt_hop"):
                self.sent_records.extend(getattr(envelope, step).records)
        super()._enqueue(queue, src, messages)


def run_union(records: dict[str, list[bytes]], group=PAPER_GROUP, seed: int | None = None, **kw) -> tuple[dict[str, SecureUnion], RecordingNetwork]:
    """One union over ``records``; with ``seed``, party k's keys and shuffles replay stream ``seed * r + k``."""
    ring = list(records)
    streams = {p: {"rng": cipher_generator(seed * len(ring) + k)} if seed is not None else {} for k, p in enumerate(ring)}
    roles = {p: SecureUnion(name=p, session_id="s1", ring=ring, records=records[p], group=group, **streams[p], **kw) for p in ring}
    net = RecordingNetwork(roles)
    for p in ring:
        net.run(roles[p].start(), sender=p)
    return roles, net


def test_union_with_the_default_2048_bit_group() -> None:
    records = {
        "party-1": [b"u1\tq\turl", b"", b"shared"],
        "party-2": [b"\xff\xfe\x00", b"shared", b"long " * 120],
        "party-3": [b"z"],
    }
    roles, net = run_union(records, group=group_for_bits(2048))
    expected = set().union(*map(set, records.values()))
    for role in roles.values():
        assert role.done and len(role.result) == len(expected) and set(role.result) == expected
    # each party's set travels its own ring of r - 1 hops, then reaches the coordinator
    hops = [(src, dst) for src, dst, step, _ in net.log if step == "union_encrypt_hop"]
    assert sorted(hops) == sorted(
        [("party-1", "party-2"), ("party-2", "party-3"), ("party-3", "party-1"),
         ("party-2", "party-3"), ("party-3", "party-1"),
         ("party-3", "party-1"), ("party-1", "party-2"), ("party-2", "party-1")]
    )
    decrypt = [(src, dst) for src, dst, step, _ in net.log if step == "union_decrypt_hop"]
    assert decrypt == [("party-1", "party-2"), ("party-2", "party-3")]


def test_padded_records_hide_their_length() -> None:
    records = {"a": [b"short", b"x" * 200], "b": [b"y" * 240, b""]}
    roles, net = run_union(records, record_chunks=2)
    assert {len(r.chunks) for r in net.sent_records} == {2}  # 127-byte chunks (1024-bit group)
    assert all(set(role.result) == {b"short", b"x" * 200, b"y" * 240, b""} for role in roles.values())
    with pytest.raises(CommutativeCipherError, match="more than the agreed 2"):
        SecureUnion(name="a", session_id="s1", ring=["a"], records=[b"z" * 300], group=PAPER_GROUP, record_chunks=2).start()


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sets(st.binary(max_size=40), max_size=5), min_size=1, max_size=4))
def test_union_is_the_set_union(sets) -> None:
    records = {f"p{k}": sorted(s) for k, s in enumerate(sets)}
    roles, _ = run_union(records)
    expected = set().union(*sets)
    for role in roles.values():
        assert len(role.result) == len(expected) and set(role.result) == expected


def origin_position_table(runs: int, r: int = 3, per_party: int = 4) -> np.ndarray:
    """Counts[origin, position]: where each party's records land in P_1's output, over runs."""
    records = {f"p{k}": [f"p{k}-record-{i}".encode() for i in range(per_party)] for k in range(r)}
    table = np.zeros((r, r * per_party), dtype=np.int64)
    for run in range(runs):
        roles, _ = run_union(records, seed=run)
        for position, record in enumerate(roles["p0"].result):
            table[int(record[1:2]), position] += 1
    return table


def test_output_position_does_not_depend_on_origin() -> None:
    """Chi-square test of independence of origin (3 parties) and output position (12 slots)
    over 60 runs (720 observations, 20 expected per cell), each run on its own replayed key
    streams, so the test is the same on every machine; a fixed set of independent runs
    fails it with probability ALPHA when the positions are independent of the origin."""
    table = origin_position_table(runs=60)
    assert table.sum() == 60 * 12
    assert chi2_contingency(table).pvalue > ALPHA


def test_the_independence_test_detects_an_order_preserving_union(monkeypatch) -> None:
    """The same test rejects a union that does not shuffle (the leak the shuffles remove)."""
    monkeypatch.setattr(secure_union.SecureUnion, "_shuffle", lambda self, items: None)
    table = origin_position_table(runs=10)
    assert chi2_contingency(table).pvalue < ALPHA


def test_protocol_errors() -> None:
    ring = ["a", "b", "c"]
    roles = {p: SecureUnion(name=p, session_id="s1", ring=ring, records=[p.encode()], group=PAPER_GROUP) for p in ring}
    (dst, hop), = roles["a"].start()
    assert dst == "b"
    with pytest.raises(ProtocolError) as err:
        roles["c"].receive("a", hop)  # a's set reaches c only through b
    assert err.value.code == "failed_precondition"
    bad = cels_pb2.Envelope()
    bad.CopyFrom(hop)
    bad.union_encrypt_hop.records[0].chunks[0] = (PAPER_GROUP.p - 1).to_bytes(PAPER_GROUP.element_bytes, "big")
    with pytest.raises(ProtocolError, match="outside the quadratic-residue subgroup") as err:
        roles["b"].receive("a", bad)
    assert err.value.code == "invalid_argument"
    early = cels_pb2.Envelope(session_id="s1", sender="a", union_decrypt_hop=cels_pb2.UnionDecryptHop(session_id="s1", hops=1))
    with pytest.raises(ProtocolError, match="before every set was encrypted"):
        roles["b"].receive("a", early)
    roles["b"].receive("a", hop)
    with pytest.raises(ProtocolError, match="out of ring order"):
        roles["b"].receive("a", hop)  # the same set twice
