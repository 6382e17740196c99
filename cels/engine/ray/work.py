"""A party's work on its Ray cluster: the pair-work tasks and :class:`RayWork` (cels.engine.ray;
docs/ray.md, "What runs where")."""


from __future__ import annotations

import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import ray
import scipy.sparse as sp

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.groups import SafePrimeGroup
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.streams import DrawKeys
from cels.engine.ray.log_shards import ShardedLog, ShardedLogWork, on_party_rows
from cels.engine.ray.common import TASK_RETRIES, WORKER_LOST, worker_peak_rss
from cels.logs.model import SearchLog
from cels.logs.readers import LogFile
from cels.mechanism.greedy import LOAD_SLACK, verdicts
from cels.engine.interface import LoadResult, WorkFailure
from cels.engine.user_draws import paper_split
from cels.engine.routines import STREAM_IDS, CommutativeHash, ItemBound, chunks, encode_records, id_list, id_width, pruned_constraint_rows
from cels.engine.ray.shards import PLACE_SECONDS, ShardPool, UserShard, _give_back, _remove_group, in_bundle, settled, spread_group

CHUNK_IDS = 8192
"""Ids per pair-work task: about 0.2-0.4 s of X25519 multiplications (docs/crypto.md); 2048
cost 3-7 % more CPU in all for the same ids (each task's submission, pickled ids and result:
docs/ray.md).  A forwarded universe chunk is split finer where the cluster has the
cores for it (:func:`layer_task_ids`)."""
MIN_TASK_IDS = 1024
"""The fewest ids per pair-work task when a forwarded chunk is split over more cores."""
USAGE_SECONDS = 10.0
"""How long a session's end waits for its shards' peak RSS (GetTimeoutError past it: the figure is lost)."""
NODE_WALK_NONZEROS = 1 << 18
"""A round whose proposed pairs hold at most this many nonzeros of the party's constraint rows
is walked on the node (cels.mechanism.greedy.verdicts over the rows it holds anyway): such a
walk takes a few milliseconds, one call to each user shard about as long again under load.
A larger round goes to the user shards (module docstring, docs/ray.md)."""
SHARD_RESTARTS = 3
"""User-shard actors a session re-creates after losing them (in the private solve or the sampling), before it aborts."""


