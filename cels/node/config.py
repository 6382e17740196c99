"""Node configuration: a TOML file, overridden by command-line flags.

```toml
[node]
name = "party-1"                 # the name in this node's certificate
listen = "127.0.0.1:7101"
deadline = 600.0                 # seconds, every RPC this node makes (sessions may set their own)
max_message_mib = 256            # the largest message a peer may send it (cels.node.framing)
insecure = false                 # plaintext gRPC: development only, prints a warning

[tls]
ca = "certs/ca.pem"
cert = "certs/party-1.pem"
key = "certs/party-1.key"

[peers]                          # every node this node may talk to: name -> host:port
solver = "127.0.0.1:7100"
party-2 = "127.0.0.1:7102"

[data]                           # party nodes: the private log, read at every session start
path = "logs/party-1.tsv"
format = "aol"                   # and columns / header / lenient / delimiter / encoding as `cels sanitize`

[solver]                         # solver nodes
time_limit = 20.0                # the most seconds the integer step gets (caps what a session asks)

[keys]                           # the offline phase (cels.node.keys)
session_keys = false             # true: a fresh Paillier key pair in every session
key_bits = 2048                  # bits of the node key made at start-up
obfuscators = 4096               # party nodes: obfuscators kept ready per peer key (0: none)
stock = { solver = 16384 }       # per key owner, overriding `obfuscators` (0: not stocked)
workers = 1                      # worker processes for obfuscators (default: half the cores)
nice = 10                        # their niceness increment (0: the node's own priority)

[ledger]                         # party nodes: the privacy budget ledger (cels.node.ledger)
path = "party-1.ledger.json"     # default: NAME.ledger.json beside this file
key = "keys/party-1.ledger.key"  # its MAC key, made at the first start (default: NAME.ledger.key beside it)
budget_epsilon = 8.0             # refuse a session that would take the window's total above this
budget_delta = 1.0
window_days = 30                 # sessions older than this no longer count (default: all)

[engine]                         # party nodes: where the local work runs (cels.engine; docs/ray.md)
kind = "ray"                     # "local" (default): in this process; "ray": on the party's own Ray cluster
address = "local"                # "local" starts a Ray instance; host:port joins a running cluster
shards = 4                       # user-shard actors P
max_in_flight = 8                # pair-work tasks at once

[policy]                         # party nodes: the sessions it joins (cels.node.policy; flags --policy-*)
initiators = ["party-1"]         # who may start a session with it (default: any peer)
solves = ["private"]             # "transformed" lets the solver rebuild every row: off unless listed
max_epsilon = 2.0                # ceilings (defaults 10 and 0.5)
max_delta = 1e-6

[metrics]                        # Prometheus metrics on a port of their own (off without this table)
listen = "127.0.0.1:9464"        # host:port, or a port alone (bound to 127.0.0.1)
```

The whole file is checked against its JSON schema (:mod:`cels.node.schemas`): an unknown
table or key, or a value of the wrong type or range, is an error naming the file, the table
and the key.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from cels.certs import controller_name
from cels.node.keys import DEFAULT_STOCK, KeyPolicy
from cels.node.schemas import NODE_SCHEMAS, check_toml
from cels.protocol.options import DEFAULT_DEADLINE

DEFAULT_MAX_MESSAGE_MIB = 256
"""Largest envelope a node reassembles by default (``[node] max_message_mib``): a peer cannot make
it buffer more for one message.  Measured (cels.node.framing; docs/faults.md, "How delivery works"): the
private solve and the DP release stream their steps in chunks of at most 0.5 MiB whatever the
input, and what grows with it is the secure union's hops (the release); the transformed solve's
hops are not chunked (26 MB each on the AOL slice) and grow with its rows times its pairs,
hence 256 MiB.  A site that runs streamed sessions only can set far less."""
MIN_KEY_BITS = 2048
DEFAULT_NICE = 10
"""Niceness increment of the obfuscator workers: an idle node fills its stock without
starving its host."""


def check_host_port(address: str, what: str) -> None:
    """ValueError naming ``what`` unless ``address`` is host:port with a port in 1..65535."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{what} {address!r} is not host:port with a port from 1 to 65535")


