"""Readiness: every node serves the standard gRPC health service (grpc.health.v1).

A node reports SERVING once it listens and its node key exists (cels.node.keys; with
``--session-keys`` as soon as it listens), NOT_SERVING before.  The service sits behind the
node's mutual TLS like every RPC, and answers only the certificates the node knows: its
peers, its controllers and its own (a probe presents one; another certificate of the same CA
gets PERMISSION_DENIED).
``python -m cels.node.health`` is that probe (docker-compose.yml's healthchecks, docs/deployment.md):

    python -m cels.node.health --name party-1 --ca ca.pem --cert party-1.pem --key party-1.key 127.0.0.1:7101

exits 0 when the node at the address is SERVING, 1 when it is not (or does not answer).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cels.node.tls import open_channel

if TYPE_CHECKING:  # the probe imports no more than it needs (it runs every few seconds)
    from cels.node.keys import NodeKeys

SERVING = health_pb2.HealthCheckResponse.SERVING


class KnownCallersHealth(health.HealthServicer):
    """The standard health service, for the certificate names in ``allowed`` only (None: any
    caller, a node without TLS)."""

    def __init__(self, allowed: set[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def _admit(self, context: grpc.ServicerContext) -> None:
        if self.allowed is None:
            return
        from cels.node.tls import peer_identity

        try:
            name = peer_identity(context).name
        except ValueError as exc:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"health: {exc}")
        if name not in self.allowed:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "health: only this node's peers, controllers and own certificate")

    def Check(self, request, context):  # noqa: N802 -- gRPC's method name
        self._admit(context)
        return super().Check(request, context)

    def Watch(self, request, context, send_response_callback=None):  # noqa: N802
        self._admit(context)
        return super().Watch(request, context, send_response_callback)


def add_health(server: grpc.Server, keys: NodeKeys, allowed: set[str] | None = None) -> health.HealthServicer:
    """Register the health service on ``server`` for ``allowed`` callers: NOT_SERVING until
    ``keys`` has its node key."""
    servicer = KnownCallersHealth(allowed)
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)

    def serving_once_keyed() -> None:
        keys.keypair_for(keys.policy.key_bits)  # waits for the node key (returns at once without one)
        if keys.keypair is not None or keys.policy.session_keys:  # not a node closed before its key
            servicer.set("", SERVING)

    threading.Thread(target=serving_once_keyed, name="health", daemon=True).start()
    return servicer


def node_health(address: str, node: str, ca: Path | None, cert: Path | None, key: Path | None, timeout: float) -> str:
    """The health status name of the node ``node`` at ``address`` (``UNREACHABLE``: no answer
    within ``timeout`` seconds).  Without credentials (``ca`` None) the channel is plaintext."""
    channel = open_channel(address, node, ca, cert, key)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    except grpc.RpcError as exc:
        return "UNREACHABLE" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else f"{exc.code().name}: {exc.details()}"
    finally:
        channel.close()


def wait_serving(
    nodes: dict[str, str], credentials: dict[str, tuple[Path, Path, Path]], timeout: float, alive: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Wait until every node (name -> address) is SERVING; ``credentials``: name -> (ca, cert,
    key) the probe of that node presents.  TimeoutError names the nodes that are not;
    ``alive()``, called before each probe, raises if a node process has exited (another
    process on its port would otherwise keep the wait going to the timeout)."""
    limit = time.monotonic() + timeout
    pending = dict(nodes)
    while pending:
        if alive is not None:
            alive()
        states = {name: node_health(address, name, *credentials[name], timeout=2.0) for name, address in pending.items()}
        pending = {name: nodes[name] for name, state in states.items() if state != "SERVING"}
        if pending and time.monotonic() > limit:
            raise TimeoutError(f"not serving after {timeout:g} s: " + ", ".join(f"{n} at {nodes[n]} ({states[n]})" for n in pending))
        if pending:
            time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cels.node.health", description="Exit 0 if the CELS node at ADDRESS is SERVING (grpc.health.v1), else 1.")
    parser.add_argument("address", help="host:port of the node")
    parser.add_argument("--name", required=True, help="the node's name (as in its certificate)")
    parser.add_argument("--ca", type=Path, help="CA certificate (PEM)")
    parser.add_argument("--cert", type=Path, help="the probe's certificate (PEM), e.g. the node's own")
    parser.add_argument("--key", type=Path, help="the probe's private key (PEM)")
    parser.add_argument("--insecure", action="store_true", help="plaintext, for a node started with --insecure")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    args = parser.parse_args(argv)
    tls = (args.ca, args.cert, args.key)
    if (args.insecure and any(tls)) or not (args.insecure or all(tls)):
        parser.error("give --ca, --cert and --key, or --insecure")
    state = node_health(args.address, args.name, *(None, None, None) if args.insecure else tls, timeout=args.timeout)
    print(f"{args.name} at {args.address}: {state}", file=sys.stdout if state == "SERVING" else sys.stderr)
    return 0 if state == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
