"""The shards on the party's Ray cluster: the actor classes of the two shard kinds
(cels.engine.shards: the log shard and the user shard), their placement, and the node's warm
pool of them (cels.engine.ray; docs/ray.md, "Warm shards")."""

from __future__ import annotations

import threading
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cels.engine.shards import LogShard, UserShard

SHARD_MEMORY = 1 << 20
"""The logical memory (Ray's ``memory`` resource) a shard actor asks for, and no CPU: enough for
Ray to place it in its bundle.  A sliver of CPU instead would leave a node one core short for
the whole-core pair-work and reader tasks (on a 2-CPU node, one task at a time)."""
SHARD_ACTORS = 2
"""Actors in a shard's bundle: its log shard and its user shard (private solve and sampling)."""
PLACE_SECONDS = 60.0
"""How long a session waits for its shards' placement group before it gives up."""
READY_SECONDS = 10.0
"""How long a session waits for a warm shard actor's reset (:meth:`ShardPool.borrow`) before it
takes the actor for lost and starts another in its place."""
STRICT_SECONDS = 2.0
"""How long a session waits for its shards on as many nodes before it takes best-effort spreading."""


class RayLogShard(LogShard):
    """A log shard on an actor: its pair-work parts go into the object store from the actor
    (each chunk's one reference), so the node relays references and never holds an id."""

    def pair_id_chunks(self, size: int, own_pairs: int) -> list:
        return [ray.put(part) for part in super().pair_id_chunks(size, own_pairs)]


ACTORS = {LogShard: ray.remote(RayLogShard), UserShard: ray.remote(UserShard)}
"""Each shard kind's actor class."""



def spread_group(bundles: int) -> PlacementGroup | None:
    """A placement group of ``bundles`` shard bundles, spread: STRICT_SPREAD (every bundle on
    another node) if the cluster places it within :data:`STRICT_SECONDS` -- it needs that many
    nodes -- else SPREAD, which is best effort (it was seen to put
    two bundles on one of two idle nodes); None if not even that is placed in
    :data:`PLACE_SECONDS`."""
    nodes = sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)
    tries = [("STRICT_SPREAD", STRICT_SECONDS)] if bundles <= nodes else []
    for strategy, wait in [*tries, ("SPREAD", PLACE_SECONDS)]:
        group = placement_group([{"memory": SHARD_ACTORS * SHARD_MEMORY}] * bundles, strategy=strategy)
        try:
            ray.get(group.ready(), timeout=wait)
            return group
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
    return None


def in_bundle(kind: type, group: PlacementGroup, shard: int):
    """A new, empty actor of shard ``kind`` (:data:`ACTORS`) in bundle ``shard`` of ``group``: no CPU, :data:`SHARD_MEMORY`."""
    where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=shard)
    return ACTORS[kind].options(num_cpus=0, memory=SHARD_MEMORY, scheduling_strategy=where).remote()


def _remove_group(group) -> None:
    """Remove a session's placement group (nothing to do once Ray is down)."""
    if ray.is_initialized():
        remove_placement_group(group)


class ShardPool:
    """A node's warm shard actors (docs/ray.md, "Warm shards"): one of each kind -- log
    shard and user shard -- per shard, started with the node in a placement group
    of its own (spread as a session's would be), so that a session starts no actor process:
    each costs about 1 s of CPU to start and import numpy, scipy and pyarrow (measured:
    docs/ray.md).  A session borrows the idle ones (:meth:`borrow`) and hands them back
    when it ends (:meth:`give_back`): each is reset (:meth:`cels.engine.shards.ShardState.reset`)
    before the next session gets it.  One that another session holds is not waited for: the
    session makes its own, in its own group, as a node without a pool does."""

    KINDS = (LogShard, UserShard)

    def __init__(self, shards: int, group: PlacementGroup) -> None:
        self.shards, self.group = shards, group
        self._lock = threading.Lock()
        self._idle: dict[tuple[Any, int], tuple[Any, Any]] = {}  # (kind, shard) -> its actor and when it is ready

    @classmethod
    def start(cls, shards: int) -> ShardPool | None:
        """Every kind's actor on every shard, started and answering; None (no pool: every
        session makes its own) if the cluster cannot place the group."""
        group = spread_group(shards)
        if group is None:
            return None
        pool = cls(shards, group)
        for kind in cls.KINDS:
            for shard in range(shards):
                actor = in_bundle(kind, group, shard)
                pool._idle[(kind, shard)] = actor, actor.peak_rss.remote()
        ray.get([ready for _, ready in pool._idle.values()])
        return pool

    def borrow(self, kind, shard: int):
        """The idle actor of ``kind`` on ``shard``, reset; None if a session holds it.  One that
        died idle is replaced (its place in the bundle is free)."""
        with self._lock:
            slot = self._idle.pop((kind, shard), None)
        if slot is None:
            return None
        actor, ready = slot
        try:
            ray.get(ready, timeout=READY_SECONDS)
        except ray.exceptions.RayError:
            ray.kill(actor)
            actor = in_bundle(kind, self.group, shard)
        return actor

    def give_back(self, kind, shard: int, actor) -> None:
        """A session is done with ``actor``: it is reset and waits for the next one (does not
        block: a dead one is found, and replaced, when it is next borrowed).  One this process's
        cluster no longer knows (the process joined another since: Ray refuses the call with a
        bare Exception) is dropped: the next session starts a fresh one."""
        if not ray.is_initialized():
            return
        try:
            ready = actor.reset.remote()
        except Exception:  # noqa: BLE001 - Ray's "Can't find actor" when the actor's cluster is gone
            return
        with self._lock:
            self._idle[(kind, shard)] = actor, ready

    def close(self) -> None:
        """The node stops: its idle actors and their group go."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for actor, _ in idle:
            ray.kill(actor)
        _remove_group(self.group)


def _give_back(pool: ShardPool, borrowed: list) -> None:
    """A session's borrowed warm actors back to ``pool`` (at its release, or when its work is dropped)."""
    while borrowed:
        pool.give_back(*borrowed.pop())
