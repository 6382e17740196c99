"""A node's operator view: its sessions (running and recent, with their outcome) and its
metrics in the Prometheus text format (docs/monitoring.md, "Status" and "Metrics").

The gRPC adapter (cels.node.service) tells a node's :class:`NodeTelemetry` when a session is
created, changes phase, ends or is refused, and which frames it sends and receives.  ``Status``
returns the sessions and a party's ledger to the node's operators; the metrics live in a
``CollectorRegistry`` of the node's own (several nodes run in one test process) and are served
over HTTP on a port of their own only when one is configured (``[metrics] listen``,
``--metrics-listen``).  Nothing here is protocol logic: the roles never see it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import HTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cels.node.ledger import Ledger, totals
from cels.node.ledger_file import LedgerError, read_entries
from cels.node.pool import ElasticThreadPool
from cels.node.settings import METRICS_HOST
from cels.protocol.phases import Phase, SessionState
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import table_message

RUNNING, DONE, ABORTED, AWAITING = SessionState.RUNNING, SessionState.DONE, SessionState.ABORTED, SessionState.AWAITING_APPROVAL
REFUSED = "refused"  # an outcome, not a host state: the session was never admitted here
LIVE = (RUNNING, AWAITING)
"""The outcomes of a session that has not ended: running, or waiting for this node's operator."""
OUTCOMES = (DONE, ABORTED, REFUSED)
"""How a session ends on a node: its part done, aborted (by anyone), or refused at its start
(the ledger's budget, an unknown peer, keys below the node's minimum)."""
RECENT_SESSIONS = 20
"""Ended or refused sessions a node remembers for ``cels status`` (running ones: all)."""
PHASE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
"""Upper bounds (seconds) of the phase histogram: a toy phase to the transformed solve's hours."""


@dataclass
class SessionRecord:
    """One session on this node, as its operator sees it."""

    session_id: str
    initiator: str
    started_at: float
    """Unix seconds (the wall clock: shown to people)."""
    started: float
    """Monotonic seconds (durations)."""
    phase: str = Phase.READY
    phase_since: float = 0.0
    outcome: str = RUNNING
    origin: str = ""
    reason: str = ""
    ended: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    engine: dict[str, Any] | None = None
    """A party's engine and what the session's work used outside the node (cels.engine), once it ended."""
    config: cels_pb2.SessionConfig | None = None
    """The session's parameters, shown while it awaits this node's operator."""

    def summary(self, now: float) -> cels_pb2.SessionSummary:
        return cels_pb2.SessionSummary(
            session_id=self.session_id, outcome=self.outcome, phase=self.phase, initiator=self.initiator,
            origin=self.origin, reason=self.reason, started_at=self.started_at,
            seconds=(self.ended if self.ended is not None else now) - self.started,
            bytes_sent=self.bytes_sent, bytes_received=self.bytes_received,
            engine=None if self.engine is None else table_message(self.engine),
            config=self.config if self.outcome == AWAITING else None,
        )  # fmt: skip


