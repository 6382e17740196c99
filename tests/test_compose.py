"""docker-compose.yml's commands and healthchecks as local processes (no Docker engine needed).

The test reads the compose file and starts every service's command with the same arguments and
environment, with the container ports remapped to free ports on 127.0.0.1 and the volumes
mapped to temporary directories; it waits, as compose does, until every node's healthcheck
(the gRPC health service, cels.node.health) passes.  tests/test_compose_docker.py runs the file
in containers (make compose-test).  Test-only change:
the session uses 512-bit keys (CELS_MIN_KEY_BITS=512 and CELS_KEY_BITS=512 for the nodes, key_bits = 512 in the copied
session.toml) to keep the run short.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import urllib.request

import yaml

from cels.logs import synthetic_log, write_log
from cels.node.client import Controller, node_statuses, wait_for_stock
from cels.node.cluster import LOOPBACK, LocalCluster, free_port
from cels.node.ledger_file import read_entries

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENV = {"CELS_MIN_KEY_BITS": "512", "CELS_KEY_BITS": "512"}


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` substitution."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(2) or ""), text)


class ComposeAsProcesses:
    def __init__(self, root: Path) -> None:
        self.doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
        self.services = self.doc["services"]
        self.root = root
        self.ports = {
            (name, port): free_port() for name, svc in self.services.items() for port in map(str, svc.get("expose", []))
        }
        self.mounts = {"certs": root / "certs", "./deploy/data": root / "data", "./deploy/out": root / "out", "./deploy/session.toml": root / "session.toml",
                       "party-1-ray": root / "ray", **{f"party-{k}-ledger": root / f"ledger-{k}" for k in (1, 2, 3)}}  # fmt: skip
        for k in (1, 2, 3):
            (root / f"ledger-{k}").mkdir(mode=0o700, parents=True, exist_ok=True)  # the image's /ledger

    def volume_map(self, service: str) -> dict[str, Path]:
        """Container path -> local path for the service's volumes."""
        result = {}
        for spec in self.services[service].get("volumes", []):
            source, target = spec.split(":")[:2]
            result[target] = self.mounts[source]
        return result

    def remap(self, text: str, service: str) -> str:
        text = interpolate(text, ENV)
        for (name, port), local in self.ports.items():
            for known_as in (f"{name}-metrics", f"{name}-operator", name):  # its aliases on its metrics / operator network, its name
                text = text.replace(f"{known_as}:{port}", f"{LOOPBACK}:{local}")
            if name == service:
                text = text.replace(f"0.0.0.0:{port}", f"{LOOPBACK}:{local}")
        for target, local in sorted(self.volume_map(service).items(), key=lambda kv: -len(kv[0])):
            text = text.replace(target, str(local))
        return text

    def argv(self, service: str) -> list[str]:
        command = self.services[service]["command"]
        program, *args = [self.remap(str(a), service) for a in command]
        return [str(BIN / program) if (BIN / program).exists() else program, *args]

    def healthcheck_argv(self, service: str) -> list[str]:
        kind, program, *args = [self.remap(str(a), service) for a in self.services[service]["healthcheck"]["test"]]
        assert kind == "CMD", kind
        return [str(BIN / program), *args]

    def wait_healthy(self, cluster: LocalCluster, services: list[str], timeout: float) -> None:
        """Run each service's healthcheck until it passes, as compose's ``service_healthy``."""
        limit = time.monotonic() + timeout
        for service in services:
            while (probe := subprocess.run(self.healthcheck_argv(service), capture_output=True, text=True, timeout=30)).returncode != 0:
                node = cluster.nodes[service]
                assert node.process.poll() is None, f"{service} exited with {node.process.returncode}:\n{node.log_text()}"
                assert time.monotonic() < limit, f"{service} not healthy after {timeout:g} s: {probe.stderr}"
                time.sleep(0.5)
            assert probe.stdout.strip().endswith("SERVING"), probe.stdout

    def address(self, service: str, index: int = 0) -> str:
        """Where the service's ``expose[index]`` port is here (0: a node's gRPC, 1: its metrics)."""
        port = str(self.services[service]["expose"][index])
        return f"{LOOPBACK}:{self.ports[(service, port)]}"


