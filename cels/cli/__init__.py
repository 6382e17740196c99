"""The ``cels`` command line: one subcommand module per capability.

Each module in :data:`SUBCOMMANDS` exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

SUBCOMMANDS = (
    "cels.cli.demo",
    "cels.cli.sanitize",
    "cels.cli.params",
    "cels.cli.bench",
    "cels.cli.experiment",
    "cels.cli.service",
    "cels.cli.views",
    "cels.cli.attack",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cels", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("cels: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # bad input or parameters: one clear line, no traceback
        print(f"cels {args.command}: error: {exc}", file=sys.stderr)
        return 2
