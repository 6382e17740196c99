"""The initiator's steps of a session, part of cels.protocol.host.SessionHost (docs/protocol.md,
"How a session lives")."""

from __future__ import annotations

from collections import deque

from cels.protocol.aborts import BEFORE_START, PROTOCOL_ERROR, abort_notice
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, Outgoing
from cels.protocol.wire import cels_pb2
from cels.protocol.hosted import Call, DONE, Effects, Event, HostedSession, Initiation, PREPARED, RUNNING, Step


class InitiatorSteps:
    """The initiator's steps of a session (docs/protocol.md, "How a session lives"): StartSession
    to every other node, BEGIN to each, its own begin; once its role is finished, FINISH to each
    and its own finish.  One call is due at a time; the driver makes it and reports back with
    :meth:`answered` or :meth:`unanswered`.  Part of :class:`SessionHost` (its sessions, ``create``,
    ``adopt`` and role calls)."""

    def initiate(self, options: SessionOptions, now: float) -> Effects:
        """This node initiates the session: it creates its own (a refusal raises, as in
        :meth:`create`, before any node is told), then calls for StartSession to every other node."""
        created = self.create(options, now)
        session = self.sessions.get(options.session_id)
        if session is None:  # born aborted (an Abort overtook it)
            return created
        others = [n for n in options.nodes if n != self.name]
        start = Envelope(session_id=options.session_id, sender=self.name, start_session=cels_pb2.StartSession(config=options.to_config()))
        calls = [Call(options.session_id, n, Step.START, BEFORE_START, start) for n in others]
        calls += [Call(options.session_id, n, Step.BEGIN, Phase.READY) for n in others]
        session.initiation = Initiation(deque(calls))
        return created.extend(self._next_call(session, now))

    def next_call(self, session_id: str) -> Call | None:
        """The initiator's call due now in a live session (None: none, or not the initiator)."""
        session = self.sessions.get(session_id)
        return _due(session.initiation) if session is not None and session.initiation is not None else None

    def answered(self, session_id: str, node: str, now: float, awaiting: bool = False) -> Effects:
        """The due call to ``node`` was taken (``awaiting``: a StartSession that ``node``'s
        operator approves first): the next call, or the initiator's own begin or finish."""
        called = self._called(session_id, node)
        if called is None:
            return Effects()
        session, _ = called
        effects = Effects()
        if awaiting and node not in session.initiation.approved:
            session.initiation.awaiting.add(node)
            session.approvals_pending = True
            effects.events.append(Event(session_id, node, "awaiting"))
        return effects.extend(self._next_call(session, now))

    def unanswered(self, session_id: str, node: str, notice: cels_pb2.Abort | None, now: float, detail: str = "", refused: bool = True) -> Effects:
        """The due call to ``node`` failed: ``notice`` is the Abort its failure implies (None:
        ``node`` refused it without one, a protocol error there), ``detail`` this node's own
        account.  A StartSession or BEGIN that fails aborts the session; a FINISH only if
        ``node`` ``refused`` it (its part is not over, or it aborted): a node gone at FINISH
        had sent its last StepReport, and the release stands (:meth:`gone_at_finish`)."""
        called = self._called(session_id, node)
        if called is None:
            return Effects()
        session, call = called
        if call.step is Step.FINISH and not refused:
            session.initiation.gone[node] = detail
            return self._next_call(session, now)
        if notice is None:
            notice = abort_notice(session_id, node, PROTOCOL_ERROR, f"{call.step}: refused it", call.phase)
        return self.adopt(session_id, notice, now, detail)

    def gone_at_finish(self, session_id: str) -> dict[str, str]:
        """Nodes that did not answer the initiator's FINISH (node -> why): their part was over."""
        session = self.sessions.get(session_id) or self.ended.get(session_id)
        return dict(session.initiation.gone) if session is not None and session.initiation is not None else {}

    def _called(self, session_id: str, node: str) -> tuple[HostedSession, Call] | None:
        """The live session whose due call went to ``node``, and that call (no longer due);
        None if the session ended meanwhile.  A report for another call is the driver's error."""
        session = self.sessions.get(session_id)
        if session is None or session.initiation is None:
            return None
        calls = session.initiation.calls
        if not calls or calls[0].node != node:
            raise ValueError(f"{self.name}: no call to {node!r} is due in session {session_id!r}")
        return session, calls.popleft()

    def _next_call(self, session: HostedSession, now: float) -> Effects:
        """The initiator's next step: its next call; once every START and BEGIN is answered its
        own begin; once every FINISH is answered its own finish."""
        initiation = session.initiation
        if initiation is None or session.state not in (PREPARED, RUNNING):
            return Effects()
        if initiation.calls:
            due = _due(initiation)  # none while awaited parties decide
            return Effects(calls=[due]) if due is not None else Effects(wake_at=session.expires_at)
        if not initiation.finishing:
            return self._begun(session, now)
        return Effects(events=self._end(session, DONE))

    def _relay(self, session: HostedSession, aborted: cels_pb2.Abort) -> list[Outgoing]:
        """The initiator passes a peer's Abort on to every other node: the peer may have died
        before its own notices went out, and a session that was never begun has no watchdog."""
        others = [n for n in session.options.nodes if n not in (self.name, aborted.origin)]
        return [(node, Envelope(session_id=aborted.session_id, sender=self.name, abort=aborted)) for node in others]


def _due(initiation: Initiation) -> Call | None:
    """The initiator's call due now: the first one left, but no BEGIN before every awaited party approved."""
    if not initiation.calls or (initiation.calls[0].step is Step.BEGIN and initiation.awaiting):
        return None
    return initiation.calls[0]
