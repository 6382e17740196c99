"""A party's shards (docs/ray.md, "A party on a Ray cluster"): the log shard, which holds its
users' rows, and the user shard, which walks the private solve and samples.  Plain objects:
the in-process engine holds one of each in the node (cels.engine.runtime.InProcessRuntime),
the Ray engine one of each per shard on an actor (cels.engine.ray.runtime).  Ray-free."""

from __future__ import annotations

import gc
import os
import resource
import socket
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.engine.log_pieces import EncodedPairs, LogPiece, merge_pieces
from cels.logs.records import MAX_COUNT
from cels.mechanism.greedy import greedy_walk
from cels.mechanism.item_kinds import ItemKinds
from cels.engine.sampling import StagedSampler
from cels.engine.user_draws import BucketDraws, draw_order
from cels.engine.variable_index import PART_CALLS, IndexPart
from cels.engine.routines import PAIR_DIGEST_BYTES, bounded_rows, column_type, smallest


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
    """What every shard kind shares: the arrays it set aside for the node, its process's peak
    RSS, and :meth:`reset`, which a Ray node's warm pool (cels.engine.ray.placement.ShardPool)
    calls when a session hands the actor back, so the next session finds it as new
    (``__init__`` again, no argument)."""

    def slice(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Entries lo..hi of the array this actor set aside for the node as ``name``
        (``self.handed``; cels.engine.runtime.fetch)."""
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


def settled(walked: np.ndarray, veto: np.ndarray, rejected: list[np.ndarray], touched: list[np.ndarray]) -> bool:
    """Whether ``veto`` (the OR of the shards' ``rejected`` when they walked against ``walked``)
    is the party's verdict: no shard added, or would now add, a proposal touching its users
    whose veto changed, so a pass against ``veto`` would walk as this one did and repeat it."""
    changed = walked != veto
    return not any(np.any(changed & hit & ~own) for own, hit in zip(rejected, touched))


class UserShard(ShardState):
    """The users whose HMAC falls on this shard after the load: for the private solve, their
    constraint rows and one round's starting loads and proposals
    (cels.mechanism.greedy.verdicts, walked against a veto); for the sampling (docs/protocol.md,
    "Sampling"), their counts over the active pairs, in draw order, and their draws, bucket by
    bucket from the party's keys (cels.engine.user_draws), so the shards draw what the party
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
        the ``veto`` ones (cels.mechanism.greedy.greedy_walk from the round's loads)."""
        return greedy_walk(self.rows, self.loads, self.proposals, self.limit, veto)

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


@dataclass
class RangePart:
    """One log shard's held pairs in one key range (:meth:`LogShard.key_ranges`): the first's
    number there (``lo``), their digests and their totals c_i before the cap."""

    lo: int
    digests: np.ndarray
    totals: np.ndarray


class LogShard(ShardState):
    """One shard's users and their rows c_ij (capped), in draw order, over the pairs they hold;
    from the universe on, over the index's columns (the counts c^k restricted to its users)."""

    def __init__(self) -> None:
        self.pieces: list[LogPiece] = []
        self.users: list[str] = []  # in draw order
        self.pairs = EncodedPairs(np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64))  # held pairs, by digest
        self.counts: sp.csr_matrix | None = None  # users x own pairs held, capped
        self.digests = np.zeros(0, dtype=f"S{PAIR_DIGEST_BYTES}")  # held pair -> its keyed digest (until key_ranges)
        self.totals = np.zeros(0, dtype=np.int64)  # held pair -> its total c_i here, before the cap (until key_ranges)
        self.own_of_pair = np.zeros(0, dtype=np.int64)  # held pair -> the party's own index
        self.hashes = np.zeros(0, dtype=bool)  # held pair -> this shard hashes it (the first holding it)
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []  # returned union keys of its key range, with their own pairs
        self.sorted_own = np.zeros(0, dtype=np.int64)  # the own pair of each of its kept keys, sorted
        self.sorted_columns = np.zeros(0, dtype=np.int64)  # the index column of each of its kept keys, sorted
        self.handed: dict[str, np.ndarray] = {}  # arrays set aside for the node, which takes them in slices
        self.column_of_pair = np.zeros(0, dtype=np.int64)  # held pair -> index column
        self.local: sp.csr_matrix | None = None  # users x index columns
        self.union_part: IndexPart | None = None  # P_1: its key range of the sorted union (cels.engine.variable_index)

    def add(self, piece: LogPiece) -> int:
        """A reader's piece of this shard's users (a user's rows may come in several pieces)."""
        self.pieces.append(piece)
        return len(piece.users)

    def finish(self, cap: int, root: bytes, seeded: bool, kinds: ItemKinds | None = None) -> tuple[int, int, int]:
        """The pieces added up (:func:`merge_pieces`), in draw order and capped (and with
        ``kinds``, the DP release's bound: cels.engine.routines.bounded_rows, the items no user
        keeps dropped); its users' digests handed over in slices (``slice``) as "users"
        (draw order).  Returns the users and held pairs here, and |D| here."""
        merged, draws = merge_pieces(self.pieces), DrawKeys(root, seeded=seeded)
        self.pieces = []
        digests = merged.user_digests
        order = draw_order(digests)
        self.users, self.pairs, self.digests = [merged.users[j] for j in order], merged.pairs, merged.digests
        counts = merged.counts[order]
        self.counts = bounded_rows(counts, cap, self.users, lambda cols: self.pairs.items(np.asarray(cols, dtype=np.int64)), draws, kinds)
        self.totals = smallest(np.asarray(counts.sum(axis=0)).ravel())
        if kinds is not None:
            held = np.flatnonzero(np.asarray(self.counts.sum(axis=0)).ravel() > 0)
            self.pairs, self.digests, self.totals = self.pairs.take(held), self.digests[held], self.totals[held]
            self.counts = self.counts[:, held].tocsr()
        self.handed = {"users": digests[order]}
        return len(digests), len(self.digests), int(counts.sum())

    def key_ranges(self, shards: int) -> tuple | RangePart:
        """Its held pairs (sorted by digest) cut into ``shards`` key ranges, range t for log
        shard t to number (:meth:`number`): range t holds the digests whose first 8 bytes,
        read as a big-endian integer, fall in the t-th of ``shards`` equal parts of [0, 2^64)
        (even, as the digests are keyed pseudorandom).  One part alone when ``shards`` is 1."""
        prefix = np.ascontiguousarray(self.digests.view(np.uint8).reshape(-1, PAIR_DIGEST_BYTES)[:, :8]).view(">u8").ravel()
        cuts = np.searchsorted(prefix, [(t << 64) // shards for t in range(1, shards)]).tolist()
        bounds = [0, *cuts, len(prefix)]
        parts = tuple(RangePart(lo, self.digests[lo:hi], self.totals[lo:hi]) for lo, hi in zip(bounds, bounds[1:]))
        self.digests, self.totals = np.zeros(0, dtype=self.digests.dtype), np.zeros(0, dtype=self.totals.dtype)  # not views: the arrays go
        return parts if shards > 1 else parts[0]

    def number(self, *parts: RangePart) -> tuple:
        """Log shard t: the distinct pairs of key range t over every log shard's ``parts``
        (:meth:`key_ranges`, in shard order), in digest order.  Returns, first, how many there
        are, how many total above MAX_COUNT over the log, and the first such (its shard, its
        held pair there, its total) or None; then, for each shard, its pairs' ranks in the range
        and which of them it hashes (the first shard holding the pair)."""
        sizes = np.cumsum([0, *(len(p.digests) for p in parts)])
        distinct, first, rank = np.unique(np.concatenate([np.zeros(0, dtype=f"S{PAIR_DIGEST_BYTES}"), *(p.digests for p in parts)]), return_index=True, return_inverse=True)
        totals = np.zeros(len(distinct), dtype=np.int64)
        np.add.at(totals, rank, np.concatenate([np.zeros(0, dtype=np.int64), *(p.totals.astype(np.int64) for p in parts)]))
        over = np.flatnonzero(totals > MAX_COUNT)
        worst = None
        if over.size:
            at = int(first[over[0]])
            s = int(np.searchsorted(sizes, at, side="right") - 1)
            worst = (s, parts[s].lo + at - int(sizes[s]), int(totals[over[0]]))
        hashes = first[rank] == np.arange(len(rank))
        rank = rank.astype(column_type(len(distinct)))
        answers = [(rank[lo:hi], hashes[lo:hi]) for lo, hi in zip(sizes, sizes[1:])]
        return ((len(distinct), int(over.size), worst), *answers)

    def own(self, offsets: list[int], *answers: tuple[np.ndarray, np.ndarray]) -> None:
        """Its held pairs' own indices -- range t's offset plus the pair's rank in it -- and
        which of them it hashes, from every log shard t's :meth:`number` (in range order, so in
        this shard's order of its pairs)."""
        own = offsets[-1]
        self.own_of_pair = np.concatenate([np.zeros(0, dtype=column_type(own)), *(rank.astype(column_type(own)) + at for (rank, _), at in zip(answers, offsets))])
        self.hashes = np.concatenate([np.zeros(0, dtype=bool), *(hashes for _, hashes in answers)])
        self.handed = {}

    def pair_id_chunks(self, size: int, own_pairs: int) -> list[tuple[np.ndarray, list[bytes]]]:
        """For each chunk of ``size`` of the party's ``own_pairs`` (its own numbering), the
        pairs in it this shard hashes: their positions in the chunk and their encoded ids (a
        pair-work task's part: cels.engine.work.pair_chunk)."""
        hashed = np.flatnonzero(self.hashes)
        own = self.own_of_pair[hashed]
        order = np.argsort(own, kind="stable")
        hashed, own = hashed[order], own[order]
        bounds = np.searchsorted(own, np.arange(0, own_pairs + size, size)).tolist()
        return [
            ((own[lo:hi] - first).astype(np.int32), self.pairs.items(hashed[lo:hi]))
            for first, lo, hi in zip(range(0, own_pairs, size), bounds, bounds[1:])
        ]  # fmt: skip

    def keep_keys(self, own: np.ndarray, keys: np.ndarray) -> None:
        """Returned union keys of its key range (cels.engine.variable_index.part_of), each
        with the own pair it is of (a slice: cels.engine.runtime.in_slices)."""
        self.kept.append((own, keys))

    def sort_keys(self, key_type: np.dtype) -> int:
        """Its kept keys (of ``key_type``) sorted, handed over in slices as "sorted", with the
        own pair of each kept in that order; returns how many."""
        own = np.concatenate([np.zeros(0, dtype=np.int64), *(o for o, _ in self.kept)])
        keys = np.concatenate([np.zeros(0, dtype=key_type), *(k for _, k in self.kept)])
        self.kept = []
        order = np.argsort(keys)  # distinct keys (a repeat is malformed): no stable sort needed
        self.sorted_own, self.handed = own[order], {"sorted": keys[order]}
        self.sorted_columns = np.zeros(len(order), dtype=np.int64)
        return len(order)

    def place_columns(self, lo: int, columns: np.ndarray) -> None:
        """Its sorted keys lo.. (a slice) are these index columns."""
        self.sorted_columns = self.sorted_columns.astype(columns.dtype, copy=False)
        self.sorted_columns[lo : lo + len(columns)] = columns

    def key_range_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The own pairs of its key range and their index columns (for every log shard's
        :meth:`index`, through the object store)."""
        placed = self.sorted_own, self.sorted_columns
        self.sorted_own, self.sorted_columns, self.handed = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), {}
        return placed

    def index(self, n: int, own_pairs: int, *placed: tuple[np.ndarray, np.ndarray]) -> tuple[str, int]:
        """Every key range's own pairs and their columns of ``n`` (:meth:`key_range_columns`):
        this shard's counts c^k over the index.  Handed over in slices: "columns", each held
        pair's column; "sums", their column sums.  Returns the sums' type and largest."""
        column_of_own = np.zeros(own_pairs, dtype=column_type(n))
        for own, columns in placed:
            column_of_own[own] = columns
        self.column_of_pair = column_of_own[self.own_of_pair]
        del column_of_own
        counts = self.counts
        self.local = sp.csr_matrix((counts.data, self.column_of_pair[counts.indices], counts.indptr), shape=(counts.shape[0], n), copy=True)
        self.local.sort_indices()  # in place: on copies, not on the counts' arrays
        sums = smallest(np.asarray(counts.sum(axis=0)).ravel())
        self.handed = {"columns": self.column_of_pair, "sums": sums}
        return sums.dtype.str, int(sums.max(initial=0))

    def column_max(self) -> str:
        """Per held pair, the largest count of one of this shard's users, handed over in slices
        as "top" (its type returned; the columns as :meth:`index` handed them)."""
        top = np.asarray(self.counts.max(axis=0).todense()).ravel() if self.counts.shape[0] else np.zeros(len(self.column_of_pair), dtype=np.int64)
        self.handed = {"columns": self.column_of_pair, "top": smallest(top)}
        return self.handed["top"].dtype.str

    def active_counts(self, active: np.ndarray) -> sp.coo_matrix:
        """This shard's users' counts over the ``active`` columns."""
        return self.local[:, active].tocoo()

    def pair_names(self, columns: np.ndarray) -> dict[int, tuple[str, str]]:
        """(query, url) of the index ``columns`` this shard's users hold."""
        order = np.argsort(self.column_of_pair)
        held, columns = self.column_of_pair[order], np.asarray(columns, dtype=np.int64)
        if not len(held):
            return {}
        at = np.minimum(np.searchsorted(held, columns), len(held) - 1)
        hit = held[at] == columns
        return {int(c): self.pairs.pair(order[a]) for c, a in zip(columns[hit], at[hit])}

    def held_pair(self, pair: int) -> tuple[str, str]:
        """(query, url) of held pair number ``pair`` (in the order of :meth:`finish`'s digests)."""
        return self.pairs.pair(pair)

    def user_names(self, rows: np.ndarray) -> list[str]:
        """The ids of this shard's users ``rows`` (its draw order)."""
        return [self.users[j] for j in rows]

    def begin_union(self, width: int) -> None:
        """P_1: an empty part of the sorted union, for ``width``-byte union keys."""
        self.union_part = IndexPart(width)

    def union(self, method: str, args: tuple):
        """P_1: ``method`` of this shard's :class:`IndexPart` (one of cels.engine.variable_index.PART_CALLS)."""
        if method not in PART_CALLS:
            raise ValueError(f"not a union part's call: {method!r}")
        answer = getattr(self.union_part, method)(*args)
        if method == "columns":  # positions in this part, int32 below 2^31: a chunk's answer fits in the call's reply (cels.engine.ray.runtime.SLICE_BYTES)
            return answer.astype(column_type(int(answer.max(initial=0)) + 1))
        return answer
