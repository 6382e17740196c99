"""Sessions in one process: SessionHosts driven over an in-memory network (tests, benchmarks,
experiments, attacks).

:class:`InMemoryNetwork` delivers messages among named nodes in FIFO order until none is left.
Every envelope is serialised and parsed again on the way, exactly as it would cross the wire,
so the byte counts are the real wire sizes (framing excluded).  :func:`run_session` runs r
parties and the solver, each a :class:`cels.protocol.host.SessionHost` (the same host the gRPC
nodes drive), and returns the initiator's output and report.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog
from cels.protocol.aborts import describe
from cels.protocol.hosted import ABORTED, Step
from cels.protocol.host import SessionHost
from cels.protocol.options import SessionOptions
from cels.protocol.party import PartyRole
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Role, Stream, step_name, take_ready
from cels.protocol.solver import SolverRole
from cels.session_report import session_report


@dataclass
class TrafficStats:
    """Bytes and messages sent, per (sender, step), and seconds spent inside each role."""

    bytes_sent: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    messages: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_sent.values())

    def bytes_by_node(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (sender, _step), n in self.bytes_sent.items():
            out[sender] += n
        return dict(out)


class Receiver:
    """Anything the in-memory network delivers to."""

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]: ...


class InMemoryNetwork:
    """Deliver messages among named nodes in FIFO order until no message is left."""

    def __init__(self, roles: Mapping[str, Receiver], max_messages: int = 10_000_000) -> None:
        self.roles = dict(roles)
        self.stats = TrafficStats()
        self.max_messages = max_messages
        self.log: list[tuple[str, str, str, int]] = []  # (sender, recipient, step, bytes)
        self.held: dict[str, deque[Outgoing | Stream]] = {}  # sender -> what it sent behind a Stream's message not made yet

    def run(self, initial: Iterable[Outgoing], sender: str = "initiator") -> TrafficStats:
        """Deliver ``initial`` and everything it sets off, in the order sent; whenever the queue
        is empty, every node with a send window is told its link drained (its next window), and
        every Stream waiting for what its sender takes is asked again."""
        queue: deque[tuple[str, str, bytes]] = deque()
        self._enqueue(queue, sender, initial)
        delivered = 0
        while queue or self._drain(queue):
            src, dst, data = queue.popleft()
            if dst not in self.roles:
                raise KeyError(f"message from {src} to unknown node {dst!r}")
            delivered += 1
            if delivered > self.max_messages:
                raise RuntimeError("in-memory network: message limit reached (a role loops?)")
            envelope = Envelope.FromString(data)
            start = time.perf_counter()
            out = self.roles[dst].receive(src, envelope)
            self.stats.seconds[dst] += time.perf_counter() - start
            self._enqueue(queue, dst, out)
        return self.stats

    def _drain(self, queue: deque) -> bool:
        """The queue is empty: the next window of every pending Stream (:meth:`MemoryNode.drained`)."""
        for name, node in self.roles.items():
            self._enqueue(queue, name, node.drained() if isinstance(node, MemoryNode) else [])
        return bool(queue)

    def _enqueue(self, queue: deque, src: str, messages: Iterable[Outgoing | Stream]) -> None:
        """Queue what ``src`` sent and is ready, a Stream (cels.protocol.roles) as far as it is
        made (this network holds every message anyway: its hosts have no send window); the rest
        waits, in order, for ``src``'s next turn."""
        held = self.held.setdefault(src, deque())
        held.extend(messages)
        for dst, envelope in take_ready(held):
            data = envelope.SerializeToString()
            step = step_name(envelope)
            self.stats.bytes_sent[(src, step)] += len(data)
            self.stats.messages[(src, step)] += 1
            self.log.append((src, dst, step, len(data)))
            queue.append((src, dst, data))


LogSource = SearchLog | Callable[[], SearchLog]


class MemoryNode:
    """A SessionHost on the in-memory network (the in-process driver, as cels.node is the gRPC
    one).  Once a node's session is aborted, messages still in flight to it are refused quietly
    (in gRPC, the error goes back to a sender that is aborting too)."""

    def __init__(self, host: SessionHost) -> None:
        self.host = host
        self.refused: list[str] = []

    def drained(self) -> list[Outgoing]:
        """Everything this node sent went out: the next window of its sessions' pending Streams
        (none unless its host has a send window)."""
        return [m for sid in list(self.host.sessions) for m in self.host.drained(sid, time.monotonic()).messages]

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        try:
            return self.host.deliver(sender, envelope, time.monotonic()).messages
        except ProtocolError as exc:
            if self.host.state(envelope.session_id)[0] != ABORTED:
                raise
            self.refused.append(str(exc))
            return []


