"""The search-log data model shared by every layer of CELS.

A search log is a multiset of (user, query, url) events.  The mechanism works on its
histogram (CELS section 2.1, EDBT section 2): ``c_ij`` = how often user ``u_j`` posed the
query-url pair ``phi_i``.  It is kept as a sparse users x pairs matrix.  The baselines
(ZEALOUS, Korolova et al., Safelog) also need the events in log order (first ``d`` queries
of a user, consecutive query pairs), so readers yield :class:`LogRecord` events and the
histogram is built from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from cels.logs.records import MAX_COUNT, LogError, LogRecord, Pair

@dataclass
class SearchLog:
    """Histogram of a search log: ``counts[j, i] = c_ij`` (users x pairs, CSR, int64).

    ``users[j]`` and ``pairs[i] = (query, url)`` name rows and columns.  ``source`` carries
    what a writer needs to emit the log in its input's format (format name, column mapping,
    header); it is opaque to the mechanism.
    """

    users: list[str]
    pairs: list[Pair]
    counts: sp.csr_matrix
    source: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.counts.shape != (len(self.users), len(self.pairs)):
            raise ValueError(
                f"counts shape {self.counts.shape} does not match "
                f"{len(self.users)} users x {len(self.pairs)} pairs"
            )

    @classmethod
    def from_records(cls, records: Iterable[LogRecord], source: dict | None = None) -> SearchLog:
        """Histogram of the click events (records without a url make no pair)."""
        histogram = HistogramBuilder()
        for rec in records:
            histogram.add(rec)
        return histogram.log(source)

    @property
    def n_users(self) -> int:
        return len(self.users)

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)

    def pair_totals(self) -> np.ndarray:
        """c_i = sum_j c_ij for every pair."""
        return np.asarray(self.counts.sum(axis=0)).ravel().astype(np.int64)

    @property
    def size(self) -> int:
        """|D| = sum_i c_i."""
        return int(self.counts.sum())

    def records(self) -> list[LogRecord]:
        """One click record per (user, pair) entry with its count, users in order, each user's
        pairs in column order (events for a reader of events, e.g. a synthetic log's)."""
        counts = self.counts.tocsr()
        out = []
        for row in range(counts.shape[0]):
            lo, hi = counts.indptr[row], counts.indptr[row + 1]
            user = self.users[row]
            out.extend(LogRecord(user, *self.pairs[c], int(v)) for c, v in zip(counts.indices[lo:hi].tolist(), counts.data[lo:hi].tolist()))
        return out

    def select_users(self, rows: np.ndarray) -> SearchLog:
        """The sub-log of the given user rows (pairs keep their index; used to split by user)."""
        rows = np.asarray(rows, dtype=np.int64)
        return SearchLog([self.users[j] for j in rows], list(self.pairs), self.counts[rows].tocsr(), dict(self.source))

    def split_by_user(self, parties: int, seed: int | None = None) -> list[SearchLog]:
        """A horizontal partition (CELS section 4: every user's whole log at exactly one party).

        Without a seed user j goes to share j mod ``parties``; with one, a seeded random
        partition into shares of (nearly) equal user counts.  Every share keeps the pair index.
        """
        if not 1 <= parties <= self.n_users:
            raise ValueError(f"cannot split {self.n_users} users into {parties} parties")
        if seed is None:
            return [self.select_users(np.arange(k, self.n_users, parties)) for k in range(parties)]
        order = np.random.default_rng(seed).permutation(self.n_users)
        return [self.select_users(np.sort(part)) for part in np.array_split(order, parties)]


def output_sizes(log: SearchLog) -> dict[str, int]:
    """What anyone can count in a released log (a release note's sizes, cels.reports): its rows
    (records), its pseudonymous users and its distinct query-url pairs, those with a record."""
    return {
        "output_records": log.size,
        "output_users": int(np.count_nonzero(log.counts.getnnz(axis=1))),
        "output_pairs": int(np.count_nonzero(log.pair_totals())),
    }


def split_records_by_user(records: Iterable[LogRecord], parties: int) -> list[list[LogRecord]]:
    """The events split as :meth:`SearchLog.split_by_user` splits users without a seed (user j in
    order of first appearance to share j mod ``parties``), each share in log order."""
    number: dict[str, int] = {}
    shares: list[list[LogRecord]] = [[] for _ in range(parties)]
    for rec in records:
        shares[number.setdefault(rec.user, len(number)) % parties].append(rec)
    if len(number) < parties:
        raise ValueError(f"cannot split {len(number)} users into {parties} parties")
    return shares


class HistogramBuilder:
    """The histogram c_ij built as a log is read: users and pairs numbered in the order they are
    first seen among the click events (a record without a url makes neither), counts summed.
    Events come one record at a time (:meth:`add`) or as a batch coded over its distinct
    values (:meth:`add_coded`, the Parquet reader's columnar path); both number alike."""

    def __init__(self) -> None:
        self.user_index: dict[str, int] = {}
        self.pair_index: dict[Pair, int] = {}
        self.rows: list[int] = []  # one per record added
        self.cols: list[int] = []
        self.vals: list[int] = []
        self.coded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows, cols, counts) per coded batch

    def add(self, rec: LogRecord) -> None:
        """One event in log order."""
        if rec.url is None:
            return
        self.rows.append(self.user_index.setdefault(rec.user, len(self.user_index)))
        self.cols.append(self.pair_index.setdefault((rec.query, rec.url), len(self.pair_index)))
        self.vals.append(rec.count)

    def add_coded(self, users: list[str], user_codes: np.ndarray, pairs: list[Pair], pair_codes: np.ndarray, counts: np.ndarray) -> None:
        """Click events in log order, event k being user ``users[user_codes[k]]``, pair
        ``pairs[pair_codes[k]]``, count ``counts[k]``: as :meth:`add` of each in turn."""
        self.coded.append((_numbered(self.user_index, users, user_codes), _numbered(self.pair_index, pairs, pair_codes), np.asarray(counts, dtype=np.int64)))

    def log(self, source: dict | None = None) -> SearchLog:
        """The histogram of every event added."""
        parts = [tuple(np.asarray(column, dtype=np.int64) for column in (self.rows, self.cols, self.vals)), *self.coded]
        rows, cols, vals = (np.concatenate([part[k] for part in parts]) for k in range(3))
        counts = sp.csr_matrix((vals, (rows, cols)), shape=(len(self.user_index), len(self.pair_index)), dtype=np.int64)
        counts.sum_duplicates()
        return SearchLog(list(self.user_index), list(self.pair_index), counts, dict(source or {}))


