"""docker-compose.yml in real containers: make compose-test's script (deploy/compose-test.sh),
run here when a Docker engine answers (CI runs ``make compose-test`` itself, installing and
starting the engine).  It builds the image offline, runs the certs step, a solver and three
party nodes with 2048-bit keys on a slice of the AOL log, and audits the release, then the same
with the transformed solve on a smaller slice, asks the metrics profile's Prometheus what it
saw, and runs and audits the private session once more with party-1 on its own Ray cluster (the
cluster profile's head and worker); this test checks that it passed, that the audits ran on
non-empty releases (the DP histogram's too), that a stranger was refused by the Ray cluster,
that on the file's own networks only party-1 reached its metrics, and that nothing of the
compose project is left (containers, volumes, networks)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = "cels-compose-test"


def engine_answers() -> bool:
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def leftovers() -> dict[str, list[str]]:
    """What of the compose project the engine still has."""
    label = f"label=com.docker.compose.project={PROJECT}"
    found = {}
    for kind, argv in {
        "containers": ["docker", "ps", "--all", "--quiet", "--filter", label],
        "volumes": ["docker", "volume", "ls", "--quiet", "--filter", label],
        "networks": ["docker", "network", "ls", "--quiet", "--filter", label],
    }.items():
        found[kind] = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout.split()
    return found


@pytest.mark.slow
@pytest.mark.realdata
@pytest.mark.skipif(not engine_answers(), reason="no Docker engine answers `docker info` (make compose-test installs and starts one; CI runs it)")
def test_compose_in_containers_audits_clean(shared_data, tmp_path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "CELS_DATA": str(shared_data), "CELS_COMPOSE_WORK": str(tmp_path)}
    run = subprocess.run(["bash", "deploy/compose-test.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    audits = re.findall(r"^audit: (\d+) users, \d+ pairs in; (\d+) clicks on \d+ pairs out; .*: clean; phases (.*)$", run.stdout, re.M)
    assert len(audits) == 3, run.stdout[-4000:]
    (private, transformed, on_ray) = audits
    assert int(private[1]) > 0 and int(transformed[1]) > 0 and int(on_ray[1]) > 0  # non-empty releases were audited
    assert "solve" in private[2] and "nlp" in transformed[2] and "solve" in on_ray[2]  # the private solve, the paper's Algorithm 2, the private solve
    assert re.search(r"compose-test: ray-worker ran [1-9]\d* Ray worker processes for party-1", run.stderr), run.stderr[-4000:]
    assert "metrics: scraped (up): party-1, party-2, party-3, solver" in run.stdout
    assert re.search(r"^audit: \d+ users, 17 pairs in; 17 pairs out at tau = \d+: clean", run.stdout, re.M), run.stdout[-4000:]  # the DP histogram
    # a stranger on the nodes' network is refused by party-1's Ray cluster, through its client server and its GCS
    assert re.search(r"a stranger on \S+ connecting to ray-head:7110: REACHED", run.stderr), run.stderr[-4000:]  # the network lets it through
    assert re.search(r"a stranger on \S+ calling ray://ray-head:7111: REFUSED", run.stderr), run.stderr[-4000:]
    assert re.search(r"a stranger on \S+ running ray start --address=ray-head:7110: exit [1-9]", run.stderr), run.stderr[-4000:]
    if "bridge networks run here" in run.stderr:  # the file's own networks: who reaches a node's metrics
        probes = dict(((who, where), verdict.split()[0]) for who, where, verdict in re.findall(r"^isolation: (\S+)\s+-> (\S+): (.*)$", run.stderr, re.M))
        assert probes.pop(("party-1", "party-1-metrics:9101")) == "REACHED" and len(probes) == 5, probes
        assert set(probes.values()) == {"UNREACHABLE"}, probes
    assert "compose-test: PASSED" in run.stderr
    for out in ("out", "out-transformed", "out-cluster"):
        assert (tmp_path / out / "sanitized.tsv").is_file() and (tmp_path / out / "operator" / "report.json").is_file()
    assert leftovers() == {"containers": [], "volumes": [], "networks": []}
    probe_net = subprocess.run(["docker", "network", "ls", "--quiet", "--filter", f"name={PROJECT}-probe"], capture_output=True, text=True, timeout=30)
    assert probe_net.stdout.split() == []  # the networking step's own network went too