def session_hosts(logs: Sequence[LogSource], options: SessionOptions, seed: int | None = None, **role_options) -> dict[str, MemoryNode]:
    """One node per node of the session: party k over ``logs[k]`` (or its loader), and the
    solver; ``role_options`` go to every role (e.g. ``allow_insecure_key_bits=True`` in tests).
    ``seed`` replays every party's draws (DrawKeys.replay: tests and reproduction only, NOT
    private).  The initiator builds its report with cels.session_report."""
    if len(logs) != len(options.parties):
        raise ValueError(f"{len(logs)} logs for {len(options.parties)} parties")

    def party(name: str, log: LogSource) -> Callable[[SessionOptions], PartyRole]:
        draws = None if seed is None else DrawKeys.replay(seed, name)
        return lambda opts: PartyRole(name, opts, log, draws=draws, session_report=session_report, **role_options)

    nodes = {name: MemoryNode(SessionHost(name, party(name, log), time.perf_counter)) for name, log in zip(options.parties, logs)}
    solver = options.solver
    solver_draws = None if seed is None else DrawKeys.replay(seed, solver)
    nodes[solver] = MemoryNode(SessionHost(solver, lambda opts: SolverRole(solver, opts, draws=solver_draws, **role_options), time.perf_counter))
    return nodes


def start_session(network: InMemoryNetwork, options: SessionOptions) -> dict[str, Role]:
    """Run a session to its end: the initiator's host says which session-control call is due
    (StartSession, BEGIN, FINISH: cels.protocol.hosted.Call); this driver makes each one,
    delivers what it sets off until no message is left, and reports back.  A refused call ends
    the session with the refusal's Abort, as over gRPC; a step message refused on the way
    raises (ProtocolError).  Returns the session's role on every node."""
    initiator, sid = options.initiator, options.session_id
    hosts = {name: _session_host(node) for name, node in network.roles.items()}
    lead = hosts[initiator]
    lead.initiate(options, time.monotonic())
    while (call := lead.next_call(sid)) is not None:
        try:
            if call.step is Step.START:
                network.run([(call.node, call.envelope)], sender=initiator)
                reached = []
            else:
                signal = hosts[call.node].begin if call.step is Step.BEGIN else hosts[call.node].finish
                reached = signal(sid, time.monotonic()).messages + _replayed(hosts[call.node], sid)
        except ProtocolError as exc:  # the node refuses the call
            effects = lead.unanswered(sid, call.node, exc.abort, time.monotonic(), str(exc))
        else:
            network.run(reached, sender=call.node)
            effects = lead.answered(sid, call.node, time.monotonic())
        network.run(effects.messages + _replayed(lead, sid), sender=initiator)
    return {name: host.role(sid) for name, host in hosts.items()}


def _replayed(host: SessionHost, session_id: str) -> list[Outgoing]:
    """A re-run that began on ``host`` replays its whole record before anything reaches it
    (cels.protocol.resume): what that sends."""
    out: list[Outgoing] = []
    while host.replay_due(session_id):
        out += host.replay(session_id, time.monotonic()).messages
    return out


def _session_host(node: Receiver) -> SessionHost:
    """The SessionHost inside delivery wrappers (each keeps the wrapped node as ``host``)."""
    while not isinstance(node, SessionHost):
        node = node.host
    return node


def abort_message(roles: Mapping[str, Role]) -> str | None:
    """Why a session run in memory aborted (None if it did not): the abort as its nodes were
    told (cels.protocol.aborts), then its origin's own details, which in one process belong
    to the caller as its log would."""
    failed = [role.aborted for role in roles.values() if role.aborted is not None]
    if not failed:
        return None
    origin = roles.get(failed[0].origin)
    detail = getattr(origin, "failure", "") if origin is not None else ""
    return f"session aborted: {describe(failed[0])}" + (f"; {failed[0].origin}'s log: {detail}" if detail else "")


def run_session(logs: Sequence[LogSource], options: SessionOptions, **role_options) -> tuple[SearchLog, dict]:
    """Run one session in memory: ``logs[k]`` is party k's log (or its loader).  Returns
    (output, report); raises RuntimeError naming the failing node and its reason if the session
    aborts (:func:`abort_message`).  (cels.views.record_session runs one that records every node's view.)"""
    nodes = session_hosts(logs, options, **role_options)
    network = InMemoryNetwork(nodes)
    started = time.perf_counter()
    roles = start_session(network, options)
    if (aborted := abort_message(roles)) is not None:
        raise RuntimeError(aborted)
    lead = roles[options.initiator]
    if not lead.finished:
        raise RuntimeError(f"session stalled: phases {({n: r.phase for n, r in roles.items()})}")
    report = dict(lead.report)
    report["wall_seconds"] = time.perf_counter() - started
    report["network"] = {
        "bytes_by_node": network.stats.bytes_by_node(),
        "messages": int(sum(network.stats.messages.values())),
        "seconds_by_node": dict(network.stats.seconds),
    }
    return lead.output, report