@dataclass
class NodeConfig:
    """Everything a node adapter needs besides its role."""

    name: str
    listen: str
    peers: dict[str, str]
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    insecure: bool = False
    deadline: float = DEFAULT_DEADLINE
    controllers: tuple[str, ...] = ()
    """The certificate names whose Run, status details and report stream this node serves
    (default: its own organisation's controller, ``controller-NAME``)."""
    min_key_bits: int = MIN_KEY_BITS
    max_message_mib: int = DEFAULT_MAX_MESSAGE_MIB
    """The largest message a peer may send this node (cels.node.framing)."""
    record_view: Path | None = None
    """Where every session's view of this node is recorded (cels.views), if anywhere."""
    keys: KeyPolicy = field(default_factory=KeyPolicy)
    """Node key and obfuscator stock (the offline phase)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The role-specific tables ([data] for a party, [solver] for the solver)."""
    ledger: dict[str, Any] = field(default_factory=dict)
    """A party's ``[ledger]`` table (cels.node.ledger)."""
    engine: dict[str, Any] = field(default_factory=dict)
    """A party's ``[engine]`` table (cels.engine)."""
    policy: dict[str, Any] = field(default_factory=dict)
    """A party's ``[policy]`` table (cels.node.policy)."""
    metrics_listen: str | None = None
    """host:port of the Prometheus metrics (cels.node.telemetry); None: no metrics port."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name missing (--name or [node] name)")
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
            from cels.node.telemetry import metrics_address  # prometheus_client: only with a metrics port

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


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every node takes (they override the TOML file)."""
    parser.add_argument("--config", type=Path, help="TOML node configuration")
    parser.add_argument("--name", help="this node's name (as in its certificate)")
    parser.add_argument("--listen", help="host:port to serve on")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=HOST:PORT", help="a peer node (repeatable)")
    parser.add_argument("--ca", type=Path, help="CA certificate (PEM) that signs every node")
    parser.add_argument("--cert", type=Path, help="this node's certificate (PEM)")
    parser.add_argument("--key", type=Path, help="this node's private key (PEM)")
    parser.add_argument("--controller", action="append", default=[], metavar="NAME",
                        help="a certificate name whose Run, status details and report stream this node serves (repeatable; "
                        "default: its own organisation's, controller-NAME)")  # fmt: skip
    parser.add_argument("--deadline", type=float, help=f"seconds for every RPC (default {DEFAULT_DEADLINE:g})")
    parser.add_argument("--insecure", action="store_true", default=None, help="no TLS (development only; prints a warning)")
    parser.add_argument(
        "--min-key-bits",
        type=int,
        help="smallest Paillier key a session may ask for (default 2048; lower only to reproduce the paper)",
    )
    parser.add_argument(
        "--max-message-mib", type=int, metavar="MIB",
        help=f"the largest message a peer may send this node, in MiB (default {DEFAULT_MAX_MESSAGE_MIB}; a larger release or the "
        "transformed solve at scale may need more: docs/faults.md, \"How delivery works\")",
    )  # fmt: skip
    parser.add_argument(
        "--record-view",
        type=Path,
        metavar="DIR",
        help="record every message this node receives and sends, and what it can decode (see `cels views DIR`)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (a port alone: 127.0.0.1; default: no metrics port)",
    )
    keys = parser.add_argument_group("keys and the offline phase")
    keys.add_argument("--session-keys", action="store_true", default=None, help="a fresh Paillier key pair in every session (no node key; nothing precomputed)")
    keys.add_argument("--node-key-bits", type=int, help="bits of the node key made at start-up (default 2048)")
    keys.add_argument(
        "--obfuscators",
        type=int,
        metavar="N",
        help=f"party nodes: obfuscators (encryptions of zero) kept ready per peer key while idle (default {DEFAULT_STOCK}; 0: none)",
    )
    keys.add_argument("--stock", action="append", default=[], metavar="NAME=N", help="stock size for one key owner (repeatable; 0: not stocked)")
    keys.add_argument("--obfuscator-workers", type=int, help="worker processes for obfuscators (default: half the cores, at least 1)")
    keys.add_argument(
        "--obfuscator-nice",
        type=int,
        metavar="N",
        help=f"niceness increment of the obfuscator workers (default {DEFAULT_NICE}: an idle node does not starve its host; 0: none)",
    )


def parse_peer(spec: str) -> tuple[str, str]:
    name, sep, address = spec.partition("=")
    if not sep or not name.strip() or not address.strip():
        raise ValueError(f"--peer {spec!r}: expected NAME=HOST:PORT")
    return name.strip(), address.strip()


def parse_stock(spec: str) -> tuple[str, int]:
    name, sep, count = spec.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        return name.strip(), int(count)
    except ValueError:
        raise ValueError(f"--stock {spec!r}: expected NAME=N (a node name and a count)") from None


