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
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from cels.node.schemas import NODE_SCHEMAS, check_toml
from cels.logs.options import LoadOptions
from cels.node.settings import DataSource, KeyPolicy, NodeConfig
from cels.settings import add_arguments, given

def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every node takes (they override the TOML file), generated from the node's
    settings (cels.node.settings)."""
    parser.add_argument("--config", type=Path, help="TOML node configuration")
    add_arguments(parser, NodeConfig)
    add_arguments(parser.add_argument_group("keys and the offline phase"), KeyPolicy)


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
    values = given(NodeConfig, args, doc, base)
    if "state_dir" not in values and args.config is not None and values.get("name"):
        values["state_dir"] = base / f"{values['name']}.state"
    return NodeConfig(
        **values,
        keys=KeyPolicy(**given(KeyPolicy, args, doc)),
        extra={"base": base, **doc.get(role_table, {})},
        ledger=doc.get("ledger", {}),
        engine=doc.get("engine", {}),
        policy=doc.get("policy", {}),
    )


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """A party's private log and how to read it (the same input switches as ``cels sanitize``)."""
    add_arguments(parser, DataSource)


def data_source(args: argparse.Namespace, table: dict[str, Any]) -> tuple[Path, LoadOptions]:
    """The data file and its LoadOptions from the flags over the ``[data]`` table (its ``base``:
    the directory its relative path is read from)."""
    base = table.get("base", Path.cwd())
    source = DataSource(**given(DataSource, args, {"data": {k: v for k, v in table.items() if k != "base"}}, base))
    if source.path is None:
        raise ValueError("a party node needs its data file (--data or [data] path)")
    return Path(source.path), source.load_options()
