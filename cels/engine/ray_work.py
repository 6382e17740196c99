"""A party's local work on its own Ray cluster (docs/deployment.md, "A party on a Ray cluster").

The gRPC node is the Ray driver and the only endpoint other nodes talk to; the cluster is
the party's own, inside its trust boundary (its workers see the party's universe scalar and
its constraint rows), never shared with another party.

- Pair work -- hashing the own pair ids to the curve and multiplying by the scalar, and the
  party's layer on a peer's ids (CELS section 4.2, docs/protocol.md "Universe") -- runs as
  stateless tasks over chunks of :data:`CHUNK_IDS` ids, at most ``max_in_flight`` at once
  (``ray.wait``).  A task gets the scalar as raw bytes and rebuilds the key
  (:meth:`cels.crypto.ec_hash.X25519Hash.scalar_bytes`): no key object is pickled.
- Per-user work -- the private solve's verdicts (cels.mechanism.greedy) -- runs on P user-shard
  actors; row j's shard is its user's draw bucket mod P (cels.protocol.user_draws: HMAC-SHA256 under
  a per-session key).  The party's verdict
  on proposal q depends on which earlier proposals the *party* accepted, so a plain OR of the
  shards' own walks would differ (a shard would add a proposal another shard rejects):
  the shards walk the proposals together, rejection by rejection (:meth:`RayWork.verdicts`),
  and the result is the same bitmap as in one process for any P.

- The sampling's draws -- each stage's Poisson draws of the exact mode, the paper mode's
  multinomial trials -- run on P :class:`SamplingShard` actors holding their users' counts;
  every draw comes from the stream of the user's draw bucket (cels.protocol.user_draws), so
  the shards draw what the party draws in one process, for any P.

Still in the node's process (inherited from :class:`InProcessWork`): loading and capping the
log, the index, the unique pairs, the constraint rows and the output records (their
pseudonyms, drawn by bucket like the sampling); and the Pohlig-Hellman universe cipher (only
X25519 goes to tasks).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import numpy as np
import ray
import scipy.sparse as sp

from cels.crypto.commutative_cipher import CommutativeCipherError
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.streams import DrawKeys
from cels.engine.options import LOCAL_RAY, EngineOptions
from cels.logs.model import SearchLog
from cels.mechanism.greedy import LOAD_SLACK
from cels.protocol.sampling import StagedSampler, paper_trials
from cels.protocol.user_draws import BucketDraws, split_over_buckets
from cels.protocol.work import CommutativeHash, InProcessWork, encode_item

CHUNK_IDS = 2048
"""Ids per pair-work task: about 0.1 s of X25519 multiplications (docs/crypto.md)."""
CONNECT_SECONDS = 5.0
"""How long the node waits for a Ray cluster address to answer before refusing to start."""


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


class RayEngine:
    """The node's connection to its Ray cluster, made once per node process."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options

    @classmethod
    def start(cls, options: EngineOptions) -> RayEngine:
        """Start a local Ray instance (``address = "local"``) or join the cluster at ``address``."""
        if not ray.is_initialized():
            if options.address == LOCAL_RAY:
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                check_reachable(options.address)
                try:
                    ray.init(address=options.address, log_to_driver=False)
                except ConnectionError as exc:
                    raise ValueError(f"cannot join the Ray cluster at {options.address}: {exc}") from None
        return cls(options)

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys) -> RayWork:
        return RayWork(log, cap, draws, self.options.shards, self.options.max_in_flight)

    def close(self) -> None:
        """Shut the Ray instance this node started down (its raylet, GCS and agents), or leave
        the cluster it joined: no Ray process outlives a stopped node."""
        ray.shutdown()


@ray.remote
def _x25519_chunk(scalar: bytes, items: list[bytes], hash_first: bool) -> list[bytes]:
    """One chunk of pair work with the party's key rebuilt from its scalar."""
    cipher = X25519Hash(scalar)
    return cipher.hash(items) if hash_first else cipher.apply(items)


