"""A session's shards on the party's Ray cluster: their placement, the user-shard actors, the
node's warm pool of shard actors and the sampler over them (cels.engine.ray; docs/ray.md,
"Warm shards")."""


from __future__ import annotations

import threading
from typing import Any

import numpy as np
import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.engine.ray.log_shards import LogShard
from cels.engine.ray.common import ShardState
from cels.protocol.sampling import StagedSampler
from cels.protocol.user_draws import BucketDraws

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


def in_bundle(kind, group: PlacementGroup, shard: int):
    """A new, empty actor of ``kind`` in bundle ``shard`` of ``group``: no CPU, :data:`SHARD_MEMORY`."""
    where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=shard)
    return kind.options(num_cpus=0, memory=SHARD_MEMORY, scheduling_strategy=where).remote()


def _remove_group(group) -> None:
    """Remove a session's placement group (nothing to do once Ray is down)."""
    if ray.is_initialized():
        remove_placement_group(group)


def settled(walked: np.ndarray, veto: np.ndarray, rejected: list[np.ndarray], touched: list[np.ndarray]) -> bool:
    """Whether ``veto`` (the OR of the shards' ``rejected`` when they walked against ``walked``)
    is the party's verdict: no shard added, or would now add, a proposal touching its users
    whose veto changed, so a pass against ``veto`` would walk as this one did and repeat it."""
    changed = walked != veto
    return not any(np.any(changed & hit & ~own) for own, hit in zip(rejected, touched))


@ray.remote
class UserShard(ShardState):
    """The users whose HMAC falls on this shard after the load: for the private solve, their
    constraint rows and one round's starting loads and proposals
    (cels.mechanism.greedy.verdicts, walked against a veto); for the sampling (docs/protocol.md,
    "Sampling"), their counts over the active pairs, in draw order, and their draws, bucket by
    bucket from the party's keys (cels.protocol.user_draws), so the shards draw what the party
    would in one process.  Each phase places its own state (:meth:`place_rows`,
    :meth:`place_counts`), so a shard re-created in one phase needs that phase's alone."""

    def __init__(self) -> None:
        self.place_rows(sp.csc_matrix((0, 0)))
        self.counts: sp.csr_matrix | None = None
        self.user_draws: BucketDraws | None = None
        self.sampler: StagedSampler | None = None

    def place_rows(self, rows: sp.csc_matrix) -> None:
        """This shard's users' constraint rows, for the session's rounds."""
        self.rows = rows
        self.loads = np.zeros(rows.shape[0])
        self.proposals = np.zeros(0, dtype=np.int64)
        self.limit = 0.0

    def begin_round(self, loads: np.ndarray, proposals: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray]:
        """A round begins: the proposals this shard rejects if no other shard rejects any, and
        those that touch its users (the others change none of its loads)."""
        self.loads, self.proposals, self.limit = loads, proposals, limit
        return self.rejected(np.zeros(len(proposals), dtype=bool)), np.diff(self.rows.indptr)[proposals] > 0

    def rejected(self, veto: np.ndarray) -> np.ndarray:
        """The proposals this shard's users reject (bool per proposal) when the party rejects
        the ``veto`` ones: the walk of cels.mechanism.greedy.verdicts from the round's loads,
        adding a proposal only if it fits here and is not vetoed."""
        rows, tentative = self.rows, self.loads.copy()
        out = np.zeros(len(self.proposals), dtype=bool)
        for q, i in enumerate(self.proposals):
            lo, hi = rows.indptr[i], rows.indptr[i + 1]
            users, cost = rows.indices[lo:hi], rows.data[lo:hi]
            if np.any(tentative[users] + cost > self.limit):
                out[q] = True
            elif not veto[q]:
                tentative[users] += cost
        return out

    def place_counts(self, counts: sp.csr_matrix, buckets: np.ndarray, root: bytes, seeded: bool) -> None:
        """This shard's users' counts over the active pairs, and their buckets' draw keys; the
        private solve is over, so its rows go (the shard holds one phase's state at a time)."""
        self.place_rows(sp.csc_matrix((0, 0)))
        self.counts = counts.copy()  # Ray hands numpy arrays over read-only
        self.user_draws = BucketDraws(DrawKeys(root, seeded=seeded), buckets)
        self.sampler = None

    def begin_sampling(self, totals: np.ndarray, x: np.ndarray, theta: float) -> bool:
        """The exact staged sampling starts; whether it is already done (x = 0)."""
        self.sampler = StagedSampler(self.counts, totals, x, self.user_draws.poisson, theta)
        return self.sampler.done

    def propose(self) -> np.ndarray:
        """This shard's draw totals over the stage's pairs."""
        return self.sampler.propose()[1]

    def settle(self, stage_totals: np.ndarray) -> bool:
        """The party's summed stage totals: keep or discard; whether the sampling is done."""
        self.sampler.settle(stage_totals)
        return self.sampler.done

    def bucket_totals(self) -> sp.csr_matrix:
        """The paper mode: this shard's bucket totals per pair."""
        return self.user_draws.bucket_totals(self.counts)

    def paper_sample(self, trials: sp.csr_matrix) -> sp.coo_matrix:
        """The paper mode: the trials of this shard's buckets over their users."""
        return self.user_draws.multinomial(self.counts, trials).tocoo()

    def sampled(self) -> sp.coo_matrix:
        """The exact mode's x_ij of this shard's users."""
        return self.sampler.result().tocoo()


class ShardPool:
    """A node's warm shard actors (docs/ray.md, "Warm shards"): one of each kind -- log
    shard and user shard -- per shard, started with the node in a placement group
    of its own (spread as a session's would be), so that a session starts no actor process:
    each costs about 1 s of CPU to start and import numpy, scipy and pyarrow (measured:
    docs/ray.md).  A session borrows the idle ones (:meth:`borrow`) and hands them back
    when it ends (:meth:`give_back`): each is reset (:meth:`cels.engine.ray.common.ShardState.reset`)
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