def key_policy(args: argparse.Namespace, table: dict[str, Any]) -> KeyPolicy:
    """The ``[keys]`` table under the flags."""
    stock = {str(k): int(v) for k, v in table.get("stock", {}).items()}
    stock.update(parse_stock(spec) for spec in args.stock)

    def pick(flag: Any, key: str, default: Any) -> Any:
        return flag if flag is not None else table.get(key, default)

    return KeyPolicy(
        session_keys=bool(pick(args.session_keys, "session_keys", False)),
        key_bits=int(pick(args.node_key_bits, "key_bits", 2048)),
        stock=int(pick(args.obfuscators, "obfuscators", DEFAULT_STOCK)),
        stock_for=stock,
        workers=pick(args.obfuscator_workers, "workers", None),
        nice=int(pick(args.obfuscator_nice, "nice", DEFAULT_NICE)),
    )


def load_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML file; ValueError naming the file if it is missing or malformed."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"config file {path} is a directory") from None


def node_config(args: argparse.Namespace, role_table: str) -> NodeConfig:
    """Merge the TOML file (if any) and the flags; relative paths in the file are relative to it."""
    doc = load_toml(args.config) if args.config else {}
    check_toml(doc, args.config, NODE_SCHEMAS[role_table])
    base = args.config.resolve().parent if args.config else Path.cwd()
    node, tls = doc.get("node", {}), doc.get("tls", {})

    def path_of(flag: Path | None, key: str) -> Path | None:
        if flag is not None:
            return flag
        return base / tls[key] if key in tls else None

    peers = {str(k): str(v) for k, v in doc.get("peers", {}).items()}
    peers.update(parse_peer(spec) for spec in args.peer)
    return NodeConfig(
        name=args.name or node.get("name", ""),
        listen=args.listen or node.get("listen", ""),
        peers=peers,
        ca=path_of(args.ca, "ca"),
        cert=path_of(args.cert, "cert"),
        key=path_of(args.key, "key"),
        insecure=bool(args.insecure if args.insecure is not None else node.get("insecure", False)),
        deadline=float(args.deadline if args.deadline is not None else node.get("deadline", DEFAULT_DEADLINE)),
        controllers=tuple(args.controller or node.get("controllers", ())),
        min_key_bits=int(args.min_key_bits if args.min_key_bits is not None else node.get("min_key_bits", MIN_KEY_BITS)),
        max_message_mib=int(args.max_message_mib if args.max_message_mib is not None else node.get("max_message_mib", DEFAULT_MAX_MESSAGE_MIB)),
        record_view=args.record_view or (base / node["record_view"] if "record_view" in node else None),
        keys=key_policy(args, doc.get("keys", {})),
        extra={"base": base, **doc.get(role_table, {})},
        ledger=doc.get("ledger", {}),
        engine=doc.get("engine", {}),
        policy=doc.get("policy", {}),
        metrics_listen=args.metrics_listen or doc.get("metrics", {}).get("listen"),
    )


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """A party's private log and how to read it (the same input flags as ``cels sanitize``)."""
    parser.add_argument("--data", type=Path, help="the party's private log (read at every session start)")
    parser.add_argument("--format", help="log format: aol, msnbc, tsv, histogram, parquet (default aol)")
    parser.add_argument("--columns", help="tsv column mapping, e.g. user=1,query=2,url=4[,count=5]")
    parser.add_argument("--no-header", action="store_true", default=None, help="the tsv file has no header line")
    parser.add_argument("--delimiter", help="tsv field delimiter, one character (default tab)")
    parser.add_argument("--lenient", action="store_true", default=None, help="skip bad lines instead of failing")
    parser.add_argument("--encoding", help="the log's text encoding, e.g. latin-1 (default utf-8; bytes not valid in it abort the session)")


def data_source(args: argparse.Namespace, table: dict[str, Any]) -> tuple[Path, Any]:
    """The data file and its LoadOptions from the flags over the ``[data]`` table."""
    from cels.logs.formats import log_format
    from cels.logs.options import LoadOptions
    from cels.logs.textio import ENCODING

    base = table.get("base", Path.cwd())
    path = args.data if args.data is not None else (base / table["path"] if "path" in table else None)
    if path is None:
        raise ValueError("a party node needs its data file (--data or [data] path)")
    columns = args.columns if args.columns is not None else table.get("columns")
    if args.no_header:
        header: bool | None = False
    else:
        header = table.get("header")
    fmt = args.format or table.get("format", "aol")
    options = LoadOptions(
        format=fmt,
        columns=log_format(fmt).parse_columns(columns) if isinstance(columns, str) else columns,
        header=header,
        lenient=bool(args.lenient if args.lenient is not None else table.get("lenient", False)),
        delimiter=args.delimiter or table.get("delimiter", "\t"),
        encoding=args.encoding or table.get("encoding", ENCODING),
    )
    return Path(path), options
