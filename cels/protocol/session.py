"""Sessions: the SessionConfig, per-node session hosts, and the in-memory session runner.

A node hosts one role per session (:class:`NodeHost`): a StartSession envelope creates the
role from the session's config, every other envelope goes to the role of its session id
(unknown session -> ProtocolError failed_precondition).  ``party_node`` / ``solver_node``
wrap the same hosts behind gRPC; :func:`run_session` runs r parties and the solver in one
process over :class:`cels.protocol.inmemory.InMemoryNetwork` (tests, benchmarks, experiments).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence

from cels.logs.model import SearchLog
from cels.protocol.inmemory import InMemoryNetwork
from cels.protocol.party import SAMPLING_MODES, PartyRole
from cels.protocol.rolebase import sanitize_params
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Role, step_name
from cels.protocol.solver import SolverRole
from cels.protocol.wire import cels_pb2

SOLVER = "solver"


def party_names(r: int) -> list[str]:
    """Node names of a session's parties in ring order: party-1 .. party-r."""
    return [f"party-{k}" for k in range(1, r + 1)]


def make_config(
    parties: int | Sequence[str],
    *,
    epsilon: float,
    delta: float,
    bound: str = "cels",
    objective: str = "kl",
    output_size: float = 0.0,
    min_count: int = 0,
    cap: int = 0,
    noise_epsilon: float = 0.0,
    sensitivity: float = 0.0,
    sampling: str = "exact",
    key_bits: int = 2048,
    group_bits: int = 2048,
    universe_cipher: str = "x25519",
    ell_ratio: float = 1.5,
    keep_user_ids: bool = False,
    support: float = 0.0,
    breakpoints: int = 0,
    solver_time_limit: float = 0.0,
    deadline_ms: int = 0,
    sampling_theta: float = 0.0,
    solver: str = SOLVER,
    addresses: dict[str, str] | None = None,
    initiator: str | None = None,
    session_id: str | None = None,
) -> cels_pb2.SessionConfig:
    """A SessionConfig with the options of ``cels sanitize`` (0 / "" = the solver's default)."""
    names = party_names(parties) if isinstance(parties, int) else list(parties)
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {sampling!r}")
    if (noise_epsilon > 0) != (sensitivity > 0):
        raise ValueError("noise needs both noise_epsilon and sensitivity")
    addresses = addresses or {}
    config = cels_pb2.SessionConfig(
        session_id=session_id or secrets.token_hex(8),
        parties=[cels_pb2.NodeAddress(name=p, address=addresses.get(p, "")) for p in names],
        solver=cels_pb2.NodeAddress(name=solver, address=addresses.get(solver, "")),
        epsilon=epsilon,
        delta=delta,
        bound=bound,
        objective=objective,
        output_size=output_size,
        min_count=min_count,
        cap=cap,
        noise_epsilon=noise_epsilon,
        sensitivity=sensitivity,
        sampling=sampling,
        key_bits=key_bits,
        group_bits=group_bits,
        universe_cipher=universe_cipher,
        ell_ratio=ell_ratio,
        keep_user_ids=keep_user_ids,
        support=support,
        breakpoints=breakpoints,
        solver_time_limit=solver_time_limit,
        deadline_ms=deadline_ms,
        initiator=initiator or names[0],
        sampling_theta=sampling_theta,
    )
    sanitize_params(config).validate()
    return config


RoleFactory = Callable[[cels_pb2.SessionConfig], Role]


def party_factory(
    name: str, log: SearchLog | Callable[[], SearchLog], **options
) -> RoleFactory:
    """Roles for a party node: ``log`` (or a loader called at every session start)."""
    return lambda config: PartyRole(name, config, log, **options)


def solver_factory(name: str = SOLVER, **options) -> RoleFactory:
    return lambda config: SolverRole(name, config, **options)


