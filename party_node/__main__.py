"""``cels-party`` / ``python -m party_node``: serve the CELS party role P_k over gRPC."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cels.logs import load_log, write_log
from cels.node.config import add_data_arguments, add_node_arguments, data_source, node_config
from cels.node.keys import NodeKeys
from cels.node.process import serve
from cels.node.service import Node
from cels.node.tls import warn_insecure_keys
from cels.protocol.options import SessionOptions
from cels.protocol.party import PartyRole


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cels-party", description="Serve a CELS party node (P_k) over gRPC with mutual TLS.")
    add_node_arguments(parser)
    add_data_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = node_config(args, "data")
        path, options = data_source(args, config.extra)
        if not path.is_file():
            raise ValueError(f"data file {path} does not exist")
    except ValueError as exc:
        print(f"cels-party: error: {exc}", file=sys.stderr)
        return 2
    allow_small = warn_insecure_keys(config)

    def factory(session: SessionOptions, keys: NodeKeys) -> PartyRole:
        # the log is read when the session begins (a bad log aborts that session, not the node)
        return PartyRole(
            config.name,
            session,
            lambda: load_log(path, options),
            allow_insecure_key_bits=allow_small,
            obfuscators=keys.obfuscators,
            keypair=keys.keypair_for(session.key_bits),
        )

    return serve(Node(config, factory, lambda log, out: write_log(log, out), encrypts=True))


if __name__ == "__main__":
    sys.exit(main())
