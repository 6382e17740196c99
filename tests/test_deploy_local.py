"""docs/deployment.md's tutorial, "A local session, step by step (deploy/local/)", as written:
`cels certs`, `cels split`, the four nodes from their TOML files, `cels run --config
deploy/local/session.toml`, `cels ledger`.  The files are deploy/local's, copied, with one
change: free ports in place of 7200-7203 and 9300-9303, so that the test runs beside anything.
A newcomer found the tutorial's `cels run` waiting its whole minute and giving up: its
controller may not read the other organisations' nodes' status, and the wait took that refusal
for a node that was not running."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from cels.logs import synthetic_log, write_log
from cels.node.cluster import LOOPBACK, LocalCluster, free_port

REPO = Path(__file__).resolve().parent.parent
NODES = ("solver", "party-1", "party-2", "party-3")


BIN = Path(sys.executable).parent
"""The console scripts the tutorial runs (cels, cels-party, cels-solver)."""


def cels(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cels"), *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_local_tutorial_runs_a_session_as_written(tmp_path) -> None:
    local = tmp_path / "deploy" / "local"
    shutil.copytree(REPO / "deploy" / "local", local, ignore=shutil.ignore_patterns("certs", "data", "out", "operator", "*.log", "*.state", "*.json"))
    ports = {str(port): str(free_port()) for port in (*range(7200, 7204), *range(9300, 9304))}
    for toml in local.glob("*.toml"):
        toml.write_text(re.sub(r"127\.0\.0\.1:(7\d{3}|9\d{3})", lambda m: f"{LOOPBACK}:{ports.get(m[1], m[1])}", toml.read_text()))
    write_log(synthetic_log(users=60, seed=3), tmp_path / "log.tsv")
    assert cels("certs", "--out", "deploy/local/certs", "--parties", "3", cwd=tmp_path).returncode == 0
    split = cels("split", "log.tsv", "--format", "aol", "--parties", "3", "--out", "deploy/local/data/party-{k}.tsv", cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    (local / "out").mkdir()
    with LocalCluster(tmp_path / "logs") as cluster:
        for name in NODES:
            script = "cels-solver" if name == "solver" else "cels-party"
            address = f"{LOOPBACK}:{ports[str(7200 + NODES.index(name))]}"
            cluster.start(name, address, [str(BIN / script), "--config", str(local / f"{name}.toml")])
        cluster.wait_ready()
        run = cels("run", "--config", "deploy/local/session.toml", cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:] + "".join(cluster.nodes[n].log_text()[-1500:] for n in NODES)
        assert "PERMISSION_DENIED" not in run.stderr  # the other organisations' nodes refuse party-1's controller their status: an answer
        assert (local / "out" / "sanitized.tsv").is_file() and (local / "out" / "sanitized.tsv.release-note.json").is_file()
        ledger = cels("ledger", "--config", "deploy/local/party-1.toml", cwd=tmp_path)
        assert ledger.returncode == 0 and "sessions" in ledger.stdout, ledger.stdout + ledger.stderr
