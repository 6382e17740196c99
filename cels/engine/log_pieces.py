"""A party's log in pieces, one per log shard (cels.engine.sharded_log): a piece's pairs as
their encoded ids (:class:`EncodedPairs`), the split by draw bucket, the merge, and the reader
task over a Parquet dataset's row groups (docs/ray.md, "A party on a Ray cluster").  Ray-free."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog
from cels.logs.records import Pair
from cels.logs.options import SKIPPED_EXAMPLES, LoadOptions
from cels.logs.parquet import RowGroup, load_parquet
from cels.engine.user_draws import buckets_of, user_digests
from cels.engine.routines import PAIR_DIGEST_BYTES, PAIR_ORDER, encode_item, pair_digests

GATHER_PAIRS = 65_536
"""Pairs :meth:`EncodedPairs.take` gathers at a time (one Python bytes object each, briefly)."""


class EncodedPairs:
    """Pair ids encoded (cels.engine.routines.encode_item) and packed: pair t is
    ``data[ends[t - 1]:ends[t]]``, one byte buffer and one offset array for all of them."""

    def __init__(self, data: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.ends = data, ends

    @classmethod
    def pack(cls, encoded: Sequence[bytes]) -> EncodedPairs:
        ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), ends)

    @classmethod
    def encode(cls, pairs: Sequence[Pair], key: bytes) -> tuple[EncodedPairs, np.ndarray]:
        """``pairs`` encoded and packed, with their keyed digests (cels.engine.routines.pair_digests
        under ``key``), :data:`GATHER_PAIRS` at a time: no Python bytes object per pair outlives its run."""
        parts, digests = [], []
        for lo in range(0, len(pairs), GATHER_PAIRS):
            encoded = [encode_item(*pair) for pair in pairs[lo : lo + GATHER_PAIRS]]
            parts.append(cls.pack(encoded))
            digests.append(pair_digests(key, encoded))
        return cls.concat(parts), np.concatenate([np.zeros(0, dtype=f"S{PAIR_DIGEST_BYTES}"), *digests])

    @classmethod
    def concat(cls, parts: Sequence[EncodedPairs]) -> EncodedPairs:
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0, *(len(p.data) for p in parts)])
        ends = [p.ends + at for p, at in zip(parts, shift)]
        return cls(np.concatenate([np.zeros(0, np.uint8), *(p.data for p in parts)]), np.concatenate([np.zeros(0, np.int64), *ends]))

    def __len__(self) -> int:
        return len(self.ends)

    def _bounds(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``pairs`` starts and ends in ``data``."""
        pairs = np.asarray(pairs, dtype=np.int64)
        return np.where(pairs > 0, self.ends[pairs - 1], 0), self.ends[pairs]

    def _slices(self, starts: np.ndarray, ends: np.ndarray) -> list[memoryview]:
        """The encoded ids at these bounds (:meth:`_bounds`), each a view into ``data``."""
        raw = memoryview(self.data)
        return [raw[lo:hi] for lo, hi in zip(starts.tolist(), ends.tolist())]

    def take(self, pairs: np.ndarray) -> EncodedPairs:
        """The ``pairs`` (numbers into this one) packed in that order, :data:`GATHER_PAIRS` at a
        time (slicing bytes beats a numpy gather of every byte by 8x)."""
        starts, ends = self._bounds(pairs)
        parts = [b"".join(self._slices(starts[lo : lo + GATHER_PAIRS], ends[lo : lo + GATHER_PAIRS])) for lo in range(0, len(starts), GATHER_PAIRS)]
        return EncodedPairs(np.frombuffer(b"".join(parts), dtype=np.uint8), np.cumsum(ends - starts))

    def items(self, pairs: np.ndarray) -> list[bytes]:
        """The encoded ids of ``pairs``, one bytes each (what the pair-work tasks hash)."""
        return [bytes(item) for item in self._slices(*self._bounds(pairs))]

    def pair(self, t: int) -> Pair | tuple[str, ...]:
        """Pair t as (query, url) -- or, for a DP release of other item kinds, the item's
        fields (cels.mechanism.item_kinds) -- decoded from its id (the encoding is JSON)."""
        return tuple(json.loads(bytes(self._slices(*self._bounds(np.array([t])))[0])))


@dataclass
class LogPiece:
    """Some of one log shard's users with their rows c_ij over the pairs they hold: each pair
    encoded once (``pairs``) and its keyed digest (cels.engine.routines.pair_digests), each user
    with its bucket digest (cels.engine.user_draws.user_digests)."""

    users: list[str]
    counts: sp.csr_matrix
    pairs: EncodedPairs
    digests: np.ndarray
    user_digests: np.ndarray


