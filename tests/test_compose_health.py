"""The readiness probe compose's healthchecks run (cels.node.health): NOT_SERVING until the
node key exists, SERVING after; behind mutual TLS like every RPC of a node.  The wait for
simulated nodes to serve, and the ports they are given (cels.node.cluster)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from cels.certs import make_dev_certs
from cels.node.cluster import LOOPBACK, NODE_PORTS, LocalCluster, ephemeral_low, free_port
from cels.node.health import add_health, main, node_health, wait_serving
from cels.node.settings import KeyPolicy
from cels.node.tls import server_credentials


class KeysAwaited:
    """NodeKeys' readiness surface: ``keypair_for`` blocks until :meth:`make` (as while the
    node key is being generated)."""

    def __init__(self, policy: KeyPolicy) -> None:
        self.policy, self.keypair, self.made = policy, None, threading.Event()

    def keypair_for(self, bits: int):
        if self.policy.session_keys:
            return None
        self.made.wait()
        return self.keypair

    def make(self) -> None:
        self.keypair = ("public", "private")
        self.made.set()


@pytest.fixture()
def certs(tmp_path: Path):
    return make_dev_certs(tmp_path / "certs", ["solver", "party-1"])


def serve(keys: KeysAwaited, cert=None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_health(server, keys)
    listen = f"{LOOPBACK}:0"
    port = server.add_secure_port(listen, server_credentials(cert.ca, cert.cert, cert.key)) if cert else server.add_insecure_port(listen)
    server.start()
    return server, f"{LOOPBACK}:{port}"


def test_not_serving_until_the_node_key_exists(certs) -> None:
    keys = KeysAwaited(KeyPolicy())
    server, address = serve(keys, certs["solver"])
    probe = certs["party-1"]  # any certificate of the deployment's CA
    try:
        assert node_health(address, "solver", probe.ca, probe.cert, probe.key, timeout=5) == "NOT_SERVING"
        with pytest.raises(TimeoutError, match=r"solver at .* \(NOT_SERVING\)"):
            wait_serving({"solver": address}, {"solver": (probe.ca, probe.cert, probe.key)}, timeout=0.5)
        keys.make()
        wait_serving({"solver": address}, {"solver": (probe.ca, probe.cert, probe.key)}, timeout=10)
        assert node_health(address, "solver", probe.ca, probe.cert, probe.key, timeout=5) == "SERVING"
        argv = ["--name=solver", f"--ca={probe.ca}", f"--cert={probe.cert}", f"--key={probe.key}", address]
        assert main(argv) == 0
    finally:
        server.stop(0)


def test_session_keys_node_serves_at_once() -> None:
    server, address = serve(KeysAwaited(KeyPolicy(session_keys=True)))  # no node key to wait for
    try:
        wait_serving({"party-1": address}, {"party-1": (None, None, None)}, timeout=10)
        assert main(["--name=party-1", "--insecure", address]) == 0
    finally:
        server.stop(0)


def test_probe_refused_without_a_certificate_of_the_ca(certs, tmp_path, capsys) -> None:
    keys = KeysAwaited(KeyPolicy())
    keys.make()
    server, address = serve(keys, certs["solver"])
    stranger = make_dev_certs(tmp_path / "other-ca", ["solver", "party-1"])["party-1"]
    try:
        state = node_health(address, "solver", stranger.ca, stranger.cert, stranger.key, timeout=5)
        assert state.startswith("UNAVAILABLE"), state
        assert main(["--name=solver", f"--ca={stranger.ca}", f"--cert={stranger.cert}", f"--key={stranger.key}", "--timeout=5", address]) == 1
        assert "solver at" in capsys.readouterr().err
        assert main(["--name=solver", "--insecure", "--timeout=5", address]) == 1  # plaintext to a TLS node
    finally:
        server.stop(0)


def test_probe_needs_credentials_or_insecure(certs) -> None:
    ca = certs["solver"].ca
    for argv in (["--name=solver", "127.0.0.1:1"], ["--name=solver", f"--ca={ca}", "127.0.0.1:1"], ["--name=solver", "--insecure", f"--ca={ca}", "127.0.0.1:1"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_the_wait_for_serving_ends_when_a_node_process_has_exited(certs, tmp_path) -> None:
    """A node that exited while a plaintext server answers on its port (Ray's, say): the wait
    stops at its first probe, naming the node, its exit code and log, not at the timeout."""
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = other.add_insecure_port(f"{LOOPBACK}:0")
    other.start()
    probe = certs["party-1"]
    try:
        with LocalCluster(tmp_path / "logs") as cluster:
            node = cluster.start("party-1", f"{LOOPBACK}:{port}", [sys.executable, "-c", "print('cannot listen'); raise SystemExit(1)"])
            node.process.wait(timeout=30)
            start = time.monotonic()
            with pytest.raises(RuntimeError, match=r"(?s)node party-1 exited with 1:.*cannot listen"):
                wait_serving({"party-1": f"{LOOPBACK}:{port}"}, {"party-1": (probe.ca, probe.cert, probe.key)}, timeout=60, alive=cluster.check_alive)
            assert time.monotonic() - start < 5
    finally:
        other.stop(0)


def test_node_ports_are_below_the_kernels_ephemeral_range_and_never_handed_out_twice() -> None:
    """free_port: distinct ports, each bindable, none the kernel could give to a port-0 bind."""
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == 40
    assert all(NODE_PORTS[0] <= p < min(NODE_PORTS[1] + 1, ephemeral_low()) for p in ports)
    with socket.socket() as sock:
        sock.bind((LOOPBACK, ports[-1]))
