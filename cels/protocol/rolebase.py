"""What the party and solver roles share: session checks, dispatch, abort, phase accounting.

A role takes one step message at a time (``receive``), dispatches it to ``_on_<step>`` and
returns the messages it causes.  It raises :class:`ProtocolError` for a message it cannot take
(its state is left unchanged, so a stray message does not end the session); a failure of its
own (a bad local log, an infeasible problem, a broken invariant) ends the session everywhere:
the role broadcasts Abort and keeps the reason.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from cels.mechanism.sanitize import SanitizeParams
from cels.mechanism.solvers import DEFAULT_BREAKPOINTS, DEFAULT_SUPPORT, DEFAULT_TIME_LIMIT
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, step_name
from cels.protocol.wire import cels_pb2

log = logging.getLogger(__name__)

STEP_PHASE = {
    "start_session": "control",
    "abort": "control",
    "step_report": "control",
    "universe_hop": "universe",
    "universe_index": "universe",
    "constraint_shape": "nlp",
    "nlp_key": "nlp",
    "nlp_sum_hop": "nlp",
    "nlp_permute_hop": "nlp",
    "nlp_solution": "nlp",
    "nlp_slack_block": "nlp",
    "union_encrypt_hop": "union",
    "union_decrypt_hop": "union",
    "union_result": "union",
}
"""The phase a step message belongs to (secure sums: by sum id, see :func:`phase_of`)."""


SUBPROTOCOL_STEPS = ("sum_", "union_")
"""Steps of the secure sum and secure union sub-protocols: whole envelopes go to
``_on_subprotocol`` (the sub-state-machines take envelopes)."""


def phase_of(envelope: Envelope) -> str:
    """Phase of a message: counts (sum ids "counts"/"unique"), sampling ("sampling-*"), ..."""
    step = step_name(envelope)
    if step.startswith("sum_"):
        sum_id = getattr(envelope, step).sum_id
        return "sampling" if sum_id.startswith("sampling") else "counts"
    return STEP_PHASE[step]


def sanitize_params(config: cels_pb2.SessionConfig) -> SanitizeParams:
    """The session's options as ``cels sanitize`` parameters (proto3 0 / "" = the default)."""
    return SanitizeParams(
        epsilon=config.epsilon,
        delta=config.delta,
        bound=config.bound or "cels",
        objective=config.objective or "kl",
        output_size=config.output_size or None,
        min_count=config.min_count,
        cap=config.cap or None,
        noise_epsilon=config.noise_epsilon or None,
        sensitivity=config.sensitivity or None,
        keep_user_ids=config.keep_user_ids,
        breakpoints=config.breakpoints or DEFAULT_BREAKPOINTS,
        support=config.support or DEFAULT_SUPPORT,
        time_limit=config.solver_time_limit or DEFAULT_TIME_LIMIT,
    )


def fail(message: str) -> ProtocolError:
    return ProtocolError(ProtocolError.FAILED_PRECONDITION, message)


def malformed(message: str) -> ProtocolError:
    return ProtocolError(ProtocolError.INVALID_ARGUMENT, message)


class RoleFailure(Exception):
    """A failure inside this node that ends the session (becomes an Abort broadcast)."""


