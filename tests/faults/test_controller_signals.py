"""Signals to ``cels run`` (issue 13 item 4): SIGTERM, SIGHUP or Ctrl-C while the session runs
leave no ``.sanitized.tsv.*.tmp`` (nor anything else) in the output directory, the command exits
128 + the signal's number, and the nodes serve the next session."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from fault_harness import BIN, FAULTS, FaultCluster

CLUSTER = {"users": 600, "pairs": 500, "deadline": 8.0}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signalled_cels_run_leaves_no_temporary_file(cluster: FaultCluster, tmp_path: Path, sig: signal.Signals) -> None:
    session = cluster.run_config(tmp_path)
    out = tmp_path / "out"
    run = subprocess.Popen([str(BIN / "cels"), "run", "--config", str(session)], stderr=subprocess.PIPE, text=True)
    limit = time.monotonic() + 60
    while not list(out.glob(".sanitized.tsv.*.tmp")) and run.poll() is None and time.monotonic() < limit:
        time.sleep(0.005)
    assert run.poll() is None, f"cels run ended before the signal: {run.stderr.read()}"
    run.send_signal(sig)
    stderr = run.communicate(timeout=30)[1]
    left = list(out.iterdir())
    FAULTS.add("leftovers", len(left))
    assert run.returncode == 128 + sig, stderr
    assert not left, left
    assert cluster.run(cluster.options(), tmp_path / "next")["solver"]["integer_total"] >= 0
