"""What every part of a party's Ray engine shares: its fault budget for tasks, the reason the
peers are told when it loses a worker, and how a worker reports its memory (docs/deployment.md,
"Faults of the engine")."""

from __future__ import annotations

import os
import resource
import socket

TASK_RETRIES = 3
"""Runs of a pair-work or reader task after the first when its worker dies (Ray's ``max_retries``); an
exception the task raises itself (a peer's bad id) is not retried: it would raise again."""
WORKER_LOST = "engine worker lost"
"""What the peers are told when the engine loses a worker for good (no digit: docs/security.md)."""


def worker_peak_rss() -> tuple[str, int]:
    """This worker process (host:pid) and its peak resident memory in bytes (``ru_maxrss``, KiB on Linux)."""
    return f"{socket.gethostname()}:{os.getpid()}", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
