"""SessionOptions: one immutable value per session, resolved once with every default and check.

Every option of a session is declared once, here: a field of :class:`SessionOptions` whose
:func:`option` entry holds its default, its meaning, its command-line flag, its range and its
field in the ``SessionConfig`` proto.  :data:`OPTIONS` is that table, and every conversion reads
it: :meth:`SessionOptions.create` (keyword options), :meth:`SessionOptions.from_config` /
:meth:`SessionOptions.to_config` (the wire: proto3 zeros and empty strings mean "the default";
every resolved value goes out explicitly, so that every node of a session runs with the same
options), the ``[session]`` table's schema (cels.node.schemas), the flags of ``cels simulate``,
``cels bench protocol`` and ``cels sanitize`` (cels.cli.options) and the mechanism's
:class:`SanitizeParams` (:attr:`SessionOptions.params`, :func:`mechanism_options`).  Adding an
option is one field here plus its proto field.  Roles, hosts and node adapters read the options
and never default again.

The privacy bound b (CELS eq. 5 / EDBT Theorem 1, :func:`cels.mechanism.conditions.privacy_bound`)
is computed once here.
"""

from __future__ import annotations

import hashlib
import operator
import secrets
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from cels.crypto.groups import DEFAULT_GROUP_BITS, group_for_bits
from cels.crypto.key_sizes import DEFAULT_KEY_BITS, MIN_TEST_KEY_BITS
from cels.mechanism.defaults import BOUNDS, DEFAULT_BATCH, DEFAULT_BREAKPOINTS, DEFAULT_SUPPORT, DEFAULT_THETA, DEFAULT_TIME_LIMIT, OBJECTIVES
from cels.protocol.roles import MAX_SESSION_ID
from cels.protocol.releases import KINDS, ReleaseKind
from cels.protocol.wire import cels_pb2

if TYPE_CHECKING:  # imported where used: the flags and schemas come from this module without numpy or scipy
    from cels.mechanism.item_kinds import ItemKinds
    from cels.mechanism.sanitize import SanitizeParams

SOLVER_NAME = "solver"
"""The solver node's name unless a session names another (certificates carry it)."""
SAMPLING_MODES = ("exact", "paper")
"""Phase 4: the exact distributed multinomial (docs/protocol.md) or the paper's local sampling."""
UNIVERSE_CIPHERS = ("x25519", "pohlig-hellman")
"""Phase 1: the commutative hash of the pair ids (docs/protocol.md)."""
SOLVE_MODES = ("private", "transformed")
"""Phase 3: the masked greedy in which no constraint row leaves its party (default), or the
paper's Algorithm 2, in which the solver decrypts the transformed problem (docs/protocol.md)."""
RELEASES = tuple(KINDS)
"""What a session publishes (docs/releases.md): one release kind each (cels.protocol.releases)."""
DEFAULT_PADDING_EPSILON = 0.1
"""The DP release: epsilon of each id set's padding, which only the nodes see (docs/releases.md)."""
DEFAULT_ELL_RATIO = 1.5
"""Algorithm 2: the random matrix A has l >= ell_ratio * m rows (well-conditioned)."""
DEFAULT_DEADLINE = 600.0
"""Seconds every node gives one protocol call of the session, and the watchdog's patience."""
DEFAULT_APPROVAL_WAIT = 3600.0
"""An hour for a party's operator to answer (``cels approve``)."""
NODES = None
""":attr:`Option.wire` of the fields that are the session's nodes and their addresses
(``parties``, ``solver``, ``addresses``): the SessionConfig's NodeAddress messages."""
NUMBER_BOUNDS = {"minimum": (">=", operator.ge), "exclusiveMinimum": (">", operator.gt), "maximum": ("<=", operator.le),
                 "exclusiveMaximum": ("<", operator.lt)}  # fmt: skip
"""The JSON-schema keywords of :attr:`Option.bounds` that :class:`SessionOptions` checks itself."""


