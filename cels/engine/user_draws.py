"""A party's draws over its users, the same for any split of its users (docs/protocol.md,
"Sampling"; docs/ray.md, "A party on a Ray cluster").

Every user j of a party falls in one of :data:`DRAW_BUCKETS` draw buckets by
HMAC-SHA256(the session's bucket key, user id).  The party's rows are kept in *draw order*:
by bucket, then by that digest.  Each draw over users -- a stage's Poisson draws of the
exact sampling, the paper mode's multinomial trials, the pseudonyms -- comes from the stream
of its bucket (and stage), :meth:`cels.crypto.streams.DrawKeys.indexed`, taken over the
bucket's entries in draw order.  So whichever worker holds a bucket's users draws the same
numbers: a party split over P user shards (shard = bucket mod P) releases the same records
as the party in one process, for every P.  The keys are per session, so neither the buckets
nor the order say anything about the users.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.engine.sampling import paper_trials
from cels.mechanism.sampling import PSEUDONYM_BYTES, multinomial_sample

DRAW_BUCKETS = 1024
"""Draw buckets per party: the finest split of its users over workers (P <= 1024 shards)."""
BUCKET_BITS = 10
STAGE_BITS = 32


def user_digests(draws: DrawKeys, users: Sequence[str]) -> np.ndarray:
    """HMAC-SHA256(bucket key, user id), its first 8 bytes as an unsigned integer, per user."""
    key = draws.secret("user buckets")
    return np.array(
        [int.from_bytes(hmac.new(key, u.encode(), hashlib.sha256).digest()[:8], "big") for u in users], dtype=np.uint64
    )


def draw_order(digests: np.ndarray) -> np.ndarray:
    """The rows in draw order: by bucket (digest mod DRAW_BUCKETS), then by digest."""
    return np.lexsort((digests, digests % DRAW_BUCKETS)).astype(np.int64)


def buckets_of(digests: np.ndarray) -> np.ndarray:
    """Each user's draw bucket."""
    return (np.asarray(digests, dtype=np.uint64) % DRAW_BUCKETS).astype(np.int64)


class BucketDraws:
    """The draws over rows in draw order (``buckets``: each row's bucket, non-decreasing)."""

    def __init__(self, draws: DrawKeys, buckets: np.ndarray) -> None:
        buckets = np.asarray(buckets, dtype=np.int64)
        if np.any(np.diff(buckets) < 0):
            raise ValueError("rows are not in draw order")
        self.draws, self.buckets = draws, buckets
        self.present, self.row_starts = np.unique(buckets, return_index=True)
        self.row_ends = np.append(self.row_starts[1:], len(buckets))

    def _spans(self, indptr: np.ndarray):
        """(bucket, first entry, end entry) of each bucket present, over a CSR's entries."""
        return zip(self.present.tolist(), indptr[self.row_starts].tolist(), indptr[self.row_ends].tolist())

    def poisson(self, counts: sp.csr_matrix, rate: np.ndarray, stage: int) -> np.ndarray:
        """One Poisson draw per entry of ``counts`` (rows in draw order) with mean ``rate``
        (aligned with its data): bucket b's entries from stream (b, stage) of "sampling"."""
        if not 0 <= stage < 2**STAGE_BITS:
            raise ValueError(f"stage {stage} out of range")
        out = np.zeros(len(rate), dtype=np.int64)
        for b, lo, hi in self._spans(counts.indptr):
            out[lo:hi] = self.draws.indexed("sampling", (b << STAGE_BITS) | stage).poisson(rate[lo:hi])
        return out

    def bucket_totals(self, counts: sp.csr_matrix) -> sp.csr_matrix:
        """Per bucket and pair, the summed counts of its users (DRAW_BUCKETS x pairs)."""
        member = sp.csr_matrix((np.ones(len(self.buckets)), (self.buckets, np.arange(len(self.buckets)))), shape=(DRAW_BUCKETS, len(self.buckets)))
        return sp.csr_matrix(member @ sp.csr_matrix(counts, dtype=np.float64)).astype(np.int64)

    def multinomial(self, counts: sp.csr_matrix, trials: sp.csr_matrix) -> sp.csr_matrix:
        """The paper's trials within each bucket: ``trials[b, i]`` multinomial draws over bucket
        b's users holding pair i (weights c_ij), from stream b of "paper sampling"."""
        trials, counts = sp.csr_matrix(trials), sp.csr_matrix(counts)
        rows, cols, vals = [], [], []
        for b, lo, hi in zip(self.present.tolist(), self.row_starts.tolist(), self.row_ends.tolist()):
            pairs = trials.indices[trials.indptr[b] : trials.indptr[b + 1]]
            if not len(pairs):
                continue
            drawn = multinomial_sample(counts[lo:hi][:, pairs], trials.data[trials.indptr[b] : trials.indptr[b + 1]], self.draws.indexed("paper sampling", b)).tocoo()
            rows.append(drawn.row + lo)
            cols.append(pairs[drawn.col])
            vals.append(drawn.data)
        if not rows:
            return sp.csr_matrix(counts.shape, dtype=np.int64)
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=counts.shape, dtype=np.int64)

    def pseudonyms(self, rows: np.ndarray) -> list[str]:
        """A fresh pseudonym for each of ``rows`` (ascending): bucket b's from stream b of
        "pseudonyms", in row order, distinct within the bucket; the bucket in the top
        BUCKET_BITS bits keeps them distinct across buckets."""
        out: list[str] = []
        low_bits = 8 * PSEUDONYM_BYTES - BUCKET_BITS
        present, needs = np.unique(self.buckets[np.asarray(rows, dtype=np.int64)], return_counts=True)
        for b, need in zip(present.tolist(), needs.tolist()):
            rng, drawn = self.draws.indexed("pseudonyms", b), {}
            while len(drawn) < need:
                drawn.setdefault((b << low_bits) | int(rng.integers(0, 1 << low_bits, dtype=np.uint64)))
            out += [value.to_bytes(PSEUDONYM_BYTES, "big").hex() for value in drawn]
        return out


