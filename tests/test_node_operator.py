"""What an operator sees of real node processes: ``/metrics`` (Prometheus text format, on a port
of its own, off by default) and ``cels status`` (docs/monitoring.md, "Status" and "Metrics").

One session (private solve, a 45-user synthetic log, 512-bit test keys) over 3 party node
processes and a solver with mutual TLS: party-1 and the solver serve metrics, party-1 keeps a
ledger with a budget of epsilon 1.5, party-2 runs with the defaults.  After it, while the nodes
still run, a second session is refused by party-1's budget; then the metrics, the listening
sockets and ``cels status`` are read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cels.cli.simulate import run_nodes
from cels.logs import synthetic_log
from cels.node.client import Controller, SessionAborted, run_on_nodes
from cels.node.cluster import LOOPBACK, LocalCluster, free_port
from cels.node.telemetry import NodeTelemetry
from cels.node.tls import open_channel
from cels.protocol.options import SessionOptions
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

BIN = Path(sys.executable).parent
EXPORTED = {
    "cels_node_info", "cels_sessions_total", "cels_active_sessions", "cels_phase_seconds", "cels_sent_bytes_total",
    "cels_received_bytes_total", "cels_grpc_pool_threads_busy", "cels_grpc_pool_threads", "cels_outbox_bytes",
}  # fmt: skip
LEDGER = {"cels_ledger_epsilon", "cels_ledger_delta"}


def scrape(address: str) -> dict[str, dict[tuple, float]]:
    """Sample name -> {labels: value} of the /metrics page at ``address``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (its sockets' inodes in /proc/net/tcp*, state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def node_toml(path: Path, argv: list[str], peers: dict[str, str], extra: str = "") -> Path:
    """The TOML of a node started with ``argv`` (what an operator's node.toml holds)."""
    peer_lines = "\n".join(f'{name} = "{address}"' for name, address in peers.items())
    path.write_text(
        f'[node]\nname = "{flag(argv, "--name")}"\nlisten = "{flag(argv, "--listen")}"\n'
        f'[tls]\nca = "{flag(argv, "--ca")}"\ncert = "{flag(argv, "--cert")}"\nkey = "{flag(argv, "--key")}"\n'
        f"[peers]\n{peer_lines}\n{extra}"
    )
    return path


def cels_status(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cels"), "status", "--config", str(config), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def operated(tmp_path_factory):
    """The session, then everything read while the nodes still run."""
    root = tmp_path_factory.mktemp("operated")
    metrics = {"party-1": f"{LOOPBACK}:{free_port()}", "solver": f"{LOOPBACK}:{free_port()}"}
    ledger = root / "party-1.ledger.json"
    flags = {
        "party-1": ["--metrics-listen", metrics["party-1"], "--ledger", str(ledger), "--budget-epsilon", "1.5"],
        "solver": ["--metrics-listen", metrics["solver"]],
    }
    options = SessionOptions.create(3, epsilon=1.0, delta=0.4, key_bits=512, deadline=30)
    seen: dict = {}

    def while_up(cluster: LocalCluster, _controller) -> None:
        addresses = {name: node.address for name, node in cluster.nodes.items()}
        argv = {name: [str(a) for a in node.process.args] for name, node in cluster.nodes.items()}
        ca, cert = Path(flag(argv["party-1"], "--ca")), Path(flag(argv["party-1"], "--cert"))
        controller = Controller("party-1", addresses["party-1"], ca, cert.with_name("controller-party-1.pem"), cert.with_name("controller-party-1.key"))
        second = SessionOptions.create(3, epsilon=1.0, delta=0.4, key_bits=512, deadline=30).with_addresses(addresses)
        try:
            run_on_nodes(controller, second.to_config(), root / "second.tsv", root / "second.json", timeout=60)
        except SessionAborted as exc:
            seen["refusal"] = str(exc)
        seen["metrics"] = {name: scrape(address) for name, address in metrics.items()}
        peer = cert.with_name("party-2.pem")  # a peer gets party-1's node key, none of what its operator sees
        with open_channel(addresses["party-1"], "party-1", ca, peer, peer.with_suffix(".key")) as channel:
            seen["peer_view"] = cels_pb2_grpc.CelsNodeStub(channel).Status(cels_pb2.NodeStatusRequest(), timeout=5)
        seen["ports"] = {name: listening_ports(node.process.pid) for name, node in cluster.nodes.items()}
        seen["grpc_ports"] = {name: int(address.rsplit(":", 1)[1]) for name, address in addresses.items()}
        peers = {n: a for n, a in addresses.items() if n != "party-1"}
        party = node_toml(root / "party-1.toml", argv["party-1"], peers, f'[ledger]\npath = "{ledger}"\n')
        solver = node_toml(root / "solver.toml", argv["solver"], {n: a for n, a in addresses.items() if n != "solver"}, "[solver]\n")
        seen["status"] = cels_status(party, "--json")
        seen["table"] = cels_status(party)
        seen["solver_status"] = cels_status(solver, "--json")
        lost = node_toml(root / "lost-peer.toml", argv["party-1"], {**peers, "party-9": f"{LOOPBACK}:{free_port()}"})
        seen["lost_peer"] = cels_status(lost, "--json", "--timeout", "1")
        seen["no_node"] = cels_status(party, "--address", f"{LOOPBACK}:{free_port()}", "--timeout", "1")
        (root / "typo.toml").write_text(party.read_text() + "[metrics]\nlisen = 1\n")
        seen["bad_config"] = cels_status(root / "typo.toml")

    shares = synthetic_log(users=45, pairs=20).split_by_user(3)
    seen["report"] = run_nodes(shares, options, root / "out", ".tsv", ["--format", "aol"], root / "operator.json", node_flags=flags, while_up=while_up, timeout=240)
    return seen


@pytest.mark.slow
def test_metrics_after_a_session(operated) -> None:
    party, solver = operated["metrics"]["party-1"], operated["metrics"]["solver"]
    for name, samples in operated["metrics"].items():
        names = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in samples}
        assert EXPORTED <= names, (name, EXPORTED - names)
        assert samples["cels_sessions_total"][(("outcome", "done"),)] == 1
        assert samples["cels_active_sessions"][()] == 0
        assert samples["cels_grpc_pool_threads"][()] == 32
        assert 0 <= samples["cels_grpc_pool_threads_busy"][()] <= 32  # the scrape is no RPC: idle but for a key refresh
        assert samples["cels_outbox_bytes"][()] == 0  # every session's outbox sent
        assert sum(samples["cels_sent_bytes_total"].values()) > 0 and sum(samples["cels_received_bytes_total"].values()) > 0
        assert samples["cels_node_info"][(("node", name), ("role", "party" if name == "party-1" else "solver"))] == 1
    # party-1 saw every peer and every phase of its part; the solver only the parties and its solve
    assert {dict(k)["peer"] for k in party["cels_sent_bytes_total"]} == {"party-2", "party-3", "solver"}
    phases = {dict(k)["phase"] for k in party["cels_phase_seconds_count"]}
    assert {"load", "universe", "counts", "solve", "sampling", "union"} <= phases, phases
    assert {dict(k)["phase"] for k in solver["cels_phase_seconds_count"]} == {"solve"}
    # finding 11: one definition of a phase's time: the initiator's stamps, in Prometheus and in the report alike
    walls = operated["report"]["phase_wall_seconds"]
    for phase in ("load", "universe", "counts", "solve", "sampling", "union"):
        assert party["cels_phase_seconds_sum"][(("phase", phase),)] == pytest.approx(walls[phase], abs=1e-6), phase
    # the second session was refused by party-1's budget: 1 spent, 1.5 - 1 left, nothing reserved
    assert "privacy budget exceeded" in operated["refusal"]
    assert party["cels_sessions_total"][(("outcome", "refused"),)] == 1
    assert party["cels_ledger_epsilon"] == {(("state", "spent"),): 1.0, (("state", "reserved"),): 0.0, (("state", "left"),): 0.5}
    assert party["cels_ledger_delta"] == {(("state", "spent"),): 0.4, (("state", "reserved"),): 0.0}  # no delta budget: no "left"
    assert not LEDGER & set(solver)


@pytest.mark.slow
def test_metrics_port_is_off_by_default(operated) -> None:
    ports, grpc_ports = operated["ports"], operated["grpc_ports"]
    for name in ("party-2", "party-3"):  # started without --metrics-listen: the gRPC port only
        assert ports[name] == {grpc_ports[name]}, (name, ports[name])
    assert len(ports["party-1"]) == 2 and grpc_ports["party-1"] in ports["party-1"]


@pytest.mark.slow
def test_status_of_a_party(operated) -> None:
    run = operated["status"]
    assert run.returncode == 0, run.stderr
    status = json.loads(run.stdout)
    assert status["serving"] and status["health"] == "SERVING" and status["exit_code"] == 0
    refused, done = status["status"]["sessions"]  # newest first
    assert refused["outcome"] == "refused" and "privacy budget exceeded" in refused["reason"] and refused["origin"] == "party-1"
    assert done["outcome"] == "done" and done["session_id"] == operated["report"]["session_id"] and done["phase"] == "over"
    assert int(done["bytes_sent"]) > 0 and int(done["bytes_received"]) > 0 and done["seconds"] > 0
    ledger = status["status"]["ledger"]
    assert (ledger["epsilon_spent"], ledger["epsilon_reserved"], ledger["epsilon_left"], ledger["sessions"]) == (1.0, 0.0, 0.5, 1)
    assert ledger["budget_delta"] is None and ledger["delta_left"] is None
    assert {name: p["reachable"] for name, p in status["peers"].items()} == {"solver": True, "party-2": True, "party-3": True}
    table = operated["table"]
    assert table.returncode == 0, table.stderr
    assert "SERVING" in table.stdout and " refused " in table.stdout and " done " in table.stdout
    assert "SPENT" in table.stdout and "LEFT" in table.stdout and table.stdout.count("reachable (node key ready)") == 3


@pytest.mark.slow
def test_a_peer_sees_no_sessions_or_ledger(operated) -> None:
    view = operated["peer_view"]
    assert view.key.n and not view.sessions and not view.HasField("ledger") and not view.stock


@pytest.mark.slow
def test_status_of_the_solver(operated) -> None:
    run = operated["solver_status"]
    assert run.returncode == 0, run.stderr
    status = json.loads(run.stdout)
    assert status["role"] == "solver" and status["status"]["ledger"] is None
    assert [s["outcome"] for s in status["status"]["sessions"]] == ["done"]  # the refused session never reached it


@pytest.mark.slow
def test_status_exit_codes(operated) -> None:
    lost = operated["lost_peer"]
    assert lost.returncode == 4, lost.stderr
    assert json.loads(lost.stdout)["peers"]["party-9"]["state"].startswith("unreachable")
    no_node = operated["no_node"]
    assert no_node.returncode == 1 and ("UNREACHABLE" in no_node.stdout or "UNAVAILABLE" in no_node.stdout), no_node.stdout
    bad = operated["bad_config"]
    assert bad.returncode == 2 and "[metrics] unknown key 'lisen'" in bad.stderr and "typo.toml" in bad.stderr


def test_metrics_config(tmp_path) -> None:
    from cels.node.settings import metrics_address

    assert metrics_address("9464") == "127.0.0.1:9464"
    assert metrics_address("0.0.0.0:9464") == "0.0.0.0:9464"
    with pytest.raises(ValueError, match="not host:port"):
        metrics_address("localhost:http")


def test_pool_counts_threads_inside_a_call() -> None:
    import threading

    from cels.node.telemetry import CountingPool

    telemetry, pool, inside, release = NodeTelemetry("solver", "solver"), CountingPool(4), threading.Event(), threading.Event()
    telemetry.watch_pool(pool)
    calls = [pool.submit(lambda: (inside.set(), release.wait(10))) for _ in range(2)]
    inside.wait(10)
    while pool.busy < 2:
        release.wait(0.01)
    assert telemetry.registry.get_sample_value("cels_grpc_pool_threads_busy") == 2
    release.set()
    for call in calls:
        call.result(10)
    assert telemetry.registry.get_sample_value("cels_grpc_pool_threads_busy") == 0
    assert telemetry.registry.get_sample_value("cels_grpc_pool_threads") == 4
    pool.shutdown()


def test_each_registry_is_the_nodes_own() -> None:
    """Two nodes in one process (the tests) keep their counts apart."""
    a, b = NodeTelemetry("party-1", "party"), NodeTelemetry("party-2", "party")
    a.session_created("s1", "party-1")
    a.session_ended("s1", "done")
    assert a.registry.get_sample_value("cels_sessions_total", {"outcome": "done"}) == 1
    assert b.registry.get_sample_value("cels_sessions_total", {"outcome": "done"}) == 0
