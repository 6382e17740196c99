"""cels.workers: a pool's workers exit when the process that made them is SIGKILLed (issue 13
item 5: a killed party node's obfuscator workers used to live on, reparented to init)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from cels.workers import PARENT_POLL, worker_pool

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from cels.workers import worker_pool
    pool = worker_pool(3, nice=1)
    for future in [pool.submit(time.sleep, 0.2) for _ in range(6)]:
        future.result()
    print(" ".join(str(p) for p in sorted(pool._processes)), flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_their_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 3 and all(alive(p) for p in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        limit = time.monotonic() + 10 * PARENT_POLL
        while any(alive(p) for p in workers) and time.monotonic() < limit:
            time.sleep(0.05)
        left = [p for p in workers if alive(p)]
    finally:
        parent.kill()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of 3 workers outlived their SIGKILLed parent"


def test_workers_run_niced_and_return_results() -> None:
    with worker_pool(2, nice=3) as pool:
        assert list(pool.map(os.nice, [0, 0])) == [os.nice(0) + 3] * 2
