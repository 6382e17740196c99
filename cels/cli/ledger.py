"""``cels ledger --config party.toml``: a party node's privacy budget ledger (cels.node.ledger)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from cels.node.ledger import add_ledger_arguments

    parser = subparsers.add_parser(
        "ledger", description="Show a party node's privacy budget ledger (docs/site-rules.md, 'Privacy budget ledger')."
    )
    parser.add_argument("--config", type=Path, help="the party node's TOML file (its [node] name and [ledger] table)")
    add_ledger_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cels.node.config import load_toml
    from cels.node.ledger import ledger_policy, show
    from cels.node.schemas import PARTY_SCHEMA, SOLVER_SCHEMA, check_toml

    doc = load_toml(args.config) if args.config else {}
    if args.config:
        if "solver" in doc:
            check_toml(doc, args.config, SOLVER_SCHEMA)
            raise ValueError(f"{args.config} configures a solver node, which keeps no privacy budget ledger (it holds no data); give a party node's TOML")
        check_toml(doc, args.config, PARTY_SCHEMA)
    name = doc.get("node", {}).get("name", "")
    policy = ledger_policy(args, name, doc.get("ledger", {}))
    if policy is None:
        raise ValueError("no ledger: give --config party.toml or --ledger FILE")
    print(show(policy))
    return 0
