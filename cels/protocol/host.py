"""SessionHost: one node's sessions as a sans-I/O state machine (docs/protocol.md, "How a
session lives").

The host owns the whole lifecycle of every session on its node: create (a StartSession, or
the initiator's own request), begin, deliver, abort, finish, report, and the expiry of
sessions that never began or stopped moving.  It takes messages and the time (``now``, in
seconds of any monotonic clock) and returns :class:`Effects`: the messages to send, the events
to log or stream, the initiator's session-control calls to make (``calls``), and when it wants
to be called again (``wake_at``).  No sockets, threads or clocks inside: the in-memory runner
(cels.inprocess), the benchmarks and the gRPC node (cels.node) all drive this one host.

The initiator's steps are the host's too (:meth:`SessionHost.initiate`): StartSession to every
other node, then BEGIN to every other node, then its own begin; once its role is finished
(output and every StepReport in), FINISH to every other node, then its own finish.  Each is a
:class:`Call` the driver makes after the messages returned before it are delivered, one at a
time, and reports back (:meth:`SessionHost.answered`, :meth:`SessionHost.unanswered`); the
host decides what comes next.

A session aborted here may be created again with ``resume`` set (a re-run after a node
restart, with the keys every node kept: docs/deployment.md, "Resume after a node restart");
one running here or done may not.

Session states and what each takes (the h11-style table :data:`TAKES`)::

    awaiting_approval --its operator approves--> prepared --begin / first step message--> running --role finished--> done
        \\                                          \\                                        \\
         `--rejected / abort / expiry----------------`--abort / expiry-------------------------`--abort / expiry / failure--> aborted

A party whose policy approves sessions by hand (:data:`Screen`) holds a new session in
``awaiting_approval`` with no role: nothing read, nothing reserved.  Its operator's decision
(:meth:`SessionHost.decide`) makes the role, or aborts the session; the approval goes to the
initiator as an Approval message, and the initiator BEGINs no node before every awaited party
has approved (docs/site-rules.md, "Approval by a person").

A message a state does not take is refused with FAILED_PRECONDITION naming the state, and
changes nothing; an aborted session's refusal carries its Abort (``ProtocolError.abort``), so
that the sender blames the node that failed, not this one.  What a peer learns of an abort is
its origin, kind, phase and generic reason (cels.protocol.aborts); the details stay in this
node's events (``Event.detail``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from cels.protocol.aborts import BEFORE_START, DEADLINE, DIED, FORGOTTEN, PROTOCOL_ERROR, REFUSED, abort_notice, describe
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase, SessionState
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Refusal, Role, fail, malformed, step_name
from cels.protocol.wire import cels_pb2
from cels.protocol.hosted import ABORTED, AWAITING, Call, DONE, Effects, Event, HostedSession, KEPT_STATES, Meter, PREPARED, RUNNING, Record, RoleFactory, Screen, Step, TAKES
from cels.protocol.initiation import InitiatorSteps
from cels.protocol.approval import ApprovalSteps
from cels.protocol.resume import ResumeSteps


class SessionHost(InitiatorSteps, ApprovalSteps, ResumeSteps):
    """All sessions of node ``name``; roles come from ``make_role``."""

    def __init__(
        self, name: str, make_role: RoleFactory, meter: Meter, send_window: int | None = None, screen: Screen | None = None,
        record: Record | None = None,
    ) -> None:
        """``send_window``: bytes of a role's Stream per call, the rest on :meth:`drained`
        (cels.protocol.roles.Stream); None hands every Stream over whole (a driver that holds
        no messages, as the in-memory network).  ``screen``: this node's check of a new
        session, and whether its operator approves it first (None: none, roles at once).
        ``record``: what a kept session took, which its re-run replays (None: none kept)."""
        self.name, self.make_role, self.screen, self.record, self.meter, self.send_window = name, make_role, screen, record, meter, send_window
        self.sessions: dict[str, HostedSession] = {}
        self.ended: OrderedDict[str, HostedSession] = OrderedDict()
        self.forewarned: OrderedDict[str, tuple[str, cels_pb2.Abort]] = OrderedDict()
        """Aborts that arrived before their session's StartSession: id -> (sender, Abort)."""
        self._events: list[Event] = []
        self._deferred = Effects()
        """What a session aborted by a refused message still has to do (see :meth:`_call`)."""

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, options: SessionOptions, now: float) -> Effects:
        """A session this node takes part in (StartSession, or the initiator's own); a refusal
        carries the Abort (kind REFUSED or PROTOCOL_ERROR) the initiator ends the session with."""
        sid = options.session_id

        def refuse(kind: int, public: str, detail: str = "") -> ProtocolError:
            notice = abort_notice(sid, self.name, kind, public, BEFORE_START)
            return ProtocolError(ProtocolError.FAILED_PRECONDITION, f"{self.name}: session {sid!r} refused: {public}", notice, detail)

        taken = _id_taken(options, sid in self.sessions, self.ended.get(sid))
        if taken is not None:
            raise refuse(PROTOCOL_ERROR, taken)
        if options.resume:  # a re-run (its node keeps its keys: cels.node.session_store)
            self._forget_earlier_run(sid)
        if self.name not in options.nodes:
            raise refuse(PROTOCOL_ERROR, "the session does not include this node")
        try:
            awaits = self.screen is not None and self.screen(options)
            role = None if awaits else self.make_role(options)
        except Refusal as exc:
            raise refuse(REFUSED, exc.public, str(exc)) from None
        except (ValueError, OSError) as exc:
            raise refuse(REFUSED, "cannot take the session", str(exc)) from None
        session = HostedSession(options, role, AWAITING if awaits else PREPARED, since=now, last_progress=now)
        self.sessions[sid] = session
        self._rerun(session)
        events = [Event(sid, self.name, "created", phase=Phase.READY)] + ([Event(sid, self.name, "awaiting")] if awaits else [])
        created = Effects(events=events, wake_at=session.expires_at)
        if role is not None:
            self._attach(session, role)
        sender, early = self.forewarned.pop(sid, ("", None))
        if sender in options.nodes:  # a node of the session aborted it before it reached this one
            if role is None:
                return created.extend(self.adopt(sid, early, now))
            notice = Envelope(session_id=sid, sender=sender, abort=early)
            created.extend(self._call(session, lambda: role.receive(sender, notice), now))
        return created

    def deliver(self, sender: str, envelope: Envelope, now: float) -> Effects:
        """A protocol message for one of this node's sessions (a StartSession creates it)."""
        step = step_name(envelope)
        if step == "start_session":
            return self.create(_started(self.name, sender, envelope), now)
        if step == "abort" and envelope.session_id not in self.sessions and envelope.session_id not in self.ended:
            return self._forewarn(sender, envelope.abort)
        session = self._session(envelope.session_id, "abort" if step == "abort" else "step")
        if sender not in session.options.nodes:
            raise fail(f"{self.name}: {sender!r} is not a node of session {session.options.session_id!r}")
        if step == "abort" and session.options.resume and envelope.abort.origin == self.name and envelope.abort.kind == DIED:
            return Effects()  # the first run's notice of this node's death, retried until it came back: moot in the re-run
        if step == "approval":
            return self._approval(self._session(envelope.session_id, "approval"), sender, now)
        if (rerun := self._rerun_step(session, sender, envelope, step, now)) is not None:
            return rerun
        effects = Effects()
        if session.state == PREPARED and step != "abort":  # a first step message also begins it
            effects.extend(self._begun(session, now))
            if session.state != RUNNING:  # its begin failed: the session ended here, the message is moot
                return effects
        return effects.extend(self._call(session, lambda: session.role.receive(sender, envelope), now))

    def check(self, session_id: str, what: str) -> None:
        """Raise the refusal that ``what`` (a step, "begin", "finish", "abort") would get now."""
        self._session(session_id, what)

    def begin(self, session_id: str, now: float) -> Effects:
        """BEGIN: start this node's role (idempotent once running)."""
        return self._begun(self._session(session_id, "begin"), now)

    def abort(self, session_id: str, origin: str, kind: int, reason: str, now: float, detail: str = "") -> Effects:
        """End a session here for a local reason (a peer unreachable or refusing, the watchdog,
        shutdown); ``origin`` is the node to blame, ``kind`` an ``Abort.Kind`` and ``reason``
        generic (no digit).  Tells every other node; ``detail`` goes to this node's event only."""
        session = self.sessions.get(session_id)
        if session is None or "abort" not in TAKES[session.state]:
            return Effects()
        return self.adopt(session_id, abort_notice(session_id, origin, kind, reason, session.phase), now, detail)

    def adopt(self, session_id: str, notice: cels_pb2.Abort, now: float, detail: str = "") -> Effects:
        """End a session here with an Abort another node made (its refusal said so, or its
        probe reports it aborted): the same origin, kind, phase and reason, told to every node."""
        session = self.sessions.get(session_id)
        if session is None or "abort" not in TAKES[session.state]:
            return Effects()
        if session.role is None:  # awaiting approval: no role to tell
            return self._abort_awaiting(session, notice, detail)
        notices = session.role.abort(notice, detail)  # empty if this node's part was over already
        return Effects(messages=notices, events=self._end(session, ABORTED, notice, detail))

    def finish(self, session_id: str, now: float) -> Effects:
        """FINISH: the initiator has the output; this node's part must be over."""
        session = self._session(session_id, "finish")
        if not session.role.finished:
            raise fail(f"{self.name}: session {session_id!r} cannot finish: this node is in phase {session.role.phase!r}")
        if session.state == DONE:
            return Effects()
        return Effects(events=self._end(session, DONE))

    def expire(self, now: float) -> Effects:
        """Timers: end every session that was never begun, or stopped moving, by its deadline;
        and what a session aborted by a refused message has left to do (its Abort notices, the event)."""
        effects, self._deferred = self._deferred, Effects()
        for session in list(self.sessions.values()):
            if session.state in (AWAITING, PREPARED, RUNNING) and now >= session.expires_at:
                what = {AWAITING: "was not approved in time", PREPARED: "was never begun"}.get(session.state, "made no progress on this node")
                limit = f"approval_wait of {session.options.approval_wait:g}s" if session.state == AWAITING else f"deadline of {session.options.deadline:g}s"
                detail = f"session {what} within its {limit}"
                effects.extend(self.abort(session.options.session_id, self.name, DEADLINE, f"session {what}", now, detail))
            elif session.state in (AWAITING, PREPARED, RUNNING):
                effects.extend(Effects(wake_at=session.expires_at))
        return effects

    def pending(self, session_id: str) -> bool:
        """Whether a running session's role holds a Stream not yet handed over (the driver
        then reports its link drained: :meth:`drained`)."""
        session = self.sessions.get(session_id)
        return session is not None and session.state == RUNNING and session.role.pending

    def drained(self, session_id: str, now: float) -> Effects:
        """The driver sent every message of ``session_id`` it was given: the role's next
        window of its pending Stream (nothing once the session is not running)."""
        if not self.pending(session_id):
            return Effects()
        return self._call(self.sessions[session_id], self.sessions[session_id].role.drained, now)

    def touch(self, session_id: str, now: float) -> None:
        """The session moved elsewhere (a peer's progress seen by the watchdog): not stalled."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_progress = now

    # -- reading -----------------------------------------------------------------------------
    def state(self, session_id: str) -> tuple[str, cels_pb2.Abort | None]:
        """(state, Abort if aborted) of a session; (UNKNOWN, None) if this node never had it."""
        session = self.sessions.get(session_id) or self.ended.get(session_id)
        if session is None:
            return SessionState.UNKNOWN, None
        return session.state, session.notice

    def role(self, session_id: str) -> Role:
        """The role of a live or ended session (its output and report); one awaiting approval has none."""
        role = self.hosted(session_id).role
        if role is None:
            raise fail(f"{self.name}: session {session_id!r} awaits its operator's approval")
        return role

    def hosted(self, session_id: str) -> HostedSession:
        """A live or ended session (its options, phase, busy seconds)."""
        session = self.sessions.get(session_id) or self.ended.get(session_id)
        if session is None:
            raise fail(f"{self.name}: unknown session {session_id!r}")
        return session

    def steps(self, session_id: str) -> int:
        """Role calls made in a session so far (the watchdog's progress counter)."""
        session = self.sessions.get(session_id) or self.ended.get(session_id)
        return session.steps if session is not None else 0

    # -- inside ------------------------------------------------------------------------------
    def _session(self, session_id: str, what: str) -> HostedSession:
        session = self.sessions.get(session_id)
        if session is None:
            ended = self.ended.get(session_id)
            if ended is None:  # the caller ends the session blaming this node, as a probe would (DIED)
                raise fail(f"{self.name}: unknown session {session_id!r}", abort_notice(session_id, self.name, DIED, FORGOTTEN, None))
            session = ended
        if what not in TAKES[session.state]:
            detail = f": {describe(session.notice)}" if session.notice is not None else ""
            raise fail(f"{self.name}: session {session_id!r} is {session.state}{detail}; {what} refused", session.notice)
        return session

    def _call(self, session: HostedSession, call: Callable[[], list[Outgoing]], now: float) -> Effects:
        """One role call: charge its busy time, then act on the role's state."""
        session.mark = self.meter()
        try:
            messages = call()
        except ProtocolError:
            aborted = session.role.aborted
            if aborted is not None and session.state in (PREPARED, RUNNING):  # SessionRole.refuse_and_abort
                # the refusal goes to the sender now; the rest waits for the next expire (the driver's timer)
                self._deferred.extend(Effects(messages=list(session.role.abort_notices), events=self._end(session, ABORTED, aborted, session.role.failure)))
            raise
        finally:
            session.role.seconds[session.role.phase] += self.meter() - session.mark
            session.steps += 1
            session.last_progress = now
        events, self._events = self._events, []
        for event in (e for e in events if e.kind == "phase"):  # a step's bytes count once it is over
            event.bytes_sent = session.role.bytes_sent.get(event.old, 0)
        if session.state == PREPARED:
            session.state = RUNNING
        aborted = session.role.aborted
        if aborted is not None:  # the role failed, or a peer's Abort reached it
            events += self._end(session, ABORTED, aborted, session.role.failure)
            own = [(dst, env) for dst, env in messages if env.WhichOneof("step") == "abort"]
            if not own and session.options.initiator == self.name:
                own = self._relay(session, aborted)
            return Effects(messages=own, events=events)
        messages = self._numbered(session, messages)  # a re-run: only what its peers never took
        effects = Effects(messages=messages, events=events, wake_at=session.expires_at)
        initiation = session.initiation
        if session.role.finished and initiation is not None and not initiation.finishing:  # FINISH everywhere
            initiation.finishing = True
            others = [n for n in session.options.nodes if n != self.name]
            initiation.calls.extend(Call(session.options.session_id, n, Step.FINISH, session.role.phase) for n in others)
            effects.extend(self._next_call(session, now))
        return effects

    def _phase(self, session: HostedSession, old: str, new: str) -> None:
        now = self.meter()
        seconds = session.role.seconds[old] + (now - session.mark)
        session.role.seconds[old] = seconds
        session.mark = now
        self._events.append(Event(session.options.session_id, self.name, "phase", phase=new, old=old, seconds=seconds, at=now))

    def _forewarn(self, sender: str, abort: cels_pb2.Abort) -> Effects:
        """An Abort overtook its session's StartSession (each travels its own call): kept, so
        that the session is born aborted if ``sender`` is one of its nodes (a bounded memory)."""
        _keep(self.forewarned, abort.session_id, (sender, abort))
        return Effects()

    def _end(self, session: HostedSession, state: str, notice: cels_pb2.Abort | None = None, detail: str = "") -> list[Event]:
        session.state, session.notice, session.detail = state, notice, detail
        sid = session.options.session_id
        self.sessions.pop(sid, None)
        _keep(self.ended, sid, session)
        return [Event(sid, self.name, state, abort=notice, detail=detail)]


def _id_taken(options: SessionOptions, running: bool, ended: HostedSession | None) -> str | None:
    """Why a session with these options cannot be created here (None: it can): its id is
    running, or ended; a re-run (``resume``) may take the id of an aborted session only."""
    if not options.resume:
        return "the session id is taken" if running or ended is not None else None
    if running:
        return "the session to resume is still running"
    return "the session to resume ended with its output" if ended is not None and ended.state != ABORTED else None


def _started(name: str, sender: str, envelope: Envelope) -> SessionOptions:
    """The session a StartSession from ``sender`` to node ``name`` starts (refused: malformed,
    or not from its initiator)."""
    config = envelope.start_session.config
    if config.session_id != envelope.session_id:
        raise malformed("StartSession config names another session")
    try:
        options = SessionOptions.from_config(config)
    except ValueError as exc:
        raise malformed(f"{name}: bad session config: {exc}") from None
    if options.initiator != sender:
        raise fail(f"{name}: StartSession from {sender!r}, but the session's initiator is {options.initiator!r}")
    return options


def _keep(memory: OrderedDict, key: str, value: object) -> None:
    """Remember ``value`` under ``key``, forgetting the oldest beyond KEPT_STATES."""
    memory[key] = value
    while len(memory) > KEPT_STATES:
        memory.popitem(last=False)
