"""``cels-solver`` / ``python -m solver_node``: serve the CELS solver role P_0 over gRPC."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Sequence

from cels.node.config import add_node_arguments, node_config
from cels.node.keys import NodeKeys
from cels.node.process import serve
from cels.node.service import Node
from cels.node.tls import warn_insecure_keys
from cels.protocol.options import SessionOptions
from cels.protocol.solver import SolverRole


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cels-solver", description="Serve the CELS solver node (P_0) over gRPC with mutual TLS.")
    add_node_arguments(parser)
    parser.add_argument(
        "--solver-time-limit",
        type=float,
        help="the most seconds this solver gives the integer step; a session asking more gets this many ([solver] time_limit)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = node_config(args, "solver")
    except ValueError as exc:
        print(f"cels-solver: error: {exc}", file=sys.stderr)
        return 2
    max_time_limit = args.solver_time_limit if args.solver_time_limit is not None else config.extra.get("time_limit")
    allow_small = warn_insecure_keys(config)

    def factory(session: SessionOptions, keys: NodeKeys) -> SolverRole:
        return SolverRole(
            config.name,
            session,
            allow_insecure_key_bits=allow_small,
            keypair=keys.keypair_for(session.key_bits),
            decryption_pool=pool,
            max_time_limit=None if max_time_limit is None else float(max_time_limit),
        )

    # CRT decryptions of the transformed problem run on every core (Algorithm 2, the solver's step)
    with ProcessPoolExecutor(config.keys.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return serve(Node(config, factory))


if __name__ == "__main__":
    sys.exit(main())
