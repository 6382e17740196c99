"""Load (issue 13): 20 sessions back to back and 4 concurrent on one set of node processes;
afterwards every node's resources return to their baseline.

Baseline: after a warm-up of one session and one round of 4 concurrent sessions (gRPC's server
thread pool and the allocator reach their working size), SETTLE seconds after the last session.
Tolerance, per node (summed over its process session): resident memory +20 %, threads +2, file
descriptors +0, processes +0, and no file in its TMPDIR.  After the load the nodes get up to
SETTLE_LIMIT seconds to come back within it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from fault_harness import FAULTS, NODES, FaultCluster, Usage, usage

pytestmark = pytest.mark.faults_long
CLUSTER = {"users": 150, "pairs": 120, "deadline": 30.0}
SETTLE, SETTLE_LIMIT = 3.0, 30.0
RSS_FACTOR, EXTRA_THREADS, EXTRA_FDS = 1.20, 2, 0


def concurrent(cluster: FaultCluster, out: Path, n: int) -> list:
    results: list = [None] * n

    def one(k: int) -> None:
        try:
            results[k] = cluster.run(cluster.options(), out / f"c{k}", timeout=300)
        except Exception as exc:  # noqa: BLE001 - reported below
            results[k] = exc

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(400)
    return results


def within(base: Usage, now: Usage) -> list[str]:
    over = []
    if now.rss > base.rss * RSS_FACTOR:
        over.append(f"rss {now.rss / 2**20:.0f} MiB > {RSS_FACTOR:g} x {base.rss / 2**20:.0f} MiB")
    if now.threads > base.threads + EXTRA_THREADS:
        over.append(f"threads {now.threads} > {base.threads} + {EXTRA_THREADS}")
    if now.fds > base.fds + EXTRA_FDS:
        over.append(f"fds {now.fds} > {base.fds} + {EXTRA_FDS}")
    if now.processes > base.processes:
        over.append(f"processes {now.processes} > {base.processes}")
    return over


def test_sessions_back_to_back_and_concurrent_return_to_baseline(cluster: FaultCluster, tmp_path: Path) -> None:
    cluster.run(cluster.options(), tmp_path / "warm")
    warm = concurrent(cluster, tmp_path / "warm-c", 4)
    assert all(isinstance(r, dict) for r in warm), warm
    time.sleep(SETTLE)
    pids = {n: cluster.runs[n].process.pid for n in NODES}
    base = {n: usage(pid) for n, pid in pids.items()}

    start = time.monotonic()
    for k in range(20):
        report = cluster.run(cluster.options(), tmp_path / f"seq{k}")
        assert report["solver"]["integer_total"] >= 0
        FAULTS.add("load_sessions")
    sequential = time.monotonic() - start
    start = time.monotonic()
    results = concurrent(cluster, tmp_path / "conc", 4)
    parallel = time.monotonic() - start
    failed = [r for r in results if not isinstance(r, dict)]
    FAULTS.add("load_sessions", len(results) - len(failed))
    assert not failed, failed

    limit = time.monotonic() + SETTLE_LIMIT
    time.sleep(SETTLE)
    while True:
        now = {n: usage(pid) for n, pid in pids.items()}
        over = {n: within(base[n], now[n]) for n in NODES}
        if not any(over.values()) or time.monotonic() > limit:
            break
        time.sleep(1.0)
    left = cluster.leftovers()
    FAULTS.add("leftovers", len(left))
    FAULTS.resources.append({
        "test": "load", "sequential_20_seconds": round(sequential, 1), "concurrent_4_seconds": round(parallel, 1),
        "baseline": {n: base[n].__dict__ for n in NODES}, "after": {n: now[n].__dict__ for n in NODES},
    })  # fmt: skip
    assert not any(over.values()), json.dumps(over)
    assert not left, left
    assert not cluster.crashed()