@dataclass(frozen=True)
class Option:
    """One session option, declared once (a field's ``metadata``; :data:`OPTIONS` lists them)."""

    help: str
    """What it is, for ``--help`` and docs (the default is added where it is shown)."""
    flag: str | None = None
    """Its flag in ``cels simulate`` / ``cels bench protocol`` (and ``cels sanitize`` when
    ``mechanism``); None: not on the command line."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    bounds: Mapping[str, float] = field(default_factory=dict)
    """Its range as JSON-schema keywords (``minimum``, ``exclusiveMinimum``, ``maximum``,
    ``exclusiveMaximum``, ``multipleOf``, ``minLength``, ``maxLength``, ``minItems``): the TOML
    schema's, and for numbers the check of :class:`SessionOptions`."""
    wire: str | None = ""
    """Its SessionConfig field ("" = the same name; :data:`NODES` = a NodeAddress)."""
    wire_scale: int = 1
    """The wire carries ``round(value * wire_scale)`` (deadline: seconds as milliseconds)."""
    toml: bool = True
    """A key of session.toml's ``[session]`` table (the initiator is ``[run]``'s)."""
    mechanism: bool = False
    """A parameter of the mechanism: the :class:`SanitizeParams` field of the same name."""
    holder: bool = False
    """A flag of ``cels sanitize`` too (one holder), though no :class:`SanitizeParams` field."""
    name: str = ""
    kind: type = object
    """The value's type (``int``, ``float``, ``str``, ``bool`` or ``tuple``; None: its default
    "none" where the field allows it)."""
    default: Any = None
    required: bool = False

    @property
    def proto_field(self) -> str:
        return self.wire or self.name


def option(default: Any = ..., help: str = "", **declaration: Any) -> Any:
    """A SessionOptions field and its :class:`Option` (``default`` left out: required)."""
    metadata = {"option": Option(help, **declaration)}
    return field(metadata=metadata) if default is ... else field(default=default, metadata=metadata)


def party_names(r: int) -> list[str]:
    """Node names of a session's parties in ring order: party-1 .. party-r."""
    return [f"party-{k}" for k in range(1, r + 1)]