@ray.remote
class UserShard:
    """The constraint rows of the users whose HMAC falls on this shard, and its tentative
    loads during one round of verdicts (cels.mechanism.greedy.verdicts, walked in steps)."""

    def __init__(self, rows: sp.csc_matrix) -> None:
        self.rows = rows
        self.tentative = np.zeros(rows.shape[0])
        self.proposals = np.zeros(0, dtype=np.int64)
        self.limit = 0.0
        self.start = 0
        self.undo: list[tuple[np.ndarray, np.ndarray]] = []

    def walk(self, loads: np.ndarray, proposals: np.ndarray, limit: float) -> int:
        """A round begins: the first proposal this shard rejects (len if none)."""
        self.tentative, self.proposals, self.limit = loads.copy(), proposals, limit
        return self._walk_from(0)

    def settle(self, rejected: int) -> int:
        """The party rejected proposal ``rejected`` (none of this shard's users had rejected one
        before it): take back what this shard added from it on, and walk on after it."""
        for users, before in reversed(self.undo[rejected - self.start :]):
            self.tentative[users] = before
        return self._walk_from(rejected + 1)

    def _walk_from(self, start: int) -> int:
        rows, tentative = self.rows, self.tentative
        self.start, self.undo = start, []
        for q in range(start, len(self.proposals)):
            i = self.proposals[q]
            lo, hi = rows.indptr[i], rows.indptr[i + 1]
            users, cost = rows.indices[lo:hi], rows.data[lo:hi]
            if np.any(tentative[users] + cost > self.limit):
                return q
            self.undo.append((users, tentative[users]))
            tentative[users] += cost
        return len(self.proposals)


@ray.remote
class SamplingShard:
    """One shard's users during the sampling (docs/protocol.md, "Sampling"): their counts over
    the active pairs, in draw order, and their draws, bucket by bucket from the party's keys
    (cels.protocol.user_draws), so the shards draw what the party would in one process."""

    def __init__(self, counts: sp.csr_matrix, buckets: np.ndarray, root: bytes, seeded: bool) -> None:
        self.counts = counts.copy()  # Ray hands numpy arrays over read-only
        self.user_draws = BucketDraws(DrawKeys(root, seeded=seeded), buckets)
        self.sampler: StagedSampler | None = None

    def begin(self, totals: np.ndarray, x: np.ndarray, theta: float) -> bool:
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


