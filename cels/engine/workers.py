"""What every part of a party's Ray engine shares: its fault budget for tasks, the reason the
peers are told when it loses a worker, how a worker reports its memory and the window of tasks (docs/deployment.md,
"Faults of the engine")."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Callable, Iterable
from typing import Any

import ray

TASK_RETRIES = 3
"""Runs of a pair-work or reader task after the first when its worker dies (Ray's ``max_retries``); an
exception the task raises itself (a peer's bad id) is not retried: it would raise again."""
WORKER_LOST = "engine worker lost"
"""What the peers are told when the engine loses a worker for good (no digit: docs/security.md)."""


def worker_peak_rss() -> tuple[str, int]:
    """This worker process (host:pid) and its peak resident memory in bytes (``ru_maxrss``, KiB on Linux)."""
    return f"{socket.gethostname()}:{os.getpid()}", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def windowed(items: Iterable, submit: Callable[[Any], tuple[Any, Any]], collect: Callable[[Any, Any], None], limit: int) -> None:
    """Each item submitted (``submit(item)``: the object reference to wait on, and what
    ``collect`` needs of it) with at most ``limit`` unfinished at once; ``collect(ref, that)``
    as each finishes (``ray.wait``): the bounded window of the pair-work and reader tasks."""
    pending: dict = {}

    def collect_one() -> None:
        (done,), _ = ray.wait(list(pending), num_returns=1)
        collect(done, pending.pop(done))

    for item in items:
        if len(pending) >= limit:
            collect_one()
        ref, that = submit(item)
        pending[ref] = that
    while pending:
        collect_one()