@dataclass(frozen=True)
class SessionOptions:
    """A session's public parameters, resolved (docs/protocol.md, "Session options")."""

    parties: tuple[str, ...] = option(help="the parties' node names in ring order P_1 .. P_r", wire=NODES, bounds={"minItems": 2})
    session_id: str = option(help="the session's id", bounds={"minLength": 1, "maxLength": MAX_SESSION_ID})
    epsilon: float = option(
        help="epsilon of the sampling's probabilistic DP (docs/mechanism.md)", flag="--epsilon", bounds={"exclusiveMinimum": 0},
        mechanism=True,
    )  # fmt: skip
    delta: float = option(
        help="per-user probability that the output holds one of the user's records (not approximate DP's delta << 1/n)",
        flag="--delta", bounds={"exclusiveMinimum": 0, "exclusiveMaximum": 1}, mechanism=True,
    )  # fmt: skip
    solver: str = option(SOLVER_NAME, "the solver's node name", wire=NODES, bounds={"minLength": 1})
    initiator: str = option("", "the party that starts the session and gets the output (default: P_1)", toml=False)
    addresses: tuple[tuple[str, str], ...] = option((), "node name -> host:port", wire=NODES, toml=False)
    bound: str = option(
        "cels", "b = min{eps/2 (cels) or eps (edbt), ln 1/(1-delta)}", flag="--bound", choices=BOUNDS, mechanism=True
    )  # fmt: skip
    objective: str = option("kl", "utility to optimise", flag="--objective", choices=OBJECTIVES, mechanism=True)
    output_size: float | None = option(
        None, "|O|: F <= 1 a fraction of the maximum, F > 1 a count (default 0.5 of the LP bound; the private solve: as many as fit)",
        flag="--output-size", metavar="F", bounds={"exclusiveMinimum": 0}, mechanism=True,
    )  # fmt: skip
    min_count: int = option(
        0, "drop pairs with total count < N (CELS cleans with 20)", flag="--min-count", metavar="N", bounds={"minimum": 0}, mechanism=True
    )  # fmt: skip
    cap: int | None = option(
        None, "per-user cap c_ij <- min(c_ij, K), applied first", flag="--cap", metavar="K", bounds={"minimum": 1}, mechanism=True
    )  # fmt: skip
    noise_epsilon: float | None = option(
        None, "add discrete Lap(d/E') to the counts before the repair (CELS 3.3); no end-to-end bound is claimed: the repair reads "
        "the data (docs/security.md)", flag="--noise-epsilon", metavar="E'", bounds={"exclusiveMinimum": 0}, mechanism=True,
    )  # fmt: skip
    sensitivity: float | None = option(
        None, "L1 sensitivity d of the counts (assumed; --preprocess enforces it)", flag="--sensitivity", metavar="d",
        bounds={"exclusiveMinimum": 0}, mechanism=True,
    )  # fmt: skip
    sampling: str = option(
        "exact", "phase 4: the exact distributed multinomial or the paper's local sampling", flag="--sampling", choices=SAMPLING_MODES
    )  # fmt: skip
    sampling_theta: float = option(
        DEFAULT_THETA, "exact sampling: a stage draws theta * R_i trials", bounds={"exclusiveMinimum": 0, "exclusiveMaximum": 1}
    )  # fmt: skip
    key_bits: int = option(
        DEFAULT_KEY_BITS, f"Paillier key bits (below {DEFAULT_KEY_BITS} only to reproduce the paper: 512/1024)", flag="--key-bits",
        bounds={"minimum": MIN_TEST_KEY_BITS, "multipleOf": 2},
    )  # fmt: skip
    group_bits: int = option(DEFAULT_GROUP_BITS, "Pohlig-Hellman group bits", bounds={"minimum": 1})
    universe_cipher: str = option(
        "x25519", "commutative hash of the universe phase", flag="--universe-cipher", choices=UNIVERSE_CIPHERS
    )  # fmt: skip
    ell_ratio: float = option(DEFAULT_ELL_RATIO, "Algorithm 2: l >= ell_ratio * m rows of A", bounds={"minimum": 1})
    keep_user_ids: bool = option(
        False, "keep the input user ids (default: fresh pseudonyms)", flag="--keep-user-ids", mechanism=True
    )  # fmt: skip
    support: float = option(
        DEFAULT_SUPPORT, "frequent: minimum support", flag="--support", metavar="s", bounds={"exclusiveMinimum": 0}, mechanism=True
    )  # fmt: skip
    breakpoints: int = option(
        DEFAULT_BREAKPOINTS, "kl: breakpoints per variable", flag="--breakpoints", metavar="K", bounds={"minimum": 1}, mechanism=True
    )  # fmt: skip
    time_limit: float = option(
        DEFAULT_TIME_LIMIT, "MIP time limit in seconds (a solver node's [solver] time_limit caps it)", flag="--time-limit",
        metavar="SEC", bounds={"exclusiveMinimum": 0}, mechanism=True,
    )  # fmt: skip
    deadline: float = option(
        DEFAULT_DEADLINE, "seconds for every RPC", flag="--deadline", bounds={"exclusiveMinimum": 0}, wire="deadline_ms", wire_scale=1000
    )  # fmt: skip
    approval_wait: float = option(
        DEFAULT_APPROVAL_WAIT, "seconds the session waits for the parties whose operators approve sessions by hand (a party's "
        "policy approve = manual; docs/site-rules.md, \"Approval by a person\"); 0: it waits for nobody",
        flag="--approval-wait", metavar="SEC", bounds={"minimum": 0},
    )  # fmt: skip
    solve: str = option(
        "private", "phase 3: private, a masked greedy, no constraint row leaves its party; transformed, the paper's Algorithm 2, "
        "in which the solver node can rebuild every row (SECURITY.md)", flag="--solve", choices=SOLVE_MODES,
    )  # fmt: skip
    round_batch: int = option(
        DEFAULT_BATCH, "private solve: proposals per round", flag="--round-batch", metavar="B", bounds={"minimum": 1}
    )  # fmt: skip
    release: str = option(
        "sampled", "what the session publishes: " + "; ".join(f"{k.name}, {k.help}" for k in KINDS.values()) + " (docs/releases.md)",
        flag="--release", choices=RELEASES, holder=True,
    )  # fmt: skip
    max_items_per_user: int = option(
        1, "dp release: Delta_0, the distinct items of each kind a user keeps (chosen at random at its party)",
        flag="--max-items-per-user", metavar="D0", bounds={"minimum": 1}, holder=True,
    )  # fmt: skip
    items: str = option(
        "pairs", "dp release: the item kinds counted, comma-separated, each KIND or KIND:D0 (its own bound; default "
        "--max-items-per-user): pairs (query-url), queries, query-pairs (consecutive queries); each kind's share of epsilon "
        "is its bound over the sum of the bounds (docs/releases.md)", flag="--items", metavar="KINDS", holder=True,
    )  # fmt: skip
    collusion: int = option(
        1, "dp release: t, the parties an observer may pool (itself included): the noise shares it does not know add up to "
        "the full discrete Laplace; 0 for recipients only", flag="--collusion", metavar="T", bounds={"minimum": 0},
    )  # fmt: skip
    padding_epsilon: float = option(
        DEFAULT_PADDING_EPSILON, "dp release: epsilon of the dummy ids that pad each id set (seen by the nodes only)",
        flag="--padding-epsilon", metavar="E", bounds={"exclusiveMinimum": 0},
    )  # fmt: skip
    resume: bool = option(
        False, "a re-run of a session that a node restart aborted: every node replays what it took, with the keys it kept, "
        "and goes on from there (cels run --resume; docs/deployment.md, \"Resume after a node restart\")", toml=False,
    )  # fmt: skip
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
        for declared in OPTIONS:
            _check(declared, getattr(self, declared.name))
        if self.solve == "private" and self.output_size is not None and self.output_size <= 1:
            raise ValueError(
                f"output_size {self.output_size:g} is a share of the LP bound, which no node can compute in the "
                "private solve: give an absolute size (> 1), or --solve transformed"
            )
        self.item_kinds  # noqa: B018 -- a bad --items is refused in one line, whatever the release
        group_for_bits(self.group_bits, allow_paper_bits=True)  # an offered group (the nodes refuse the paper's 1024 unless allowed)
        self.release_kind.check(self)
        if self.resume and not self.replayable:
            raise ValueError("a session that solves with 'transformed' cannot be resumed: its Paillier randomness is not replayed (docs/crypto.md, Randomness)")
        object.__setattr__(self, "b", self.params.validate())

    # -- derived values ------------------------------------------------------------------
    @property
    def release_kind(self) -> ReleaseKind:
        """What the session publishes (cels.protocol.releases)."""
        return KINDS[self.release]

    @property
    def item_kinds(self) -> ItemKinds:
        """The DP release's item kinds and their bounds (``items`` and ``max_items_per_user``)."""
        from cels.mechanism.item_kinds import ItemKinds

        return ItemKinds.parse(self.items, self.max_items_per_user)

    @property
    def replayable(self) -> bool:
        """Whether every message of the session is a function of its nodes' draw keys, so that a
        re-run sends the same bytes (all but Algorithm 2's Paillier sums: docs/crypto.md, Randomness)."""
        return not (self.release_kind.solves and self.solve == "transformed")

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node of the session: the parties in ring order, then the solver."""
        return (*self.parties, self.solver)

    @property
    def params(self) -> SanitizeParams:
        """The mechanism's parameters (the same as ``cels sanitize`` with these flags)."""
        from cels.mechanism.sanitize import SanitizeParams

        return SanitizeParams(**{o.name: getattr(self, o.name) for o in OPTIONS if o.mechanism})

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
        known = {o.name for o in OPTIONS} - {"session_id", "parties", "addresses", "initiator"}
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
        given = {}
        for declared in OPTIONS:
            if declared.wire is NODES:
                continue
            value = getattr(config, declared.proto_field)
            if declared.required and declared.kind in (int, float) and not value > 0:
                raise ValueError(f"a session needs {declared.name} > 0")
            if value or declared.required or _present(config, declared.proto_field):
                given[declared.name] = value / declared.wire_scale if declared.wire_scale != 1 else value
        nodes = [*config.parties, config.solver]
        return cls(
            parties=tuple(p.name for p in config.parties),
            addresses=tuple((n.name, n.address) for n in nodes if n.address),
            **({"solver": config.solver.name} if config.solver.name else {}),
            **given,
        )

    def to_config(self) -> cels_pb2.SessionConfig:
        """Every resolved value, explicitly (None -> 0: "none" for cap, output size, noise)."""
        values = {}
        for declared in OPTIONS:
            value = getattr(self, declared.name)
            if declared.wire is not NODES and value is not None:
                values[declared.proto_field] = round(value * declared.wire_scale) if declared.wire_scale != 1 else value
        return cels_pb2.SessionConfig(
            parties=[cels_pb2.NodeAddress(name=p, address=self.address(p)) for p in self.parties],
            solver=cels_pb2.NodeAddress(name=self.solver, address=self.address(self.solver)),
            **values,
        )

    def digest(self) -> str:
        """SHA-256 of the session's parameters (its wire config, deterministic), the nodes'
        addresses and ``resume`` left out: what a re-run must ask again, unchanged."""
        config = replace(self, addresses=(), resume=False).to_config()
        return hashlib.sha256(config.SerializeToString(deterministic=True)).hexdigest()

    def with_addresses(self, addresses: Mapping[str, str]) -> SessionOptions:
        """The same session with the nodes' addresses (``cels run`` / ``cels simulate``)."""
        return replace(self, addresses=tuple(addresses.items()))


