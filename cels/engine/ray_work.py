"""A party's local work on its own Ray cluster (docs/ray.md, "A party on a Ray cluster").

The gRPC node is the Ray driver and the only endpoint other nodes talk to; the cluster is
the party's own, inside its trust boundary (its workers see the party's universe key, the root
of its session's draw keys, its users' counts and its constraint rows), never shared with
another party.

- The log -- its rows, capped, split by user over P log shards (draw bucket mod P), read
  where it lives if it is a Parquet dataset -- and what runs over its rows for the universe
  and the counts (the index, the sums' vectors, the unique pairs, the users' counts over the
  active pairs) and the output records' names: cels.engine.log_shards.
- Pair work -- hashing the own pair ids into the group (the curve, or Pohlig-Hellman's
  group) and applying the party's key, and the party's layer on a peer's ids (CELS section
  4.2, docs/protocol.md "Universe") -- runs as stateless tasks over chunks of
  :data:`CHUNK_IDS` ids (a forwarded chunk finer on a larger cluster: :func:`layer_task_ids`),
  at most ``max_in_flight`` at once (``ray.wait``).  A task gets the
  key as raw bytes (:func:`key_material`) and rebuilds it: no key object is pickled.  The own
  ids go from the log shards to the tasks through the object store.
- Per-user work -- the private solve's verdicts (cels.mechanism.greedy) -- runs on P user-shard
  actors, for a round whose proposals touch more than :data:`NODE_WALK_NONZEROS` of the
  party's constraint rows (a smaller round is walked on the node, which holds the rows); row
  j's shard is its user's draw bucket mod P (cels.protocol.user_draws: HMAC-SHA256 under a
  per-session key).  The party's verdict on proposal q depends on which
  earlier proposals the *party* accepted, so a plain OR of the shards' own walks would differ
  (a shard would add a proposal another shard rejects): the shards walk the proposals again
  against the OR of their rejections until it is settled (:meth:`RayWork.verdicts`), and the
  result is the same bitmap as in one process for any P.
- The sampling's draws -- each stage's Poisson draws of the exact mode, the paper mode's
  multinomial trials -- run on the same P :class:`UserShard` actors, which hold their users'
  counts over the active pairs from the sampling on (one actor for both phases, so a node's
  Ray instance keeps 2P actor processes, not 3P: docs/ray.md, "Where Ray's CPU
  goes"); every draw comes from the stream of the user's draw bucket
  (cels.protocol.user_draws), so the shards draw what the party draws in one process, for
  any P.

Faults (docs/ray.md, "Faults of the engine"): a pair-work or reader task whose worker
dies is run again (:data:`TASK_RETRIES`; it is stateless, so the ids are the same).  A
user-shard actor that dies is re-created from the rows the node placed and the round is walked
again from its starting loads (the round is a function of rows, loads and proposals), at most
:data:`SHARD_RESTARTS` times a session; past that, once a task has no retry left, or when a
log shard is lost (it holds the only copy of its users' rows in the session: reading them
again would keep a second copy of the log in the object store), the session aborts with
LOCAL_FAILURE and the generic reason :data:`WORKER_LOST` (the node's log has which worker and
why).

The node starts its shard actors (P of each kind) and warms its task workers once, when it
starts, not per session (:class:`ShardPool`, docs/ray.md "Warm shards"): a session
borrows the idle actors and hands them back, reset, when it ends.

P_1's sorted union of the complete id sets (the index) is split by key range over the log
shards (cels.protocol.variable_index.RangedIndex).

What stays in the node's process: no row of the log and no union key but its own; every
user's draw bucket (the party's draw order), per own pair the log shard that hashes it, the
vectors over the index the protocol sends, the users' counts over the active pairs (the
constraint rows and the sampling's input) and the records.

What the workers used (:meth:`RayWork.usage`, in the node's per-session summary): every task
and shard reports its own process's peak RSS, and every task its CPU seconds, because
the workers may run on other machines than the node (``cels bench scale --engine ray``).
"""

from __future__ import annotations