def split_by_shard(log: SearchLog, draws: DrawKeys, shards: int) -> list[LogPiece]:
    """``log``'s users by shard (draw bucket mod ``shards``: one shard holds them all), each
    piece over its own pairs only, in digest order (as :func:`merge_pieces` orders them, so
    that the merge of a single piece copies nothing)."""
    encoded, digests = EncodedPairs.encode(log.pairs, draws.secret(PAIR_ORDER))
    users = user_digests(draws, log.users)  # once per user: the shard's finish orders by them
    if shards == 1:  # every user on the one shard: no rows to cut
        parts = [(list(log.users), log.counts, users)]
    else:
        shard = buckets_of(users) % shards
        parts = [([log.users[j] for j in rows], log.counts[rows].tocsr(), users[rows]) for rows in (np.flatnonzero(shard == s) for s in range(shards))]
    pieces = []
    for names, counts, keys in parts:
        held = np.unique(counts.indices)
        held = held[np.argsort(digests[held])]
        pieces.append(LogPiece(names, counts[:, held].tocsr(), encoded.take(held), digests[held], keys))
    return pieces


def merge_pieces(pieces: Sequence[LogPiece]) -> LogPiece:
    """One shard's pieces added up (a user's or a pair's rows may come in several): its users
    in the order first seen, its pairs by digest."""
    digests = np.concatenate([np.zeros(0, dtype=f"S{PAIR_DIGEST_BYTES}"), *(p.digests for p in pieces)])
    held, first, column = np.unique(digests, return_index=True, return_inverse=True)
    user_index: dict[str, int] = {}
    user_keys = [np.zeros(0, dtype=np.uint64)]  # each user's digest, from the piece it is first seen in
    rows, cols, vals = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    offset = 0
    for piece in pieces:
        entries = piece.counts.tocoo()
        seen = len(user_index)
        users = np.array([user_index.setdefault(u, len(user_index)) for u in piece.users], dtype=np.int64)
        user_keys.append(piece.user_digests[users >= seen])
        rows.append(users[entries.row])
        cols.append(column[offset + entries.col])
        vals.append(entries.data.astype(np.int64))
        offset += len(piece.digests)
    counts = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(user_index), len(held)), dtype=np.int64)
    counts.sum_duplicates()
    pairs = EncodedPairs.concat([p.pairs for p in pieces])
    in_order = len(first) == len(pairs) and np.array_equal(first, np.arange(len(first)))  # one piece, as split_by_shard made it
    return LogPiece(list(user_index), counts, pairs if in_order else pairs.take(first), held, np.concatenate(user_keys))


def read_batches(row_groups: Sequence[RowGroup], rows: int) -> list[list[RowGroup]]:
    """Consecutive runs of row groups of at most ``rows`` rows (a larger group alone), as even
    as whole groups allow: a run's share is the rows not yet in a run over as many runs as
    they need, and a run closes before the group that would take it further past that share
    than it stays short of it.  A party of 326,629 rows in groups of 65,536 is read in runs
    of 131,072 and 195,557 rows, not 262,144 and 64,485 (where cores are free, the larger run
    is the load's wall time)."""
    left = sum(group.rows for group in row_groups)  # rows not in a closed run
    batches: list[list[RowGroup]] = []
    size = share = 0
    for group in row_groups:
        if not batches or size + group.rows > rows or size + group.rows / 2 > share:
            left -= size
            share = left / max(1, -(-left // rows))  # the rest's share of a run
            batches.append([])
            size = 0
        batches[-1].append(group)
        size += group.rows
    return batches


def merge_sources(source: dict, read: Sequence[dict]) -> dict:
    """The Parquet reader's ``source`` of the whole log from its reader tasks' (row groups
    read, bad rows skipped and the first reasons)."""
    merged = dict(source)
    merged["row_groups"] = sum(part["row_groups"] for part in read)
    merged["skipped_lines"] = sum(part["skipped_lines"] for part in read)
    for key in ("skipped_examples", "skipped_at"):
        merged[key] = [item for part in read for item in part[key]][:SKIPPED_EXAMPLES]
    return merged


def read_row_groups(path: str, options: LoadOptions, groups: list[RowGroup], root: bytes, seeded: bool, shards: int) -> tuple:
    """One reader task: the histogram of ``groups`` (every row checked: docs/formats.md), split
    by shard; returns the ``shards`` pieces, then the reader's ``source``."""
    log = load_parquet(path, options, groups)
    return (*split_by_shard(log, DrawKeys(root, seeded=seeded), shards), log.source)