def _numbered(index: dict, values: list, codes: np.ndarray) -> np.ndarray:
    """The numbers in ``index`` of ``values[codes]``, a value not in it yet numbered next in the
    order its first code comes in ``codes`` (as ``index.setdefault`` event by event would)."""
    distinct, first = np.unique(codes, return_index=True)
    numbers = np.zeros(len(values), dtype=np.int64)
    for code in distinct[np.argsort(first, kind="stable")].tolist():
        numbers[code] = index.setdefault(values[code], len(index))
    return numbers[codes]


def check_pair_totals(log: SearchLog, path: str) -> None:
    """LogError naming the file and the first pair whose total c_i is above MAX_COUNT (docs/formats.md, Limits)."""
    totals = log.pair_totals()
    over = np.flatnonzero(totals > MAX_COUNT)
    if over.size:
        raise pair_total_error(path, log.pairs[int(over[0])], int(totals[over[0]]), over.size)


def pair_total_error(path: str, pair: Pair, total: int, pairs_over: int) -> LogError:
    """The LogError of a pair totalling above MAX_COUNT over the log (``pairs_over`` pairs do)."""
    query, url = pair
    return LogError(
        path, None, None,
        f"pair (query {query!r}, url {url!r}) totals {total} over the log, above the {MAX_COUNT} "
        f"(2^31 - 1) one pair may total{f' ({pairs_over} pairs are)' if pairs_over > 1 else ''} (docs/formats.md, Limits)",
    )  # fmt: skip