def _declared(session_field: Field[Any], hint: Any) -> Option:
    """A field's :class:`Option` with its name, type, default and whether it is required."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
    base = next((a for a in args if a is not type(None)), hint)
    required = session_field.default is MISSING
    return replace(
        session_field.metadata["option"], name=session_field.name, kind=typing.get_origin(base) or base,
        default=None if required else session_field.default, required=required,
    )  # fmt: skip


_HINTS = typing.get_type_hints(SessionOptions)
OPTIONS: tuple[Option, ...] = tuple(_declared(f, _HINTS[f.name]) for f in fields(SessionOptions) if "option" in f.metadata)
"""Every session option, in SessionOptions' field order: the one table the conversions read."""
OPTION = {o.name: o for o in OPTIONS}


def _present(config: cels_pb2.SessionConfig, name: str) -> bool:
    """A proto3 ``optional`` field that was set (its 0 is a value, not "the default")."""
    descriptor = config.DESCRIPTOR.fields_by_name[name]
    return descriptor.has_presence and config.HasField(name)


def mechanism_options(params: SanitizeParams) -> dict[str, Any]:
    """The SessionOptions fields of ``cels sanitize``'s parameters (the inverse of
    :attr:`SessionOptions.params`; the single-holder-only ones stay out)."""
    return {o.name: getattr(params, o.name) for o in OPTIONS if o.mechanism}


def _check(declared: Option, value: Any) -> None:
    """ValueError naming the option unless ``value`` is one of its choices and within its bounds."""
    if declared.choices is not None and value not in declared.choices:
        raise ValueError(f"{declared.name} must be one of {', '.join(declared.choices)}; got {value!r}")
    if value is None or declared.kind not in (int, float):
        return
    bounds = declared.bounds
    step = bounds.get("multipleOf")
    if any(not holds(value, bounds[k]) for k, (_, holds) in NUMBER_BOUNDS.items() if k in bounds) or (step and value % step):
        said = ([] if step is None else ["even" if step == 2 else f"a multiple of {step:g}"]) + [
            f"{relation} {bounds[k]:g}" for k, (relation, _) in NUMBER_BOUNDS.items() if k in bounds
        ]
        raise ValueError(f"{declared.name} must be {' and '.join(said)}, got {value!r}")


def sampled_spends(options: SessionOptions) -> tuple[float, float, float]:
    """(eps, delta, eps') a sampled-release session spends in a party's ledger (cels.protocol.releases;
    eps' = 0 without noise on the counts)."""
    return float(options.epsilon), float(options.delta), float(options.noise_epsilon or 0.0)
