"""cels.node.pool: a thread pool whose idle threads end (a node's gRPC server and decryptions)."""

from __future__ import annotations

import threading
import time

import pytest

from cels.node.pool import ElasticThreadPool


def wait_until(condition, timeout: float = 5.0) -> bool:
    limit = time.monotonic() + timeout
    while not condition() and time.monotonic() < limit:
        time.sleep(0.01)
    return condition()


def test_threads_grow_with_concurrent_calls_and_end_when_idle() -> None:
    pool = ElasticThreadPool(8, thread_name_prefix="t", idle_seconds=0.3)
    gate, started = threading.Event(), threading.Semaphore(0)

    def held(k: int) -> int:
        started.release()
        gate.wait(5)
        return k

    calls = [pool.submit(held, k) for k in range(5)]
    for _ in range(5):  # all five run at once: a held call does not wait for a thread
        assert started.acquire(timeout=5)
    assert pool.threads() == 5
    gate.set()
    assert [f.result(5) for f in calls] == list(range(5))
    assert [f.result(5) for f in [pool.submit(pow, 2, k) for k in range(20)]] == [2**k for k in range(20)]
    assert pool.threads() <= 8  # never past the maximum
    assert wait_until(lambda: pool.threads() == 0), pool.threads()  # back to none at rest
    assert pool.submit(lambda: "again").result(5) == "again"
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(print)


def test_at_the_maximum_calls_queue_and_every_one_runs() -> None:
    pool = ElasticThreadPool(2, idle_seconds=0.2)
    running, peak, lock = [0], [0], threading.Lock()

    def call(k: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return k

    for _ in range(3):  # rounds with idle gaps in between: threads end and come back
        assert sorted(f.result(10) for f in [pool.submit(call, k) for k in range(50)]) == list(range(50))
        time.sleep(0.3)
    assert peak[0] == 2
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    pool.shutdown()
    assert pool.threads() <= 2
