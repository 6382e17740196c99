"""``cels status --config node.toml``: is a party or solver node serving, its sessions, a
party's ledger, and whether each of its peers can be reached (docs/monitoring.md, "Status").

The node is asked over its own mutual TLS with the certificate its TOML names (the node's own:
whoever holds its key is its operator), through the gRPC health service and ``Status``.  Each
peer is probed from here with that certificate, as the node itself reaches it (``Status``,
time-bounded, all peers at once): a peer that answers but refuses this node's name counts as
not reachable.

Exit codes: 0 serving and every peer reachable; 1 the node is not serving or does not answer;
4 serving, but a peer cannot be reached; 2 a bad configuration.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EXIT_SERVING, EXIT_NOT_SERVING, EXIT_BAD_CONFIG, EXIT_PEER_UNREACHABLE = 0, 1, 2, 4
SHOWN = ("initiator", "parties", "release", "solve", "epsilon", "delta", "noise_epsilon", "keep_user_ids", "collusion",
         "items", "max_items_per_user", "key_bits", "approval_wait")  # fmt: skip
"""The parameters an operator is shown of a session that waits for it."""

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
"""Listen hosts that are no address to call: ``cels status`` calls 127.0.0.1 instead."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        description="Is a node serving, its sessions (running and recent, with outcome), a party's privacy budget "
        "ledger, and can each of its peers be reached (docs/monitoring.md, 'Status'). Exit 0 serving and every "
        "peer reachable, 1 the node is not serving or does not answer, 4 a peer cannot be reached, 2 bad configuration.",
    )  # fmt: skip
    parser.add_argument("--config", required=True, type=Path, help="the node's TOML file (party or solver)")
    parser.add_argument("--address", metavar="HOST:PORT", help="where to call the node (default: its [node] listen; 0.0.0.0 is called at 127.0.0.1)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds for each call and each peer's probe (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=run)


def node_settings(path: Path):
    """The node's configuration as the node reads it (ValueError naming the file otherwise), and
    its role: "solver" with a [solver] table, else "party"."""
    from cels.node.config import add_node_arguments, load_toml, node_config

    doc = load_toml(path)
    role_table = "solver" if "solver" in doc else "data"
    parser = argparse.ArgumentParser(add_help=False)
    add_node_arguments(parser)
    config = node_config(parser.parse_args(["--config", str(path)]), role_table)
    return config, "solver" if role_table == "solver" else "party"


def parameters(config: Any) -> str:
    """A session's parameters as one line (the :data:`SHOWN` ones)."""
    from cels.protocol.options import SessionOptions

    options = SessionOptions.from_config(config)
    shown = []
    for name in SHOWN:
        value = getattr(options, name)
        shown.append(f"{name} {','.join(value) if isinstance(value, tuple) else value}")
    return "; ".join(shown)


def call_address(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    return f"127.0.0.1:{port}" if host in WILDCARDS else listen


def probe_peer(config, name: str, address: str, timeout: float) -> dict[str, Any]:
    """One peer's ``Status`` called with this node's certificate: reachable, and its node key."""
    import grpc

    from cels.node.tls import open_channel
    from cels.protocol.wire import cels_pb2, cels_pb2_grpc

    tls = (None, None, None) if config.insecure else (config.ca, config.cert, config.key)
    channel = open_channel(address, name, *tls)
    try:
        reply = cels_pb2_grpc.CelsNodeStub(channel).Status(cels_pb2.NodeStatusRequest(), timeout=timeout)
        return {"address": address, "reachable": True, "state": "reachable", "node_key": bool(reply.key.n)}
    except grpc.RpcError as exc:
        from cels.node.peers import tls_refusal

        refuses = exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
        state = f"refuses {config.name}: {exc.code().name}: {exc.details()}" if refuses else tls_refusal(exc) or f"unreachable: {exc.code().name}: {exc.details()}"
        return {"address": address, "reachable": False, "state": state, "node_key": None}
    finally:
        channel.close()


def json_message(message) -> dict[str, Any]:
    """A protobuf message as a dict with every field, its 64-bit integers as numbers (proto3's
    JSON mapping writes them as strings), map values too."""
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.json_format import MessageToDict

    wide = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    out = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for field in message.DESCRIPTOR.fields:
        value = out.get(field.name)
        if value is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].cpp_type in wide:
                out[field.name] = {k: int(v) for k, v in value.items()}
        elif field.cpp_type in wide:
            out[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return out


def node_state(config, address: str, timeout: float) -> dict[str, Any]:
    """The node's health, and its ``Status`` as its operator sees it (None if it did not answer)."""
    import grpc

    from cels.node.health import node_health
    from cels.node.tls import open_channel
    from cels.protocol.wire import cels_pb2, cels_pb2_grpc
    from cels.protocol.wire.codec import table_of

    tls = (None, None, None) if config.insecure else (config.ca, config.cert, config.key)
    health = node_health(address, config.name, *tls, timeout=timeout)
    channel = open_channel(address, config.name, *tls)
    try:
        status = cels_pb2_grpc.CelsNodeStub(channel).Status(cels_pb2.NodeStatusRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        from cels.node.peers import tls_refusal

        return {"health": health, "status": None, "error": tls_refusal(exc) or f"{exc.code().name}: {exc.details()}"}
    finally:
        channel.close()
    sessions = [
        json_message(s) | ({"engine": table_of(s.engine)} if s.HasField("engine") else {})
        | ({"parameters": parameters(s.config)} if s.HasField("config") else {})
        for s in status.sessions
    ]  # a party's engine usage as its report (cels.engine), not as a Table's entries; what awaits approval, in one line
    ledger = None
    if status.HasField("ledger"):
        from cels.node.telemetry import budget_left

        ledger = json_message(status.ledger)
        for key in ("budget_epsilon", "budget_delta", "window_days"):
            ledger.setdefault(key, None)
        ledger.update({f"{w}_left": budget_left(ledger, w) for w in ("epsilon", "delta")})
    return {
        "health": health,
        "status": {
            "node_key_bits": status.key.n and len(status.key.n) * 8 or None,
            "running_sessions": status.running_sessions,
            "sessions": sessions,
            "ledger": ledger,
            "stock": [{"owner": e.owner, "ready": e.ready, "target": e.target, "used": e.handed_out} for e in status.stock],
        },
        "error": None,
    }


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive seconds, not {args.timeout:g}")
    config, role = node_settings(args.config)
    address = args.address or call_address(config.listen)
    with ThreadPoolExecutor(max(1, len(config.peers)) + 1) as pool:
        node = pool.submit(node_state, config, address, args.timeout)
        peers = {name: pool.submit(probe_peer, config, name, peer_address, args.timeout) for name, peer_address in config.peers.items()}
        state = node.result()
        reached = {name: probe.result() for name, probe in peers.items()}
    serving = state["health"] == "SERVING" and state["status"] is not None
    code = EXIT_NOT_SERVING if not serving else EXIT_SERVING if all(p["reachable"] for p in reached.values()) else EXIT_PEER_UNREACHABLE
    result = {"node": config.name, "role": role, "config": str(args.config), "address": address, "serving": serving, **state, "peers": reached, "exit_code": code}
    print(json.dumps(result, indent=2) if args.json else tables(result, args.timeout))
    return code


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def tables(result: dict[str, Any], timeout: float) -> str:
    """The readable form: the node, its sessions, a party's ledger, its peers."""
    status = result["status"]
    if status is None:
        head = f"node {result['node']} ({result['role']}) at {result['address']}: {result['health']}; Status: {result['error']}"
        lines = [head]
    else:
        key = f"node key {status['node_key_bits']} bits" if status["node_key_bits"] else "no node key yet"
        lines = [f"node {result['node']} ({result['role']}) at {result['address']}: {result['health']} ({key}; {status['running_sessions']} session(s) running)"]
        lines += ["", "sessions (running first, then the most recent):"]
        rows = [("SESSION", "OUTCOME", "PHASE", "STARTED (UTC)", "SECONDS", "MB SENT", "MB RECEIVED", "INITIATOR", "ORIGIN: REASON")]
        for s in status["sessions"]:
            why = f"{s['origin']}: {s['reason']}" if s["origin"] or s["reason"] else ""
            rows.append((s["session_id"], s["outcome"], s["phase"], _when(s["started_at"]), f"{s['seconds']:.1f}",
                         f"{int(s['bytes_sent']) / 1e6:.3f}", f"{int(s['bytes_received']) / 1e6:.3f}", s["initiator"], why))  # fmt: skip
        lines += _aligned(rows) if len(rows) > 1 else ["  none"]
        for s in (s for s in status["sessions"] if s["outcome"] == "resumable"):
            lines += ["", f"session {s['session_id']} can run again with the keys this node kept: "
                      f"cels run --config session.toml --resume {s['session_id']} (its initiator's controller)"]  # fmt: skip
        for s in (s for s in status["sessions"] if "parameters" in s):
            lines += ["", f"session {s['session_id']} waits for your approval: {s['parameters']}",
                      f"  cels approve --config {result['config']} {s['session_id']}   or   cels reject --config {result['config']} {s['session_id']}"]  # fmt: skip
        if result["role"] == "party":
            lines += ["", *_ledger_lines(status["ledger"])]
    lines += ["", f"peers (called with {result['node']}'s certificate, {timeout:g} s each):"]
    lines += _aligned([(name, p["address"], p["state"] + (" (node key ready)" if p["node_key"] else "")) for name, p in result["peers"].items()]) or ["  none"]
    return "\n".join(lines)


def _ledger_lines(ledger: dict[str, Any] | None) -> list[str]:
    if ledger is None:
        return ["ledger: none kept (the node was started without --ledger or --config)"]
    window = f"the last {ledger['window_days']:g} days" if ledger["window_days"] is not None else "all sessions"
    rows = [("", "SPENT", "RESERVED", "LEFT", "BUDGET")]
    for what in ("epsilon", "delta"):
        rows.append((what, _number(ledger[f"{what}_spent"]), _number(ledger[f"{what}_reserved"]), _number(ledger[f"{what}_left"]), _number(ledger[f"budget_{what}"])))
    rows.append(("sessions", str(ledger["sessions"]), str(ledger["reserved_sessions"]), "", ""))
    return [f"ledger {ledger['path']} (basic composition over {window}; reserved: running sessions):", *_aligned(rows)]


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
