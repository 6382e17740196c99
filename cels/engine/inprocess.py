"""The in-process engine (``kind = "local"``, the default): every session's work in the party
node's own process, exactly as CELS section 4.2 describes one party's computation
(:class:`InProcessWork`: the one-shard case of the routines the Ray engine shares)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.engine.interface import LoadResult, PartyWork
from cels.engine.options import EngineOptions
from cels.engine.routines import (
    PAIR_ORDER, CommutativeHash, ItemBound, bounded_rows, chunks, column_type, encode_item, encode_records, id_array, id_list, id_width,
    pair_digests, party_log, pruned_constraint_rows, smallest,
)  # fmt: skip
from cels.engine.sampling import StagedSampler
from cels.engine.user_draws import BucketDraws, buckets_of, draw_order, paper_split, user_digests
from cels.engine.variable_index import IndexPart
from cels.logs.model import SearchLog
from cels.mechanism.greedy import verdicts


class InProcessWork:
    """The whole log in this process (the default).  ``log`` is the log or its loader;
    ``draws`` the party's keys for this session.  The rows are kept in draw order
    (cels.engine.user_draws)."""

    def __init__(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> None:
        self._source, self._cap, self.draws, self.bound = log, cap, draws, bound
        self.log: SearchLog | None = None
        self.user_draws: BucketDraws | None = None
        self.counts: sp.csr_matrix | None = None  # users x own pairs, capped
        self.own = np.zeros(0, dtype=np.int64)  # the pairs this party holds (log numbering, ascending)
        self.sent = np.zeros(0, dtype=np.int64)  # the own pairs in the order their ids left (hashed_ids)
        self.returned = np.zeros(0, dtype="V16")  # their union keys, every layer applied, in that order
        self.sorted_from = np.zeros(0, dtype=np.int64)  # the position in that order of each returned key, sorted
        self.columns = np.zeros(0, dtype=np.int64)  # the index column of each own pair, in that order
        self.local: sp.csr_matrix | None = None  # users x universe
        self.pair_of: dict[int, int] = {}  # universe column -> own pair index
        self.row_users = np.zeros(0, dtype=np.int64)  # the user (log row) of each constraint row

    def load(self) -> LoadResult:
        log = party_log(self._source, self.bound)
        digests = user_digests(self.draws, log.users)
        order = draw_order(digests)
        self.log = log if np.array_equal(order, np.arange(len(order))) else log.select_users(order)
        self.user_draws = BucketDraws(self.draws, buckets_of(digests[order]))
        pairs = self.log.pairs
        self.counts = bounded_rows(self.log.counts, self._cap, self.log.users, lambda cols: [encode_item(*pairs[c]) for c in cols], self.draws,
                                   self.bound.kinds if self.bound is not None else None)  # fmt: skip
        self.own = np.flatnonzero(np.asarray(self.counts.sum(axis=0)).ravel() > 0)
        return LoadResult(len(self.own), log.source)

    def hashed_ids(self, cipher: CommutativeHash, size: int) -> Iterator[np.ndarray]:
        pairs = self.log.pairs
        encoded = [encode_item(*pairs[i]) for i in self.own]
        order = np.argsort(pair_digests(self.draws.secret(PAIR_ORDER), encoded), kind="stable")
        self.sent = self.own[order]
        for lo, hi, _more in chunks(len(order), size):
            yield id_array(cipher.hash([encoded[t] for t in order[lo:hi].tolist()]), id_width(cipher))

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        if len(self.returned) != len(self.sent) or self.returned.dtype != keys.dtype:
            self.returned = np.zeros(len(self.sent), dtype=keys.dtype)
        self.returned[first : first + len(keys)] = keys

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        self.sorted_from = np.argsort(self.returned)  # distinct keys (a repeat is malformed): no stable sort needed
        for lo, hi, _more in chunks(len(self.returned), size):
            yield self.returned[self.sorted_from[lo:hi]]

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        if len(self.columns) != len(self.sent):
            self.columns = np.zeros(len(self.sent), dtype=column_type(n))
        self.columns[self.sorted_from[first : first + len(columns)]] = columns

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        if len(self.columns) != len(self.sent):
            self.columns = np.zeros(len(self.sent), dtype=column_type(n))
        self.columns[first : first + len(columns)] = columns

    def apply_layer(self, cipher: CommutativeHash, ids: np.ndarray) -> np.ndarray:
        return id_array(cipher.apply(id_list(ids)), id_width(cipher))

    def union(self, width: int) -> IndexPart:
        return IndexPart(width)

    def index(self, n: int) -> np.ndarray:
        own, columns = self.sent, self.columns
        self.returned, self.sorted_from, self.columns = self.returned[:0].copy(), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        select = sp.csr_matrix((np.ones(len(columns), dtype=np.int64), (np.arange(len(columns)), columns)), shape=(len(columns), n))
        self.local = (self.counts[:, own] @ select).tocsr()
        self.pair_of = dict(zip(columns.tolist(), own.tolist()))
        return smallest(np.asarray(self.local.sum(axis=0)).ravel())

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        col_max = np.asarray(self.local.max(axis=0).todense()).ravel() if self.local.shape[0] else np.zeros(len(totals))
        return ((col_max >= totals) & (totals > 0)).astype(np.uint8)

    def constraint_rows(self, active: np.ndarray, totals: np.ndarray) -> sp.csr_matrix:
        rows, self.row_users = pruned_constraint_rows(self.local[:, active], totals)
        return rows

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        return verdicts(rows, loads, proposals, b)

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> StagedSampler:
        return StagedSampler(self.local[:, active], totals, x, self.user_draws.poisson, theta)

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        local = self.local[:, active]
        return self.user_draws.multinomial(local, paper_split(totals, x, self.user_draws.bucket_totals(local), self.draws))

    def records(self, sampled: sp.csr_matrix, active: np.ndarray, keep_user_ids: bool) -> list[bytes]:
        names = (lambda rows: [self.log.users[j] for j in rows]) if keep_user_ids else self.user_draws.pseudonyms
        return encode_records(sampled, names, lambda col: self.log.pairs[self.pair_of[int(active[col])]])

    def items(self, columns: np.ndarray) -> list[bytes]:
        return [encode_item(*self.log.pairs[self.pair_of[c]]) for c in columns.tolist()]


class InProcessEngine:
    """Every session's work in this process (the default)."""

    @classmethod
    def start(cls, options: EngineOptions) -> InProcessEngine:
        """This process is the engine: nothing to start."""
        return cls()

    def check(self) -> None:
        """This process is always there."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> PartyWork:
        return InProcessWork(log, cap, draws, bound)

    def usage(self, work: PartyWork) -> dict[str, Any]:
        """Everything ran in the node's process (its peak RSS is the node's)."""
        return {"kind": "local"}

    def release(self, work: PartyWork) -> None:
        """Nothing of a session outlives it outside the node's process."""

    def close(self) -> None:
        """Nothing runs outside the node's process."""
