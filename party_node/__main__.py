"""``cels-party`` / ``python -m party_node``: serve the CELS party role P_k over gRPC.

Exit codes: see :mod:`cels.node.process` (0 stopped, 1 cannot serve, 2 bad configuration,
130 interrupted during start-up).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cels.node.process import node_main, node_parser


def build_parser():
    """The flags of ``cels-party`` (imported here: a Ctrl-C while loading is a start-up interrupt)."""
    from cels.engine.options import add_engine_arguments
    from cels.node.config import add_data_arguments
    from cels.node.ledger import add_ledger_arguments
    from cels.node.policy import add_policy_arguments

    tables = (add_data_arguments, add_ledger_arguments, add_engine_arguments, add_policy_arguments)
    return node_parser("cels-party", "Serve a CELS party node (P_k) over gRPC with mutual TLS.", *tables)


def start(argv: Sequence[str] | None):
    """Read the configuration and build the party node (not serving yet)."""
    args = build_parser().parse_args(argv)

    import os
    from functools import partial

    import logging

    from cels.claims import TRANSFORMED_WARNING
    from cels.crypto.streams import DrawKeys
    from cels.engine import open_engine
    from cels.logs import LogFile
    from cels.protocol.releases import write_output
    from cels.engine.options import engine_options
    from cels.node.config import data_source, node_config
    from cels.node.keys import NodeKeys
    from cels.node.ledger import Ledger, ledger_policy
    from cels.node.policy import PartyPolicy
    from cels.node.pool import ElasticThreadPool
    from cels.node.service import Node
    from cels.node.session_store import SessionStore, input_digest
    from cels.node.tls import warn_insecure_keys
    from cels.protocol.options import SessionOptions
    from cels.protocol.party import PartyRole
    from cels.protocol.roles import Refusal
    from cels.engine.interface import EngineUnavailable
    from cels.engine.routines import ItemBound
    from cels.session_report import session_report

    config = node_config(args, "data")
    policy = PartyPolicy.of(config.policy, args)
    log = logging.getLogger("cels.party")
    path, options = data_source(args, config.extra)
    if not options.log_format.exists(path):  # a Parquet dataset is a directory
        raise ValueError(f"data file {path} does not exist")
    ledger = Ledger.open(ledger_policy(args, config.name, config.ledger))
    store = SessionStore.open(config.state_dir)
    engine = open_engine(engine_options(args, config.engine))  # once per node: an unreachable Ray cluster refuses the node
    allow_small = warn_insecure_keys(config)
    if args.seed is not None:
        DrawKeys.replay(args.seed, config.name)  # a seed out of range is refused at start-up
        print(f"{config.name}: WARNING: every draw is replayed from --seed {args.seed}: releases are NOT private", file=sys.stderr)
    # P_1 decrypts every secure sum while the other parties wait for the result: all cores
    # (the exponentiations release the GIL, so threads suffice)
    decryption_pool = ElasticThreadPool(os.cpu_count() or 1, thread_name_prefix="decrypt")
    works = {}  # session id -> its work, until the session ends here

    def screen(session: SessionOptions) -> bool:
        # the party's policy first (cels.node.policy), before anything is read or reserved; a
        # session its operator approves by hand waits here (cels approve)
        policy.check(config.name, session)
        return policy.awaits(config.name, session)

    def factory(session: SessionOptions, keys: NodeKeys):
        # once the policy admitted the session (screen) and, where the policy says so, its
        # operator approved it: a Ray cluster that no longer answers refuses the session
        # (FAILED_PRECONDITION), then the privacy budget is checked (a refusal is
        # FAILED_PRECONDITION too); the log is read when the session begins (a bad log aborts
        # that session, not the node)
        if session.release_kind.solves and session.solve == "transformed":
            log.warning("%s: session %s: %s", config.name, session.session_id, TRANSFORMED_WARNING)
        try:
            engine.check()
        except EngineUnavailable as exc:
            raise Refusal(exc.public, str(exc)) from None
        load = LogFile(path, options, snapshot=store.snapshot(session))  # a re-run reads the log it loaded

        def role() -> PartyRole:
            # a first run's keys are kept (state_dir); a re-run takes them back (cels.node.session_store)
            draws = store.draws(session, input_digest(path), partial(DrawKeys.of, args.seed, config.name))
            works[session.session_id] = work = engine.work(load, session.cap, draws, ItemBound.of(session))
            return PartyRole(
                config.name,
                session,
                load,
                allow_insecure_key_bits=allow_small,
                obfuscators=keys.obfuscators,
                keypair=keys.keypair_for(session.key_bits),
                decryption_pool=decryption_pool,
                session_report=session_report,
                draws=draws,
                work=work,
                keeping=store.keeping(session, draws),
            )

        return ledger.admit(session, role)

    def session_ended(session_id: str) -> None:
        """What the session's work used goes to its summary (``cels status``), then its workers
        go; the ledger releases its reservation."""
        if session_id in works:
            work = works.pop(session_id)
            node.telemetry.session_engine(session_id, engine.usage(work))
            engine.release(work)
        ledger.release(session_id)

    node = Node(
        config, factory, write_output, encrypts=True, ledger=ledger, session_ended=session_ended, on_stop=engine.close, screen=screen, store=store,
    )
    return node


def main(argv: Sequence[str] | None = None) -> int:
    return node_main("cels-party", lambda: start(argv))


if __name__ == "__main__":
    sys.exit(main())
