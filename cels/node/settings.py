"""A node's settings, declared once (cels.settings): its ``[node]``, ``[tls]``, ``[peers]``,
``[keys]`` and ``[metrics]`` tables and their flags (cels.node.config merges them; the TOML
schemas are generated from here: cels.node.schemas).  Plain data: nothing here opens a socket."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cels.certs import controller_name
from cels.crypto.key_sizes import DEFAULT_KEY_BITS, MIN_TEST_KEY_BITS
from cels.logs.formats import FORMATS, log_format
from cels.logs.options import LoadOptions
from cels.logs.textio import ENCODING
from cels.protocol.options import DEFAULT_DEADLINE
from cels.settings import setting

PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
"""A TCP port, 1..65535, as a regular expression."""
HOST_PORT = {"type": "string", "pattern": rf"^\S+:{PORT}$", "description": "host:port (a port from 1 to 65535)"}
POSITIVE = {"type": "number", "exclusiveMinimum": 0}
NAME = {"type": "string", "minLength": 1, "description": "a name (a non-empty string)"}
KEY_BITS = {"type": "integer", "minimum": MIN_TEST_KEY_BITS}


METRICS_HOST = "127.0.0.1"
"""Where the metrics port binds when ``[metrics] listen`` gives a port only."""


def metrics_address(listen: str) -> str:
    """``[metrics] listen`` as host:port: a port alone binds to 127.0.0.1 (ValueError if it is
    neither)."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        host, port = METRICS_HOST, listen
    if not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise ValueError(f"metrics listen address {listen!r} is not host:port or a port")
    return f"{host}:{port}"


def parse_peer(spec: str) -> tuple[str, str]:
    """``--peer NAME=HOST:PORT``."""
    name, sep, address = spec.partition("=")
    if not sep or not name.strip() or not address.strip():
        raise ValueError(f"--peer {spec!r}: expected NAME=HOST:PORT")
    return name.strip(), address.strip()


DEFAULT_STOCK = 4096
"""Obfuscators a party node keeps ready per peer key (about 2.2 MB per 2048-bit key)."""
DEFAULT_NICE = 10
"""Niceness increment of the obfuscator workers: an idle node fills its stock without
starving its host."""


def parse_stock(spec: str) -> tuple[str, int]:
    """``--stock NAME=N``: one key owner's stock size."""
    name, sep, count = spec.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        return name.strip(), int(count)
    except ValueError:
        raise ValueError(f"--stock {spec!r}: expected NAME=N (a node name and a count)") from None




