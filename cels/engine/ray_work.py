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
  actors; row j's shard is HMAC-SHA256(per-session key, user id) mod P.  The party's verdict
  on proposal q depends on which earlier proposals the *party* accepted, so a plain OR of the
  shards' own walks would differ (a shard would add a proposal another shard rejects):
  the shards walk the proposals together, rejection by rejection (:meth:`RayWork.verdicts`),
  and the result is the same bitmap as in one process for any P.

Still in the node's process (inherited from :class:`InProcessWork`): loading and capping the
log, the index, the unique pairs, the constraint rows, the sampling and the output records;
and the Pohlig-Hellman universe cipher (only X25519 goes to tasks).

What the workers used (:meth:`RayWork.usage`, in the node's per-session summary): every task
and user shard reports its own process's peak RSS, and every task its CPU seconds, because
the workers may run on other machines than the node (``cels bench scale --engine ray``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import resource
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import scipy.sparse as sp

from cels.crypto.commutative_cipher import CommutativeCipherError
from cels.crypto.ec_hash import X25519Hash
from cels.engine.options import LOCAL_RAY, EngineOptions
from cels.logs.model import SearchLog
from cels.mechanism.greedy import LOAD_SLACK
from cels.protocol.work import CommutativeHash, InProcessWork, encode_item

CHUNK_IDS = 2048
"""Ids per pair-work task: about 0.1 s of X25519 multiplications (docs/crypto.md)."""
USAGE_SECONDS = 10.0
"""How long a session's end waits for its shards' peak RSS (GetTimeoutError past it: the figure is lost)."""
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

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int) -> RayWork:
        return RayWork(log, cap, self.options.shards, self.options.max_in_flight)

    def usage(self, work: RayWork) -> dict[str, Any]:
        """The engine and what the session's workers used (:meth:`RayWork.usage`), or why it is unknown."""
        engine = {"kind": "ray", "shards": self.options.shards, "max_in_flight": self.options.max_in_flight}
        try:
            return engine | work.usage()
        except ray.exceptions.RayError as exc:  # a shard's actor is gone: its figure is lost, the session is not
            return engine | {"error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        """Shut the Ray instance this node started down (its raylet, GCS and agents), or leave
        the cluster it joined: no Ray process outlives a stopped node."""
        ray.shutdown()


def worker_peak_rss() -> tuple[str, int]:
    """This worker process (host:pid) and its peak resident memory in bytes (``ru_maxrss``, KiB on Linux)."""
    return f"{socket.gethostname()}:{os.getpid()}", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@ray.remote
def _x25519_chunk(scalar: bytes, items: list[bytes], hash_first: bool) -> tuple[list[bytes], tuple[str, int], float]:
    """One chunk of pair work with the party's key rebuilt from its scalar; its worker's
    peak RSS and the chunk's CPU seconds come back with it."""
    cpu = time.process_time()
    cipher = X25519Hash(scalar)
    out = cipher.hash(items) if hash_first else cipher.apply(items)
    return out, worker_peak_rss(), time.process_time() - cpu


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

    def peak_rss(self) -> tuple[str, int]:
        """This actor's process and its peak RSS so far (bytes)."""
        return worker_peak_rss()

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


class RayWork(InProcessWork):
    """:class:`InProcessWork` with the universe's pair work on Ray tasks and the private
    solve's verdicts on ``shards`` user-shard actors (what stays in process: module docstring)."""

    def __init__(self, log: SearchLog | Callable[[], SearchLog], cap: int, shards: int, max_in_flight: int) -> None:
        super().__init__(log, cap)
        self.shards, self.max_in_flight = shards, max_in_flight
        self._shard_key = secrets.token_bytes(32)  # this session's HMAC key of the user shards
        self._placed: sp.spmatrix | None = None  # the rows the actors hold
        self._actors: list = []
        self._members: list[np.ndarray] = []  # shard -> its rows (ascending)
        self._pair_workers: dict[str, int] = {}  # worker process -> its peak RSS (bytes), as its tasks reported
        self._pair_cpu_seconds = 0.0
        self._pair_tasks = 0

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
                out[t], (worker, rss), cpu = ray.get(done)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, CommutativeCipherError):  # element numbers are the chunk's
                    raise CommutativeCipherError(f"in the ids from {starts[t]} on: {exc.cause}") from None
                raise
            self._pair_workers[worker] = max(rss, self._pair_workers.get(worker, 0))
            self._pair_cpu_seconds += cpu
            self._pair_tasks += 1

        for t, start in enumerate(starts):
            if len(pending) >= self.max_in_flight:
                collect_one()
            pending[_x25519_chunk.remote(scalar, items[start : start + CHUNK_IDS], hash_first)] = t
        while pending:
            collect_one()
        return [e for chunk in out for e in chunk]

    def shard_of(self, user: str) -> int:
        """HMAC-SHA256(session key, user id) mod P: where this user's rows live."""
        digest = hmac.new(self._shard_key, user.encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") % self.shards

    def _place(self, rows: sp.spmatrix) -> None:
        """One actor per shard with its users' rows (again only if the rows change)."""
        if len(self.row_users) != rows.shape[0]:
            raise ValueError(f"verdicts over {rows.shape[0]} rows, but this party's constraint rows are {len(self.row_users)}")
        shard = np.array([self.shard_of(self.log.users[j]) for j in self.row_users], dtype=np.int64)
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

    def usage(self) -> dict[str, Any]:
        """What this session's workers used so far: every user shard's peak RSS (asked of the
        actors now; none before the private solve placed them), and the pair-work tasks'
        workers' peak RSS and CPU seconds."""
        shards = ray.get([a.peak_rss.remote() for a in self._actors], timeout=USAGE_SECONDS)
        return {
            "shard_peak_rss_bytes": [rss for _, rss in shards],
            "pair_tasks": self._pair_tasks,
            "pair_task_cpu_seconds": self._pair_cpu_seconds,
            "pair_worker_peak_rss_bytes": dict(sorted(self._pair_workers.items())),
        }
