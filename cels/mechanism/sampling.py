"""Multinomial sampling of user ids per pair (CELS Definition 3, EDBT section 3.2).

For every pair i: x_i independent trials, each picks user j with probability c_ij / c_i, so
sum_j x_ij = x_i exactly and only users holding the pair can be picked.  Released users get
fresh random pseudonyms unless the ids are kept on request.

Randomness: the ChaCha20 stream of :mod:`cels.crypto.streams`, keyed from ``secrets`` by
default.  ``--seed`` makes a release reproducible and therefore NOT private (anyone with the
seed can replay the draws).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import cipher_generator
from cels.logs.model import SearchLog

PSEUDONYM_BYTES = 8


def make_rng(seed: int | None = None) -> np.random.Generator:
    """The release's ChaCha20 stream: keyed from ``secrets``, or from ``seed`` (reproducible,
    not private)."""
    return cipher_generator(seed)


def multinomial_sample(
    log_or_counts: SearchLog | sp.spmatrix, x: np.ndarray, rng: np.random.Generator
) -> sp.csr_matrix:
    """Sampled user counts x_ij (users x pairs, CSR int64) with sum_j x_ij = x_i."""
    counts = log_or_counts.counts if isinstance(log_or_counts, SearchLog) else log_or_counts
    csc = sp.csc_matrix(counts, dtype=np.int64)
    csc.sum_duplicates()
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (csc.shape[1],):
        raise ValueError(f"x has shape {x.shape}, expected one count per pair ({csc.shape[1]})")
    if np.any(x < 0):
        raise ValueError("output counts must be non-negative")
    rows, cols, vals = [], [], []
    for i in np.flatnonzero(x):
        lo, hi = csc.indptr[i], csc.indptr[i + 1]
        weights = csc.data[lo:hi].astype(np.float64)
        if weights.sum() <= 0:
            raise ValueError(f"pair {i} has output count {x[i]} but no user holds it")
        draw = rng.multinomial(int(x[i]), weights / weights.sum())
        hit = draw > 0
        rows.append(csc.indices[lo:hi][hit])
        cols.append(np.full(int(hit.sum()), i))
        vals.append(draw[hit])
    if not rows:
        return sp.csr_matrix(csc.shape, dtype=np.int64)
    return sp.csr_matrix(
        (np.concatenate(vals).astype(np.int64), (np.concatenate(rows), np.concatenate(cols))),
        shape=csc.shape,
        dtype=np.int64,
    )


def pseudonyms(k: int, rng: np.random.Generator) -> list[str]:
    """k distinct fresh ids of ``PSEUDONYM_BYTES`` random bytes each (hex), drawn from ``rng``,
    in the order drawn (a set's order would follow the process's string hashing)."""
    out: dict[str, None] = {}
    while len(out) < k:
        out.setdefault(rng.bytes(PSEUDONYM_BYTES).hex())
    return list(out)


def released_log(
    log: SearchLog,
    sampled: sp.csr_matrix,
    *,
    keep_user_ids: bool = False,
    rng: np.random.Generator | None = None,
) -> SearchLog:
    """The output log: users with at least one sampled row (fresh pseudonyms from ``rng``, by
    default a fresh stream, in random order unless ``keep_user_ids``), pairs with an output
    count, the input's ``source`` copied."""
    sampled = sp.csr_matrix(sampled)
    sampled.eliminate_zeros()
    users = np.flatnonzero(np.diff(sampled.indptr) > 0)
    pairs = np.flatnonzero(np.asarray(sampled.sum(axis=0)).ravel() > 0)
    counts = sampled[users][:, pairs].tocsr()
    if keep_user_ids:
        names = [log.users[j] for j in users]
    else:
        names = pseudonyms(len(users), rng or make_rng())
        order = np.argsort(names)  # random ids sorted: the input's user order is not revealed
        names = [names[k] for k in order]
        counts = counts[order]
    return SearchLog(names, [log.pairs[i] for i in pairs], counts.tocsr(), dict(log.source))
