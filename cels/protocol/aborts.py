"""What an Abort tells a peer, and how it reads (docs/protocol.md, "Aborts").

A peer is told the node to blame (``origin``), the kind of failure (``Abort.Kind``), the phase
and a generic reason: never a number, a row, a user or a pair from the data.  The details
(a load, a file and line, a peer's refusal) stay with the node that saw them: its log and its
local error.  :func:`abort_notice` refuses a reason with a digit, so a number cannot slip into
a notice; :func:`describe` renders any Abort as one line for people (no code parses it).
"""

from __future__ import annotations

from cels.protocol.wire import cels_pb2

Kind = cels_pb2.Abort.Kind
REFUSED, UNREACHABLE, DIED = cels_pb2.Abort.REFUSED, cels_pb2.Abort.UNREACHABLE, cels_pb2.Abort.DIED
DEADLINE, PROTOCOL_ERROR = cels_pb2.Abort.DEADLINE, cels_pb2.Abort.PROTOCOL_ERROR
LOCAL_FAILURE, CANCELLED = cels_pb2.Abort.LOCAL_FAILURE, cels_pb2.Abort.CANCELLED
BEFORE_START = "start"
"""The phase of an abort before any role ran (a refused or undeliverable StartSession)."""
BEFORE_SESSION = (BEFORE_START, "prepared")
"""Phases in which no session ran yet: the rendering says "no session ran"."""


def abort_notice(session_id: str, origin: str, kind: int, reason: str, phase: str) -> cels_pb2.Abort:
    """The Abort a node sends its peers; ValueError for a reason with a digit (a number from
    the data belongs in the local detail, not in a notice)."""
    if any(ch.isdigit() for ch in reason):
        raise ValueError(f"an abort reason for peers carries no digit: {reason!r}")
    if kind not in Kind.values() or kind == cels_pb2.Abort.KIND_UNSPECIFIED:
        raise ValueError(f"unknown abort kind {kind}")
    return cels_pb2.Abort(session_id=session_id, origin=origin, kind=kind, reason=reason, phase=phase)


def describe(abort: cels_pb2.Abort) -> str:
    """One line: what happened, to whom, in which phase, e.g. "party-3 died in phase counts
    (stopped answering)" or "no session ran: refused by party-2 (privacy budget exceeded)"."""
    origin, phase = abort.origin or "a node", abort.phase
    why = f" ({abort.reason})" if abort.reason else ""
    where = f" in phase {phase}" if phase and phase not in BEFORE_SESSION else ""
    kind = abort.kind
    if kind == REFUSED:
        text = f"refused by {origin}{why}"
    elif kind == UNREACHABLE:
        text = f"{origin} unreachable{where}{why}"
    elif kind == DIED:
        text = f"{origin} died{where}{why}"
    elif kind == DEADLINE:
        text = f"{origin} timed out{where}{why}"
    elif kind == PROTOCOL_ERROR:
        text = f"protocol error at {origin}{where}{why}"
    elif kind == LOCAL_FAILURE:
        text = f"{origin} failed{where}{why}"
    elif kind == CANCELLED:
        text = f"cancelled by {origin}{where}{why}"
    else:
        text = f"aborted by {origin}{where}{why}"
    return f"no session ran: {text}" if phase in BEFORE_SESSION else text