@dataclass
class KeyPolicy:
    """How a node handles Paillier keys (``[keys]`` table / flags)."""

    session_keys: bool = setting(False, table="keys", key="session_keys", flag="--session-keys", schema={"type": "boolean"},
                                 help="a fresh Paillier key pair in every session (no node key; nothing precomputed)")
    """A fresh key pair in every session (nothing can be precomputed)."""
    key_bits: int = setting(DEFAULT_KEY_BITS, table="keys", key="key_bits", flag="--node-key-bits",
                            schema={"type": "integer", "minimum": MIN_TEST_KEY_BITS}, help="bits of the node key made at start-up")
    """Bits of the node key; sessions asking for another size get a fresh key pair."""
    stock: int = setting(DEFAULT_STOCK, table="keys", key="obfuscators", flag="--obfuscators", metavar="N", schema={"type": "integer", "minimum": 0},
                         help="party nodes: obfuscators (encryptions of zero) kept ready per peer key while idle (0: none)")
    """Obfuscators kept ready per stocked key (0: none; they are computed during the session)."""
    stock_for: dict[str, int] = setting(
        default_factory=dict, table="keys", key="stock", flag="--stock", metavar="NAME=N", repeat=True, item=parse_stock,
        schema={"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        help="stock size for one key owner, overriding --obfuscators (repeatable; 0: not stocked)",
    )
    """Per key owner (a peer's name or this node's): its own stock size, 0 = not stocked."""
    workers: int | None = setting(None, table="keys", key="workers", flag="--obfuscator-workers", schema={"type": "integer", "minimum": 1},
                                  help="worker processes for obfuscators", shown="half the cores, at least 1")
    """Worker processes for obfuscators (default: cels.node.keys.default_workers)."""
    nice: int = setting(DEFAULT_NICE, table="keys", key="nice", flag="--obfuscator-nice", metavar="N", schema={"type": "integer", "minimum": 0, "maximum": 19},
                        help="niceness increment of the obfuscator workers (an idle node does not starve its host; 0: none)")
    """Niceness increment of those workers (os.nice in each worker): the stock fills while
    the node is idle, and must not starve its host."""

    def __post_init__(self) -> None:
        if self.stock < 0 or any(v < 0 for v in self.stock_for.values()):
            raise ValueError("obfuscator stock sizes must be >= 0")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"obfuscator workers must be >= 1, got {self.workers}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"obfuscator nice must lie in 0..19, got {self.nice}")

    def target(self, owner: str) -> int:
        return self.stock_for.get(owner, self.stock)


DEFAULT_MAX_MESSAGE_MIB = 256
"""Largest envelope a node reassembles by default (``[node] max_message_mib``): a peer cannot make
it buffer more for one message.  Measured (cels.node.framing; docs/faults.md, "How delivery works"): the
private solve and the DP release stream their steps in chunks of at most 0.5 MiB whatever the
input, and what grows with it is the secure union's hops (the release); the transformed solve's
hops are not chunked (26 MB each on the AOL slice) and grow with its rows times its pairs,
hence 256 MiB.  A site that runs streamed sessions only can set far less."""
MIN_KEY_BITS = 2048


def check_host_port(address: str, what: str) -> None:
    """ValueError naming ``what`` unless ``address`` is host:port with a port in 1..65535."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{what} {address!r} is not host:port with a port from 1 to 65535")


@dataclass
class NodeConfig:
    """Everything a node adapter needs besides its role."""

    name: str = setting("", table="node", key="name", flag="--name", schema=NAME, help="this node's name (as in its certificate)")
    listen: str = setting("", table="node", key="listen", flag="--listen", schema=HOST_PORT, help="host:port to serve on")
    peers: dict[str, str] = setting(default_factory=dict, table="peers", key=None, flag="--peer", repeat=True, item=parse_peer,
                                    metavar="NAME=HOST:PORT", schema={"type": "object", "additionalProperties": HOST_PORT},
                                    help="a peer node (repeatable)")  # fmt: skip
    ca: Path | None = setting(None, table="tls", key="ca", flag="--ca", path=True, schema={"type": "string"}, help="CA certificate (PEM) that signs every node")
    cert: Path | None = setting(None, table="tls", key="cert", flag="--cert", path=True, schema={"type": "string"}, help="this node's certificate (PEM)")
    key: Path | None = setting(None, table="tls", key="key", flag="--key", path=True, schema={"type": "string"}, help="this node's private key (PEM)")
    insecure: bool = setting(False, table="node", key="insecure", flag="--insecure", schema={"type": "boolean"},
                             help="no TLS (development only; prints a warning)")
    deadline: float = setting(DEFAULT_DEADLINE, table="node", key="deadline", flag="--deadline", schema=POSITIVE, help="seconds for every RPC")
    controllers: tuple[str, ...] = setting(
        (), table="node", key="controllers", flag="--controller", repeat=True, metavar="NAME", schema={"type": "array", "items": NAME},
        help="a certificate name whose Run, status details and report stream this node serves (repeatable; "
        "default: its own organisation's, controller-NAME)",
    )
    """The certificate names whose Run, status details and report stream this node serves
    (default: its own organisation's controller, ``controller-NAME``)."""
    min_key_bits: int = setting(MIN_KEY_BITS, table="node", key="min_key_bits", flag="--min-key-bits", schema=KEY_BITS,
                                help="smallest Paillier key a session may ask for (lower only to reproduce the paper)")
    max_message_mib: int = setting(
        DEFAULT_MAX_MESSAGE_MIB, table="node", key="max_message_mib", flag="--max-message-mib", metavar="MIB",
        schema={"type": "integer", "minimum": 1, "maximum": 2047},
        help="the largest message a peer may send this node, in MiB (a larger release or the transformed solve at scale "
        "may need more: docs/faults.md, \"How delivery works\")",
    )
    """The largest message a peer may send this node (cels.node.framing)."""
    record_view: Path | None = setting(
        None, table="node", key="record_view", flag="--record-view", path=True, metavar="DIR", schema={"type": "string"},
        help="record every message this node receives and sends, and what it can decode (see `cels views DIR`)",
    )
    """Where every session's view of this node is recorded (cels.views), if anywhere."""
    state_dir: Path | None = setting(
        None, table="node", key="state_dir", flag="--state-dir", path=True, metavar="DIR", schema={"type": "string"},
        help="keep each unfinished session's keys here (mode 0700), so that a session a restart aborted can be resumed "
        "(cels run --resume)", shown="NAME.state beside --config; none without either",
    )
    """Where the node keeps its unfinished sessions' keys (cels.node.session_store), if anywhere."""
    keys: KeyPolicy = field(default_factory=KeyPolicy)
    """Node key and obfuscator stock (the offline phase: the ``[keys]`` table)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The role-specific tables ([data] for a party, [solver] for the solver)."""
    ledger: dict[str, Any] = field(default_factory=dict)
    """A party's ``[ledger]`` table (cels.node.ledger)."""
    engine: dict[str, Any] = field(default_factory=dict)
    """A party's ``[engine]`` table (cels.engine)."""
    policy: dict[str, Any] = field(default_factory=dict)
    """A party's ``[policy]`` table (cels.node.policy)."""
    metrics_listen: str | None = setting(
        None, table="metrics", key="listen", flag="--metrics-listen", metavar="HOST:PORT",
        schema={"type": "string", "description": "host:port, or a port alone (127.0.0.1)"},
        help="serve Prometheus metrics at http://HOST:PORT/metrics (a port alone: 127.0.0.1; default: no metrics port)",
    )
    """host:port of the Prometheus metrics (cels.node.telemetry); None: no metrics port."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name missing (--name or [node] name)")
        self.peers = {str(k): str(v) for k, v in self.peers.items()}
        self.controllers = tuple(self.controllers) or (controller_name(self.name),)
        check_host_port(self.listen, "listen address")
        if self.name in self.peers:
            raise ValueError(f"node {self.name!r} lists itself among its peers")
        for peer, address in self.peers.items():
            check_host_port(address, f"peer {peer}: address")
        if self.deadline <= 0:
            raise ValueError(f"deadline must be positive seconds, not {self.deadline}")
        if not 1 <= self.max_message_mib <= 2047:
            raise ValueError(f"max_message_mib must lie in 1..2047 (protobuf's 2 GiB limit), not {self.max_message_mib}")
        if self.metrics_listen is not None:
            self.metrics_listen = metrics_address(self.metrics_listen)
        if not self.insecure:
            missing = [n for n in ("ca", "cert", "key") if getattr(self, n) is None]
            if missing:
                raise ValueError(
                    f"mutual TLS needs {', '.join(missing)} ([tls] table or --ca/--cert/--key); "
                    "--insecure disables TLS for development"
                )
            for n in ("ca", "cert", "key"):
                if not Path(getattr(self, n)).is_file():
                    raise ValueError(f"[tls] {n} (--{n}): {getattr(self, n)} does not exist")
            from cels.node.tls import certificate_identity  # grpc: only once the node is configured

            try:
                identity = certificate_identity(Path(self.cert).read_bytes())
            except ValueError as exc:
                raise ValueError(f"cert file {self.cert} is no node certificate: {exc}") from None
            if identity.name != self.name:
                raise ValueError(f"cert file {self.cert} names {identity.name!r}, not this node {self.name!r}")
            if not identity.serves:
                raise ValueError(f"cert file {self.cert} lacks extended key usage serverAuth (a node serves its peers)")


COLUMNS = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "additionalProperties": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1}]}},
    ],
    "description": 'a column mapping: "user=1,query=2,url=4[,count=5]" or a table of column numbers (parquet: of column names)',
}
BOOLEAN = {"type": "boolean"}


@dataclass(frozen=True)
class DataSource:
    """A party's private log, read at every session start, and how to read it (``[data]``: the
    switches of ``cels sanitize``'s input, docs/formats.md)."""

    path: Path | None = setting(None, table="data", key="path", flag="--data", path=True, schema={"type": "string"},
                                help="the party's private log (read at every session start)")
    format: str = setting("aol", table="data", key="format", flag="--format", schema={"enum": list(FORMATS)}, help="log format")
    columns: str | dict[str, Any] | None = setting(None, table="data", key="columns", flag="--columns", schema=COLUMNS,
                                                   help="tsv column mapping, e.g. user=1,query=2,url=4[,count=5]")
    header: bool | None = setting(None, table="data", key="header", flag="--no-header", flag_value=False, schema=BOOLEAN,
                                  help="the tsv file has no header line", shown="detected")
    lenient: bool = setting(False, table="data", key="lenient", flag="--lenient", schema=BOOLEAN, help="skip bad lines instead of failing")
    delimiter: str = setting("\t", table="data", key="delimiter", flag="--delimiter", shown="tab", help="tsv field delimiter, one character",
                             schema={"type": "string", "minLength": 1, "maxLength": 1, "description": "one character"})
    encoding: str = setting(ENCODING, table="data", key="encoding", flag="--encoding", schema={"type": "string"},
                            help="the log's text encoding, e.g. latin-1 (bytes not valid in it abort the session)")

    def load_options(self) -> LoadOptions:
        """How the log is read (a columns string parsed by its format)."""
        columns = log_format(self.format).parse_columns(self.columns) if isinstance(self.columns, str) else self.columns
        return LoadOptions(format=self.format, columns=columns, header=self.header, lenient=bool(self.lenient), delimiter=self.delimiter, encoding=self.encoding)
