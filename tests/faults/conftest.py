"""The fault suite (issue 13): fixtures, the fuzz budget, and the summary it prints.

``make faults`` runs every case (``-m "faults_long or not faults_long"``,
``CELS_FAULTS_FUZZ=10000``); ``make test`` runs the bounded part (the ``faults_long`` cases are
deselected in pyproject's addopts, 1,000 fuzzed messages).  After the run the terminal shows the
kill matrix (role x phase x signal -> outcome, seconds to abort, blamed node), the restart
times, and one JSON line ``FAULTS-SUMMARY {...}`` with the counts of
:data:`fault_harness.SUMMARY_COUNTS`; ``CELS_FAULTS_SUMMARY=FILE`` also writes it to FILE.
TLS cases are the live cases tests/faults/test_tls_matrix.py records in ``FAULTS.counts["tls_cases"]``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fault_harness import FAULTS, SUMMARY_COUNTS, FaultCluster

_XFAILED: dict[str, str] = {}
_RAN: list[str] = []


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    """Three party nodes and a solver node for one test module (its ``CLUSTER`` dict gives
    FaultCluster's options); stopped at the end, counting crashes and orphans."""
    options = getattr(request.module, "CLUSTER", {})
    nodes = FaultCluster(tmp_path_factory.mktemp(Path(request.module.__file__).stem), **options)
    try:
        nodes.start()
        yield nodes
    finally:
        stop_and_count(nodes)


def stop_and_count(nodes: FaultCluster) -> None:
    crashed = nodes.crashed()
    FAULTS.add("crashes", len(crashed))
    FAULTS.add("orphans", len(nodes.stop()))
    assert not crashed, f"node processes exited by themselves: {crashed}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    if "tests/faults/" not in report.nodeid.replace("\\", "/"):
        return
    _RAN.append(report.nodeid)
    if hasattr(report, "wasxfail"):
        _XFAILED[report.nodeid] = report.wasxfail


def summary() -> dict:
    counts = {key: int(FAULTS.counts.get(key, 0)) for key in SUMMARY_COUNTS}
    fuzz = dict(sorted(FAULTS.replies.items()))
    return {
        **counts,
        "fuzz_replies": fuzz,
        "restart_seconds": [r["seconds"] for r in FAULTS.restarts],
        "restart_max_seconds": max((r["seconds"] for r in FAULTS.restarts), default=None),
        "expected_failures": _XFAILED,
        "clean": all(counts[k] == 0 for k in ("crashes", "hangs", "orphans", "leftovers")) and not _XFAILED,
    }


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _RAN:
        return
    write = terminalreporter.write_line
    if FAULTS.kills:
        terminalreporter.section("kill matrix (role x phase x signal)")
        write(f"{'role':<12} {'phase':<9} {'signal':<8} {'outcome':<10} {'abort s':>8} {'blamed':<18} {'restart s':>9}  notes")
        for row in FAULTS.kills:
            seconds = "-" if row["abort_seconds"] is None else f"{row['abort_seconds']:.1f}"
            write(f"{row['role']:<12} {row['phase']:<9} {row['signal']:<8} {row['outcome']:<10} {seconds:>8} "
                  f"{row['blamed']:<18} {row['restart_seconds']:>9.1f}  {row['notes']}")  # fmt: skip
    if FAULTS.restarts:
        terminalreporter.section("restart: a killed node serves the next session within N s")
        for r in FAULTS.restarts:
            write(f"{r['node']:<10} {r['how']:<30} N = {r['seconds']:.1f} s ({r['attempts']} session attempt(s)), serving Status after {r['serving']:.1f} s")
    if FAULTS.resources:
        terminalreporter.section("resources against baseline")
        for r in FAULTS.resources:
            write(json.dumps(r))
    line = json.dumps(summary(), sort_keys=False)
    terminalreporter.section("fault suite summary")
    write(f"FAULTS-SUMMARY {line}")
    target = os.environ.get("CELS_FAULTS_SUMMARY")
    if target:
        Path(target).write_text(line + "\n")
