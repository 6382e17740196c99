"""A node at rest after concurrent sessions (issue 23): after 5 sessions run 2 at a time, every
node comes back to the threads it had when it first served (+2) and to +20 % of its resident
memory, with no warm-up: gRPC's server pool and the party's decryption pool end their idle
threads (cels.node.pool), and a node keeps no tqdm monitor thread.  (Before, a party node kept
2 to 5 more threads, however long it rested.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cels.node.pool import IDLE_SECONDS
from fault_harness import NODES, FaultCluster, usage

CLUSTER = {"users": 150, "pairs": 120, "deadline": 30.0}
SETTLE = 3.0
EXTRA_THREADS, RSS_FACTOR = 2, 1.20


def test_five_sessions_two_at_a_time_leave_no_threads(cluster: FaultCluster, tmp_path: Path) -> None:
    time.sleep(SETTLE)
    pids = {n: cluster.runs[n].process.pid for n in NODES}
    fresh = {n: usage(pid) for n, pid in pids.items()}
    sessions, failures = iter(range(5)), []

    def worker() -> None:
        for k in sessions:
            try:
                cluster.run(cluster.options(), tmp_path / f"s{k}", timeout=120)
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

    two = [threading.Thread(target=worker) for _ in range(2)]
    for t in two:
        t.start()
    for t in two:
        t.join(600)
    assert not failures, failures
    limit = time.monotonic() + IDLE_SECONDS + SETTLE + 10
    while True:
        now = {n: usage(pid) for n, pid in pids.items()}
        over = {n: f"threads {now[n].threads} vs {fresh[n].threads} at start, rss {now[n].rss / fresh[n].rss:.2f} x"
                for n in NODES if now[n].threads > fresh[n].threads + EXTRA_THREADS or now[n].rss > fresh[n].rss * RSS_FACTOR}  # fmt: skip
        if not over or time.monotonic() > limit:
            break
        time.sleep(0.5)
    assert not over, over
    assert not cluster.crashed()
