"""``cels-solver`` / ``python -m solver_node``: serve the CELS solver role P_0 over gRPC.

Exit codes: see :mod:`cels.node.process` (0 stopped, 1 cannot serve, 2 bad configuration,
130 interrupted during start-up).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cels.node.process import node_main, node_parser


def build_parser():
    """The flags of ``cels-solver``."""
    parser = node_parser("cels-solver", "Serve the CELS solver node (P_0) over gRPC with mutual TLS.")
    parser.add_argument(
        "--time-limit",
        "--solver-time-limit",
        dest="time_limit",
        type=float,
        help="the most seconds this solver gives the integer step; a session whose time_limit asks more gets this many ([solver] time_limit)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    def start():
        from functools import partial

        from cels.crypto.streams import DrawKeys
        from cels.node.config import node_config
        from cels.node.keys import NodeKeys
        from cels.node.service import Node
        from cels.node.session_store import SessionStore
        from cels.node.tls import warn_insecure_keys
        from cels.protocol.options import SessionOptions
        from cels.protocol.solver import SolverRole
        from cels.workers import worker_pool

        args = build_parser().parse_args(argv)
        config = node_config(args, "solver")
        max_time_limit = args.time_limit if args.time_limit is not None else config.extra.get("time_limit")
        allow_small = warn_insecure_keys(config)
        # CRT decryptions of the transformed problem run on a process pool (Algorithm 2, the solver's step)
        pool = worker_pool(config.keys.workers)
        store = SessionStore.open(config.state_dir)
        if args.seed is not None:
            DrawKeys.replay(args.seed, config.name)  # a seed out of range is refused at start-up
            print(f"{config.name}: WARNING: every draw is replayed from --seed {args.seed}: releases are NOT private", file=sys.stderr)

        def factory(session: SessionOptions, keys: NodeKeys) -> SolverRole:
            return SolverRole(
                config.name,
                session,
                allow_insecure_key_bits=allow_small,
                keypair=keys.keypair_for(session.key_bits),
                decryption_pool=pool,
                max_time_limit=None if max_time_limit is None else float(max_time_limit),
                draws=store.draws(session, None, partial(DrawKeys.of, args.seed, config.name)),
            )

        # the pool ends with the node: its queues' semaphores are released, not left to the resource tracker
        return Node(config, factory, on_stop=lambda: pool.shutdown(wait=True, cancel_futures=True), store=store)

    return node_main("cels-solver", start)


if __name__ == "__main__":
    sys.exit(main())
