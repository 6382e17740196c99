"""What every part of a party's Ray engine shares: its fault budget for tasks, the reason the
peers are told when it loses a worker, how a worker reports its memory and the window of tasks (docs/ray.md,
"Faults of the engine")."""

from __future__ import annotations

import gc
import os
import resource
import socket
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import ray

TASK_RETRIES = 3
"""Runs of a pair-work or reader task after the first when its worker dies (Ray's ``max_retries``); an
exception the task raises itself (a peer's bad id) is not retried: it would raise again."""
WORKER_LOST = "engine worker lost"
"""What the peers are told when the engine loses a worker for good (no digit: docs/security.md)."""


def worker_peak_rss() -> tuple[str, int]:
    """This worker process (host:pid) and its peak resident memory in bytes: Linux's ``VmHWM``
    (which :meth:`ShardState.reset` clears for a warm shard's next session), else ``ru_maxrss``
    (KiB on Linux, the process's whole life)."""
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return where, int(line.split()[1]) * 1024
    except OSError:
        pass
    return where, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class ShardState:
    """What every shard actor kind shares: its process's peak RSS, and :meth:`reset`, which a
    node's warm pool (cels.engine.ray.shards.ShardPool) calls when a session hands the actor
    back, so the next session finds it as new (``__init__`` again, no argument)."""

    def slice(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Entries lo..hi of the array this actor set aside for the node as ``name``
        (``self.handed``; :func:`in_slices`)."""
        return self.handed[name][lo:hi]

    def peak_rss(self) -> tuple[str, int]:
        """This actor's process and its peak RSS since it started or was last reset (bytes)."""
        return worker_peak_rss()

    def reset(self) -> None:
        """Drop the session's state (the rows, counts or draws it held) and clear the peak RSS
        (``/proc/self/clear_refs``: 5 resets VmHWM; a kernel that refuses keeps the old peak)."""
        self.__init__()
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
                refs.write("5")
        except OSError:
            pass


SLICE_BYTES = 96 << 10
"""Bytes of an array per call between a node and its shards (:func:`in_slices`): under Ray's
default 100 KiB bound for passing a value in the call itself (``max_direct_call_object_size``;
4 MiB on the instance a node starts: cels.engine.ray.cluster.LOCAL_RAY_CONFIG), so no
per-pair array of the load goes through the object store, whose pages the node would keep
mapped for the rest of its life (RssShmem: 40 MB at 4M pairs; docs/ray.md)."""


def in_slices(length: int, itemsize: int) -> list[tuple[int, int]]:
    """(lo, hi) slices of an array of ``length`` items of ``itemsize`` bytes, each at most
    :data:`SLICE_BYTES`."""
    step = max(1, SLICE_BYTES // max(1, itemsize))
    return [(lo, min(lo + step, length)) for lo in range(0, length, step)]


def fetch(actor: Any, name: str, length: int, dtype: np.dtype, start: int = 0) -> list:
    """Object references of the slices of ``length`` items from ``start`` on of ``actor``'s
    array ``name`` (:meth:`ShardState.slice`), all asked at once; their concatenation is that
    part of the array."""
    return [actor.slice.remote(name, start + lo, start + hi) for lo, hi in in_slices(length, np.dtype(dtype).itemsize)]


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