import math
import socket
import subprocess
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray._raylet import Config
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
import scipy.sparse as sp

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.groups import SafePrimeGroup
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.streams import DrawKeys
from cels.engine.log_shards import LogShard, ShardedLog, ShardedLogWork, on_party_rows
from cels.engine.ray_common import TASK_RETRIES, WORKER_LOST, ShardState, worker_peak_rss
from cels.engine.options import LOCAL_RAY, EngineOptions
from cels.engine.ray_trust import private_dir, refuse_open_cluster, require_token_auth
from cels.engine.reaper import SETTLE_SECONDS, watch
from cels.logs.model import SearchLog
from cels.logs.parquet import pyarrow_modules
from cels.logs.readers import LogFile
from cels.mechanism.greedy import LOAD_SLACK, verdicts
from cels.protocol.sampling import StagedSampler, paper_trials
from cels.protocol.stages.results import LoadResult
from cels.protocol.user_draws import BucketDraws, split_over_buckets
from cels.protocol.rolebase import RoleFailure
from cels.protocol.roles import Refusal
from cels.protocol.chunked import chunks
from cels.protocol.stages.universe import STREAM_IDS
from cels.protocol.work import CommutativeHash, ItemBound, encode_records, id_list, id_width, pruned_constraint_rows

CHUNK_IDS = 8192
"""Ids per pair-work task: about 0.2-0.4 s of X25519 multiplications (docs/crypto.md); 2048
cost 3-7 % more CPU in all for the same ids (each task's submission, pickled ids and result:
docs/ray.md).  A forwarded universe chunk is split finer where the cluster has the
cores for it (:func:`layer_task_ids`)."""
MIN_TASK_IDS = 1024
"""The fewest ids per pair-work task when a forwarded chunk is split over more cores."""
USAGE_SECONDS = 10.0
"""How long a session's end waits for its shards' peak RSS (GetTimeoutError past it: the figure is lost)."""
CONNECT_SECONDS = 5.0
"""How long the node waits for a Ray cluster address to answer: at start-up (else it refuses
to start) and at every StartSession (else it refuses the session)."""
NODE_WALK_NONZEROS = 1 << 18
"""A round whose proposed pairs hold at most this many nonzeros of the party's constraint rows
is walked on the node (cels.mechanism.greedy.verdicts over the rows it holds anyway): such a
walk takes a few milliseconds, one call to each user shard about as long again under load.
A larger round goes to the user shards (module docstring, docs/ray.md)."""
LOCAL_RAY_CONFIG = {
    "max_direct_call_object_size": 4 << 20,
    "task_events_report_interval_ms": 0, "enable_timeline": False, "enable_metrics_collection": False, "event_stats": False,
}  # fmt: skip
"""Ray's system settings for the instance a node starts itself (``address = "local"``).

- Values up to 4 MiB pass in the call itself, not through the object store (Ray's default
  bound is 100 KiB): a pair-work task's ids and result (256 KiB of X25519 ids, 2 MiB of
  2048-bit Pohlig-Hellman ids per :data:`CHUNK_IDS`).  A task of 8,192 X25519 ids that only
  echoes them cost 6.3 ms of CPU over all processes through the store and 2.6 ms inline
  (docs/ray.md, "Where Ray's CPU goes").
- No task events, timeline, metrics or event-loop statistics, which nothing here reads (no
  dashboard).  One party of 1M pairs alone, every process's CPU counted: its first hash took
  8.9-9.1 CPU seconds with them off against 9.3-9.5 on (docs/ray.md, "What runs where").

A cluster the node joins keeps its operator's settings (``ray start --system-config`` on its
head: docs/ray.md)."""
SHARD_RESTARTS = 3
"""User-shard actors a session re-creates after losing them (in the private solve or the sampling), before it aborts."""
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
WARM_SECONDS = 0.5
"""How long a warm-up task holds its CPU (:func:`warm_task_workers`): long enough that the tasks
of all the cluster's CPUs run at once, on as many workers."""
STRICT_SECONDS = 2.0
"""How long a session waits for its shards on as many nodes before it takes best-effort spreading."""
JOIN_ATTEMPTS = 3
"""Tries to join a cluster at start-up: a Ray client server that fails to start its per-client
server once (seen under compose) is not a cluster that is gone."""
JOIN_BACKOFF_SECONDS = 2.0
"""The wait before the second try, doubled before each later one."""


