"""The real Prometheus server scrapes real node processes (docs/monitoring.md, "Prometheus and
Grafana").

Prometheus (Debian's package; .ci/run installs it) runs with a temporary configuration that
scrapes every node's metrics port on 127.0.0.1 every second and a temporary storage directory,
on a free 127.0.0.1 port.  One session (private solve, a 30-user synthetic log, 512-bit test
keys) runs over 3 party node processes and a solver with mutual TLS; then Prometheus's HTTP API
(/api/v1/query) is asked for the sessions counter until every node's shows the session.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from cels.cli.simulate import run_nodes
from cels.logs import synthetic_log
from cels.node.cluster import LOOPBACK, LocalCluster, free_port
from cels.protocol.options import SessionOptions

PROMETHEUS = shutil.which("prometheus")
WAIT_SECONDS = 20.0
NODES = ("solver", "party-1", "party-2", "party-3")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary on PATH (Debian: apt-get install prometheus; .ci/run installs it)"
)


def query(api: str, promql: str) -> list[dict]:
    """The result vector of an instant query (empty while Prometheus has nothing, or is starting)."""
    url = f"http://{api}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            body = json.loads(reply.read())
    except OSError:
        return []
    assert body["status"] == "success", body
    return body["data"]["result"]


def start_prometheus(root: Path, targets: dict[str, str]) -> tuple[subprocess.Popen, str]:
    api = f"{LOOPBACK}:{free_port()}"
    config = root / "prometheus.yml"
    jobs = "\n".join(f"      - targets: ['{address}']\n        labels: {{node: '{name}'}}" for name, address in targets.items())
    config.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: cels\n    static_configs:\n{jobs}\n")
    log = open(root / "prometheus.log", "wb")
    argv = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address={api}", "--log.level=warn"]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), api


@pytest.mark.slow
def test_prometheus_scrapes_a_session(tmp_path) -> None:
    metrics = {name: f"{LOOPBACK}:{free_port()}" for name in NODES}
    prometheus, api = start_prometheus(tmp_path, metrics)
    seen: dict[str, list[dict]] = {}

    def wait_for_prometheus(cluster: LocalCluster, _controller) -> None:
        """While the nodes still run: Prometheus's counter shows the session on every node."""
        limit = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < limit:
            seen["done"] = query(api, 'cels_sessions_total{job="cels", outcome="done"} == 1')
            if len(seen["done"]) == len(NODES):
                break
            time.sleep(0.5)
        seen["up"] = query(api, 'up{job="cels"} == 1')
        seen["phases"] = query(api, 'sum by (phase) (cels_phase_seconds_count{node="party-1"})')
        seen["sent"] = query(api, "sum(cels_sent_bytes_total)")

    try:
        options = SessionOptions.create(3, epsilon=1.0, delta=0.4, key_bits=512, deadline=30)
        shares = synthetic_log(users=30, pairs=15).split_by_user(3)
        flags = {name: ["--metrics-listen", address] for name, address in metrics.items()}
        run_nodes(shares, options, tmp_path / "out", ".tsv", ["--format", "aol"], tmp_path / "operator.json", node_flags=flags, while_up=wait_for_prometheus, timeout=120)
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(10)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait(10)
    log = (tmp_path / "prometheus.log").read_text(errors="replace")
    assert sorted(r["metric"]["node"] for r in seen["done"]) == sorted(NODES), f"{seen}\n{log[-3000:]}"
    assert sorted(r["metric"]["node"] for r in seen["up"]) == sorted(NODES)
    assert {"load", "universe", "counts", "solve", "sampling", "union"} <= {r["metric"]["phase"] for r in seen["phases"]}
    assert float(seen["sent"][0]["value"][1]) > 0


def test_a_taken_metrics_port_names_the_address_and_the_setting() -> None:
    """Issue 41 finding 9: it said "[Errno 98] Address already in use" alone."""
    import socket

    from cels.node.telemetry import NodeTelemetry

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError) as err:
            NodeTelemetry("party-1", "party").serve(address)
    assert str(err.value).startswith(f"party-1: cannot serve metrics on {address} (--metrics-listen / [metrics] listen): ")
