"""A party's log split by user over its log shards (docs/ray.md, "A party on a Ray cluster"):
the in-process engine's one shard in the node, or the Ray engine's P shards on the party's
cluster (cels.engine.runtime says where each call runs).  Ray-free.

Shard s holds the users whose draw bucket is s mod P (cels.engine.user_draws: HMAC-SHA256
under the session's bucket key), with their rows c_ij (capped) over the pairs they hold.  A
Parquet dataset on a Ray cluster is read where it lives: reader tasks each read a run of its row groups
(:func:`read_batches`), split their histogram by shard (:func:`split_by_shard`) and hand
each piece to its shard's :class:`LogShard` through the object store, so the node never holds
a row; a log in another format (or cut to its first users) is read by the node and split the
same way.

A piece (:class:`LogPiece`) carries its pairs as their encoded ids, packed in one buffer
(:class:`EncodedPairs`), with their digests: each pair is encoded and digested once, where it
is read, and no Python object per pair crosses the object store.  A shard keeps its pairs so
until the universe hashes them.

The node keeps what the protocol needs and no row: each shard's users' digests (for the
party's draw order).  The party's own pairs are the distinct pair ids over all shards,
numbered in the order of their keyed digests (cels.engine.routines.pair_digests, 16 bytes) by
the shards themselves, each numbering one key range of the digests (:meth:`ShardedLog.load`).
That is the order the party's ids leave in on either engine (docs/protocol.md, "Universe"),
so a shard hashes its pairs' ids chunk by chunk of the own numbering and the node merely
relays the chunks; the ids' returned union keys are kept on the shards by key range too, as
P_1's union is split, and so are the index's columns (:meth:`ShardedLog.keep_returned`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog, pair_total_error
from cels.logs.records import MAX_LOG_TOTAL, LogError
from cels.logs.formats import PARQUET
from cels.logs.parquet import ParquetReader, RowGroup
from cels.logs.readers import LogFile
from cels.engine.variable_index import RangedIndex, part_of
from cels.engine.interface import LoadResult
from cels.engine.runtime import Runtime, fetch, in_slices, windowed
from cels.engine.user_draws import BucketDraws, buckets_of, draw_order
from cels.engine.routines import ItemBound, chunks, column_type, encode_item, party_log
from cels.engine.shards import LogShard
from cels.engine.log_pieces import merge_sources, read_batches, read_row_groups, split_by_shard

READ_ROWS = 262_144
"""Rows a reader task reads at most (whole row groups; one larger row group is read alone;
the runs as even as the groups allow: :func:`read_batches`)."""


def on_party_rows(rows: Sequence[np.ndarray], parts: Sequence[sp.coo_matrix], shape: tuple[int, int]) -> sp.csr_matrix:
    """The shards' matrices on the party's rows (shard s's row k is the party's ``rows[s][k]``)."""
    empty = np.zeros(0, dtype=np.int64)
    party_rows = np.concatenate([empty, *(m[p.row] for m, p in zip(rows, parts))])
    cols = np.concatenate([empty, *(p.col for p in parts)])
    vals = np.concatenate([empty, *(p.data for p in parts)]).astype(np.int64)
    return sp.csr_matrix((vals, (party_rows, cols)), shape=shape, dtype=np.int64)


def shard_positions(digests: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The party's draw order over all shards' users (``digests``: each shard's, in its draw
    order): every user's digest in that order, and shard s -> its users' rows there (ascending)."""
    every = np.concatenate([np.zeros(0, dtype=np.uint64), *digests])
    order = draw_order(every)
    row = np.empty(len(every), dtype=np.int64)
    row[order] = np.arange(len(every))
    starts = np.cumsum([0, *(len(d) for d in digests)])
    return every[order], [row[lo:hi] for lo, hi in zip(starts[:-1], starts[1:])]


