"""A session that waits for a party's operator, part of cels.protocol.host.SessionHost
(docs/site-rules.md, "Approval by a person")."""

from __future__ import annotations


from cels.protocol.aborts import REFUSED
from cels.protocol.roles import Envelope, Refusal, Role, fail
from cels.protocol.wire import cels_pb2
from cels.protocol.hosted import ABORTED, Effects, Event, HostedSession, PREPARED


class ApprovalSteps:
    """A session that waits for a party's operator (module doc): the decision on that node,
    and the Approvals the initiator counts before it BEGINs any node.  Part of
    :class:`SessionHost` (its sessions, roles and aborts)."""

    def decide(self, session_id: str, approve: bool, now: float) -> Effects:
        """This node's operator approves the session awaiting it (its role is made now: a
        refusal, e.g. its budget, aborts the session; the initiator gets an Approval) or rejects
        it (aborted, kind REFUSED)."""
        session = self._session(session_id, "decide")
        if not approve:
            return self.abort(session_id, self.name, REFUSED, "its operator rejected the session", now, "rejected by its operator (cels reject)")
        try:
            role = self.make_role(session.options)
        except Refusal as exc:
            return self.abort(session_id, self.name, REFUSED, exc.public, now, str(exc))
        except (ValueError, OSError) as exc:
            return self.abort(session_id, self.name, REFUSED, "cannot take the session", now, str(exc))
        self._attach(session, role)
        session.state, session.since, session.approvals_pending = PREPARED, now, True
        initiator = session.options.initiator
        approval = Envelope(session_id=session_id, sender=self.name, approval=cels_pb2.Approval(session_id=session_id))
        messages = [(initiator, approval)] if initiator != self.name else []
        return Effects(messages=messages, events=[Event(session_id, self.name, "approved")], wake_at=session.expires_at)

    def approvals_pending(self, session_id: str) -> bool:
        """Whether the session waits for parties' operators (the initiator tells its probes)."""
        session = self.sessions.get(session_id)
        return session is not None and session.state == PREPARED and session.initiation is not None and bool(session.initiation.awaiting)

    def awaits_approvals(self, session_id: str) -> Effects:
        """The initiator says parties' operators are approving: a prepared session here waits
        for them too (at most approval_wait more)."""
        session = self.sessions.get(session_id)
        if session is None or session.state != PREPARED or session.approvals_pending:
            return Effects()
        session.approvals_pending = True
        return Effects(wake_at=session.expires_at)

    def _approval(self, session: HostedSession, sender: str, now: float) -> Effects:
        """A party's Approval reached the initiator: BEGIN may follow once no party is awaited."""
        initiation = session.initiation
        if initiation is None or sender == self.name or sender in initiation.approved:
            raise fail(f"{self.name}: an Approval of session {session.options.session_id!r} from {sender!r} is not awaited")
        initiation.awaiting.discard(sender)
        initiation.approved.add(sender)
        return Effects(events=[Event(session.options.session_id, sender, "approved")]).extend(self._next_call(session, now))

    def _abort_awaiting(self, session: HostedSession, notice: cels_pb2.Abort, detail: str) -> Effects:
        """End a session that awaits approval (it has no role): every other node is told here."""
        others = [n for n in session.options.nodes if n != self.name]
        notices = [(n, Envelope(session_id=session.options.session_id, sender=self.name, abort=notice)) for n in others]
        return Effects(messages=notices, events=self._end(session, ABORTED, notice, detail))

    def _attach(self, session: HostedSession, role: Role) -> None:
        session.role = role
        role.phase_hook = lambda old, new: self._phase(session, old, new)
        role.send_window = self.send_window