def layer_task_ids(ids: int, parallel: int) -> int:
    """Ids per pair-work task for one forwarded universe chunk of ``ids``: spread over
    ``parallel`` tasks at once (the cluster's CPUs, at most the task window), between
    :data:`MIN_TASK_IDS` and :data:`CHUNK_IDS` each.  A party handles one forwarded chunk at a
    time, so on 128 cores a chunk of 16,384 ids in two tasks of CHUNK_IDS would keep two busy;
    in 16 tasks of 1024 it keeps 16.  On two CPUs it is two tasks of 8192, as before."""
    return min(CHUNK_IDS, max(MIN_TASK_IDS, -(-ids // max(1, parallel))))


def key_material(cipher: CommutativeHash) -> tuple[bytes, SafePrimeGroup | None]:
    """What a pair-work task rebuilds the party's universe key from: X25519's scalar, or the
    Pohlig-Hellman exponent and its (public) group; raw bytes, never a pickled key."""
    if isinstance(cipher, X25519Hash):
        return cipher.scalar_bytes(), None
    return cipher.exponent_bytes(), cipher.group


@ray.remote
def _pair_chunk(key: bytes, group: SafePrimeGroup | None, hash_first: bool, *parts) -> tuple[bytes, tuple[str, int], float]:
    """One chunk of pair work with the party's key rebuilt from ``key`` (:func:`key_material`):
    to hash, one part per log shard (the positions in the chunk of the pairs it hashes, and
    their encoded ids: cels.engine.ray.shards.LogShard.pair_id_chunks), merged by position; to
    layer, one part, an :func:`id_array` of ids.  The ids out as one string of fixed-width ids
    (one object to pickle, not one per id), with its worker's peak RSS and the chunk's CPU
    seconds."""
    cpu = time.process_time()
    cipher = X25519Hash(key) if group is None else PohligHellmanHash.from_exponent(group, key)
    if hash_first:
        out: list[bytes] = [b""] * sum(len(positions) for positions, _ in parts)
        for positions, items in parts:
            for at, element in zip(positions.tolist(), cipher.hash(items)):
                out[at] = element
    else:
        out = cipher.apply(id_list(parts[0]))
    return b"".join(out), worker_peak_rss(), time.process_time() - cpu


class PairTasks:
    """A session's pair work on stateless tasks (:func:`_pair_chunk`), at most ``max_in_flight``
    at once, and what they reported: tasks run, their CPU seconds, and each worker process's
    peak RSS (bytes)."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.workers: dict[str, int] = {}
        self.cpu_seconds = 0.0
        self.tasks = 0

    def run(self, cipher: CommutativeHash, tasks: Iterable[tuple], hash_first: bool, size: int) -> Iterator[np.ndarray]:
        """Each chunk's result as an :func:`id_array`, in order, as it is asked for, with at most
        ``max_in_flight`` tasks submitted ahead (``tasks``: each chunk's parts of :func:`_pair_chunk`,
        ``size`` ids, the last maybe fewer)."""
        key, group = key_material(cipher)  # an inline argument of each task (over the cluster's authenticated RPC), not an object in the store
        dtype = f"V{id_width(cipher)}"
        task = _pair_chunk.options(max_retries=TASK_RETRIES, retry_exceptions=False)
        pending: deque = deque()

        def collect() -> np.ndarray:
            ref, t = pending.popleft()
            try:
                ids, (worker, rss), cpu = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, CommutativeCipherError):  # element numbers are the chunk's
                    raise CommutativeCipherError(f"in the ids from {t * size} on: {exc.cause}") from None
                raise
            except ray.exceptions.RayError as exc:  # not the task's own error: its worker, node or result is gone
                raise WorkFailure(WORKER_LOST, f"the pair-work task on the ids from {t * size} on is lost after {TASK_RETRIES} retries: {exc}") from None
            self.workers[worker] = max(rss, self.workers.get(worker, 0))
            self.cpu_seconds += cpu
            self.tasks += 1
            return np.frombuffer(ids, dtype=dtype)

        for t, parts in enumerate(tasks):
            if len(pending) >= self.max_in_flight:
                yield collect()
            pending.append((task.remote(key, group, hash_first, *parts), t))
        while pending:
            yield collect()


class ShardedSampler:
    """:class:`StagedSampler`'s interface to the party's stage over its user shards: the
    node adds the shards' stage totals (integers, so in any order) and hands every shard the
    summed totals of the secure sum.  A shard lost on the way is re-created from the counts
    the node placed and replayed: begun again, then every past stage proposed (its draws are
    those of its buckets' streams at that stage, so the same) and settled with the summed
    totals the node kept (:meth:`RayWork.sampling_call`)."""

    def __init__(self, work: RayWork, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> None:
        self.work, self.shape = work, (work.n_users, len(active))
        self.settled: list[np.ndarray] = []  # the summed totals of every stage so far
        self.proposed = False
        self.begin = (totals, x, theta)
        self.actors = work.sampling_shards(active)
        self.done = all(self._each(lambda a: a.begin_sampling.remote(*self.begin)))

    @property
    def stage(self) -> int:
        return len(self.settled)

    def _each(self, call: Callable) -> list:
        return self.work.sampling_call(self.actors, call, self._replay)

    def _replay(self, actor) -> None:
        """A re-created shard brought to where the others are."""
        ray.get(actor.begin_sampling.remote(*self.begin))
        for totals in self.settled:
            ray.get(actor.propose.remote())
            ray.get(actor.settle.remote(totals))
        if self.proposed:
            ray.get(actor.propose.remote())

    def propose(self) -> tuple[None, np.ndarray]:
        local = sum(self._each(lambda a: a.propose.remote()))
        self.proposed = True
        return None, local

    def settle(self, stage_totals: np.ndarray) -> None:
        self.done = all(self._each(lambda a: a.settle.remote(stage_totals)))
        self.settled.append(stage_totals)
        self.proposed = False

    def result(self) -> sp.csr_matrix:
        return self.work.gather(self._each(lambda a: a.sampled.remote()), self.shape)


class RayWork(ShardedLogWork):
    """A party's :class:`cels.engine.interface.PartyWork` on its Ray cluster: the log on ``shards`` log shards (cels.engine.ray.log_shards;
    the DP release's ``bound`` applied there), the universe's pair work on tasks, the private solve's verdicts and the sampling on
    user-shard actors (module docstring).  ``log`` is the log, its loader, or a :class:`cels.logs.LogFile` (a Parquet dataset is
    read by reader tasks, row group by row group; any other is read by the node and split).  Its shard actors are the node's warm
    ones where ``pool`` has them idle (:class:`ShardPool`)."""

    def __init__(
        self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, shards: int, max_in_flight: int,
        pool: ShardPool | None = None, cpus: int = 1, bound: ItemBound | None = None,
    ) -> None:
        self._source, self._cap, self.draws, self.bound = log, cap, draws, bound
        self.shards, self.max_in_flight = shards, max_in_flight
        self.layer_ids = layer_task_ids(STREAM_IDS, min(cpus, max_in_flight))  # ids per task of a forwarded chunk
        self._pool, self._borrowed = pool, []  # the warm actors this session holds: (kind, shard, actor)
        if pool is not None:
            self._give_back = weakref.finalize(self, _give_back, pool, self._borrowed)  # at release, or when the work is dropped
        self.log: ShardedLog | None = None  # made at load (the shards' placement group with it)
        self.row_users = np.zeros(0, dtype=np.int64)  # the user (row) of each constraint row
        self._placed: sp.spmatrix | None = None  # the rows the actors hold
        self._actors: list = []
        self._members: list[np.ndarray] = []  # shard -> its rows (ascending)
        self._shard_rows: list[sp.csc_matrix] = []  # shard -> its rows' values: what a lost shard is re-created from
        self.shard_restarts = 0  # user-shard actors re-created in this session
        self.verdict_rounds = self.verdict_passes = 0  # private-solve rounds on the user shards, and their passes over them
        self.node_rounds = 0  # private-solve rounds walked on the node (NODE_WALK_NONZEROS)
        self._group = None  # this session's placement group of the shards (made at the first shard)
        self.pair_tasks = PairTasks(max_in_flight)

    def load(self) -> LoadResult:
        self.log = ShardedLog(self._source, self._cap, self.draws, self.shards, self.max_in_flight, self._shard, self.bound)
        return self.log.load()

    def hashed_ids(self, cipher: CommutativeHash, size: int) -> Iterator[np.ndarray]:
        """The own pairs' ids hashed on tasks, in the own numbering (the order of their keyed
        digests), each by the first log shard holding it: a task per :data:`CHUNK_IDS` (or
        fewer, dividing ``size``), at most ``max_in_flight`` ahead of the chunk asked for."""
        task_ids = math.gcd(size, CHUNK_IDS)
        results = self.pair_tasks.run(cipher, self.log.id_chunks(task_ids), hash_first=True, size=task_ids)
        for lo, hi, _more in chunks(self.log.own_pairs, size):
            yield np.concatenate([np.zeros(0, dtype=f"V{id_width(cipher)}"), *(next(results) for _ in range(lo, hi, task_ids))])

    def apply_layer(self, cipher: CommutativeHash, ids: np.ndarray) -> np.ndarray:
        chunks = [(ids[lo : lo + self.layer_ids],) for lo in range(0, len(ids), self.layer_ids)]
        return np.concatenate([ids[:0], *self.pair_tasks.run(cipher, chunks, hash_first=False, size=self.layer_ids)])

    def constraint_rows(self, active: np.ndarray, totals: np.ndarray) -> sp.csr_matrix:
        rows, self.row_users = pruned_constraint_rows(self.log.counts_over(active), totals)
        return rows

    def records(self, sampled: sp.csr_matrix, active: np.ndarray, keep_user_ids: bool) -> list[bytes]:
        """The records drawn: the names of their pairs (the active pairs drawn from only) and,
        with ``keep_user_ids``, of their users from the log shards; else pseudonyms drawn by bucket."""
        names = self.log.pair_names(active[np.unique(sp.csr_matrix(sampled).indices)])
        users = self.log.user_names if keep_user_ids else self.user_draws.pseudonyms
        return encode_records(sampled, users, lambda col: names[int(active[col])])

    def _shard(self, kind, shard: int):
        """Shard ``shard``'s actor of ``kind``, empty: the node's warm one if it is idle
        (:class:`ShardPool`), else a new one in shard ``shard``'s bundle of this session's
        placement group: P bundles spread (:func:`spread_group`), so the shards go to as many of
        the cluster's nodes as it has (Ray's default placement may put them all on one).  A
        shard's log-shard and user-shard actors share its bundle.  The group is made at the
        first shard made here and removed by :meth:`release`."""
        actor = self._pool.borrow(kind, shard) if self._pool is not None else None
        if actor is not None:
            self._borrowed.append((kind, shard, actor))
            return actor
        if self._group is None:
            group = spread_group(self.shards)
            if group is None:
                raise WorkFailure(WORKER_LOST, f"the {self.shards} shards found no place on the cluster in {PLACE_SECONDS:g} s")
            self._group = group
            self._drop_group = weakref.finalize(self, _remove_group, group)  # at release, or when the work is dropped
        return in_bundle(kind, self._group, shard)

    def release(self) -> None:
        """The session ended here: the warm actors it borrowed go back to the node's pool, the
        shard actors it made end and its placement group goes."""
        warm = {id(actor) for _, _, actor in self._borrowed}  # the very handles _shard lent out
        for actor in [*(self.log.actors if self.log else []), *self._actors]:
            if id(actor) not in warm:
                ray.kill(actor)
        if self._pool is not None:
            self._give_back()
        self.log, self._actors = None, []
        if self._group is not None:
            self._drop_group()
            self._group = None

    def _user_shards(self) -> list:
        """The session's P user-shard actors, made at the first phase that places state on them
        (a round of the private solve, or the sampling) and kept for the other."""
        self._actors = self._actors or [self._shard(UserShard, s) for s in range(self.shards)]
        return self._actors

    def sampling_shards(self, active: np.ndarray) -> list:
        """Every user shard with its users' counts over the ``active`` pairs (:meth:`UserShard.place_counts`)."""
        local = self.log.counts_over(active)
        self._sample_members = self.log.shard_members(np.arange(local.shape[0]))
        root, seeded = self.draws.root_bytes(), self.draws.seeded
        self._sampling_args = [(local[m], self.user_draws.buckets[m], root, seeded) for m in self._sample_members]
        for actor, args in zip(self._user_shards(), self._sampling_args):
            actor.place_counts.remote(*args)  # which drops the shard's constraint rows
        self._placed = None
        return self._actors  # a lost one is replaced in this list (sampling_call)

    def sampling_call(self, actors: list, call: Callable, replay: Callable | None = None) -> list:
        """``call(actor)`` on every user shard in the sampling, in order.  A shard lost on the way is
        re-created from its placed counts, brought up by ``replay(actor)`` and called again,
        out of the session's :data:`SHARD_RESTARTS`; past them: "engine worker lost"."""
        refs = [call(a) for a in actors]
        out = []
        for s, ref in enumerate(refs):
            while True:
                try:
                    out.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError as exc:
                    self._count_restart(exc)
                    actors[s] = self._shard(UserShard, s)
                    actors[s].place_counts.remote(*self._sampling_args[s])
                    if replay is not None:
                        replay(actors[s])
                    ref = call(actors[s])
        return out

    def gather(self, parts: list[sp.coo_matrix], shape: tuple[int, int]) -> sp.csr_matrix:
        """The shards' x_ij back on the party's rows."""
        return on_party_rows(self._sample_members, parts, shape)

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> ShardedSampler:
        """The exact staged sampling with each shard drawing for its users."""
        return ShardedSampler(self, active, totals, x, theta)

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        """The paper's local sampling: the node splits each pair's trials over the buckets
        (from the shards' bucket totals), every shard draws its buckets' trials."""
        actors = self.sampling_shards(active)
        bucket_totals = sum(self.sampling_call(actors, lambda a: a.bucket_totals.remote()))
        split = paper_split(totals, x, bucket_totals, self.draws)
        parts = self.sampling_call(actors, lambda a: a.paper_sample.remote(split))
        return self.gather(parts, (self.n_users, len(active)))

    def _place(self, rows: sp.spmatrix) -> None:
        """One actor per shard with its users' rows (again only if the rows change)."""
        if len(self.row_users) != rows.shape[0]:
            raise ValueError(f"verdicts over {rows.shape[0]} rows, but this party's constraint rows are {len(self.row_users)}")
        csr = sp.csr_matrix(rows, dtype=np.float64)
        self._members = self.log.shard_members(self.row_users)
        self._shard_rows = [csr[members].tocsc() for members in self._members]
        for actor, held in zip(self._user_shards(), self._shard_rows):
            actor.place_rows.remote(held)
        self._placed = rows

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        """The party's verdicts as in one process: on the node for a round of at most
        :data:`NODE_WALK_NONZEROS`, else on the user shards (:meth:`_joint_walk`); a round that
        loses a shard is walked again from its starting loads once the shard is re-created
        (module doc)."""
        if int((rows.indptr[proposals + 1] - rows.indptr[proposals]).sum()) <= NODE_WALK_NONZEROS:  # rows: CSC, a column per active pair
            self.node_rounds += 1
            return verdicts(rows, loads, proposals, b)
        if rows is not self._placed:
            self._place(rows)
        while True:
            try:
                return self._joint_walk(loads, proposals, b * (1 - LOAD_SLACK))
            except ray.exceptions.RayActorError as exc:
                self._replace_lost_shards(exc)

    def _joint_walk(self, loads: np.ndarray, proposals: np.ndarray, limit: float) -> np.ndarray:
        """The party's verdicts as a fixed point: every shard walks the round against the veto
        so far (:meth:`UserShard.rejected`), the OR of their rejections is the next veto, until
        it is settled.  Each pass makes the veto right through its first wrong entry (the walks
        before it saw the party's accepted set), so it ends, with the one-process bitmap; a
        pass costs one call per shard, however many proposals the round rejects."""
        answers = ray.get([a.begin_round.remote(loads[m], proposals, limit) for a, m in zip(self._actors, self._members)])
        touched = [t for _, t in answers]
        rejected = [r for r, _ in answers]
        walked, veto = np.zeros(len(proposals), dtype=bool), np.logical_or.reduce(rejected)
        self.verdict_rounds, self.verdict_passes = self.verdict_rounds + 1, self.verdict_passes + 1
        while not settled(walked, veto, rejected, touched):
            rejected = ray.get([a.rejected.remote(veto) for a in self._actors])
            walked, veto = veto, np.logical_or.reduce(rejected)
            self.verdict_passes += 1
        return veto.astype(np.uint64)

    def _count_restart(self, exc: ray.exceptions.RayActorError) -> None:
        """One more shard actor re-created in this session, or "engine worker lost" past :data:`SHARD_RESTARTS`."""
        self.shard_restarts += 1
        if self.shard_restarts > SHARD_RESTARTS:
            raise WorkFailure(WORKER_LOST, f"a shard actor was lost after {SHARD_RESTARTS} restarts in this session: {exc}") from None

    def _replace_lost_shards(self, exc: ray.exceptions.RayActorError) -> None:
        """Re-create the shard ``exc`` reports dead from the rows the node placed (every shard
        if it names none), or abort the session once :data:`SHARD_RESTARTS` are used up."""
        self._count_restart(exc)
        named = [s for s, actor in enumerate(self._actors) if actor._actor_id.hex() == exc.actor_id]
        for s in named or range(self.shards):  # an actor dropped here ends with its last handle
            self._actors[s] = self._shard(UserShard, s)
            self._actors[s].place_rows.remote(self._shard_rows[s])

    def usage(self) -> dict[str, Any]:
        """What this session's workers used so far: every shard's peak RSS (asked of its actors
        now; none before the private solve or the sampling placed them), and the pair-work tasks'
        workers' peak RSS and CPU seconds."""
        kinds = [actors for actors in (self.log.actors if self.log else [], self._actors) if actors]
        answers = ray.get([a.peak_rss.remote() for actors in kinds for a in actors], timeout=USAGE_SECONDS)
        by_kind = [answers[k * self.shards : (k + 1) * self.shards] for k in range(len(kinds))]
        return {
            # shard s: the larger peak of its log shard and its user shard
            "shard_peak_rss_bytes": [max(rss for _, rss in peaks) for peaks in zip(*by_kind)],
            "node_rounds": self.node_rounds,
            "verdict_rounds": self.verdict_rounds,
            "verdict_passes": self.verdict_passes,
            "pair_tasks": self.pair_tasks.tasks,
            "pair_task_cpu_seconds": self.pair_tasks.cpu_seconds,
            "pair_worker_peak_rss_bytes": dict(sorted(self.pair_tasks.workers.items())),
        }