def test_compose_services_and_dependencies() -> None:
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) == {"certs", "solver", "party-1", "party-2", "party-3", "run", "prometheus", "ray-head", "ray-worker"}
    for node in ("solver", "party-1", "party-2", "party-3"):
        assert services[node]["depends_on"]["certs"]["condition"] == "service_completed_successfully"
        assert services[node]["command"][0] == ("cels-solver" if node == "solver" else "cels-party")
        assert not any("insecure" in str(a) for a in services[node]["command"])  # mutual TLS by default
    # the run trigger waits for every node's healthcheck: the gRPC health service, probed
    # with the node's own certificate at the address its peers use
    assert {name: dep["condition"] for name, dep in services["run"]["depends_on"].items()} == dict.fromkeys(("solver", "party-1", "party-2", "party-3"), "service_healthy")
    for node in ("solver", "party-1", "party-2", "party-3"):
        port = services[node]["expose"][0]
        assert f"--listen=0.0.0.0:{port}" in services[node]["command"]  # its peers reach it by its name on the default network
        assert services[node]["healthcheck"]["test"] == [
            "CMD", "python", "-m", "cels.node.health", f"--name={node}", "--ca=/certs/ca.pem",
            f"--cert=/certs/{node}.pem", f"--key=/certs/{node}.key", f"{node}:{port}",
        ]  # fmt: skip
    # every node serves metrics on a port of its own, on the address it has on a network that
    # only it and Prometheus join (internal: no route out); no other service joins one, so no
    # peer reads another's per-peer byte counters (issue 40); the metrics profile's Prometheus
    # scrapes exactly those addresses and answers only on the operator's network
    metrics = {}
    members = {net: sorted(name for name, svc in services.items() if net in svc.get("networks", {"default": {}})) for net in doc["networks"]}
    for node in ("solver", "party-1", "party-2", "party-3"):
        grpc_port, metrics_port = services[node]["expose"]
        net = f"{node}-metrics"
        assert f"--metrics-listen={net}:{metrics_port}" in services[node]["command"] and metrics_port != grpc_port
        assert services[node]["networks"] == {"default": {}, net: {"aliases": [net]}}
        assert doc["networks"][net] == {"internal": True} and members[net] == sorted([node, "prometheus"])
        metrics[node] = f"{net}:{metrics_port}"
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["metrics"] and "depends_on" not in prometheus
    assert prometheus["build"] == "./deploy/prometheus" and (REPO / "deploy" / "prometheus" / "Dockerfile").is_file()
    assert "--web.listen-address=prometheus-operator:9090" in prometheus["command"] and prometheus["expose"] == ["9090"]
    assert prometheus["networks"]["operator"] == {"aliases": ["prometheus-operator"]} and members["operator"] == ["prometheus"]
    assert "default" not in prometheus["networks"] and prometheus["ports"] == ["127.0.0.1:9090:9090"]
    config_source, config_target = prometheus["volumes"][0].split(":")[:2]
    assert f"--config.file={config_target}" in prometheus["command"]
    scrape = yaml.safe_load((REPO / config_source).read_text())
    (job,) = scrape["scrape_configs"]
    assert {group["labels"]["node"]: target for group in job["static_configs"] for target in group["targets"]} == metrics
    # the image's build context holds everything pip needs to build the project
    ignored = (REPO / ".dockerignore").read_text().split()
    for path in ("pyproject.toml", "README.md", "cels", "party_node", "solver_node", "protos"):
        assert path not in ignored, path


