"""The contract between a session host and the roles it hosts, and the errors they raise.

A role is one node's state machine for one session (h11-style, sans-I/O): the host gives it
step messages and gets back the messages they cause.  Which message a role takes in which phase
is an explicit table (cels.protocol.machines); anything
else is refused with FAILED_PRECONDITION, and the role's state is left unchanged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from cels.protocol.wire import cels_pb2

Envelope = cels_pb2.Envelope
Outgoing = tuple[str, cels_pb2.Envelope]
"""A message to send: (recipient node name, envelope)."""
SEND_WINDOW = 4 << 20
"""Bytes of a :class:`Stream` a role hands its driver per call: a party's own universe ids or a
masked sum's shares are made as the link drains them, never all at once (issue 25)."""


class Stream:
    """Messages made as they are sent: a role returns one among its Outgoing (a list that would
    hold a whole vector's chunks), hands its driver at most its host's send window of it per
    call (a node's: :data:`SEND_WINDOW`): the first with the call that made it, each next one
    when the driver reports its link drained (:meth:`Role.drained`), so a node's outbox holds
    about a window of it however fast the role's other messages come.  ``batches`` yields lists
    of messages (a chunk's, to each of its recipients: handed over together), or None: nothing
    is ready yet (P_1's chunks of a total wait for every share of them), and the role asks
    again at its next call, or at once if the link is idle.  Whatever the role returns after a
    Stream waits behind it: the order of the messages is the order in which the role made them."""

    def __init__(self, batches: Iterable[list[Outgoing] | None]) -> None:
        self.batches = iter(batches)
        self.begun = False  # its first window handed over


STREAM_OVER = object()
"""What ``next(stream.batches, STREAM_OVER)`` gives once a :class:`Stream` has made all its messages."""


def take_ready(held: deque[Outgoing | Stream]) -> list[Outgoing]:
    """The messages at the front of ``held`` that are ready, in order: up to a Stream's first
    message not made yet (it and what follows stay held), all of a Stream that is over."""
    out: list[Outgoing] = []
    while held:
        if not isinstance(held[0], Stream):
            out.append(held.popleft())
            continue
        batch = next(held[0].batches, STREAM_OVER)
        if batch is None:
            break
        if batch is STREAM_OVER:
            held.popleft()
        else:
            out += batch
    return out


PhaseHook = Callable[[str, str], None]
"""Called by a role when it leaves phase ``old`` for phase ``new`` (the host's accounting)."""


class ProtocolError(Exception):
    """A message the role cannot take.

    ``code`` is ``"failed_precondition"`` (unknown session, message out of protocol order,
    unexpected sender) or ``"invalid_argument"`` (malformed content); the gRPC adapters map
    it to the status code of the same name.  ``abort``: the Abort the sender should end the
    session with (the session is aborted here already, or this node refuses it), carried to
    the sender as a structured field (cels.node: trailing metadata), never parsed from text.
    ``detail``: what only this node's log (and its own controller) may read, e.g. the numbers
    behind a refusal of its policy; the message itself goes to the sender.
    """

    FAILED_PRECONDITION = "failed_precondition"
    INVALID_ARGUMENT = "invalid_argument"

    def __init__(self, code: str, message: str, abort: cels_pb2.Abort | None = None, detail: str = "") -> None:
        if code not in (self.FAILED_PRECONDITION, self.INVALID_ARGUMENT):
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(message)
        self.code = code
        self.abort, self.detail = abort, detail


class Refusal(ValueError):
    """A node's policy refuses a session (a role factory raises it): ``public`` is what the
    peers are told (no digit), the message the details for this node's log and its controller."""

    def __init__(self, public: str, detail: str) -> None:
        super().__init__(detail)
        self.public = public


QUOTE_CHARS = 40
"""Characters of a peer's string a refusal quotes (refusals travel as gRPC metadata)."""


def quoted(text: str, limit: int = QUOTE_CHARS) -> str:
    """``repr(text)``, cut to ``limit`` characters of ``text`` (a peer's string in an error message)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def fail(message: str, abort: cels_pb2.Abort | None = None) -> ProtocolError:
    """A message out of protocol order, from the wrong sender, or for an unknown session."""
    return ProtocolError(ProtocolError.FAILED_PRECONDITION, message, abort)


def malformed(message: str) -> ProtocolError:
    """A message whose content is wrong."""
    return ProtocolError(ProtocolError.INVALID_ARGUMENT, message)


MAX_SESSION_ID = 128
"""Characters of a session id: refusals quote it, so a peer cannot blow up the reply."""


def check_session_id(session_id: str) -> None:
    """Refuse (INVALID_ARGUMENT) an empty, overlong or unprintable session id, quoting none of it."""
    if not 0 < len(session_id) <= MAX_SESSION_ID or not session_id.isprintable():
        raise malformed(f"a session id is 1 to {MAX_SESSION_ID} printable characters, not {len(session_id)} characters")


class Role(Protocol):
    """Everything a session host may call on a role (cels.protocol.host)."""

    name: str
    phase: str
    aborted: cels_pb2.Abort | None
    failure: str
    output: Any
    report: dict | None
    seconds: dict[str, float]
    phase_hook: PhaseHook | None
    abort_notices: list[Outgoing]
    """The Abort envelopes of a session this role aborted while refusing a message (the host
    sends them: the refusal itself reaches the sender as the ProtocolError)."""
    send_window: int | None
    """Bytes of a :class:`Stream` the role hands over per call (None: whole; the host sets it)."""
    pending: bool
    """A Stream of the role's waits for the driver's link to drain."""

    def begin(self) -> list[Outgoing]:
        """Start this node's part (idempotent)."""
        ...

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take one step message; return the messages it causes. Raises ProtocolError."""
        ...

    def abort(self, notice: cels_pb2.Abort, detail: str = "") -> list[Outgoing]:
        """This node gives up with ``notice`` (what the peers are told; ``detail`` stays
        here): the Abort envelopes for every other node."""
        ...

    def drained(self) -> list[Outgoing]:
        """The driver sent all this role gave it: the next window of a pending :class:`Stream`."""
        ...

    @property
    def finished(self) -> bool:
        """This node's part is over (the initiator: output and every node's report in)."""
        ...


def addressed(session_id: str, sender: str, recipients: str | Sequence[str], **step) -> list[Outgoing]:
    """The same step message from ``sender`` to each recipient (in the given order)."""
    if isinstance(recipients, str):
        recipients = [recipients]
    return [(node, Envelope(session_id=session_id, sender=sender, **step)) for node in recipients]


def step_name(envelope: Envelope) -> str:
    """The protocol step an envelope carries (its ``step`` oneof field name)."""
    name = envelope.WhichOneof("step")
    if name is None:
        raise malformed("envelope carries no step message")
    return name
