"""SessionOptions: one immutable value per session, resolved once with every default and check.

Every option of a session has exactly one default, here.  The command line (``cels simulate``,
``cels bench``), the session TOML (``cels run``) and the wire (``SessionConfig`` in the
StartSession message) meet at one conversion: :meth:`SessionOptions.create` builds the value
from keyword options, :meth:`SessionOptions.from_config` from a received SessionConfig (proto3
zeros and empty strings mean "the default"), :meth:`SessionOptions.to_config` writes every
resolved value back explicitly, so that every node of a session runs with the same resolved
options.  Roles, hosts and node adapters read the options and never default again.

The privacy bound b (CELS eq. 5 / EDBT Theorem 1, :func:`cels.mechanism.conditions.privacy_bound`)
is computed once here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from cels.crypto.groups import DEFAULT_GROUP_BITS
from cels.crypto.paillier import DEFAULT_KEY_BITS, MIN_TEST_KEY_BITS
from cels.mechanism.conditions import BOUNDS
from cels.mechanism.greedy import DEFAULT_BATCH
from cels.mechanism.sanitize import SanitizeParams
from cels.mechanism.solvers import DEFAULT_BREAKPOINTS, DEFAULT_SUPPORT, DEFAULT_TIME_LIMIT, OBJECTIVES
from cels.protocol.roles import MAX_SESSION_ID
from cels.protocol.wire import cels_pb2

SOLVER_NAME = "solver"
"""The solver node's name unless a session names another (certificates carry it)."""
SAMPLING_MODES = ("exact", "paper")
"""Phase 4: the exact distributed multinomial (docs/protocol.md) or the paper's local sampling."""
UNIVERSE_CIPHERS = ("x25519", "pohlig-hellman")
SOLVE_MODES = ("private", "transformed")
"""Phase 3: the masked greedy in which no constraint row leaves its party (default), or the
paper's Algorithm 2, in which the solver decrypts the transformed problem (docs/protocol.md)."""
"""Phase 1: the commutative hash of the pair ids (docs/protocol.md)."""
DEFAULT_THETA = 0.7
"""Exact sampling: a stage draws mu_i = theta * R_i trials of the R_i still missing."""
DEFAULT_ELL_RATIO = 1.5
"""Algorithm 2: the random matrix A has l >= ell_ratio * m rows (well-conditioned)."""
DEFAULT_DEADLINE = 600.0
"""Seconds every node gives one protocol call of the session, and the watchdog's patience."""


def party_names(r: int) -> list[str]:
    """Node names of a session's parties in ring order: party-1 .. party-r."""
    return [f"party-{k}" for k in range(1, r + 1)]