def env_file(path: Path) -> dict[str, str]:
    """Compose's ``--env-file``: ``NAME=value`` lines, ``#`` comments."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def party_1_engine(command: list[str], env: dict[str, str]):
    """The engine party-1's command line asks for, with compose's interpolation of ``env``."""
    from cels.engine.options import engine_options
    from party_node.__main__ import build_parser

    args = build_parser().parse_args([interpolate(str(a), env) for a in command[1:]])
    return engine_options(args, {})


def test_compose_cluster_profile_is_party_1s_own_ray_cluster() -> None:
    """The cluster profile: a Ray head and a worker that waits for it; party-1 joins the head's
    Ray client port with deploy/cluster.env and runs in process without it; no other service
    refers to the cluster (it holds party-1's universe scalar and constraint rows)."""
    from cels.engine.options import EngineOptions

    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    cluster = {name for name, svc in services.items() if "cluster" in svc.get("profiles", [])}
    assert cluster == {"ray-head", "ray-worker"}
    head, worker = services["ray-head"], services["ray-worker"]
    # the head issues its own TLS certificate and party-1's from party-1's Ray CA (made once, in
    # the token's volume), makes its token (never printed), then execs `ray start` with the rest
    # as "$@"; the worker issues its own certificate from that CA, then execs `ray start`
    ca = "--ca /home/cels/.ray/tls/ca"
    assert head["command"][:4] == [
        "sh", "-c", f"cels ray-tls {ca} --name ray-head --out /tmp/ray-tls >/dev/null && cels ray-tls {ca} --name party-1 --client "
        '--out /home/cels/.ray/tls/party-1 >/dev/null && ray get-auth-token --generate >/dev/null && exec "$$@"', "ray-head",
    ]  # fmt: skip
    assert worker["command"][:4] == ["sh", "-c", f'cels ray-tls {ca} --name ray-worker --out /tmp/ray-tls >/dev/null && exec "$$@"', "ray-worker"]
    head_argv, worker_argv = head["command"][4:], worker["command"][4:]
    for svc, argv in ((head, head_argv), (worker, worker_argv)):
        assert svc["profiles"] == ["cluster"] and svc["image"] == "cels:dev" and svc["init"] is True
        assert argv[:2] == ["ray", "start"] and "--block" in argv  # the container's main process
    flags = dict(a.split("=", 1) for a in head_argv if "=" in a)
    assert "--head" in head_argv and flags["--num-cpus"] == "0"  # the head schedules; the worker works
    gcs, client = flags["--port"], flags["--ray-client-server-port"]
    assert head["expose"] == [gcs, client]
    assert head["healthcheck"]["test"] == ["CMD", "ray", "health-check", f"--address=ray-head:{gcs}", "--component=ray_client_server"]
    assert f"--address=ray-head:{gcs}" in worker_argv
    assert worker["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    # token authentication: the token's volume is written by the head, read by the worker and party-1
    token = {name: [v for v in svc.get("volumes", []) if v.startswith("party-1-ray:")] for name, svc in services.items()}
    assert {name: v for name, v in token.items() if v} == {
        "ray-head": ["party-1-ray:/home/cels/.ray"], "ray-worker": ["party-1-ray:/home/cels/.ray:ro"], "party-1": ["party-1-ray:/home/cels/.ray:ro"],
    }  # fmt: skip
    tls = {"RAY_USE_TLS": "1", **{var: f"/tmp/ray-tls/{f}" for var, f in (("RAY_TLS_SERVER_CERT", "tls.pem"), ("RAY_TLS_SERVER_KEY", "tls.key"), ("RAY_TLS_CA_CERT", "ca.pem"))}}
    for name in ("ray-head", "ray-worker", "party-1"):
        environment = services[name]["environment"]
        assert environment["RAY_AUTH_MODE"] == "token", name
        own = tls if name != "party-1" else {var: path.replace("/tmp/ray-tls", "/home/cels/.ray/tls/party-1") for var, path in tls.items()}
        assert {var: environment[var] for var in tls} == own, name  # TLS on every process of the cluster, and on its client

    env = env_file(REPO / "deploy" / "cluster.env")
    assert env["COMPOSE_PROFILES"] == "cluster"
    command = services["party-1"]["command"]
    assert party_1_engine(command, env) == EngineOptions(kind="ray", address=f"ray://ray-head:{client}", shards=2)
    assert party_1_engine(command, {}) == EngineOptions()  # without the env file: the default, in the node
    for name, svc in services.items():
        if name not in cluster | {"party-1"}:
            text = yaml.safe_dump(svc)
            assert not any(ref in text for ref in ("ray-head", "ray-worker", "party-1-ray", "RAY_", "CELS_PARTY_1_ENGINE", f":{gcs}", f":{client}")), name
    # the image has Ray, and make compose-test's offline wheelhouse has its wheels, from the image's hashed lock
    assert "'/src[ray]'" in (REPO / "Dockerfile").read_text()
    assert "lock=deploy/lock/image.txt" in (REPO / "deploy" / "compose-test.sh").read_text()
    assert "ray==" in (REPO / "deploy" / "lock" / "image.txt").read_text()


def test_compose_commands_run_a_session_as_local_processes(tmp_path) -> None:
    compose = ComposeAsProcesses(tmp_path)
    env = {**os.environ, **ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    certs = subprocess.run(compose.argv("certs"), env=env, capture_output=True, text=True, timeout=60)
    assert certs.returncode == 0, certs.stderr
    # a second `up` keeps the CA: nodes that still run hold the first one's certificates
    ca = (tmp_path / "certs" / "ca.pem").read_bytes()
    again = subprocess.run(compose.argv("certs"), env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "kept" in again.stdout and (tmp_path / "certs" / "ca.pem").read_bytes() == ca, again
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    for k, share in enumerate(synthetic_log(users=90, pairs=40).split_by_user(3), start=1):
        write_log(share, tmp_path / "data" / f"party-{k}.tsv")
    session = (REPO / "deploy" / "session.toml").read_text()
    assert "key_bits = 2048" in session
    (tmp_path / "session.toml").write_text(compose.remap(session.replace("key_bits = 2048", "key_bits = 512"), "run"))

    with LocalCluster(tmp_path / "logs") as cluster:
        for service in ("solver", "party-1", "party-2", "party-3"):
            cluster.start(service, compose.address(service), compose.argv(service), env=ENV)
        compose.wait_healthy(cluster, ["solver", "party-1", "party-2", "party-3"], timeout=120)
        # the offline phase with the compose defaults: every party learns the node keys of its
        # peers through Status and stocks obfuscators for them (4096 per key) before the session
        certs = tmp_path / "certs"
        identities = {n: (certs / f"controller-{n}.pem", certs / f"controller-{n}.key") for n in ("solver", "party-1", "party-2", "party-3")}
        ctrl = Controller("party-1", compose.address("party-1"), certs / "ca.pem", *identities["party-1"], identities=identities)
        parties = {p: compose.address(p) for p in ("party-1", "party-2", "party-3")}
        before = wait_for_stock(ctrl, parties, timeout=120)
        run = subprocess.run(compose.argv("run"), env=env, capture_output=True, text=True, timeout=300)
        logs = "\n".join(f"--- {n}\n{p.log_text()}" for n, p in cluster.nodes.items())
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
        # every party learned every node key; the private solve (the default) sums by pairwise
        # masks and encrypts nothing under any of them: the stocks are kept for --solve transformed
        solver_key = node_statuses(ctrl, {"solver": compose.address("solver")})["solver"].key.n
        for name, status in node_statuses(ctrl, parties).items():
            stock, earlier = {e.owner: e for e in status.stock}, {e.owner: e for e in before[name].stock}
            assert set(stock) == {"solver", "party-1", "party-2", "party-3"} and stock["solver"].n == solver_key
            assert {o: e.handed_out for o, e in stock.items()} == {o: e.handed_out for o, e in earlier.items()}
        released = {name: (tmp_path / "out" / name).read_bytes() for name in ("sanitized.tsv", "sanitized.tsv.release-note.json", "operator/report.json")}
        for k in (1, 2, 3):  # every party charged the session in its own ledger (its key beside it, 0600)
            ledger = tmp_path / f"ledger-{k}" / f"party-{k}.ledger.json"
            assert len(read_entries(ledger)) == 1 and stat.S_IMODE(ledger.with_name(f"party-{k}.ledger.key").stat().st_mode) == 0o600
        # every node's metrics port (remapped like its gRPC port) counted the session
        for service in ("solver", "party-1", "party-2", "party-3"):
            with urllib.request.urlopen(f"http://{compose.address(service, 1)}/metrics", timeout=5) as page:
                assert 'cels_sessions_total{outcome="done"} 1.0' in page.read().decode(), service
        # a malformed log on party-2: the session aborts, the run names party-2 (its log: the line), nothing is written
        bad = tmp_path / "data" / "party-2.tsv"
        good = bad.read_bytes()
        bad.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\tt\tr\thttp://x/\textra\n")
        again = [*compose.argv("run"), "--force"]  # the same session.toml again: its release exists (issue 41 finding 2)
        failed = subprocess.run(again, env=env, capture_output=True, text=True, timeout=300)
        assert failed.returncode == 1, failed.stderr
        assert "cels run: party-2 failed in phase load (cannot load its log)" in failed.stderr, failed.stderr
        assert "line 2" in cluster.nodes["party-2"].log_text()
        assert "line 2" not in failed.stderr  # party-2's details stay with party-2's operator
        # the initiator's own bad log: its controller (the caller) gets the file, line and field (issue 41 finding 25)
        first = tmp_path / "data" / "party-1.tsv"
        first.write_text(bad.read_text())
        bad.write_bytes(good)  # party-1 alone fails now
        own = subprocess.run(again, env=env, capture_output=True, text=True, timeout=300)
        assert own.returncode == 1 and "cels run: party-1 failed in phase load (cannot load its log): " in own.stderr, own.stderr
        assert "party-1.tsv, line 2" in own.stderr, own.stderr
        assert {name: (tmp_path / "out" / name).read_bytes() for name in released} == released
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["operator", "sanitized.tsv", "sanitized.tsv.release-note.json"]
    sanitized = (tmp_path / "out" / "sanitized.tsv").read_text().splitlines()
    assert sanitized[0] == "AnonID\tQuery\tQueryTime\tItemRank\tClickURL"  # the parties' input format (AOL)
    report = json.loads((tmp_path / "out" / "operator" / "report.json").read_text())
    assert report["solver"]["integer_total"] == len(sanitized) - 1  # one AOL row per released click
    assert {"privacy", "solver", "utility", "phases", "bytes_total", "wire"} <= set(report)


def test_the_compose_verdict_script_audits_a_dp_release_by_the_sessions_machine(tmp_path) -> None:
    """deploy/compose_release.py (make compose-test's verdict, run outside the containers) loads
    with the project's modules and reads the phases a DP session must report from its machine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_release", REPO / "deploy" / "compose_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from cels.protocol.options import SessionOptions

    options = SessionOptions.create(3, epsilon=1.0, delta=1e-6, release="dp")
    assert [p.value for p in module.party_machine(options).phases] == ["load", "universe", "counts"]


def test_the_compose_test_runs_the_file_as_shipped_but_for_each_sessions_data_and_outputs() -> None:
    """deploy/compose-test.yml replaces mounts only, each at a path the shipped file mounts: the
    networks, ports and commands under test are docker-compose.yml's own."""

    def target(volume: str) -> str:  # SOURCE:TARGET[:ro], the source may hold ${VAR:-}
        fields = volume.split(":")
        return fields[-2] if fields[-1] in ("ro", "rw") else fields[-1]

    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    override = yaml.safe_load((REPO / "deploy" / "compose-test.yml").read_text())
    assert set(override) == {"services"}
    for name, service in override["services"].items():
        assert set(service) == {"volumes"}, name
        shipped = {target(v) for v in doc["services"][name]["volumes"]}
        assert {target(v) for v in service["volumes"]} <= shipped, name


def test_the_compose_probe_tells_a_port_that_answers_from_one_that_does_not() -> None:
    """deploy/compose_probe.py connect (the isolation step's verdict inside a container)."""
    probe = [sys.executable, str(REPO / "deploy" / "compose_probe.py"), "connect", "127.0.0.1"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        reached = subprocess.run([*probe, str(port)], capture_output=True, text=True, timeout=30)
    assert reached.stdout.strip() == "REACHED", reached.stdout + reached.stderr
    closed = subprocess.run([*probe, str(port)], capture_output=True, text=True, timeout=30)
    assert closed.stdout.startswith("UNREACHABLE ConnectionRefusedError"), closed.stdout + closed.stderr
    unknown = subprocess.run([*probe[:-1], "no-such-host.invalid", "9101"], capture_output=True, text=True, timeout=30)
    assert unknown.stdout.startswith("UNREACHABLE gaierror"), unknown.stdout + unknown.stderr


def test_the_compose_tests_fallback_runs_the_compose_file_on_the_hosts_loopback(tmp_path) -> None:
    """Where bridge networks cannot run: deploy/compose_release.py loopback, docker-compose.yml
    less what host networking cannot have (networks, published ports), every node on
    127.0.0.1, nothing else changed, and deploy/compose-host.yml naming every node 127.0.0.1."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_release", REPO / "deploy" / "compose_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    loopback = module.loopback_compose(doc)
    assert "networks" not in loopback and set(loopback["services"]) == set(doc["services"])
    for name, service in doc["services"].items():
        kept = loopback["services"][name]
        assert "networks" not in kept and "ports" not in kept
        command, now = service.get("command", []), kept.get("command", [])
        assert len(now) == len(command) and not any("0.0.0.0" in str(a) for a in now), name
        for before, after in zip(command, now):  # the same command, but a node listening on every interface listens on loopback
            listens_everywhere = isinstance(before, str) and before.startswith("--listen=0.0.0.0:")
            assert after == (before.replace("0.0.0.0", "127.0.0.1") if listens_everywhere else before), (name, before, after)
        assert {k: v for k, v in kept.items() if k != "command"} == {k: v for k, v in service.items() if k not in ("command", "networks", "ports")}
    override = yaml.safe_load((REPO / "deploy" / "compose-host.yml").read_text())
    assert set(override["services"]) == set(doc["services"])
    hosts = dict(h.split(":") for h in override["x-loopback"]["extra_hosts"])
    for node in ("solver", "party-1", "party-2", "party-3"):
        assert hosts[node] == hosts[f"{node}-metrics"] == "127.0.0.1"
        assert any(a.startswith("--listen=127.0.0.1:") for a in loopback["services"][node]["command"])
    assert hosts["prometheus-operator"] == "127.0.0.1"
