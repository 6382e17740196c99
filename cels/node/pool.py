"""A thread pool whose idle threads end: the executor of a node's gRPC server and of the
party's decryptions.

``concurrent.futures.ThreadPoolExecutor`` starts a thread whenever no idle one is there, up to
its maximum, and keeps every thread until shutdown, so a node kept the peak of its concurrent
calls (sessions run two at a time hold Run streams, held messages, probes) as idle threads
after the sessions were over (docs/faults.md, "Under faults": load).  Here a thread that
waited ``idle_seconds`` for work ends, so a node returns to its thread count at rest.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

IDLE_SECONDS = 5.0
"""How long an idle pool thread waits for work before it ends."""


class ElasticThreadPool(futures.Executor):
    """Threads started on demand up to ``max_workers``; each ends after ``idle_seconds`` without work.

    Accounting (under the lock): ``idle`` counts threads waiting for work beyond the queued
    tasks; a submitted task claims one of them, else starts a thread, else (at the maximum)
    becomes backlog that the next thread done with its task takes.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = "pool", idle_seconds: float = IDLE_SECONDS) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers, self.idle_seconds, self.prefix = max_workers, idle_seconds, thread_name_prefix
        self._tasks: queue.SimpleQueue[tuple[futures.Future, Callable, tuple, dict] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._backlog = 0
        self._numbers = itertools.count()
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._tasks.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, name=f"{self.prefix}_{next(self._numbers)}", daemon=True)
                self._threads.add(thread)
                thread.start()
            else:
                self._backlog += 1
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                task = self._tasks.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._tasks.empty():  # no task was queued for this thread meanwhile
                        self._idle -= 1
                        self._threads.discard(me)
                        return
                continue
            if task is None:  # shutdown
                return
            future, fn, args, kwargs = task
            del task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the future carries it
                    future.set_exception(exc)
            del future, fn, args, kwargs
            with self._lock:
                if self._backlog:
                    self._backlog -= 1
                else:
                    self._idle += 1

    def threads(self) -> int:
        """Threads alive in the pool now."""
        with self._lock:
            return len(self._threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
        for _ in threads:
            self._tasks.put(None)
        if wait:
            for thread in threads:
                thread.join()
