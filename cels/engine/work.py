"""A party's work over its sharded log (docs/ray.md, "What runs where"): :class:`ShardedWork`,
the :class:`cels.engine.interface.PartyWork` of both engines -- in process, one shard whose
calls run at once in the node (cels.engine.runtime.InProcessRuntime); on Ray, P shards on
actors and the pair work on tasks (cels.engine.ray.runtime).  Ray-free: where a call runs is
the runtime's.

- Pair work -- hashing the own pair ids into the group (the curve, or Pohlig-Hellman's group)
  and applying the party's key, and the party's layer on a peer's ids (CELS section 4.2,
  docs/protocol.md "Universe") -- runs as stateless tasks over chunks of :data:`CHUNK_IDS`
  ids (a forwarded chunk finer on a larger cluster: :func:`layer_task_ids`), at most
  ``max_in_flight`` at once.  A task gets the key as raw bytes (:func:`key_material`) and
  rebuilds it: no key object is pickled.
- Per-user work -- the private solve's verdicts (cels.mechanism.greedy) -- runs on the user
  shards for a round whose proposals touch more than the runtime's ``node_walk_nonzeros`` of
  the party's constraint rows (a smaller round is walked on the node, which holds the rows).
  The party's verdict on proposal q depends on which earlier proposals the *party* accepted,
  so a plain OR of the shards' own walks would differ (a shard would add a proposal another
  shard rejects): the shards walk the proposals again against the OR of their rejections
  until it is settled (:meth:`ShardedWork.verdicts`), and the result is the same bitmap as in
  one walk for any P.
- The sampling's draws run on the same user shards, each user's from the stream of its draw
  bucket (cels.engine.user_draws), so the shards draw what one shard would, for any P.

A user shard lost on the way (on Ray: its actor died) is re-created from what the node placed,
at most :data:`SHARD_RESTARTS` times a session (docs/ray.md, "Faults of the engine").
"""


from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import scipy.sparse as sp

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.groups import SafePrimeGroup
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.streams import DrawKeys
from cels.engine.sharded_log import ShardedLog, ShardedLogWork, on_party_rows
from cels.logs.model import SearchLog
from cels.logs.readers import LogFile
from cels.mechanism.greedy import LOAD_SLACK, verdicts
from cels.engine.interface import LoadResult, WorkerLost
from cels.engine.runtime import Runtime
from cels.engine.user_draws import paper_split
from cels.engine.routines import STREAM_IDS, CommutativeHash, ItemBound, chunks, encode_records, id_list, id_width, pruned_constraint_rows
from cels.engine.shards import UserShard, settled, worker_peak_rss

CHUNK_IDS = 8192
"""Ids per pair-work task: about 0.2-0.4 s of X25519 multiplications (docs/crypto.md); 2048
cost 3-7 % more CPU in all for the same ids (each task's submission, pickled ids and result:
docs/ray.md).  A forwarded universe chunk is split finer where the cluster has the
cores for it (:func:`layer_task_ids`)."""
MIN_TASK_IDS = 1024
"""The fewest ids per pair-work task when a forwarded chunk is split over more cores."""
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