class ShardedLog:
    """The node's side of its log shards: it places the log on them (:meth:`load`) and asks
    them for what the protocol needs over the rows, holding no row itself.  ``runtime`` makes
    the shards and runs their calls (cels.engine.runtime)."""

    def __init__(
        self, source: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, shards: int, max_in_flight: int, runtime: Runtime,
        bound: ItemBound | None = None,
    ) -> None:
        self.source, self.cap, self.draws, self.bound = source, cap, draws, bound
        self.shards, self.max_in_flight, self.runtime = shards, max_in_flight, runtime
        self.actors = [runtime.shard(LogShard, s) for s in range(shards)]
        self.user_draws: BucketDraws | None = None  # every user's bucket, in the party's draw order
        self.rows: list[np.ndarray] = []  # log shard -> its users' rows in the party's draw order (ascending)
        self.own_pairs = 0  # distinct pairs over all log shards
        self.key_type = np.dtype("V16")  # the returned union keys' type
        self.sorted_starts = np.zeros(1, dtype=np.int64)  # log shard -> the first of its key range's sorted keys
        self.calls: list = []  # calls to the shards not yet waited for (keys kept, columns placed)
        self.held_pairs: list[int] = []  # log shard -> the pairs it holds
        self.active_counts: sp.csr_matrix | None = None  # users x the pairs ``active`` (counts_over)
        self.active = np.zeros(0, dtype=np.int64)
        self.sent_columns: np.ndarray | None = None  # the DP release: each own pair's column (place_sent_columns)

    @property
    def n_users(self) -> int:
        return len(self.user_draws.buckets)

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """Where these rows' users live: their draw bucket mod P (cels.engine.user_draws)."""
        return self.user_draws.buckets[rows] % self.shards

    def shard_members(self, rows: np.ndarray) -> list[np.ndarray]:
        """Shard s -> the positions in ``rows`` whose users live on it (ascending)."""
        shard = self.shard_of(rows)
        return [np.flatnonzero(shard == s) for s in range(self.shards)]

    def load(self) -> LoadResult:
        """The log onto the log shards (read where it lives if it is a Parquet dataset), then
        the party's own pairs: the distinct pair ids over the shards, numbered on the shards by
        key range (each shard sends every shard its pairs in that shard's range and numbers
        its own range: :meth:`LogShard.key_ranges`, :meth:`LogShard.number`, :meth:`LogShard.own`),
        so the node holds no per-pair array."""
        source, path = self._place()
        kinds = self.bound.kinds if self.bound is not None else None
        sizes = self.runtime.get([a.finish.remote(self.cap, self.draws.root_bytes(), self.draws.seeded, kinds) for a in self.actors])
        every, self.rows = shard_positions(self.take_handed([(s, "users", users, np.uint64) for s, (users, *_) in enumerate(sizes)]))
        self.user_draws = BucketDraws(self.draws, buckets_of(every))
        self.held_pairs = [held for _, held, _ in sizes]
        if not sum(self.held_pairs):
            raise LogError(path, None, None, f"no query-url pair in {path}")
        size = sum(total for *_, total in sizes)
        if size > MAX_LOG_TOTAL:
            raise LogError(path, None, None, f"the counts total {size}, above the {MAX_LOG_TOTAL} (2^53) of one log (docs/formats.md, Limits)")
        p = self.shards
        ranges = [a.key_ranges.options(num_returns=p).remote(p) for a in self.actors]
        ranges = [parts if p > 1 else [parts] for parts in ranges]
        numbered = [a.number.options(num_returns=p + 1).remote(*(parts[t] for parts in ranges)) for t, a in enumerate(self.actors)]
        summaries = self.runtime.get([answers[0] for answers in numbered])
        over = [(worst, count) for _, count, worst in summaries if count]
        if over:
            (s, held, total), _ = over[0]
            pair = self.runtime.get([self.actors[s].held_pair.remote(held)])[0]
            raise pair_total_error(path, pair, total, sum(count for _, count in over))
        offsets = np.cumsum([0, *(distinct for distinct, *_ in summaries)]).tolist()
        self.runtime.get([a.own.remote(offsets, *(answers[1 + s] for answers in numbered)) for s, a in enumerate(self.actors)])
        self.own_pairs = offsets[-1]
        return LoadResult(self.own_pairs, source)

    def take_handed(self, arrays: Sequence[tuple[int, str, int, np.dtype]]) -> list[np.ndarray]:
        """Arrays the log shards set aside for the node (``LogShard.handed``), each given as
        (shard, name, length, type), asked in slices at once (cels.engine.runtime.fetch: on Ray,
        no object store pages in the node)."""
        refs = [fetch(self.runtime, self.actors[s], name, length, dtype) for s, name, length, dtype in arrays]
        got = iter(self.runtime.get([ref for array in refs for ref in array]))
        return [np.concatenate([np.zeros(0, dtype=dtype), *(next(got) for _ in array)]) for (*_, dtype), array in zip(arrays, refs)]

    def _place(self) -> tuple[dict, str]:
        """Every user's rows onto its log shard; the log's ``source`` and its path (for errors).
        A Parquet dataset, where the runtime reads in tasks (not cut to its first users, which
        needs file order, nor counted as items other than pairs, which need each user's events
        in order), is read by tasks
        of :data:`READ_ROWS` rows, at most ``max_in_flight`` at once, each piece going from the
        task to its shard through the object store."""
        given = self.source
        pairs = self.bound is None or self.bound.kinds.only_pairs
        parquet = isinstance(given, LogFile) and given.options.log_format is PARQUET
        if self.runtime.reads_in_tasks and parquet and given.options.max_users is None and pairs:
            reader = ParquetReader(given.path, given.options)
            task = self.runtime.task(read_row_groups, returns=self.shards + 1)
            root, seeded = self.draws.root_bytes(), self.draws.seeded
            read, added = [], []

            def submit(batch: list[RowGroup]) -> tuple:
                *pieces, source = task.remote(str(given.path), given.options, batch, root, seeded, self.shards)
                return source, pieces

            def collect(done, pieces: list) -> None:
                read.append(self.runtime.get([done])[0])
                added.extend(a.add.remote(piece) for a, piece in zip(self.actors, pieces))

            windowed(self.runtime, read_batches(reader.row_groups, READ_ROWS), submit, collect, self.max_in_flight)
            self.runtime.get(added)
            return merge_sources(reader.source, read), str(given.path)
        log = party_log(given, self.bound)
        self.runtime.get([a.add.remote(piece) for a, piece in zip(self.actors, split_by_shard(log, self.draws, self.shards))])
        return log.source, str(given.path if isinstance(given, LogFile) else "the log")

    def id_chunks(self, size: int) -> list[tuple]:
        """The own pairs' encoded ids in chunks of ``size`` of the own numbering: per chunk,
        one part per log shard (:meth:`LogShard.pair_id_chunks`: on Ray, an object reference;
        each pair from the first shard holding it)."""
        return list(zip(*self.runtime.get([a.pair_id_chunks.remote(size, self.own_pairs) for a in self.actors])))

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        """Own ids ``first``.. came back (own numbering = the order they left): each union key
        to the log shard of its key range (cels.engine.variable_index.part_of), with its own
        pair, in slices; the node keeps none."""
        self.key_type, part = keys.dtype, part_of(keys, self.shards)
        for t, actor in enumerate(self.actors):
            at = np.flatnonzero(part == t)
            own = (at + first).astype(column_type(self.own_pairs))
            self.calls += [actor.keep_keys.remote(own[lo:hi], keys[at[lo:hi]]) for lo, hi in in_slices(len(at), keys.itemsize + own.itemsize, self.runtime.slice_bytes)]

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        """Every kept key sorted: each log shard sorts its key range's, and the ranges follow
        one another; chunks of ``size`` asked of the shards in slices as the link drains."""
        self.runtime.get(self.calls)
        self.calls = []
        self.sorted_starts = np.cumsum([0, *self.runtime.get([a.sort_keys.remote(self.key_type) for a in self.actors])])
        for lo, hi, _more in chunks(int(self.sorted_starts[-1]), size):
            refs = [ref for t, a, b in self._in_ranges(lo, hi) for ref in fetch(self.runtime, self.actors[t], "sorted", b - a, self.key_type, a)]
            yield np.concatenate([np.zeros(0, dtype=self.key_type), *self.runtime.get(refs)])

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The sorted keys ``first``.. are these index columns: to the log shards holding them, in slices."""
        columns = columns.astype(column_type(n))
        for t, a, b in self._in_ranges(first, first + len(columns)):
            shift = int(self.sorted_starts[t]) - first  # its key a is columns[a + shift]
            self.calls += [self.actors[t].place_columns.remote(a + x, columns[a + x + shift : a + y + shift]) for x, y in in_slices(b - a, columns.itemsize, self.runtime.slice_bytes)]

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The DP release: own pairs ``first``.. (own numbering, the order their ids left) are
        these columns; kept here, a column per own pair, until :meth:`index` hands them over."""
        if self.sent_columns is None:
            self.sent_columns = np.zeros(self.own_pairs, dtype=column_type(n))
        self.sent_columns[first : first + len(columns)] = columns

    def _in_ranges(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(shard, from, to) of the sorted keys lo..hi, numbered in each shard's key range."""
        starts = self.sorted_starts
        return [(t, max(lo, int(starts[t])) - int(starts[t]), min(hi, int(starts[t + 1])) - int(starts[t])) for t in range(self.shards) if min(hi, starts[t + 1]) > max(lo, starts[t])]

    def index(self, n: int) -> np.ndarray:
        """Every own pair's column is placed: every log shard's counts over the index, from the
        key ranges' own pairs and columns (object references: the node fetches none); their sum
        is the party's c^k, in the smallest unsigned type that holds it (a byte or two a pair
        where 8 would be mostly zeros)."""
        self.runtime.get(self.calls)
        self.calls = []
        if self.sent_columns is not None:  # the DP release: every own pair's column, in own numbering
            placed, self.sent_columns = [self.runtime.put((np.arange(self.own_pairs), self.sent_columns))], None
        else:
            placed = [a.key_range_columns.remote() for a in self.actors]
        kinds = self.runtime.get([a.index.remote(n, self.own_pairs, *placed) for a in self.actors])
        local = np.zeros(n, dtype=np.min_scalar_type(sum(most for _, most in kinds)))  # holds every sum (issue 25)
        for cols, part in self._by_column(n, "sums", [kind for kind, _ in kinds]):
            local[cols] += part
        return local

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        """One of the party's users holds all of pair i iff one shard's largest count there does
        (no vector of the largest counts over the index; a shard's held pairs at a time)."""
        held = np.zeros(len(totals), dtype=np.uint8)
        for cols, most in self._by_column(len(totals), "top", self.runtime.get([a.column_max.remote() for a in self.actors])):
            held[cols[most >= totals[cols]]] = 1
        held[totals <= 0] = 0
        return held

    def _by_column(self, n: int, name: str, kinds: list[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Per log shard, one at a time: its held pairs' columns of the index of ``n`` pairs
        (as :meth:`LogShard.index` handed them) and the array ``name`` of type ``kinds[s]``
        it handed beside them."""
        for s, kind in enumerate(kinds):
            held = self.held_pairs[s]
            yield tuple(self.take_handed([(s, "columns", held, column_type(n)), (s, name, held, kind)]))

    def union(self, width: int) -> RangedIndex:
        """P_1's sorted union split by key range over the log shards (cels.engine.variable_index):
        the node holds none of its keys."""
        self.runtime.get([a.begin_union.remote(width) for a in self.actors])

        def call(calls: list[tuple[int, str, tuple]]) -> list:
            """Each part's answer; a set's keys go in slices (cels.engine.runtime.in_slices), in order."""
            asked = [
                [self.actors[s].union.remote(method, args)] if method != "add"
                else [self.actors[s].union.remote(method, (args[0], args[1][lo:hi])) for lo, hi in in_slices(len(args[1]), args[1].itemsize, self.runtime.slice_bytes)]
                for s, method, args in calls
            ]  # fmt: skip
            answers = iter(self.runtime.get([ref for refs in asked for ref in refs]))
            return [[next(answers) for _ in refs][-1] for refs in asked]

        return RangedIndex(call, self.shards)

    def counts_over(self, active: np.ndarray) -> sp.csr_matrix:
        """The users' counts over the ``active`` pairs (users x active: few pairs, the rest being
        unique or below the minimum count), sent by the log shards once per set of pairs."""
        active = np.asarray(active, dtype=np.int64)
        if self.active_counts is None or not np.array_equal(active, self.active):
            where = self.runtime.put(active)
            parts = self.runtime.get([a.active_counts.remote(where) for a in self.actors])
            self.active_counts = on_party_rows(self.rows, parts, (self.n_users, len(active)))
            self.active = active
        return self.active_counts

    def pair_names(self, columns: np.ndarray) -> dict[int, tuple[str, str]]:
        """(query, url) of the index ``columns``, asked of the log shards holding them."""
        names: dict[int, tuple[str, str]] = {}
        for held in self.runtime.get([a.pair_names.remote(columns) for a in self.actors]):
            names.update(held)
        return names

    def items(self, columns: np.ndarray) -> list[bytes]:
        """The DP release: the encoded pair of each own column (cels.engine.interface.PartyWork.items)."""
        names = self.pair_names(columns)
        return [encode_item(*names[c]) for c in columns.tolist()]

    def user_names(self, rows: np.ndarray) -> list[str]:
        """The ids of the users ``rows`` (the party's draw order), asked of their log shards."""
        rows = np.asarray(rows, dtype=np.int64)
        shard = self.shard_of(rows)
        asked = [np.searchsorted(self.rows[s], rows[shard == s]) for s in range(self.shards)]
        out = [""] * len(rows)
        for s, names in enumerate(self.runtime.get([a.user_names.remote(local) for a, local in zip(self.actors, asked)])):
            for t, name in zip(np.flatnonzero(shard == s).tolist(), names):
                out[t] = name
        return out


class ShardedLogWork:
    """The calls of :class:`cels.engine.interface.PartyWork` that a party's sharded log answers
    by itself (:class:`ShardedLog`, made at the load): cels.engine.work.ShardedWork has them."""

    log: ShardedLog | None

    @property
    def n_users(self) -> int:
        return self.log.n_users

    @property
    def user_draws(self) -> BucketDraws:
        return self.log.user_draws

    def union(self, width: int) -> RangedIndex:
        return self.log.union(width)

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        self.log.keep_returned(first, keys)

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        return self.log.sorted_returned(size)

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        self.log.place_columns(n, first, columns)

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        self.log.place_sent_columns(n, first, columns)

    def index(self, n: int) -> np.ndarray:
        return self.log.index(n)

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        return self.log.held_whole(totals)

    def items(self, columns: np.ndarray) -> list[bytes]:
        return self.log.items(columns)
