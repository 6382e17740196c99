"""What the session host (cels.protocol.host) holds and returns: the session states and
which inputs each takes, a hosted session, the initiator's calls, events and effects."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase, SessionState
from cels.protocol.roles import Envelope, Outgoing, Role, fail
from cels.protocol.wire import cels_pb2

RoleFactory = Callable[[SessionOptions], Role]
"""Builds this node's role for a session; ValueError / OSError refuses the session (a
:class:`Refusal` with the reason the peers are told)."""
Screen = Callable[[SessionOptions], bool]
"""Whether a new session waits for this node's operator (``approve = "manual"``) before its
role is made; a refusal raises, as in :data:`RoleFactory` (the node's policy is checked here,
before anything is read or reserved)."""
Record = Callable[[str], "Recorded"]
"""What this node took in a kept session's earlier runs, by session id (its store's record:
cels.node.session_store), which a re-run replays (cels.protocol.resume)."""
Meter = Callable[[], float]
"""Seconds of a performance counter, read around role calls to charge busy time per phase
(the driver passes ``time.perf_counter``; the host itself reads no clock)."""

PREPARED, RUNNING, DONE, ABORTED = SessionState.PREPARED, SessionState.RUNNING, SessionState.DONE, SessionState.ABORTED
AWAITING = SessionState.AWAITING_APPROVAL
TAKES: dict[str, frozenset[str]] = {
    AWAITING: frozenset({"decide", "abort", "expire"}),
    PREPARED: frozenset({"begin", "step", "approval", "abort", "expire"}),
    RUNNING: frozenset({"begin", "step", "abort", "expire", "finish"}),
    DONE: frozenset({"finish", "report"}),
    ABORTED: frozenset(),
}
"""Which input each session state takes: ``decide`` (its operator approves or rejects it),
``begin`` (BEGIN signal), ``step`` (a protocol message), ``approval`` (the initiator: a party's
Approval), ``abort`` (an Abort or a local reason), ``expire`` (its timers), ``finish`` (FINISH:
the initiator has everything) and ``report`` (reading the initiator's report)."""
HOST_STEPS = frozenset({"start_session", "approval", "abort", "resume_from"})
"""The step messages the host takes itself (the roles' tables take the rest; an Abort reaches
the role too): session control, which a kept session neither records nor counts (cels.protocol.resume)."""
KEPT_STATES = 256
"""Ended sessions whose final state the host remembers (for probes and late messages)."""


class Step(str, Enum):
    """A session-control call of the initiator (docs/protocol.md, "How a session lives")."""

    START = "start_session"
    BEGIN = "BEGIN"
    FINISH = "FINISH"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Call:
    """One session-control call the initiator's driver makes to ``node``: StartSession (the
    ``envelope``), BEGIN or FINISH.  A failure of it is reported in ``phase``."""

    session_id: str
    node: str
    step: Step
    phase: Phase
    envelope: Envelope | None = None


@dataclass
class Initiation:
    """The initiator's calls still to make, the first one due; the parties whose operators
    have still to approve (``awaiting``) or have approved; nodes gone at FINISH."""

    calls: deque[Call]
    finishing: bool = False
    gone: dict[str, str] = field(default_factory=dict)
    awaiting: set[str] = field(default_factory=set)
    approved: set[str] = field(default_factory=set)


@dataclass
class Event:
    """Something worth a log line or a progress event: ``kind`` is "created", "awaiting" (the
    session waits for the operator of ``node``), "approved" (``node``'s operator approved it),
    "phase" (the node's role left ``old`` for ``phase`` at ``at``, the host's meter; ``seconds``
    spent and ``bytes_sent`` sent in ``old``), "aborted" (``abort``: what the peers were told;
    ``detail``: this node's own details, for its log only) or "done"."""

    session_id: str
    node: str
    kind: str
    phase: str = ""
    old: str = ""
    seconds: float = 0.0
    bytes_sent: int = 0
    abort: cels_pb2.Abort | None = None
    detail: str = ""
    at: float = 0.0


@dataclass
class Effects:
    """What the driver must do after a host call."""

    messages: list[Outgoing] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    wake_at: float | None = None
    calls: list[Call] = field(default_factory=list)
    """The initiator's call now due (at most one; :class:`Call`)."""

    def extend(self, other: Effects) -> Effects:
        self.messages += other.messages
        self.events += other.events
        self.calls += other.calls
        if other.wake_at is not None:
            self.wake_at = other.wake_at if self.wake_at is None else min(self.wake_at, other.wake_at)
        return self


@dataclass
class Recorded:
    """What a node took in a session's earlier runs: per sender, the SHA-256 of each step
    message, in its order (``digests``: its numbers are 1, 2, ...), and the messages
    themselves, in the order they were taken (``messages``)."""

    digests: dict[str, list[bytes]]
    messages: Iterator[tuple[str, Envelope]]

    def taken(self, sender: str) -> int:
        """How many of ``sender``'s step messages were taken (its numbers 1..that)."""
        return len(self.digests.get(sender, ()))


class Resend:
    """A re-run's outgoing filter: per peer, the step messages this node makes for it numbered
    up to ``taken`` are dropped (the peer took them in an earlier run), the rest pass; a peer's
    messages wait until its ResumeFrom says how many it took."""

    def __init__(self, peers: list[str]) -> None:
        self.skip: dict[str, int | None] = dict.fromkeys(peers)
        self.held: dict[str, list[Outgoing]] = {peer: [] for peer in peers}

    def told(self, peer: str, taken: int) -> list[Outgoing]:
        """``peer`` took ``taken`` of this node's step messages: what waited for it and may go."""
        if self.skip.get(peer, 0) is not None:
            raise fail(f"resume_from from {peer!r}: not a peer of this re-run, or said twice")
        self.skip[peer] = taken
        held, self.held[peer] = self.held[peer], []
        return self.passed(held)

    def passed(self, messages: list[Outgoing]) -> list[Outgoing]:
        """Of ``messages`` (in the order made), those to send now."""
        out: list[Outgoing] = []
        for recipient, envelope in messages:
            left = self.skip.get(recipient, 0)
            if envelope.WhichOneof("step") in HOST_STEPS or recipient not in self.skip:
                out.append((recipient, envelope))
            elif left is None:
                self.held[recipient].append((recipient, envelope))
            elif envelope.seq > left:
                out.append((recipient, envelope))
        return out


@dataclass
class Rerun:
    """A re-run's state on this node (cels.protocol.resume): what the earlier runs took (its
    messages replayed, its digests the check of a message sent again), its filter, whether it
    told its peers (``announced``) and whether its record is replayed."""

    earlier: Recorded
    resend: Resend
    announced: bool = False
    replayed: bool = False


@dataclass
class HostedSession:
    """One session on this node: its options, role (None while it awaits approval), state and deadlines."""

    options: SessionOptions
    role: Role | None
    state: str
    since: float
    last_progress: float
    notice: cels_pb2.Abort | None = None
    detail: str = ""
    steps: int = 0
    mark: float = 0.0
    initiation: Initiation | None = None
    """The initiator's session-control calls (None on the other nodes)."""
    approvals_pending: bool = False
    """Parties' operators are approving the session (the initiator said so): a prepared session
    waits for them, at most the session's approval_wait longer."""
    rerun: Rerun | None = None
    """A re-run's replay and outgoing filter (cels.protocol.resume; None: a first run)."""
    made: dict[str, int] = field(default_factory=dict)
    """Per recipient, the step messages made for it so far (the last one's ``Envelope.seq``)."""

    @property
    def expires_at(self) -> float:
        """A session awaiting approval ends approval_wait after it came; a prepared one that is
        never begun one deadline later (and approval_wait more while approvals are pending); a
        running one where nothing moves on this node one deadline after its last move (the gRPC
        watchdog also probes the peers)."""
        if self.state == AWAITING:
            return self.since + self.options.approval_wait
        if self.state == PREPARED:
            return self.since + self.options.deadline + (self.options.approval_wait if self.approvals_pending else 0.0)
        return self.last_progress + self.options.deadline

    @property
    def phase(self) -> Phase:
        return self.role.phase if self.role is not None else Phase.READY

    @property
    def finished(self) -> bool:
        return self.role is not None and self.role.finished

    @property
    def busy_seconds(self) -> float:
        return sum(self.role.seconds.values()) if self.role is not None else 0.0
