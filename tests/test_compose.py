"""docker-compose.yml cannot rot: its commands run here as local processes.

No Docker engine runs on these machines, so the test reads the compose file and starts every
service's command with the same arguments and environment, with the container ports remapped
to free ports on 127.0.0.1 and the volumes mapped to temporary directories.  Test-only change:
the session uses 512-bit keys (CELS_MIN_KEY_BITS=512 and CELS_KEY_BITS=512 for the nodes, key_bits = 512 in the copied
session.toml) to keep the run short.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from cels.logs import synthetic_log, write_log
from cels.node.client import Controller, node_statuses, wait_for_stock
from cels.node.cluster import LOOPBACK, LocalCluster, free_port

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
        self.mounts = {"certs": root / "certs", "./deploy/data": root / "data", "./deploy/out": root / "out", "./deploy/session.toml": root / "session.toml"}

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
            text = text.replace(f"{name}:{port}", f"{LOOPBACK}:{local}")
            if name == service:
                text = text.replace(f"0.0.0.0:{port}", f"{LOOPBACK}:{local}")
        for target, local in sorted(self.volume_map(service).items(), key=lambda kv: -len(kv[0])):
            text = text.replace(target, str(local))
        return text

    def argv(self, service: str) -> list[str]:
        command = self.services[service]["command"]
        program, *args = [self.remap(str(a), service) for a in command]
        return [str(BIN / program), *args]

    def address(self, service: str) -> str:
        (port,) = [local for (name, _), local in self.ports.items() if name == service]
        return f"{LOOPBACK}:{port}"


def test_compose_services_and_dependencies() -> None:
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) == {"certs", "solver", "party-1", "party-2", "party-3", "run"}
    for node in ("solver", "party-1", "party-2", "party-3"):
        assert services[node]["depends_on"]["certs"]["condition"] == "service_completed_successfully"
        assert services[node]["command"][0] == ("cels-solver" if node == "solver" else "cels-party")
        assert not any("insecure" in str(a) for a in services[node]["command"])  # mutual TLS by default
    assert set(services["run"]["depends_on"]) == {"solver", "party-1", "party-2", "party-3"}
    dockerfile = (REPO / "Dockerfile").read_text()
    for path in ("pyproject.toml", "cels", "party_node", "solver_node", "protos"):
        assert re.search(rf"^COPY .*\b{path} ", dockerfile, re.M), path


def test_compose_commands_run_a_session_as_local_processes(tmp_path) -> None:
    compose = ComposeAsProcesses(tmp_path)
    env = {**os.environ, **ENV}
    certs = subprocess.run(compose.argv("certs"), env=env, capture_output=True, text=True, timeout=60)
    assert certs.returncode == 0, certs.stderr
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
        cluster.wait_ready(timeout=60)
        # the offline phase with the compose defaults: every party learns the node keys of its
        # peers through Status and stocks obfuscators for them (4096 per key) before the session
        certs = tmp_path / "certs"
        ctrl = Controller("party-1", compose.address("party-1"), certs / "ca.pem", certs / "controller.pem", certs / "controller.key")
        parties = {p: compose.address(p) for p in ("party-1", "party-2", "party-3")}
        before = wait_for_stock(ctrl, parties, timeout=120)
        run = subprocess.run(compose.argv("run"), env=env, capture_output=True, text=True, timeout=300)
        logs = "\n".join(f"--- {n}\n{p.log_text()}" for n, p in cluster.nodes.items())
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
        # every party learned the solver's node key; the private solve (the default) encrypts
        # nothing under it, while P_1's node key encrypted the secure sums from the stocks
        solver_key = node_statuses(ctrl, {"solver": compose.address("solver")})["solver"].key.n
        for name, status in node_statuses(ctrl, parties).items():
            stock = {e.owner: e for e in status.stock}
            assert set(stock) == {"solver", "party-1", "party-2", "party-3"} and stock["solver"].n == solver_key
            assert stock["solver"].handed_out == {e.owner: e for e in before[name].stock}["solver"].handed_out
            assert stock["party-1"].handed_out > 0
        released = {name: (tmp_path / "out" / name).read_bytes() for name in ("sanitized.tsv", "report.json")}
        # a malformed log on party-2: the session aborts, the run reports party-2's error, nothing is written
        bad = tmp_path / "data" / "party-2.tsv"
        bad.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\tt\tr\thttp://x/\textra\n")
        failed = subprocess.run(compose.argv("run"), env=env, capture_output=True, text=True, timeout=300)
        assert failed.returncode == 1, failed.stderr
        assert "session aborted by party-2" in failed.stderr and f"{bad}, line 2" in failed.stderr, failed.stderr
        assert {name: (tmp_path / "out" / name).read_bytes() for name in released} == released
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.json", "sanitized.tsv"]
    sanitized = (tmp_path / "out" / "sanitized.tsv").read_text().splitlines()
    assert sanitized[0] == "AnonID\tQuery\tQueryTime\tItemRank\tClickURL"  # the parties' input format (AOL)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["solver"]["integer_total"] == len(sanitized) - 1  # one AOL row per released click
    assert {"privacy", "solver", "utility", "phases", "bytes_total", "wire"} <= set(report)
