"""What the party and solver roles share: the transition table, abort, phase accounting.

A role takes one step message at a time (``receive``): the row of its phase in its machine's
table (cels.protocol.machines) says which messages it takes there and by which handler; anything else is
refused with :class:`ProtocolError` and leaves the role unchanged, so a stray message does not
end the session.  A failure of the role's own (a bad local log, an infeasible problem, a broken
invariant) is a :class:`RoleFailure`: the role ends the session everywhere by returning Abort
envelopes (kind, phase and a generic reason, cels.protocol.aborts) and keeps the details
(``failure``) for this node's log.  Roles hold no clock: the host charges busy time to the
phase the role reports through ``phase_hook`` (cels.protocol.host).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cels.engine.interface import WorkFailure
from cels.protocol.aborts import LOCAL_FAILURE, PROTOCOL_ERROR, abort_notice, describe, peer_abort
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import STREAM_OVER, Envelope, addressed, Outgoing, PhaseHook, ProtocolError, Stream, fail, malformed, step_name
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_to_wire

@dataclass(frozen=True)
class Takes:
    """A cell of a machine's table: a step message the role takes in a phase, and its handler
    ``handler(role, sender, message)`` (``whole``: it takes the envelope, as the secure sum and
    secure union sub-protocols do).  Its sender's bytes are charged to the phase that takes
    it, to ``charged`` where the message is taken in more than one phase, or (``by_sum_id``) to
    the counts or the sampling by its sum id."""

    handler: Callable[..., list[Outgoing]]
    whole: bool = False
    charged: Phase | None = None
    by_sum_id: bool = False


@dataclass(frozen=True)
class PhaseRow:
    """A state of a role's machine: the step messages it takes in this phase, and the phase it
    enters once the phase's work has its result (``then``; none: its part is over).  A party
    builds the phase's machine from the result of the phase before (``build``) and keeps the
    phase's own result as ``keep`` where a later phase needs it."""

    takes: Mapping[str, Takes]
    then: Phase | None = None
    build: Callable[..., Any] | None = None
    keep: str | None = None


@dataclass(frozen=True)
class Machine:
    """One role's machine (cels.protocol.machines): its rows in protocol order (the first is
    entered at begin; OVER's row, if any, says what the role still takes once its part is
    over).  ``ring``: the party's secure-sum ring; ``start``: the role's method that sets up what
the machine needs (the solver's aggregators)."""

    name: str
    rows: Mapping[Phase, PhaseRow]
    ring: Callable[..., Any] | None = None
    start: str | None = None

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The working phases, in order."""
        return tuple(p for p in self.rows if p is not Phase.OVER)

    def taken_in(self, step: str) -> list[Phase]:
        return [p for p, row in self.rows.items() if step in row.takes]


Charges = Mapping[str, Phase | None]
"""Step message -> the phase its sender's bytes are charged to (None: by its sum id)."""
CONTROL_STEPS = ("abort", "step_report")


def charges(*machines: Machine) -> Charges:
    """The phase each step message of a session is charged to, read from its machines' tables
    (each message the same in every table that takes it; Aborts and StepReports: control)."""
    found: dict[str, Phase | None] = {step: Phase.CONTROL for step in CONTROL_STEPS}
    for machine in machines:
        for phase, row in machine.rows.items():
            for step, take in row.takes.items():
                if step in CONTROL_STEPS:
                    continue  # session control, wherever it is taken
                charged = None if take.by_sum_id else take.charged or phase
                if found.setdefault(step, charged) is not charged:
                    raise ValueError(f"machine {machine.name}: {step} charged to {charged!r} here, {found[step]!r} elsewhere")
    return found


def phase_of(envelope: Envelope, charged: Charges) -> Phase:
    """The phase a step message is charged to: its session's ``charged`` phase, or for the
    secure sums' messages the counts ("counts"/"unique") or the sampling ("sampling-*") by sum id."""
    step = step_name(envelope)
    phase = charged[step]
    if phase is None:
        sum_id = getattr(envelope, step).sum_id
        return Phase.SAMPLING if sum_id.startswith(Phase.SAMPLING.value) else Phase.COUNTS
    return phase


class RoleFailure(WorkFailure):
    """A failure inside this node that ends the session: the Abort broadcast says ``reason``
    (generic, no digit), of ``kind``, blaming ``origin`` (default: this node); the message
    (``detail``, with the numbers) stays in this node's ``failure``.  Its engine's failures
    (cels.engine.interface.WorkFailure) are local failures of this node."""

    def __init__(self, reason: str, detail: str, kind: int = LOCAL_FAILURE, origin: str = "") -> None:
        super().__init__(reason, detail)
        self.kind, self.origin = kind, origin


