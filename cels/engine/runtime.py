"""Where a party's shards run (docs/ray.md, "What runs where"): the one seam between the
sharded work (cels.engine.work, cels.engine.sharded_log), which both engines run, and a
backend.

The sharded work calls its shards and tasks as Ray's API does -- ``handle.method.remote(*args)``
gives a reference, ``runtime.get(refs)`` the values -- and a :class:`Runtime` decides where
that runs.  :class:`InProcessRuntime` runs every call at once in the node's process on plain
objects, as SecretFlow's ``proxy()`` runs a device's calls: this is the in-process engine,
the one-shard case of the same code.  The Ray engine's runtime (cels.engine.ray.runtime) puts
each shard on an actor of the party's cluster and each task on a worker.  Ray-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np


class Runtime(Protocol):
    """What the sharded work asks of its backend.  A reference stands for a call's value
    (or its error, raised by :meth:`get`), and may be passed to another call, which gets the
    value; a handle's ``method.options(num_returns=k).remote(...)`` gives k references to a
    call that returns k values (one reference, not a list, when k is 1)."""

    slice_bytes: int
    """Bytes of an array per call between the node and a shard (:func:`in_slices`)."""
    node_walk_nonzeros: int
    """A private-solve round over at most this many nonzeros is walked on the node, a larger one on the user shards."""
    reads_in_tasks: bool
    """Whether a Parquet dataset is read by reader tasks where it lives, not by the node."""

    def shard(self, kind: type, shard: int) -> Any:
        """An empty shard object of ``kind`` for shard number ``shard``: its handle."""
        ...

    def task(self, function: Callable, returns: int = 1) -> Any:
        """``function`` as a task (``.remote(*args)``) with ``returns`` values."""
        ...

    def put(self, value: Any) -> Any:
        """A reference to ``value`` (shared by the calls it is passed to)."""
        ...

    def get(self, refs: Sequence[Any]) -> list:
        """The values of ``refs``.  A call's own exception is raised as it was raised; a shard
        or task worker the backend lost is a :class:`cels.engine.interface.WorkerLost`."""
        ...

    def first_done(self, refs: Sequence[Any]) -> Any:
        """One of ``refs`` whose call has finished (waits for one)."""
        ...

    def lost_shards(self, lost: Exception, handles: Sequence[Any]) -> list[int]:
        """Which of ``handles`` a :class:`cels.engine.interface.WorkerLost` names (none: unknown)."""
        ...


class Done:
    """A finished in-process call: its value, or the exception it raised (raised by :meth:`InProcessRuntime.get`)."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


def _call(function: Callable, args: tuple, returns: int) -> Done | list[Done]:
    """``function`` run now on ``args`` (references resolved to their values) as Ray would run it."""
    if any(isinstance(a, Done) and a.error is not None for a in args):
        failed = Done(error=next(a.error for a in args if isinstance(a, Done) and a.error is not None))
        return failed if returns == 1 else [failed] * returns
    try:
        value = function(*(a.value if isinstance(a, Done) else a for a in args))
    except Exception as exc:  # noqa: BLE001 - kept for get(), as Ray keeps a task's error
        return Done(error=exc) if returns == 1 else [Done(error=exc)] * returns
    return Done(value) if returns == 1 else [Done(v) for v in value]


class InProcessCall:
    """``function`` called as a task or an actor method, at once, in this process."""

    def __init__(self, function: Callable, returns: int = 1) -> None:
        self.function, self.returns = function, returns

    def options(self, num_returns: int = 1, **_: Any) -> InProcessCall:
        return InProcessCall(self.function, num_returns)

    def remote(self, *args: Any) -> Done | list[Done]:
        return _call(self.function, args, self.returns)


class InProcessHandle:
    """A shard object in this process, called as an actor is (``handle.method.remote(...)``)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> InProcessCall:
        return InProcessCall(getattr(self._target, name))


class InProcessRuntime:
    """Every shard and task in the node's process, each call run when it is made: the
    in-process engine.  No value is sliced (a call passes a reference, not a copy), every round
    of the private solve is walked on the node, and the node reads every log itself (so a
    re-run reads the kept log: cels.logs.snapshot)."""

    slice_bytes = 1 << 62
    node_walk_nonzeros = 1 << 62
    reads_in_tasks = False

    def shard(self, kind: type, shard: int) -> InProcessHandle:
        return InProcessHandle(kind())

    def task(self, function: Callable, returns: int = 1) -> InProcessCall:
        return InProcessCall(function, returns)

    def put(self, value: Any) -> Done:
        return Done(value)

    def get(self, refs: Sequence[Done]) -> list:
        for ref in refs:
            if ref.error is not None:
                raise ref.error
        return [ref.value for ref in refs]

    def first_done(self, refs: Sequence[Done]) -> Done:
        return refs[0]

    def lost_shards(self, lost: Exception, handles: Sequence[Any]) -> list[int]:
        """Nothing is lost in the node's own process (it dies with its shards)."""
        return []


def in_slices(length: int, itemsize: int, slice_bytes: int) -> list[tuple[int, int]]:
    """(lo, hi) slices of an array of ``length`` items of ``itemsize`` bytes, each at most ``slice_bytes``."""
    step = max(1, slice_bytes // max(1, itemsize))
    return [(lo, min(lo + step, length)) for lo in range(0, length, step)]


def fetch(runtime: Runtime, handle: Any, name: str, length: int, dtype: np.dtype, start: int = 0) -> list:
    """References to the slices of ``length`` items from ``start`` on of the array a shard set
    aside as ``name`` (cels.engine.shards.ShardState.slice), all asked at once; their
    concatenation is that part of the array."""
    return [handle.slice.remote(name, start + lo, start + hi) for lo, hi in in_slices(length, np.dtype(dtype).itemsize, runtime.slice_bytes)]


def windowed(runtime: Runtime, items: Iterable, submit: Callable[[Any], tuple[Any, Any]], collect: Callable[[Any, Any], None], limit: int) -> None:
    """Each item submitted (``submit(item)``: the reference to wait on, and what ``collect``
    needs of it) with at most ``limit`` unfinished at once; ``collect(ref, that)`` as each
    finishes: the bounded window of the reader tasks."""
    pending: dict = {}

    def collect_one() -> None:
        done = runtime.first_done(list(pending))
        collect(done, pending.pop(done))

    for item in items:
        if len(pending) >= limit:
            collect_one()
        ref, that = submit(item)
        pending[ref] = that
    while pending:
        collect_one()