def split_over_buckets(trials: np.ndarray, bucket_totals: sp.csr_matrix, rng: np.random.Generator) -> sp.csr_matrix:
    """The paper's local trials of each pair split over the buckets holding it: a multinomial
    with weights the bucket totals, as conditional binomials bucket by bucket (DRAW_BUCKETS x
    pairs).  Multinomial within the buckets after it is the multinomial over the party's users."""
    trials = np.asarray(trials, dtype=np.int64).copy()
    remaining = np.asarray(bucket_totals.sum(axis=0)).ravel().astype(np.int64)
    totals = sp.csr_matrix(bucket_totals)
    rows, cols, vals = [], [], []
    for b in np.flatnonzero(np.diff(totals.indptr)).tolist():  # the buckets holding pairs, in order
        lo, hi = totals.indptr[b], totals.indptr[b + 1]
        pairs, held = totals.indices[lo:hi], totals.data[lo:hi]
        live = trials[pairs] > 0
        pairs, held = pairs[live], held[live]
        if not len(pairs):
            continue
        take = rng.binomial(trials[pairs], np.minimum(held / remaining[pairs], 1.0))
        trials[pairs] -= take
        remaining[pairs] -= held
        rows.append(np.full(len(pairs), b))
        cols.append(pairs)
        vals.append(take)
    if not rows:
        return sp.csr_matrix(totals.shape, dtype=np.int64)
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=totals.shape, dtype=np.int64)


PAPER_SPLIT = "paper split"
"""The label of a party's stream that splits the paper's local trials over its draw buckets."""


def paper_split(totals: np.ndarray, x: np.ndarray, bucket_totals: sp.csr_matrix, draws: DrawKeys) -> sp.csr_matrix:
    """The paper's local sampling, as every engine splits it (DRAW_BUCKETS x pairs): floor(x_i
    c_i^k / c_i) trials per pair (cels.engine.sampling.paper_trials, c_i^k the party's holdings,
    the sum of its ``bucket_totals``), split over the buckets by :func:`split_over_buckets`."""
    held = np.asarray(bucket_totals.sum(axis=0)).ravel()
    return split_over_buckets(paper_trials(held, totals, x), bucket_totals, draws.stream(PAPER_SPLIT))
