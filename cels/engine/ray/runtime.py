"""Where a session's shards and tasks run on the party's Ray cluster: the Ray engine's
:class:`cels.engine.runtime.Runtime` (docs/ray.md, "What runs where").  Every shard is an actor
in its bundle of the session's placement group, or the node's warm one
(cels.engine.ray.actors), every task a Ray task with :data:`TASK_RETRIES`, and Ray's errors
become the engine's: a call's own exception as it was raised, a lost worker
:class:`cels.engine.interface.WorkerLost`."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import ray

from cels.engine.interface import WorkerLost
from cels.engine.ray.actors import PLACE_SECONDS, ShardPool, _give_back, _remove_group, in_bundle, spread_group

TASK_RETRIES = 3
"""Runs of a pair-work or reader task after the first when its worker dies (Ray's ``max_retries``); an
exception the task raises itself (a peer's bad id) is not retried: it would raise again."""
SLICE_BYTES = 96 << 10
"""Bytes of an array per call between a node and its shards (cels.engine.runtime.in_slices):
under Ray's default 100 KiB bound for passing a value in the call itself
(``max_direct_call_object_size``; 4 MiB on the instance a node starts:
cels.engine.ray.cluster.LOCAL_RAY_CONFIG), so no per-pair array of the load goes through the
object store, whose pages the node would keep mapped for the rest of its life (RssShmem: 40 MB
at 4M pairs; docs/ray.md)."""
NODE_WALK_NONZEROS = 1 << 18
"""A round whose proposed pairs hold at most this many nonzeros of the party's constraint rows
is walked on the node (cels.mechanism.greedy.verdicts over the rows it holds anyway): such a
walk takes a few milliseconds, one call to each user shard about as long again under load.
A larger round goes to the user shards (cels.engine.work, docs/ray.md)."""

_REMOTE: dict[Callable, Any] = {}


class RayRuntime:
    """One session's shards and tasks on the cluster.  Its shard actors are the node's warm ones
    where ``pool`` has them idle (:class:`ShardPool`), else new ones in this session's placement
    group of ``shards`` bundles, made at the first such shard and removed by :meth:`release`."""

    slice_bytes = SLICE_BYTES
    node_walk_nonzeros = NODE_WALK_NONZEROS
    reads_in_tasks = True

    def __init__(self, shards: int, pool: ShardPool | None = None) -> None:
        self.shards, self._pool = shards, pool
        self._borrowed: list = []  # the warm actors this session holds: (kind, shard, actor)
        self.made: list = []  # the actors this session made (not the pool's)
        if pool is not None:
            self._give_back = weakref.finalize(self, _give_back, pool, self._borrowed)  # at release, or when the runtime is dropped
        self._group = None

    def shard(self, kind: type, shard: int) -> Any:
        """Shard ``shard``'s actor of ``kind``, empty: the node's warm one if it is idle, else a
        new one in shard ``shard``'s bundle of this session's placement group: P bundles spread
        (:func:`spread_group`), so the shards go to as many of the cluster's nodes as it has
        (Ray's default placement may put them all on one).  A shard's log-shard and user-shard
        actors share its bundle."""
        actor = self._pool.borrow(kind, shard) if self._pool is not None else None
        if actor is not None:
            self._borrowed.append((kind, shard, actor))
            return actor
        if self._group is None:
            group = spread_group(self.shards)
            if group is None:
                raise WorkerLost(f"the {self.shards} shards found no place on the cluster in {PLACE_SECONDS:g} s")
            self._group = group
            self._drop_group = weakref.finalize(self, _remove_group, group)  # at release, or when the runtime is dropped
        actor = in_bundle(kind, self._group, shard)
        self.made.append(actor)
        return actor

    def task(self, function: Callable, returns: int = 1) -> Any:
        """``function`` as a Ray task: retried :data:`TASK_RETRIES` times if its worker dies, never for its own exception."""
        if function not in _REMOTE:  # one remote function per process: Ray exports it once
            _REMOTE[function] = ray.remote(function)
        return _REMOTE[function].options(num_returns=returns, max_retries=TASK_RETRIES, retry_exceptions=False)

    def put(self, value: Any) -> Any:
        return ray.put(value)

    def get(self, refs: Sequence[Any]) -> list:
        try:
            return ray.get(list(refs))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, Exception) and not isinstance(exc.cause, ray.exceptions.RayError):
                raise exc.cause from None
            raise
        except ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"a shard actor is lost: {exc}", exc.actor_id) from None
        except ray.exceptions.RayError as exc:  # not the call's own error: its worker, node or result is gone
            raise WorkerLost(f"a task is lost after {TASK_RETRIES} retries: {exc}") from None

    def first_done(self, refs: Sequence[Any]) -> Any:
        (done,), _ = ray.wait(list(refs), num_returns=1)
        return done

    def lost_shards(self, lost: Exception, handles: Sequence[Any]) -> list[int]:
        actor_id = getattr(lost, "actor_id", None)
        return [s for s, actor in enumerate(handles) if actor_id is not None and actor._actor_id.hex() == actor_id]

    def release(self) -> None:
        """The session ended here: the warm actors it borrowed go back to the node's pool, the
        shard actors it made end and its placement group goes."""
        for actor in self.made:
            ray.kill(actor)
        self.made = []
        if self._pool is not None:
            self._give_back()
        if self._group is not None:
            self._drop_group()
            self._group = None
