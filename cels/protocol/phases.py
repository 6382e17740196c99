"""The session's vocabulary, one enum each (docs/protocol.md, "How a session lives").

:class:`Phase` is where one node's role is in a session: CELS section 4 in order -- the load
of its log, the universe (Algorithm 3's commutative hash), the counts (Algorithm 1's secure
sums), phase 3 (the private solve, or the paper's Algorithm 2 as ``NLP``), the sampling and
the secure union -- between ``READY`` (made, not begun) and ``OVER`` (its part is done) or
``FAILED`` (the session was aborted).  :class:`SessionState` is what a node's host knows of a
session (cels.protocol.host): its own names, so a role's phase is never compared with a host
state.  Both are ``str`` enums: their values are what reports and logs show; the wire carries
the proto enums ``Phase`` and ``SessionState.State`` that mirror them (cels.protocol.wire.codec
converts), and every module names a phase through these members, never through a string literal.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """A role's phase (the rows of the roles' transition tables, cels.protocol.machines)."""

    READY = "ready"
    LOAD = "load"
    UNIVERSE = "universe"
    COUNTS = "counts"
    SOLVE = "solve"
    NLP = "nlp"
    SAMPLING = "sampling"
    UNION = "union"
    OVER = "over"
    FAILED = "failed"
    CONTROL = "control"
    """Not a phase a role is in: the bucket that session control (Abort, StepReport) is counted in."""
    START = "start"
    """Not a phase a role is in: an Abort's phase when no role ran yet (a refused or
    undeliverable StartSession)."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # messages quote a phase as its wire value
        return repr(self.value)


WORK_PHASES = tuple(Phase)[tuple(Phase).index(Phase.READY) + 1 : tuple(Phase).index(Phase.OVER)]
"""The phases in which a role works and is charged busy seconds and bytes: the members between
READY and OVER, in protocol order."""


class SessionState(str, Enum):
    """A session as a node's host knows it (cels.protocol.host)."""

    UNKNOWN = "unknown"
    """The host never had the session, or has forgotten it."""
    PREPARED = "prepared"
    RUNNING = "running"
    DONE = "done"
    ABORTED = "aborted"
    AWAITING_APPROVAL = "awaiting_approval"
    """Taken by the party's policy only, nothing read or reserved: its operator decides
    (``cels approve`` / ``cels reject``), or the session's approval_wait ends it."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)