def pair_chunk(key: bytes, group: SafePrimeGroup | None, hash_first: bool, *parts) -> tuple[bytes, tuple[str, int], float]:
    """One chunk of pair work with the party's key rebuilt from ``key`` (:func:`key_material`):
    to hash, one part per log shard (the positions in the chunk of the pairs it hashes, and
    their encoded ids: cels.engine.shards.LogShard.pair_id_chunks), merged by position; to
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
    """A session's pair work on stateless tasks (:func:`pair_chunk`), at most ``max_in_flight``
    at once, and what they reported: tasks run, their CPU seconds, and each worker process's
    peak RSS (bytes)."""

    def __init__(self, runtime: Runtime, max_in_flight: int) -> None:
        self.runtime, self.max_in_flight = runtime, max_in_flight
        self.workers: dict[str, int] = {}
        self.cpu_seconds = 0.0
        self.tasks = 0

    def run(self, cipher: CommutativeHash, tasks: Iterable[tuple], hash_first: bool, size: int) -> Iterator[np.ndarray]:
        """Each chunk's result as an :func:`id_array`, in order, as it is asked for, with at most
        ``max_in_flight`` tasks submitted ahead (``tasks``: each chunk's parts of :func:`pair_chunk`,
        ``size`` ids, the last maybe fewer)."""
        key, group = key_material(cipher)  # on Ray an inline argument of each task (over the cluster's authenticated RPC), not an object in the store
        dtype = f"V{id_width(cipher)}"
        task = self.runtime.task(pair_chunk)
        pending: deque = deque()

        def collect() -> np.ndarray:
            ref, t = pending.popleft()
            try:
                [(ids, (worker, rss), cpu)] = self.runtime.get([ref])
            except CommutativeCipherError as exc:  # element numbers are the chunk's
                raise CommutativeCipherError(f"in the ids from {t * size} on: {exc}") from None
            except WorkerLost as exc:
                raise WorkerLost(f"the pair-work task on the ids from {t * size} on is lost: {exc}") from None
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
    totals the node kept (:meth:`ShardedWork.sampling_call`)."""

    def __init__(self, work: ShardedWork, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> None:
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
        get = self.work.runtime.get
        get([actor.begin_sampling.remote(*self.begin)])
        for totals in self.settled:
            get([actor.propose.remote()])
            get([actor.settle.remote(totals)])
        if self.proposed:
            get([actor.propose.remote()])

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


class ShardedWork(ShardedLogWork):
    """A party's :class:`cels.engine.interface.PartyWork` over ``shards`` log shards (cels.engine.sharded_log; the DP release's
    ``bound`` applied there), the universe's pair work on tasks, the private solve's verdicts and the sampling on user shards
    (module docstring), each call where ``runtime`` runs it.  ``log`` is the log, its loader, or a :class:`cels.logs.LogFile`
    (where the runtime reads in tasks, a Parquet dataset is read by reader tasks, row group by row group; any other is read by
    the node and split).  ``cpus``: the cores the tasks may use, which size a forwarded chunk's tasks."""

    def __init__(
        self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, runtime: Runtime, shards: int = 1,
        max_in_flight: int = 1, cpus: int = 1, bound: ItemBound | None = None,
    ) -> None:
        self._source, self._cap, self.draws, self.bound = log, cap, draws, bound
        self.runtime, self.shards, self.max_in_flight = runtime, shards, max_in_flight
        self.layer_ids = layer_task_ids(STREAM_IDS, min(cpus, max_in_flight))  # ids per task of a forwarded chunk
        self.log: ShardedLog | None = None  # made at load
        self.row_users = np.zeros(0, dtype=np.int64)  # the user (row) of each constraint row
        self._placed: sp.spmatrix | None = None  # the rows the user shards hold
        self._actors: list = []
        self._members: list[np.ndarray] = []  # shard -> its rows (ascending)
        self._shard_rows: list[sp.csc_matrix] = []  # shard -> its rows' values: what a lost shard is re-created from
        self.shard_restarts = 0  # user shards re-created in this session
        self.verdict_rounds = self.verdict_passes = 0  # private-solve rounds on the user shards, and their passes over them
        self.node_rounds = 0  # private-solve rounds walked on the node (the runtime's node_walk_nonzeros)
        self.pair_tasks = PairTasks(runtime, max_in_flight)

    def load(self) -> LoadResult:
        self.log = ShardedLog(self._source, self._cap, self.draws, self.shards, self.max_in_flight, self.runtime, self.bound)
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

    def _user_shards(self) -> list:
        """The session's P user-shard actors, made at the first phase that places state on them
        (a round of the private solve, or the sampling) and kept for the other."""
        self._actors = self._actors or [self.runtime.shard(UserShard, s) for s in range(self.shards)]
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
                    out.extend(self.runtime.get([ref]))
                    break
                except WorkerLost as exc:
                    self._count_restart(exc)
                    actors[s] = self.runtime.shard(UserShard, s)
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
        """The party's verdicts as in one walk: on the node for a round of at most the runtime's
        ``node_walk_nonzeros``, else on the user shards (:meth:`_joint_walk`); a round that
        loses a shard is walked again from its starting loads once the shard is re-created
        (module doc)."""
        if int((rows.indptr[proposals + 1] - rows.indptr[proposals]).sum()) <= self.runtime.node_walk_nonzeros:  # rows: CSC, a column per active pair
            self.node_rounds += 1
            return verdicts(rows, loads, proposals, b)
        if rows is not self._placed:
            self._place(rows)
        while True:
            try:
                return self._joint_walk(loads, proposals, b * (1 - LOAD_SLACK))
            except WorkerLost as exc:
                self._replace_lost_shards(exc)

    def _joint_walk(self, loads: np.ndarray, proposals: np.ndarray, limit: float) -> np.ndarray:
        """The party's verdicts as a fixed point: every shard walks the round against the veto
        so far (:meth:`UserShard.rejected`), the OR of their rejections is the next veto, until
        it is settled.  Each pass makes the veto right through its first wrong entry (the walks
        before it saw the party's accepted set), so it ends, with the one-process bitmap; a
        pass costs one call per shard, however many proposals the round rejects."""
        answers = self.runtime.get([a.begin_round.remote(loads[m], proposals, limit) for a, m in zip(self._actors, self._members)])
        touched = [t for _, t in answers]
        rejected = [r for r, _ in answers]
        walked, veto = np.zeros(len(proposals), dtype=bool), np.logical_or.reduce(rejected)
        self.verdict_rounds, self.verdict_passes = self.verdict_rounds + 1, self.verdict_passes + 1
        while not settled(walked, veto, rejected, touched):
            rejected = self.runtime.get([a.rejected.remote(veto) for a in self._actors])
            walked, veto = veto, np.logical_or.reduce(rejected)
            self.verdict_passes += 1
        return veto.astype(np.uint64)

    def _count_restart(self, exc: WorkerLost) -> None:
        """One more user shard re-created in this session, or "engine worker lost" past :data:`SHARD_RESTARTS`."""
        self.shard_restarts += 1
        if self.shard_restarts > SHARD_RESTARTS:
            raise WorkerLost(f"a shard actor was lost after {SHARD_RESTARTS} restarts in this session: {exc}") from None

    def _replace_lost_shards(self, exc: WorkerLost) -> None:
        """Re-create the shard ``exc`` reports lost from the rows the node placed (every shard
        if it names none), or abort the session once :data:`SHARD_RESTARTS` are used up."""
        self._count_restart(exc)
        named = self.runtime.lost_shards(exc, self._actors)
        for s in named or range(self.shards):  # an actor dropped here ends with its last handle
            self._actors[s] = self.runtime.shard(UserShard, s)
            self._actors[s].place_rows.remote(self._shard_rows[s])
