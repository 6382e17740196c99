"""Approval by a person (a party's policy ``approve = "manual"``; docs/site-rules.md, "Approval by
a person"): the sans-I/O host holds such a session with no role until its operator decides,
and the initiator BEGINs no node before every awaited party has approved."""

from __future__ import annotations

import time

import pytest

from cels.inprocess import session_hosts
from cels.logs import synthetic_log
from cels.node.policy import PartyPolicy
from cels.protocol.aborts import DEADLINE, REFUSED
from cels.protocol.hosted import ABORTED, PREPARED, Step
from cels.protocol.host import SessionHost
from cels.protocol.options import SessionOptions
from cels.protocol.party import PartyRole
from cels.protocol.phases import SessionState
from cels.protocol.roles import Envelope, ProtocolError, Refusal
from cels.protocol.wire import cels_pb2

AWAITING = SessionState.AWAITING_APPROVAL
TEST_KEYS = {"key_bits": 256, "group_bits": 1024}
OPTIONS = SessionOptions.create(3, epsilon=1.0, delta=0.4, deadline=30.0, approval_wait=100.0, session_id="ask", **TEST_KEYS)
SID = OPTIONS.session_id
START = Envelope(session_id=SID, sender="party-1", start_session=cels_pb2.StartSession(config=OPTIONS.to_config()))
APPROVAL = Envelope(session_id=SID, sender="party-2", approval=cels_pb2.Approval(session_id=SID))


def awaiting_host(made: list[str]) -> SessionHost:
    """party-2 with a manual-approval screen; ``made`` lists the sessions its roles were made for."""
    log = synthetic_log(seed=3, users=12)

    def make_role(options: SessionOptions) -> PartyRole:
        made.append(options.session_id)
        return PartyRole("party-2", options, log, allow_insecure_key_bits=True)

    return SessionHost("party-2", make_role, time.perf_counter, screen=lambda options: True)


def test_a_session_awaiting_approval_has_no_role_until_its_operator_approves() -> None:
    made: list[str] = []
    host = awaiting_host(made)
    created = host.deliver("party-1", START, now=0.0)
    assert host.state(SID) == (AWAITING, None) and made == []  # nothing made, so nothing read or reserved
    assert [e.kind for e in created.events] == ["created", "awaiting"] and created.wake_at == 100.0
    for refused in (lambda: host.begin(SID, 1.0), lambda: host.finish(SID, 1.0)):
        with pytest.raises(ProtocolError, match="awaiting_approval") as err:
            refused()
        assert err.value.code == ProtocolError.FAILED_PRECONDITION
    approved = host.decide(SID, True, now=5.0)
    assert made == [SID] and host.state(SID)[0] == PREPARED
    assert [(to, env.WhichOneof("step")) for to, env in approved.messages] == [("party-1", "approval")]
    assert [e.kind for e in approved.events] == ["approved"]
    assert approved.wake_at == 5.0 + 30.0 + 100.0  # begun once the other awaited parties approve too
    with pytest.raises(ProtocolError, match="prepared; decide refused"):
        host.decide(SID, True, now=6.0)


def test_a_rejected_session_is_aborted_at_every_node_and_nothing_was_made() -> None:
    made: list[str] = []
    host = awaiting_host(made)
    host.deliver("party-1", START, now=0.0)
    rejected = host.decide(SID, False, now=3.0)
    state, notice = host.state(SID)
    assert state == ABORTED and made == []
    assert (notice.origin, notice.kind, notice.reason) == ("party-2", REFUSED, "its operator rejected the session")
    assert sorted(to for to, env in rejected.messages if env.WhichOneof("step") == "abort") == ["party-1", "party-3", "solver"]
    assert rejected.events[-1].detail == "rejected by its operator (cels reject)"


def test_a_session_nobody_approves_ends_after_its_approval_wait() -> None:
    host = awaiting_host([])
    host.deliver("party-1", START, now=0.0)
    assert host.expire(99.9).wake_at == 100.0 and host.state(SID)[0] == AWAITING
    ended = host.expire(100.0)
    state, notice = host.state(SID)
    assert state == ABORTED and (notice.kind, notice.reason) == (DEADLINE, "session was not approved in time")
    assert ended.events[-1].detail == "session was not approved in time within its approval_wait of 100s"
    assert len(ended.messages) == 3