class ShardedSampler:
    """:class:`StagedSampler`'s interface to the party's stage over its sampling shards: the
    node adds the shards' stage totals (integers, so in any order) and hands every shard the
    summed totals of the secure sum."""

    def __init__(self, work: RayWork, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> None:
        self.work, self.shape = work, (work.local.shape[0], len(active))
        self.actors = work.sampling_shards(active)
        self.done = all(ray.get([a.begin.remote(totals, x, theta) for a in self.actors]))
        self.stage = 0

    def propose(self) -> tuple[None, np.ndarray]:
        return None, sum(ray.get([a.propose.remote() for a in self.actors]))

    def settle(self, stage_totals: np.ndarray) -> None:
        self.done = all(ray.get([a.settle.remote(stage_totals) for a in self.actors]))
        self.stage += 1

    def result(self) -> sp.csr_matrix:
        return self.work.gather(ray.get([a.sampled.remote() for a in self.actors]), self.shape)


class RayWork(InProcessWork):
    """:class:`InProcessWork` with the universe's pair work on Ray tasks and the private
    solve's verdicts on ``shards`` user-shard actors (what stays in process: module docstring)."""

    def __init__(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, shards: int, max_in_flight: int) -> None:
        super().__init__(log, cap, draws)
        self.shards, self.max_in_flight = shards, max_in_flight
        self._placed: sp.spmatrix | None = None  # the rows the actors hold
        self._actors: list = []
        self._members: list[np.ndarray] = []  # shard -> its rows (ascending)

    def hash_ids(self, cipher: CommutativeHash, own: np.ndarray) -> list[bytes]:
        if not isinstance(cipher, X25519Hash):
            return super().hash_ids(cipher, own)
        pairs = self.log.pairs
        return self._pair_work(cipher, [encode_item(*pairs[i]) for i in own], hash_first=True)

    def apply_layer(self, cipher: CommutativeHash, ids: list[bytes]) -> list[bytes]:
        if not isinstance(cipher, X25519Hash):
            return super().apply_layer(cipher, ids)
        return self._pair_work(cipher, ids, hash_first=False)

    def _pair_work(self, cipher: X25519Hash, items: list[bytes], hash_first: bool) -> list[bytes]:
        """The chunks' results in order, with at most ``max_in_flight`` tasks running."""
        scalar = ray.put(cipher.scalar_bytes())
        starts = range(0, len(items), CHUNK_IDS)
        out: list[list[bytes]] = [[] for _ in starts]
        pending: dict = {}

        def collect_one() -> None:
            (done,), _ = ray.wait(list(pending), num_returns=1)
            t = pending.pop(done)
            try:
                out[t] = ray.get(done)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, CommutativeCipherError):  # element numbers are the chunk's
                    raise CommutativeCipherError(f"in the ids from {starts[t]} on: {exc.cause}") from None
                raise

        for t, start in enumerate(starts):
            if len(pending) >= self.max_in_flight:
                collect_one()
            pending[_x25519_chunk.remote(scalar, items[start : start + CHUNK_IDS], hash_first)] = t
        while pending:
            collect_one()
        return [e for chunk in out for e in chunk]

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """Where these rows' users live: their draw bucket mod P (cels.protocol.user_draws)."""
        return self.user_draws.buckets[rows] % self.shards

    def sampling_shards(self, active: np.ndarray) -> list:
        """One sampling actor per shard with its users' counts over the ``active`` pairs."""
        local = self.local[:, active].tocsr()
        shard = self.shard_of(np.arange(local.shape[0]))
        self._sample_members = [np.flatnonzero(shard == s) for s in range(self.shards)]
        root, seeded = self.draws.root_bytes(), self.draws.seeded
        return [SamplingShard.remote(local[m], self.user_draws.buckets[m], root, seeded) for m in self._sample_members]

    def gather(self, parts: list[sp.coo_matrix], shape: tuple[int, int]) -> sp.csr_matrix:
        """The shards' x_ij back on the party's rows."""
        rows = np.concatenate([m[p.row] for m, p in zip(self._sample_members, parts)])
        cols = np.concatenate([p.col for p in parts])
        vals = np.concatenate([p.data for p in parts]).astype(np.int64)
        return sp.csr_matrix((vals, (rows, cols)), shape=shape, dtype=np.int64)

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> ShardedSampler:
        """The exact staged sampling with each shard drawing for its users."""
        return ShardedSampler(self, active, totals, x, theta)

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        """The paper's local sampling: the node splits each pair's trials over the buckets
        (from the shards' bucket totals), every shard draws its buckets' trials."""
        actors = self.sampling_shards(active)
        bucket_totals = sum(ray.get([a.bucket_totals.remote() for a in actors]))
        held = np.asarray(bucket_totals.sum(axis=0)).ravel()
        split = split_over_buckets(paper_trials(held, totals, x), bucket_totals, self.draws.stream("paper split"))
        parts = ray.get([a.paper_sample.remote(split) for a in actors])
        return self.gather(parts, (self.local.shape[0], len(active)))

    def _place(self, rows: sp.spmatrix) -> None:
        """One actor per shard with its users' rows (again only if the rows change)."""
        if len(self.row_users) != rows.shape[0]:
            raise ValueError(f"verdicts over {rows.shape[0]} rows, but this party's constraint rows are {len(self.row_users)}")
        shard = self.shard_of(self.row_users)
        csr = sp.csr_matrix(rows, dtype=np.float64)
        self._members = [np.flatnonzero(shard == s) for s in range(self.shards)]
        self._actors = [UserShard.remote(csr[members].tocsc()) for members in self._members]
        self._placed = rows

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        """The party's verdicts as in one process: every shard walks to its first rejection;
        the earliest is the party's; every shard takes back what it added from there and
        walks on after it, until no shard rejects."""
        if rows is not self._placed:
            self._place(rows)
        limit = b * (1 - LOAD_SLACK)
        firsts = ray.get([a.walk.remote(loads[m], proposals, limit) for a, m in zip(self._actors, self._members)])
        veto = np.zeros(len(proposals), dtype=np.uint64)
        while (rejected := min(firsts)) < len(proposals):
            veto[rejected] = 1
            firsts = ray.get([a.settle.remote(rejected) for a in self._actors])
        return veto