def check_reachable(address: str) -> None:
    """A TCP connection to the cluster's ``host:port`` (``ray://`` allowed), or a ValueError
    naming the address (Ray itself would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"engine.address {address!r} is neither \"local\" nor host:port")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ValueError(f"the Ray cluster at {address} is unreachable: {exc}") from None


def join(address: str) -> None:
    """``ray.init(address)``, tried :data:`JOIN_ATTEMPTS` times with backoff, else a ValueError
    naming the address and the last error."""
    for attempt in range(1, JOIN_ATTEMPTS + 1):
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as exc:
            ray.shutdown()  # whatever half of the join was made
            if attempt == JOIN_ATTEMPTS:
                raise ValueError(f"cannot join the Ray cluster at {address} ({JOIN_ATTEMPTS} attempts): {exc}") from None
            time.sleep(JOIN_BACKOFF_SECONDS * 2 ** (attempt - 1))


def stop_log_monitor() -> None:
    """End the log monitor of the Ray instance this process started.  It tails every worker's
    log files ten times a second for drivers that print them, and a node does not
    (``log_to_driver=False``; the files stay in the session directory): 0.67 % of a core per
    instance, about 1.2 CPU seconds of a 1M x 3 session on three instances (docs/ray.md,
    "Where Ray's CPU goes").  ``ray.init`` has no switch for it (``ray start
    --include-log-monitor=false`` has), so this ends it through Ray's handle on the node it
    started, a private one (tests/test_engine_ray.py checks that it is gone)."""
    ray._private.worker._global_node.kill_log_monitor(check_alive=False)


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


class RayEngine:
    """The node's connection to its Ray cluster, made once per node process; ``reaper``: the
    watcher that ends the Ray instance the node started, if it started one (cels.engine.reaper);
    ``pool``: the node's warm shard actors (:class:`ShardPool`), if it keeps any."""

    def __init__(
        self, options: EngineOptions, reaper: subprocess.Popen | None = None, pool: ShardPool | None = None, own_dir: Path | None = None
    ) -> None:
        self.options, self.reaper, self.pool, self.own_dir = options, reaper, pool, own_dir

    @classmethod
    def start(cls, options: EngineOptions) -> RayEngine:
        """Start a local Ray instance (``address = "local"``) under a 0700 directory of the
        node's, watched by a reaper, or join the cluster at ``address``, with Ray's token
        authentication on either way (cels.engine.ray_trust); then start the node's warm
        shard actors."""
        reaper, own_dir = None, None
        if not ray.is_initialized():
            require_token_auth(ray.__version__, joining=options.address != LOCAL_RAY)
            Config.initialize("")  # Ray read RAY_AUTH_MODE when it was imported: this process reads it again, as ray.init does when it turns tokens on
            if options.address == LOCAL_RAY:
                own_dir = private_dir()
                context = ray.init(include_dashboard=False, log_to_driver=False, _system_config=LOCAL_RAY_CONFIG, _temp_dir=str(own_dir / "r"))
                stop_log_monitor()
                reaper = watch(context.address_info["session_dir"], own_dir)
            else:
                check_reachable(options.address)
                refuse_open_cluster(options.address)
                join(options.address)
        pool = ShardPool.start(options.shards)
        warm_task_workers()
        return cls(options, reaper, pool, own_dir)

    def check(self) -> None:
        """A StartSession: the cluster this node joined still answers (within
        :data:`CONNECT_SECONDS`) and still refuses calls without its token, or a
        :class:`Refusal` naming the address to this node's log and controller, before the
        session loads anything.  A Ray instance of the node's own
        lives and dies with the node: nothing to check."""
        if self.options.address != LOCAL_RAY:
            try:
                check_reachable(self.options.address)
            except ValueError as exc:
                raise Refusal("its Ray cluster does not answer", str(exc)) from None
            try:  # restarted since without its token authentication
                refuse_open_cluster(self.options.address)
            except ValueError as exc:
                raise Refusal("its Ray cluster accepts unauthenticated calls", str(exc)) from None

    def work(self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> RayWork:
        """A session's work, sized to the cluster's CPUs as it is now (one that scales up is
        counted at the next session)."""
        cpus = cluster_cpus()
        return RayWork(log, cap, draws, self.options.shards, self.options.max_in_flight, self.pool, cpus, bound)

    def usage(self, work: RayWork) -> dict[str, Any]:
        """The engine and what the session's workers used (:meth:`RayWork.usage`), or why it is unknown."""
        engine = {"kind": "ray", "address": self.options.address, "shards": self.options.shards, "max_in_flight": self.options.max_in_flight}
        try:
            return engine | work.usage()
        except ray.exceptions.RayError as exc:  # a shard's actor is gone: its figure is lost, the session is not
            return engine | {"error": f"{type(exc).__name__}: {exc}"}

    def release(self, work: RayWork) -> None:
        """A session ended: its shard actors and their placement group go (on a cluster that
        is gone they went with it)."""
        try:
            work.release()
        except ray.exceptions.RayError:
            pass

    def close(self) -> None:
        """Shut the Ray instance this node started down (its raylet, GCS and agents), or leave
        the cluster it joined: no Ray process outlives a stopped node."""
        if self.pool is not None:
            self.pool.close()
        ray.shutdown()
        if self.reaper is not None:  # it ends what shutdown left, removes the node's Ray directory (and then ends itself)
            self.reaper.stdin.close()
            self.reaper.wait(SETTLE_SECONDS + 5)


@ray.remote
def _warm_worker() -> None:
    """A task worker's imports, done before a session needs them (:func:`warm_task_workers`)."""
    try:
        pyarrow_modules()  # the reader tasks' Parquet
    except ValueError:
        pass  # no Parquet extra, so no Parquet log to read
    time.sleep(WARM_SECONDS)


def cluster_cpus() -> int:
    """The CPUs of the Ray cluster this process is connected to (at least one)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def warm_task_workers() -> None:
    """One warm-up task per CPU of the cluster, all at once, so that each lands on a worker of
    its own: every idle task worker has imported this module (numpy, scipy, the curve's
    library) and pyarrow before a session's first reader or pair-work task, which would
    otherwise pay for it (docs/ray.md, "Warm shards")."""
    ray.get([_warm_worker.remote() for _ in range(cluster_cpus())])


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
    their encoded ids: cels.engine.log_shards.LogShard.pair_id_chunks), merged by position; to
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
                raise RoleFailure(WORKER_LOST, f"the pair-work task on the ids from {t * size} on is lost after {TASK_RETRIES} retries: {exc}") from None
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


class ShardPool:
    """A node's warm shard actors (docs/ray.md, "Warm shards"): one of each kind -- log
    shard and user shard -- per shard, started with the node in a placement group
    of its own (spread as a session's would be), so that a session starts no actor process:
    each costs about 1 s of CPU to start and import numpy, scipy and pyarrow (measured:
    docs/ray.md).  A session borrows the idle ones (:meth:`borrow`) and hands them back
    when it ends (:meth:`give_back`): each is reset (:meth:`cels.engine.ray_common.ShardState.reset`)
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
    """A party's :class:`cels.protocol.work.PartyWork` on its Ray cluster: the log on ``shards`` log shards (cels.engine.log_shards;
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
                raise RoleFailure(WORKER_LOST, f"the {self.shards} shards found no place on the cluster in {PLACE_SECONDS:g} s")
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
        held = np.asarray(bucket_totals.sum(axis=0)).ravel()
        split = split_over_buckets(paper_trials(held, totals, x), bucket_totals, self.draws.stream("paper split"))
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
            raise RoleFailure(WORKER_LOST, f"a shard actor was lost after {SHARD_RESTARTS} restarts in this session: {exc}") from None

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