class CountingPool(ElasticThreadPool):
    """The gRPC server's thread pool, counting the threads inside an RPC right now (a streaming
    RPC holds its thread for the whole stream)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pool") -> None:
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix)
        self.size = max_workers
        self.busy = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        def counted() -> Any:
            with self._count_lock:
                self.busy += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self.busy -= 1

        return super().submit(counted)


def ledger_standing(ledger: Ledger) -> dict[str, Any] | None:
    """The ledger's spend in its window, what running sessions reserve, and its budget; None
    for a party that keeps no ledger or whose file became unreadable (the node then refuses
    every session, and says why)."""
    policy = ledger.policy
    if policy is None:
        return None
    try:
        spent = totals(read_entries(policy.path, policy.key_file), policy.window_days, ledger.clock())
    except LedgerError:
        return None
    reservations = ledger.reserved().values()
    count, eps, delta = len(reservations), sum(r.epsilon for r in reservations), sum(r.delta for r in reservations)
    return {
        "path": str(policy.path), "sessions": spent["sessions"], "epsilon_spent": spent["epsilon"], "delta_spent": spent["delta"],
        "reserved_sessions": count, "epsilon_reserved": eps, "delta_reserved": delta,
        "budget_epsilon": policy.budget_epsilon, "budget_delta": policy.budget_delta, "window_days": policy.window_days,
    }  # fmt: skip


def budget_left(standing: dict[str, Any], what: str) -> float | None:
    """Budget ``what`` ("epsilon", "delta") minus spent minus reserved; None without a budget."""
    budget = standing[f"budget_{what}"]
    return None if budget is None else budget - standing[f"{what}_spent"] - standing[f"{what}_reserved"]


class LedgerCollector(Collector):
    """``cels_ledger_epsilon`` / ``cels_ledger_delta`` {state = spent, reserved, left}, read at
    every scrape (the ledger file is the truth; reservations live in the node)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        standing = ledger_standing(self.ledger)
        if standing is None:
            return
        for what in ("epsilon", "delta"):
            family = GaugeMetricFamily(
                f"cels_ledger_{what}", f"privacy budget ledger: {what} spent in the window, reserved by running sessions, left of the budget", labels=["state"]
            )  # fmt: skip
            family.add_metric(["spent"], standing[f"{what}_spent"])
            family.add_metric(["reserved"], standing[f"{what}_reserved"])
            left = budget_left(standing, what)
            if left is not None:
                family.add_metric(["left"], left)
            yield family


