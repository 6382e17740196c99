"""``cels approve`` / ``cels reject --config node.toml SESSION``: a party's operator decides on a
session that waits for it (docs/site-rules.md, "Approval by a person").

A party whose policy has ``approve = "manual"`` takes a session another party starts with
nothing read and nothing reserved, until its operator decides here; ``cels status`` lists such
sessions with their parameters.  The node is called as ``cels status`` calls it, over its own
mutual TLS with the certificate its TOML names (whoever holds the node's key is its operator).

Exit codes: 0 decided (approve: the node took the session; reject: it is aborted); 1 the node
refused the decision (no such session waiting, or the session could not be taken: its budget);
2 a bad configuration.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

def register(subparsers: argparse._SubParsersAction) -> None:
    for command, verb in (("approve", "approve"), ("reject", "reject")):
        parser = subparsers.add_parser(
            command,
            description=f"{verb.capitalize()} a session that waits for this party node's operator (its policy's approve = "
            "manual; cels status lists them with their parameters). Exit 0 decided, 1 refused by the node, 2 bad configuration.",
        )  # fmt: skip
        parser.add_argument("session", metavar="SESSION", help="the session's id (cels status)")
        parser.add_argument("--config", required=True, type=Path, help="the party node's TOML file")
        parser.add_argument("--address", metavar="HOST:PORT", help="where to call the node (default: its [node] listen)")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds for the call (default 10)")
        parser.set_defaults(func=run, approve=command == "approve")


def awaiting(status: Any, session_id: str) -> Any | None:
    """The SessionSummary of ``session_id`` if it waits for this node's operator."""
    return next((s for s in status.sessions if s.session_id == session_id and s.outcome == "awaiting_approval"), None)


def run(args: argparse.Namespace) -> int:
    import grpc

    from cels.cli.status import call_address, node_settings, parameters
    from cels.node.tls import open_channel
    from cels.protocol.wire import cels_pb2, cels_pb2_grpc

    config, role = node_settings(args.config)
    if role != "party":
        raise ValueError(f"{args.config}: a solver node takes no approvals (only a party's policy has approve = manual)")
    verb = "approve" if args.approve else "reject"
    tls = (None, None, None) if config.insecure else (config.ca, config.cert, config.key)
    channel = open_channel(args.address or call_address(config.listen), config.name, *tls)
    try:
        stub = cels_pb2_grpc.CelsNodeStub(channel)
        summary = awaiting(stub.Status(cels_pb2.NodeStatusRequest(), timeout=args.timeout), args.session)
        state = stub.Decide(cels_pb2.ApprovalDecision(session_id=args.session, approve=args.approve), timeout=args.timeout)
    except grpc.RpcError as exc:
        print(f"cels {verb}: {config.name} refused: {exc.code().name}: {exc.details()}")
        return 1
    finally:
        channel.close()
    from cels.protocol.wire.codec import state_from_wire

    shown = f" ({parameters(summary.config)})" if summary is not None and summary.HasField("config") else ""
    outcome = state_from_wire(state.state)
    print(f"cels {verb}: session {args.session} on {config.name} is now {outcome}{shown}" + (f": {state.reason}" if state.reason else ""))
    return 0 if (outcome != "aborted") == args.approve else 1