class SessionRole:
    """Base of PartyRole and SolverRole: one node's state machine for one session."""

    def __init__(self, name: str, config: cels_pb2.SessionConfig) -> None:
        self.name = name
        self.config = config
        self.session_id = config.session_id
        self.parties = [p.name for p in config.parties]
        self.solver = config.solver.name
        self.initiator = config.initiator or self.parties[0]
        self.params = sanitize_params(config)
        self.b = self.params.validate()
        self.nodes = [*self.parties, self.solver]
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"node names must be distinct: {self.nodes}")
        if len(self.parties) < 2:
            raise ValueError("a session needs at least two parties")
        if name not in self.nodes:
            raise ValueError(f"{name!r} is not a node of session {self.session_id!r}")
        if self.initiator not in self.parties:
            raise ValueError(f"initiator {self.initiator!r} is not a party of the session")
        self.phase = "prepared"
        self.done = False
        self.aborted: cels_pb2.Abort | None = None
        self.seconds: dict[str, float] = defaultdict(float)
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self._mark = 0.0
        self._report_due = False

    # -- the contract -------------------------------------------------------------------
    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take one step message (cels.protocol.roles contract)."""
        if envelope.session_id != self.session_id:
            raise fail(f"{self.name}: unknown session {envelope.session_id!r}")
        step = step_name(envelope)
        if step != "start_session" and sender not in self.nodes:
            raise fail(f"{self.name}: {sender!r} is not a node of session {self.session_id!r}")
        if self.aborted is not None and step != "abort":
            raise fail(f"{self.name}: session {self.session_id!r} was aborted ({self.aborted.reason})")
        if self.done and step not in ("abort", "step_report"):
            raise fail(f"{self.name}: session {self.session_id!r} is finished; {step} out of order")
        if step.startswith(SUBPROTOCOL_STEPS) and hasattr(self, "_on_subprotocol"):
            return self._run(lambda: self._on_subprotocol(sender, envelope))
        handler = getattr(self, f"_on_{step}", None)
        if handler is None:
            raise fail(f"{self.name}: a {type(self).__name__} does not take {step}")
        return self._run(lambda: handler(sender, getattr(envelope, step)))

    def start(self) -> list[Outgoing]:
        """Begin the session on this node (idempotent; a first protocol message also begins it)."""
        if self.aborted is not None:
            return []
        return self._run(self._begin)

    def abort(self, reason: str) -> list[Outgoing]:
        """This node gives up (peer unreachable, watchdog): tell every other node."""
        if self.aborted is not None or self.done:
            return []
        self.aborted = cels_pb2.Abort(session_id=self.session_id, origin=self.name, reason=reason)
        log.warning("session %s, %s: aborting: %s", self.session_id, self.name, reason)
        self.phase = "aborted"
        return [(node, self._envelope(abort=self.aborted)) for node in self.nodes if node != self.name]

    # -- helpers for subclasses -----------------------------------------------------------
    def _begin(self) -> list[Outgoing]:
        return []

    def _run(self, action) -> list[Outgoing]:
        self._mark = time.perf_counter()
        try:
            out = action()
        except RoleFailure as exc:
            out = self.abort(str(exc))
        self._tick()
        for _dst, env in out:
            self.bytes_sent[phase_of(env)] += env.ByteSize()
        if self._report_due:
            self._report_due = False
            out = out + self._report()
        return out

    def _finish(self) -> None:
        """This node's part is over: it reports to the initiator after this step's messages."""
        self._enter("done")
        self.done = True
        self._report_due = True

    def _report(self) -> list[Outgoing]:
        """Send this node's StepReports to the initiator (the initiator overrides: it keeps them)."""
        return [(self.initiator, self._envelope(step_report=r)) for r in self.step_reports()]

    def _tick(self) -> None:
        now = time.perf_counter()
        self.seconds[self.phase] += now - self._mark
        self._mark = now

    def _enter(self, phase: str) -> None:
        """Switch phase, charging the time spent so far to the old one."""
        self._tick()
        log.info("session %s, %s: %s done in %.2f s, now %s", self.session_id, self.name, self.phase, self.seconds[self.phase], phase)
        self.phase = phase

    def _envelope(self, **step) -> Envelope:
        return cels_pb2.Envelope(session_id=self.session_id, sender=self.name, **step)

    def _send(self, recipients, **step) -> list[Outgoing]:
        """The same step message to each recipient (in the given order)."""
        if isinstance(recipients, str):
            recipients = [recipients]
        return [(node, self._envelope(**step)) for node in recipients]

    def _expect(self, phase: str, step: str) -> None:
        if self.phase != phase:
            raise fail(f"{self.name}: {step} out of order (in phase {self.phase!r}, expected {phase!r})")

    def _expect_sender(self, sender: str, expected: str, step: str) -> None:
        if sender != expected:
            raise fail(f"{self.name}: {step} from {sender!r}, expected from {expected!r}")

    def _on_start_session(self, sender: str, msg: cels_pb2.StartSession) -> list[Outgoing]:
        raise fail(f"{self.name}: session {self.session_id!r} already exists")

    def _on_abort(self, sender: str, msg: cels_pb2.Abort) -> list[Outgoing]:
        if self.aborted is None and not self.done:
            self.aborted = cels_pb2.Abort(session_id=self.session_id, origin=msg.origin or sender, reason=msg.reason)
            log.warning("session %s, %s: aborted by %s: %s", self.session_id, self.name, self.aborted.origin, msg.reason)
            self.phase = "aborted"
        return []

    def step_reports(self) -> list[cels_pb2.StepReport]:
        """This node's accounting: busy seconds and bytes sent per phase."""
        self._tick()
        phases = sorted((set(self.seconds) | set(self.bytes_sent)) - {"prepared", "done"})
        return [
            cels_pb2.StepReport(
                session_id=self.session_id,
                node=self.name,
                phase=p,
                seconds=self.seconds.get(p, 0.0),
                bytes_sent=self.bytes_sent.get(p, 0),
            )
            for p in phases
        ]