class Overreach(Exception):
    """A peer's message that no session can go on from (a size past what the session's public
    sizes allow), raised by a phase machine: the role refuses it and aborts the session
    (:meth:`SessionRole.refuse_and_abort`)."""


class SessionRole:
    """Base of PartyRole and SolverRole: one node's state machine for one session."""

    def __init__(self, name: str, options: SessionOptions, machine: Machine, charged: Charges) -> None:
        """``machine``: this role's table (cels.protocol.machines); ``charged``: the phase of
        each of the session's step messages (:func:`charges`)."""
        if name not in options.nodes:
            raise ValueError(f"{name!r} is not a node of session {options.session_id!r}")
        self.name = name
        self.options = options
        self.machine = machine
        self.charged = charged
        self.session_id = options.session_id
        self.parties = list(options.parties)
        self.solver = options.solver
        self.initiator = options.initiator
        self.nodes = list(options.nodes)
        self.b = options.b
        self.phase = Phase.READY
        self.done = False
        self.aborted: cels_pb2.Abort | None = None
        self.failure = ""  # this node's details of its own failure (its log only)
        self.output = None
        self.report: dict | None = None
        self.seconds: dict[Phase, float] = defaultdict(float)
        self.bytes_sent: dict[Phase, int] = defaultdict(int)
        self.phase_hook: PhaseHook | None = None
        self._report_due = False
        self.abort_notices: list[Outgoing] = []
        self._backlog: deque[Outgoing | Stream] = deque()  # made, not yet handed to the driver (cels.protocol.roles.Stream)
        self.send_window: int | None = None  # the host's (cels.protocol.host.SessionHost)
        self._idle = True  # the driver's link has nothing of this role's to send, as far as it knows

    # -- the contract -------------------------------------------------------------------
    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take one step message (cels.protocol.roles contract)."""
        if envelope.session_id != self.session_id:
            raise fail(f"{self.name}: unknown session {envelope.session_id!r}")
        step = step_name(envelope)
        if sender not in self.nodes:
            raise fail(f"{self.name}: {sender!r} is not a node of session {self.session_id!r}")
        if step == "abort":
            return self._on_abort(sender, envelope.abort)
        if self.aborted is not None:
            raise fail(f"{self.name}: session {self.session_id!r} was aborted: {describe(self.aborted)}", self.aborted)
        row = self.machine.rows.get(self.phase)
        take = row.takes.get(step) if row is not None else None
        if take is None:
            phases = self.machine.taken_in(step)
            if not phases:
                raise fail(f"{self.name}: a {type(self).__name__} does not take {step}")
            raise fail(f"{self.name}: {step} out of order (in phase {self.phase!r}, taken in {phases})")
        message = envelope if take.whole else getattr(envelope, step)
        return self._run(lambda: take.handler(self, sender, message))

    def begin(self) -> list[Outgoing]:
        """Begin the session on this node (idempotent)."""
        if self.aborted is not None or self.phase != Phase.READY:
            return []
        return self._run(self._begin)

    def abort(self, notice: cels_pb2.Abort, detail: str = "") -> list[Outgoing]:
        """This node gives up (peer unreachable, watchdog, own failure): tell every other node
        ``notice``; ``detail`` stays here (``failure``)."""
        if self.aborted is not None or self.done:
            return []
        self.aborted, self.failure = notice, detail
        self._backlog.clear()
        self._enter(Phase.FAILED)
        return self._send([n for n in self.nodes if n != self.name], abort=self.aborted)

    def refuse_and_abort(self, message: str) -> ProtocolError:
        """A peer's message that no session can go on from (a size past what the session's
        public sizes allow): this node aborts the session (the host sends the notices, held in
        ``abort_notices``: a protocol error, no number) and the returned INVALID_ARGUMENT
        refuses the message, telling its sender ``message``."""
        notice = abort_notice(self.session_id, self.name, PROTOCOL_ERROR, "a peer's message does not fit the session's sizes", self.phase)
        self.abort_notices = self.abort(notice, message)
        return malformed(message)

    @property
    def finished(self) -> bool:
        return self.done

    # -- helpers for subclasses -----------------------------------------------------------
    def _begin(self) -> list[Outgoing]:
        return []

    @property
    def pending(self) -> bool:
        return bool(self._backlog)

    def drained(self) -> list[Outgoing]:
        """The driver sent all this role gave it: the next window of a pending Stream."""
        return self._run(list, drained=True) if self._backlog and self.aborted is None else []

    def _run(self, action: Callable[[], list[Outgoing | Stream]], drained: bool = False) -> list[Outgoing]:
        try:
            out = action()
        except WorkFailure as exc:
            out = self._failed(exc)
        except Overreach as exc:
            raise self.refuse_and_abort(str(exc)) from None
        if self.aborted is not None:  # the notices go now, nothing made before them
            self._backlog.clear()
        self._backlog.extend(out)
        if self._report_due:
            self._report_due = False
            self._backlog.extend(self._report())
        return self._window(drained)

    def _failed(self, exc: WorkFailure) -> list[Outgoing]:
        """This node's own failure ends the session everywhere: the abort's notices."""
        kind, origin = (exc.kind, exc.origin) if isinstance(exc, RoleFailure) else (LOCAL_FAILURE, "")
        notice = abort_notice(self.session_id, origin or self.name, kind, exc.reason, self.phase)
        return self.abort(notice, str(exc))

    def _window(self, drained: bool) -> list[Outgoing]:
        """What the backlog hands the driver now: every message up to the first pending Stream,
        then at most ``send_window`` bytes of that Stream -- on a ``drained`` call, for a Stream
        not yet begun (its first window: the driver's link then drains it and asks for more) or
        while the link is idle; without a window, or once this node's part is over, all of it
        that is ready (nothing may stay behind a finished role).  Each message is counted to its
        phase."""
        out, streamed, window = [], 0, self.send_window
        whole = window is None or self.done
        while self._backlog and (whole or streamed < window):
            head = self._backlog[0]
            if isinstance(head, Stream):
                if not (whole or drained or self._idle or not head.begun):
                    break  # the link has the window before it still to send
                try:
                    batch = next(head.batches, STREAM_OVER)
                except WorkFailure as exc:  # the work making the Stream failed (its engine lost a worker)
                    out = self._failed(exc)  # the notices go now, nothing made before them
                    break
                if batch is STREAM_OVER:
                    self._backlog.popleft()
                    continue
                if batch is None:  # nothing ready yet: taken again at the next call
                    break
                head.begun = True  # once its first batch is out, the link's drained calls pace it
                streamed += sum(env.ByteSize() for _, env in batch)
                out += batch
            else:
                out.append(self._backlog.popleft())
        for _dst, env in out:
            self.bytes_sent[phase_of(env, self.charged)] += env.ByteSize()
        if out or drained:  # the link has messages to send, or (drained) had none left
            self._idle = not out
        return out

    def _advance(self) -> None:
        """The running phase's work is done: enter its row's next phase, or finish."""
        then = self.machine.rows[self.phase].then
        if then is None:
            self._finish()
        else:
            self._enter(then)

    def _finish(self) -> None:
        """This node's part is over: it reports to the initiator after this step's messages."""
        self._enter(Phase.OVER)
        self.done = True
        self._report_due = True

    def _report(self) -> list[Outgoing]:
        """Send this node's StepReports to the initiator (the initiator overrides: it keeps them)."""
        return [(self.initiator, self._envelope(step_report=r)) for r in self.step_reports()]

    def _enter(self, phase: Phase) -> None:
        """Switch phase; the host charges the time spent so far to the old one."""
        if self.phase_hook is not None:
            self.phase_hook(self.phase, phase)
        self.phase = phase

    def _envelope(self, **step) -> Envelope:
        return cels_pb2.Envelope(session_id=self.session_id, sender=self.name, **step)

    def _send(self, recipients: str | list[str], **step) -> list[Outgoing]:
        """The same step message to each recipient (in the given order)."""
        return addressed(self.session_id, self.name, recipients, **step)

    def _expect_sender(self, sender: str, expected: str, step: str) -> None:
        if sender != expected:
            raise fail(f"{self.name}: {step} from {sender!r}, expected from {expected!r}")

    def _on_abort(self, sender: str, msg: cels_pb2.Abort) -> list[Outgoing]:
        """A peer's Abort ends the session here while this node's part runs; once it is over,
        only the initiator's does (no FINISH will come, and a re-run may follow)."""
        if self.aborted is None and (not self.done or sender == self.initiator != self.name):
            self.aborted = peer_abort(msg, sender, self.session_id)
            self._enter(Phase.FAILED)
        return []

    def view_keys(self) -> list:
        """The Paillier private keys this node holds now, for recording its view (cels.views)
        in its own process: what it can decrypt is part of what it learns."""
        return []

    def step_reports(self) -> list[cels_pb2.StepReport]:
        """This node's accounting: busy seconds and bytes sent per phase."""
        phases = sorted((set(self.seconds) | set(self.bytes_sent)) - {Phase.READY, Phase.OVER, Phase.FAILED})
        return [
            cels_pb2.StepReport(
                session_id=self.session_id,
                node=self.name,
                phase=phase_to_wire(p),
                seconds=self.seconds.get(p, 0.0),
                bytes_sent=self.bytes_sent.get(p, 0),
                last=k == len(phases) - 1,
            )
            for k, p in enumerate(phases)
        ]