def _lead() -> SessionHost:
    logs = synthetic_log(seed=3, users=24).split_by_user(3)
    lead = session_hosts(logs, OPTIONS, allow_insecure_key_bits=True)["party-1"].host
    lead.initiate(OPTIONS, now=0.0)
    return lead


def _answer_starts(lead: SessionHost, awaiting: set[str]) -> list:
    events = []
    while (call := lead.next_call(SID)) is not None and call.step is Step.START:
        events += lead.answered(SID, call.node, 1.0, awaiting=call.node in awaiting).events
    return events


def test_the_initiator_begins_no_node_before_every_awaited_party_approved() -> None:
    lead = _lead()
    events = _answer_starts(lead, {"party-2", "party-3"})
    assert [(e.kind, e.node) for e in events] == [("awaiting", "party-2"), ("awaiting", "party-3")]
    assert lead.next_call(SID) is None and lead.approvals_pending(SID)  # its probes tell the prepared nodes to wait
    assert lead.hosted(SID).expires_at == 0.0 + 30.0 + 100.0
    lead.deliver("party-2", APPROVAL, now=2.0)
    assert lead.next_call(SID) is None  # party-3 still decides
    with pytest.raises(ProtocolError, match="not awaited"):
        lead.deliver("party-2", APPROVAL, now=2.5)  # a second Approval is a protocol error
    third = Envelope(session_id=SID, sender="party-3", approval=cels_pb2.Approval(session_id=SID))
    effects = lead.deliver("party-3", third, now=3.0)
    assert [(e.kind, e.node) for e in effects.events] == [("approved", "party-3")]
    assert [(c.step, c.node) for c in effects.calls] == [(Step.BEGIN, "party-2")] and not lead.approvals_pending(SID)


def test_an_approval_that_overtakes_its_start_answer_is_kept() -> None:
    lead = _lead()
    assert lead.next_call(SID).node == "party-2"
    lead.deliver("party-2", APPROVAL, now=0.5)  # party-2's operator was quicker than the Ack
    _answer_starts(lead, {"party-2"})
    assert lead.next_call(SID).step is Step.BEGIN and not lead.approvals_pending(SID)


def test_a_prepared_node_waits_for_approvals_once_the_initiator_says_so() -> None:
    logs = synthetic_log(seed=3, users=24).split_by_user(3)
    host = session_hosts(logs, OPTIONS, allow_insecure_key_bits=True)["party-3"].host
    host.deliver("party-1", START, now=0.0)
    assert host.hosted(SID).expires_at == 30.0
    assert host.awaits_approvals(SID).wake_at == 130.0 and host.hosted(SID).expires_at == 130.0  # at most approval_wait more
    assert host.expire(129.0).wake_at == 130.0 and host.state(SID)[0] == PREPARED


def test_the_policy_asks_its_operator_only_for_sessions_another_party_starts() -> None:
    manual = PartyPolicy.of({"approve": "manual"})
    assert manual.awaits("party-2", OPTIONS) and not manual.awaits("party-1", OPTIONS)  # party-1's own controller started it
    assert not PartyPolicy.of({}).awaits("party-2", OPTIONS)
    no_time = SessionOptions.create(3, epsilon=1.0, delta=0.4, approval_wait=0.0, session_id="now")
    with pytest.raises(Refusal, match="approval_wait = 0 leaves no time"):
        manual.awaits("party-2", no_time)
    with pytest.raises(ValueError, match="policy.approve"):
        PartyPolicy.of({"approve": "sometimes"})


def test_its_operator_sees_the_waiting_session_with_its_parameters_and_a_gauge() -> None:
    from cels.node.telemetry import NodeTelemetry

    telemetry = NodeTelemetry("party-2", "party")
    telemetry.session_created(SID, "party-1", OPTIONS.to_config())
    gauge = lambda: telemetry.registry.get_sample_value("cels_sessions_awaiting_approval")  # noqa: E731
    assert gauge() == 0 and not telemetry.sessions()[0].HasField("config")  # running: no parameters repeated
    telemetry.session_awaiting(SID, True)
    (summary,) = telemetry.sessions()
    assert gauge() == 1 and summary.outcome == "awaiting_approval" and SessionOptions.from_config(summary.config) == OPTIONS
    telemetry.session_awaiting(SID, False)
    assert gauge() == 0 and telemetry.sessions()[0].outcome == "running"
    telemetry.session_ended(SID, "done")
    assert telemetry.sessions()[0].outcome == "done" and telemetry.registry.get_sample_value("cels_sessions_total", {"outcome": "done"}) == 1
