"""Worker process pools that die with the process that made them (issue 13 item 5).

Every process pool in CELS (a node's obfuscator workers, the solver's decryption pool, the
benchmarks' pools) comes from :func:`worker_pool`.  Its workers are spawned (no fork of a
process with gRPC threads) and each runs a watcher thread: when the parent dies -- also by
SIGKILL, when nothing in it can run -- the worker is reparented and exits within
``PARENT_POLL`` seconds.  ``prctl(PR_SET_PDEATHSIG)`` is not used: it fires when the *thread*
that spawned the worker ends, and pools spawn workers from short-lived request threads.

This module imports nothing heavy: every spawned worker imports it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PARENT_POLL = 0.5
"""Seconds between a worker's checks that its parent is alive."""


def worker_pool(workers: int, nice: int = 0) -> ProcessPoolExecutor:
    """A spawn-context pool of ``workers`` processes, each ``nice`` steps nicer than its
    parent, that exit when their parent dies."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_bind_to_parent, initargs=(os.getpid(), nice))


def _bind_to_parent(parent: int, nice: int) -> None:
    """Worker initializer: renice, then watch the parent pid from a daemon thread."""
    if nice:
        os.nice(nice)
    if os.getppid() != parent:  # the parent died while this worker started
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="watch-parent", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    os._exit(1)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