@dataclass(frozen=True)
class SessionOptions:
    """A session's public parameters, resolved (docs/protocol.md, "Session options")."""

    session_id: str
    parties: tuple[str, ...]
    epsilon: float
    delta: float
    solver: str = SOLVER_NAME
    initiator: str = ""
    addresses: tuple[tuple[str, str], ...] = ()
    bound: str = "cels"
    objective: str = "kl"
    output_size: float | None = None
    min_count: int = 0
    cap: int | None = None
    noise_epsilon: float | None = None
    sensitivity: float | None = None
    sampling: str = "exact"
    sampling_theta: float = DEFAULT_THETA
    key_bits: int = DEFAULT_KEY_BITS
    group_bits: int = DEFAULT_GROUP_BITS
    universe_cipher: str = "x25519"
    ell_ratio: float = DEFAULT_ELL_RATIO
    keep_user_ids: bool = False
    support: float = DEFAULT_SUPPORT
    breakpoints: int = DEFAULT_BREAKPOINTS
    solver_time_limit: float = DEFAULT_TIME_LIMIT
    deadline: float = DEFAULT_DEADLINE
    solve: str = "private"
    round_batch: int = DEFAULT_BATCH
    b: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < len(self.session_id) <= MAX_SESSION_ID or not self.session_id.isprintable():
            raise ValueError(f"a session id is 1 to {MAX_SESSION_ID} printable characters")
        if not self.initiator:
            object.__setattr__(self, "initiator", self.parties[0] if self.parties else "")
        object.__setattr__(self, "parties", tuple(self.parties))
        object.__setattr__(self, "addresses", tuple(sorted(dict(self.addresses).items())))
        nodes = [*self.parties, self.solver]
        if len(self.parties) < 2:
            raise ValueError(f"a session needs at least two parties, got {len(self.parties)}")
        if len(set(nodes)) != len(nodes) or not all(nodes):
            raise ValueError(f"node names must be distinct and non-empty: {nodes}")
        if self.initiator not in self.parties:
            raise ValueError(f"initiator {self.initiator!r} is not a party of the session")
        _one_of("bound", self.bound, BOUNDS)
        _one_of("objective", self.objective, OBJECTIVES)
        _one_of("sampling", self.sampling, SAMPLING_MODES)
        _one_of("universe_cipher", self.universe_cipher, UNIVERSE_CIPHERS)
        _one_of("solve", self.solve, SOLVE_MODES)
        if self.round_batch < 1:
            raise ValueError(f"round_batch must be >= 1, got {self.round_batch}")
        if self.solve == "private" and self.output_size is not None and self.output_size <= 1:
            raise ValueError(
                f"output_size {self.output_size:g} is a share of the LP bound, which no node can compute in the "
                "private solve: give an absolute size (> 1), or --solve transformed"
            )
        if self.key_bits < MIN_TEST_KEY_BITS or self.key_bits % 2:
            raise ValueError(f"key_bits must be even and >= {MIN_TEST_KEY_BITS}, got {self.key_bits}")
        if not 0 < self.sampling_theta < 1:
            raise ValueError(f"sampling_theta must be in (0, 1), got {self.sampling_theta}")
        if self.ell_ratio < 1:
            raise ValueError(f"ell_ratio must be >= 1, got {self.ell_ratio}")
        if self.deadline <= 0 or self.solver_time_limit <= 0 or self.breakpoints < 1 or self.support <= 0:
            raise ValueError("deadline, solver_time_limit, breakpoints and support must be positive")
        if self.output_size is not None and self.output_size <= 0:
            raise ValueError(f"output_size must be positive, got {self.output_size}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"cap must be >= 1, got {self.cap}")
        object.__setattr__(self, "b", self.params.validate())

    # -- derived values ------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node of the session: the parties in ring order, then the solver."""
        return (*self.parties, self.solver)

    @property
    def params(self) -> SanitizeParams:
        """The mechanism's parameters (the same as ``cels sanitize`` with these flags)."""
        return SanitizeParams(
            epsilon=self.epsilon,
            delta=self.delta,
            bound=self.bound,
            objective=self.objective,
            output_size=self.output_size,
            min_count=self.min_count,
            cap=self.cap,
            noise_epsilon=self.noise_epsilon,
            sensitivity=self.sensitivity,
            keep_user_ids=self.keep_user_ids,
            breakpoints=self.breakpoints,
            support=self.support,
            time_limit=self.solver_time_limit,
        )

    def address(self, node: str) -> str:
        return dict(self.addresses).get(node, "")

    # -- the one conversion ----------------------------------------------------------------
    @classmethod
    def create(
        cls,
        parties: int | Sequence[str],
        *,
        session_id: str | None = None,
        addresses: Mapping[str, str] | None = None,
        initiator: str | None = None,
        **options: Any,
    ) -> SessionOptions:
        """A new session's options: ``parties`` is r (named party-1 .. party-r) or the names in
        ring order; ``options`` are the fields above (None = the default)."""
        names = party_names(parties) if isinstance(parties, int) else list(parties)
        known = {f.name for f in fields(cls)} - {"b", "session_id", "parties", "addresses", "initiator"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown session option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        given = {k: v for k, v in options.items() if v is not None}
        return cls(
            session_id=session_id or secrets.token_hex(8),
            parties=tuple(names),
            addresses=tuple((addresses or {}).items()),
            initiator=initiator or "",
            **given,
        )

    @classmethod
    def from_config(cls, config: cels_pb2.SessionConfig) -> SessionOptions:
        """The options a received SessionConfig asks for (0 / "" = the default).  ValueError
        names what is wrong."""
        if config.epsilon <= 0 or config.delta <= 0:
            raise ValueError("a session needs epsilon > 0 and delta > 0")
        nodes = [*config.parties, config.solver]
        optional = {
            "solver": config.solver.name,
            "initiator": config.initiator,
            "bound": config.bound,
            "objective": config.objective,
            "output_size": config.output_size,
            "min_count": config.min_count,
            "cap": config.cap,
            "noise_epsilon": config.noise_epsilon,
            "sensitivity": config.sensitivity,
            "sampling": config.sampling,
            "sampling_theta": config.sampling_theta,
            "key_bits": config.key_bits,
            "group_bits": config.group_bits,
            "universe_cipher": config.universe_cipher,
            "ell_ratio": config.ell_ratio,
            "keep_user_ids": config.keep_user_ids,
            "support": config.support,
            "breakpoints": config.breakpoints,
            "solver_time_limit": config.solver_time_limit,
            "deadline": config.deadline_ms / 1000,
            "solve": config.solve,
            "round_batch": config.round_batch,
        }
        return cls(
            session_id=config.session_id,
            parties=tuple(p.name for p in config.parties),
            epsilon=config.epsilon,
            delta=config.delta,
            addresses=tuple((n.name, n.address) for n in nodes if n.address),
            **{k: v for k, v in optional.items() if v},
        )

    def to_config(self) -> cels_pb2.SessionConfig:
        """Every resolved value, explicitly (None -> 0: "none" for cap, output size, noise)."""
        return cels_pb2.SessionConfig(
            session_id=self.session_id,
            parties=[cels_pb2.NodeAddress(name=p, address=self.address(p)) for p in self.parties],
            solver=cels_pb2.NodeAddress(name=self.solver, address=self.address(self.solver)),
            epsilon=self.epsilon,
            delta=self.delta,
            bound=self.bound,
            objective=self.objective,
            output_size=self.output_size or 0.0,
            min_count=self.min_count,
            cap=self.cap or 0,
            noise_epsilon=self.noise_epsilon or 0.0,
            sensitivity=self.sensitivity or 0.0,
            sampling=self.sampling,
            key_bits=self.key_bits,
            group_bits=self.group_bits,
            universe_cipher=self.universe_cipher,
            ell_ratio=self.ell_ratio,
            keep_user_ids=self.keep_user_ids,
            support=self.support,
            breakpoints=self.breakpoints,
            solver_time_limit=self.solver_time_limit,
            deadline_ms=round(self.deadline * 1000),
            initiator=self.initiator,
            sampling_theta=self.sampling_theta,
            solve=self.solve,
            round_batch=self.round_batch,
        )

    def with_addresses(self, addresses: Mapping[str, str]) -> SessionOptions:
        """The same session with the nodes' addresses (``cels run`` / ``cels simulate``)."""
        return replace(self, addresses=tuple(addresses.items()))


def mechanism_options(params: SanitizeParams) -> dict[str, Any]:
    """The SessionOptions fields of ``cels sanitize``'s parameters (the inverse of
    :attr:`SessionOptions.params`; the single-holder-only ones stay out)."""
    return {
        "epsilon": params.epsilon,
        "delta": params.delta,
        "bound": params.bound,
        "objective": params.objective,
        "output_size": params.output_size,
        "min_count": params.min_count,
        "cap": params.cap,
        "noise_epsilon": params.noise_epsilon,
        "sensitivity": params.sensitivity,
        "keep_user_ids": params.keep_user_ids,
        "breakpoints": params.breakpoints,
        "support": params.support,
        "solver_time_limit": params.time_limit,
    }


def _one_of(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
