"""What an Abort tells a peer, and how it reads (docs/protocol.md, "Aborts").

A peer is told the node to blame (``origin``), the kind of failure (``Abort.Kind``), the phase
and a generic reason: never a number, a row, a user or a pair from the data.  The details
(a load, a file and line, a peer's refusal) stay with the node that saw them: its log and its
local error.  :func:`abort_notice` refuses a reason with a digit, so a number cannot slip into
a notice; :func:`describe` renders any Abort as one line for people (no code parses it).
"""

from __future__ import annotations

from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_from_wire, phase_to_wire

Kind = cels_pb2.Abort.Kind
REFUSED, UNREACHABLE, DIED = cels_pb2.Abort.REFUSED, cels_pb2.Abort.UNREACHABLE, cels_pb2.Abort.DIED
DEADLINE, PROTOCOL_ERROR = cels_pb2.Abort.DEADLINE, cels_pb2.Abort.PROTOCOL_ERROR
LOCAL_FAILURE, CANCELLED = cels_pb2.Abort.LOCAL_FAILURE, cels_pb2.Abort.CANCELLED
RESUMABLE = frozenset({UNREACHABLE, DIED, DEADLINE, CANCELLED})
"""The kinds of abort after which a session may be re-run (``cels run --resume``): a node or
the controller went away.  A refusal, a broken rule or a bad input ends a session for good."""
FORGOTTEN = "no longer knows the session (restarted?)"
"""The reason of a node that does not know a session a peer calls it about: it restarted (or
never had it).  Kind DIED, which a re-run may follow."""
BEFORE_START = Phase.START
"""The phase of an abort before any role ran (a refused or undeliverable StartSession): the
rendering says "no session ran"."""


def abort_notice(session_id: str, origin: str, kind: int, reason: str, phase: Phase | None) -> cels_pb2.Abort:
    """The Abort a node sends its peers (``phase`` None: not known); ValueError for a reason
    with a digit (a number from the data belongs in the local detail, not in a notice)."""
    if any(ch.isdigit() for ch in reason):
        raise ValueError(f"an abort reason for peers carries no digit: {reason!r}")
    if kind not in Kind.values() or kind == cels_pb2.Abort.KIND_UNSPECIFIED:
        raise ValueError(f"unknown abort kind {kind}")
    return cels_pb2.Abort(session_id=session_id, origin=origin, kind=kind, reason=reason, phase=phase_to_wire(phase))


PEER_TEXT = 200
"""Characters of a peer's reason an adopted Abort keeps."""


def peer_abort(abort: cels_pb2.Abort, sender: str, session_id: str) -> cels_pb2.Abort:
    """A peer's Abort as this node keeps and passes it on: this session, ``sender`` as the
    origin if it names none, its texts cut to PEER_TEXT printable characters (one log line), a
    phase this version does not know as not known."""

    def clean(text: str) -> str:
        return "".join(ch if ch.isprintable() else " " for ch in text[:PEER_TEXT])

    return cels_pb2.Abort(
        session_id=session_id, origin=clean(abort.origin) or sender, kind=abort.kind, reason=clean(abort.reason),
        phase=phase_to_wire(phase_from_wire(abort.phase)),
    )


RENDERING = {
    REFUSED: "refused by {origin}{why}",
    UNREACHABLE: "{origin} unreachable{where}{why}",
    DIED: "{origin} died{where}{why}",
    DEADLINE: "{origin} timed out{where}{why}",
    PROTOCOL_ERROR: "protocol error at {origin}{where}{why}",
    LOCAL_FAILURE: "{origin} failed{where}{why}",
    CANCELLED: "cancelled by {origin}{where}{why}",
}
"""How each kind reads (:func:`describe`); an unknown kind reads "aborted by ..."."""


def describe(abort: cels_pb2.Abort) -> str:
    """One line: what happened, to whom, in which phase, e.g. "party-3 died in phase counts
    (stopped answering)" or "no session ran: refused by party-2 (privacy budget exceeded)"."""
    phase = phase_from_wire(abort.phase)
    text = RENDERING.get(abort.kind, "aborted by {origin}{where}{why}").format(
        origin=abort.origin or "a node",
        where=f" in phase {phase}" if phase not in (None, BEFORE_START) else "",
        why=f" ({abort.reason})" if abort.reason else "",
    )
    return f"no session ran: {text}" if phase is BEFORE_START else text