class NodeHost:
    """One node's sessions: StartSession creates a role, other messages go to their session."""

    def __init__(self, name: str, make_role: RoleFactory) -> None:
        self.name = name
        self.make_role = make_role
        self.sessions: dict[str, Role] = {}

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        step = step_name(envelope)
        if step == "start_session":
            config = envelope.start_session.config
            if config.session_id != envelope.session_id:
                raise ProtocolError(ProtocolError.INVALID_ARGUMENT, "StartSession config names another session")
            if config.session_id in self.sessions:
                raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"session {config.session_id!r} exists already")
            try:
                self.sessions[config.session_id] = self.make_role(config)
            except ValueError as exc:
                raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: bad session config: {exc}") from None
            return []
        role = self.sessions.get(envelope.session_id)
        if role is None:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"{self.name}: unknown session {envelope.session_id!r}")
        return role.receive(sender, envelope)


class _AfterAbort:
    """In-memory stand-in for a gRPC error reply: once a node's session is aborted, messages
    still in flight to it are refused (the error goes back to a sender that is aborting too)."""

    def __init__(self, host: NodeHost) -> None:
        self.host = host
        self.refused: list[str] = []

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        try:
            return self.host.receive(sender, envelope)
        except ProtocolError as exc:
            role = self.host.sessions.get(envelope.session_id)
            if role is None or role.aborted is None:
                raise
            self.refused.append(str(exc))
            return []


def session_hosts(
    logs: Sequence[SearchLog | Callable[[], SearchLog]], config: cels_pb2.SessionConfig, **options
) -> dict[str, NodeHost]:
    """One host per node of ``config``: party k over ``logs[k]``, and the solver."""
    names = [p.name for p in config.parties]
    if len(logs) != len(names):
        raise ValueError(f"{len(logs)} logs for {len(names)} parties")
    hosts = {name: NodeHost(name, party_factory(name, log, **options)) for name, log in zip(names, logs)}
    hosts[config.solver.name] = NodeHost(config.solver.name, solver_factory(config.solver.name, **options))
    return hosts


def in_memory_network(hosts: dict) -> InMemoryNetwork:
    """An InMemoryNetwork over the hosts, refusing quietly what reaches an aborted session."""
    return InMemoryNetwork({n: _AfterAbort(host) for n, host in hosts.items()})


def start_session(network: InMemoryNetwork, config: cels_pb2.SessionConfig) -> dict[str, Role]:
    """Deliver StartSession to every node (the initiator last, so that every node knows the
    session before a step message is sent), then begin at the initiator and run to the end.
    Returns the session's role on every node."""
    initiator = config.initiator or config.parties[0].name
    start = cels_pb2.Envelope(
        session_id=config.session_id, sender=initiator, start_session=cels_pb2.StartSession(config=config)
    )
    order = [n for n in network.roles if n != initiator] + [initiator]
    network.run([(n, start) for n in order], sender=initiator)
    roles = {n: _host(network.roles[n]).sessions[config.session_id] for n in network.roles}
    network.run(roles[initiator].start(), sender=initiator)
    return roles


def _host(node) -> NodeHost:
    """The NodeHost inside delivery wrappers (each keeps the wrapped node as ``host``)."""
    while not isinstance(node, NodeHost):
        node = node.host
    return node


def run_session(
    logs: Sequence[SearchLog | Callable[[], SearchLog]],
    config: cels_pb2.SessionConfig,
    *,
    record_view: str | None = None,
    **options,
) -> tuple[SearchLog, dict]:
    """Run one session in memory: ``logs[k]`` is party k's log (or its loader); ``options``
    go to the roles (e.g. ``allow_insecure_key_bits=True`` in tests); ``record_view=DIR``
    records every node's view (cels.protocol.views).  Returns (output, report); raises
    RuntimeError naming the failing node and its reason if the session aborts.
    """
    hosts = session_hosts(logs, config, **options)
    if record_view is not None:
        from cels.protocol.views import record_hosts

        record_hosts(hosts, record_view)
    network = in_memory_network(hosts)
    started = time.perf_counter()
    roles = start_session(network, config)
    failed = [role.aborted for role in roles.values() if role.aborted is not None]
    if failed:
        raise RuntimeError(f"session aborted by {failed[0].origin}: {failed[0].reason}")
    lead = roles[config.initiator or config.parties[0].name]
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