class NodeTelemetry:
    """One node's sessions and metrics (thread-safe); ``ledger``: a party's, None on the solver."""

    def __init__(self, name: str, role: str, ledger: Ledger | None = None, clock: Callable[[], float] = time.time) -> None:
        self.name, self.ledger, self.clock = name, ledger, clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()
        self._http: HTTPServer | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Gauge("cels_node_info", "this node's name and role (always 1)", ["node", "role"], registry=r).labels(name, role).set(1)
        self.sessions_total = Counter("cels_sessions", "sessions that ended on this node, by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:  # every series exists from the start (rate() and absent() need it)
            self.sessions_total.labels(outcome)
        self.active = Gauge("cels_active_sessions", "sessions running on this node now", registry=r)
        self.awaiting = Gauge("cels_sessions_awaiting_approval", "sessions waiting for this node's operator (cels approve / cels reject)", registry=r)
        self.awaiting.set_function(self._awaiting)
        self.phase_seconds = Histogram(
            "cels_phase_seconds", "wall-clock seconds this node spent in a protocol phase (entered to left)", ["phase"],
            buckets=PHASE_BUCKETS, registry=r,
        )  # fmt: skip
        self.sent = Counter("cels_sent_bytes", "bytes of protocol frames this node sent (Deliver), by peer", ["peer"], registry=r)
        self.received = Counter("cels_received_bytes", "bytes of protocol frames this node received (Deliver), by peer", ["peer"], registry=r)
        self.pool_busy = Gauge("cels_grpc_pool_threads_busy", "gRPC server threads inside an RPC now", registry=r)
        self.pool_size = Gauge("cels_grpc_pool_threads", "size of the gRPC server's thread pool", registry=r)
        self.outbox = Gauge("cels_outbox_bytes", "bytes of protocol messages this node made and has not sent yet, all sessions", registry=r)
        if ledger is not None:
            r.register(LedgerCollector(ledger))

    # -- what the node tells ---------------------------------------------------------------------
    def watch_pool(self, pool: CountingPool) -> None:
        self.pool_size.set(pool.size)
        self.pool_busy.set_function(lambda: pool.busy)

    def watch_outboxes(self, queued: Callable[[], int]) -> None:
        """``queued()``: the bytes waiting in the node's session outboxes, read at every scrape."""
        self.outbox.set_function(queued)

    def session_created(self, session_id: str, initiator: str, config: cels_pb2.SessionConfig | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self._records[session_id] = SessionRecord(session_id, initiator, self.clock(), now, phase_since=time.perf_counter(), config=config)
            self.active.inc()

    def session_phase(self, session_id: str, old: str, new: str, at: float | None = None) -> None:
        """The node left ``old`` for ``new`` at ``at`` (the host's meter, time.perf_counter; the
        event's own time: a step's events reach the driver together)."""
        at = time.perf_counter() if at is None else at
        with self._lock:
            record = self._records.get(session_id)
            if record is None:
                return
            if old != Phase.READY:
                self.phase_seconds.labels(old).observe(at - record.phase_since)
            record.phase, record.phase_since = new, at

    def _awaiting(self) -> int:
        """Sessions waiting for this node's operator (``cels_sessions_awaiting_approval``, read at every scrape)."""
        with self._lock:
            return sum(record.outcome == AWAITING for record in self._records.values())

    def session_awaiting(self, session_id: str, awaiting: bool) -> None:
        """The session waits for this node's operator (True), or was approved (False)."""
        with self._lock:
            record = self._records.get(session_id)
            if record is not None and record.outcome in LIVE:
                record.outcome = AWAITING if awaiting else RUNNING

    def session_ended(self, session_id: str, outcome: str, origin: str = "", reason: str = "") -> None:
        with self._lock:
            record = self._records.get(session_id)
            if record is None or record.outcome not in LIVE:
                return
            record.outcome, record.origin, record.reason, record.ended = outcome, origin, reason, time.monotonic()
            self._records.move_to_end(session_id)
            self.active.dec()
            self.sessions_total.labels(outcome).inc()
            self._forget()

    def session_engine(self, session_id: str, usage: dict[str, Any]) -> None:
        """What a party's engine used for the session (cels.engine.Engine.usage)."""
        with self._lock:
            if session_id in self._records:
                self._records[session_id].engine = usage

    def session_refused(self, session_id: str, initiator: str, reason: str) -> None:
        """This node would not take the session (its role factory refused it)."""
        now = time.monotonic()
        with self._lock:
            if session_id in self._records:
                return
            self._records[session_id] = SessionRecord(
                session_id, initiator, self.clock(), now, phase=Phase.READY, outcome=REFUSED, origin=self.name, reason=reason, ended=now
            )  # fmt: skip
            self.sessions_total.labels(REFUSED).inc()
            self._forget()

    def frames_sent(self, peer: str, session_id: str, size: int) -> None:
        self.sent.labels(peer).inc(size)
        with self._lock:
            if session_id in self._records:
                self._records[session_id].bytes_sent += size

    def frames_received(self, peer: str, session_id: str, size: int) -> None:
        self.received.labels(peer).inc(size)
        with self._lock:
            if session_id in self._records:
                self._records[session_id].bytes_received += size

    def _forget(self) -> None:
        ended = [sid for sid, r in self._records.items() if r.outcome not in LIVE]
        for sid in ended[: max(0, len(ended) - RECENT_SESSIONS)]:
            del self._records[sid]

    # -- what the operator reads -----------------------------------------------------------------
    def sessions(self) -> list[cels_pb2.SessionSummary]:
        """Running sessions (oldest first), then the ended and refused ones, newest first."""
        now = time.monotonic()
        with self._lock:
            records = list(self._records.values())
        running = [r for r in records if r.outcome in LIVE]
        ended = sorted((r for r in records if r.outcome not in LIVE), key=lambda r: r.ended or 0.0, reverse=True)
        return [r.summary(now) for r in [*running, *ended]]

    def ledger_status(self) -> cels_pb2.LedgerStatus | None:
        standing = ledger_standing(self.ledger) if self.ledger is not None else None
        if standing is None:
            return None
        return cels_pb2.LedgerStatus(**{k: v for k, v in standing.items() if v is not None})

    # -- the metrics port ------------------------------------------------------------------------
    def serve(self, listen: str) -> int:
        """Serve ``/metrics`` on ``listen`` (host:port) in a thread of its own; the bound port
        (OSError when it is taken)."""
        host, _, port = listen.rpartition(":")
        try:
            self._http, _thread = start_http_server(int(port), addr=host.strip("[]") or METRICS_HOST, registry=self.registry)
        except OSError as exc:  # a taken port: name the address and the setting, not only the errno
            raise OSError(f"{self.name}: cannot serve metrics on {listen} (--metrics-listen / [metrics] listen): {exc.strerror or exc}") from None
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
