"""The in-memory network delivers in FIFO order, serialises on the way and counts bytes."""

from __future__ import annotations

import pytest

from cels.inprocess import InMemoryNetwork
from cels.protocol.roles import Envelope, ProtocolError, step_name
from cels.protocol.wire import cels_pb2


class Relay:
    """Adds its name to a StepReport's node and forwards it along a fixed ring once."""

    def __init__(self, name: str, nxt: str | None) -> None:
        self.name, self.nxt, self.seen = name, nxt, []

    def receive(self, sender: str, envelope: Envelope):
        self.seen.append((sender, envelope.step_report.node))
        if self.nxt is None:
            return []
        report = cels_pb2.StepReport(session_id=envelope.session_id, node=envelope.step_report.node + self.name)
        return [(self.nxt, cels_pb2.Envelope(session_id=envelope.session_id, sender=self.name, step_report=report))]


def test_ring_delivery_and_byte_counts() -> None:
    roles = {"a": Relay("a", "b"), "b": Relay("b", "c"), "c": Relay("c", None)}
    first = cels_pb2.Envelope(session_id="s", sender="init", step_report=cels_pb2.StepReport(session_id="s", node=">"))
    stats = InMemoryNetwork(roles).run([("a", first)])
    assert roles["c"].seen == [("b", ">ab")]
    assert stats.messages[("initiator", "step_report")] == 1
    assert stats.bytes_sent[("a", "step_report")] == len(
        cels_pb2.Envelope(session_id="s", sender="a", step_report=cels_pb2.StepReport(session_id="s", node=">a")).SerializeToString()
    )
    assert set(stats.bytes_by_node()) == {"initiator", "a", "b"}


def test_empty_envelope_is_invalid_argument() -> None:
    with pytest.raises(ProtocolError) as err:
        step_name(cels_pb2.Envelope(session_id="s"))
    assert err.value.code == ProtocolError.INVALID_ARGUMENT
