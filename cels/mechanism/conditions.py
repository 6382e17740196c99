"""Privacy conditions of the multinomial sampling mechanism (CELS Theorem 2, EDBT Theorem 1).

For output counts x = (x_1..x_n) the sampling is (epsilon, delta)-DP when
(1) unique pairs (c_ij = c_i for some user j) get x_i = 0 and
(2)+(3) for every user j: sum_i x_i ln t_ij <= b with t_ij = c_i / (c_i - c_ij) and
b = min{epsilon/2, ln 1/(1-delta)} (CELS) or min{epsilon, ln 1/(1-delta)} (EDBT).
Dominated and duplicate user rows add nothing (ln t_ij grows with c_ij) and are removed exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.logs.model import SearchLog

from cels.mechanism.defaults import BOUNDS


def privacy_bound(epsilon: float, delta: float, bound: str = "cels") -> float:
    """b of CELS eq. 6 (min{eps/2, ln 1/(1-delta)}) or EDBT eq. 4 (min{eps, ln 1/(1-delta)})."""
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be a positive number, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    eps_term = epsilon / 2 if bound == "cels" else epsilon
    return min(eps_term, -math.log1p(-delta))


def apply_cap(counts: sp.csr_matrix, cap: int | None) -> sp.csr_matrix:
    """Per-user contribution cap c_ij <- min(c_ij, K); a per-user map, so the DP guarantee holds."""
    if cap is None:
        return counts
    if cap < 1:
        raise ValueError(f"cap must be a positive integer, got {cap}")
    capped = counts.copy()
    np.minimum(capped.data, cap, out=capped.data)
    return capped


def unique_pairs(counts: sp.csr_matrix, totals: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the pairs one user holds entirely (c_ij = c_i): Condition 1, x_i = 0."""
    if totals is None:
        totals = np.asarray(counts.sum(axis=0)).ravel()
    col_max = np.asarray(counts.max(axis=0).todense()).ravel()
    return (col_max >= totals) & (totals > 0)


def log_t_rows(local_counts: sp.csr_matrix, totals: np.ndarray) -> sp.csr_matrix:
    """ln t_ij = ln(c_i / (c_i - c_ij)) for one party's user rows against GLOBAL totals c_i.

    Unique pairs must already be removed (c_ij < c_i everywhere); empty rows are kept so the
    caller's row index still names its users.
    """
    counts = sp.csr_matrix(local_counts)
    counts.eliminate_zeros()
    totals = np.asarray(totals, dtype=np.float64)
    col_totals = totals[counts.indices]
    if np.any(counts.data >= col_totals):
        bad = int(counts.indices[np.argmax(counts.data >= col_totals)])
        raise ValueError(f"pair column {bad} is unique (c_ij = c_i): suppress unique pairs first")
    rows = sp.csr_matrix(
        (-np.log1p(-counts.data / col_totals), counts.indices.copy(), counts.indptr.copy()),
        shape=counts.shape,
    )
    return rows


def _count_ge(candidates: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """For each candidate row, how many kept rows are >= it element-wise (dense blocks)."""
    out = np.zeros(candidates.shape[0], dtype=np.int64)
    if kept.shape[0] == 0:
        return out
    step = max(1, 4_000_000 // max(1, kept.shape[0] * kept.shape[1]))
    for start in range(0, candidates.shape[0], step):
        block = candidates[start : start + step]
        out[start : start + step] = (kept[None, :, :] >= block[:, None, :]).all(axis=2).sum(axis=1)
    return out


def _maximal_dense(rows: np.ndarray, order: np.ndarray, block: int = 2048) -> list[int]:
    """Indices (into rows) of the maximal distinct rows, scanning by decreasing row sum."""
    kept: list[int] = []
    for start in range(0, len(order), block):
        cand = order[start : start + block]
        cand = cand[_count_ge(rows[cand], rows[kept]) == 0]
        for idx in cand:  # survivors of the block, checked against earlier ones in the block
            if _count_ge(rows[idx][None, :], rows[kept])[0] == 0:
                kept.append(int(idx))
    return kept


def _first_of_each_distinct(dense: np.ndarray) -> np.ndarray:
    """Index of the first occurrence of every distinct row: sort a 64-bit hash of the raw bits,
    then verify equality (falls back to an exact row sort on a hash collision)."""
    bits = np.ascontiguousarray(dense).view(np.uint64)
    mult = np.arange(1, 2 * bits.shape[1], 2, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        key = ((bits ^ (bits >> np.uint64(29))) * mult).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if not np.array_equal(dense, dense[first[inverse]]):
        _, first = np.unique(dense, axis=0, return_index=True)
    return first


def _maximal_sparse(rows: sp.csr_matrix, order: np.ndarray) -> list[int]:
    """Maximal rows of a wide sparse matrix: a dominator must hold every column of the row, so
    only the holders of the row's rarest column are compared."""
    csc = rows.tocsc()
    holders = np.diff(csc.indptr)
    kept_mask = np.zeros(rows.shape[0], dtype=bool)
    kept_mask[order] = True
    for r in order:
        cols = rows.indices[rows.indptr[r] : rows.indptr[r + 1]]
        vals = rows.data[rows.indptr[r] : rows.indptr[r + 1]]
        if len(cols) == 0:
            kept_mask[r] = False
            continue
        rare = cols[np.argmin(holders[cols])]
        cand = csc.indices[csc.indptr[rare] : csc.indptr[rare + 1]]
        cand = cand[(cand != r) & kept_mask[cand]]
        if len(cand) and (rows[cand][:, cols].toarray() >= vals).all(axis=1).any():
            kept_mask[r] = False
    return list(np.flatnonzero(kept_mask))


def dominant_rows(rows: sp.csr_matrix) -> np.ndarray:
    """Sorted indices of the rows that survive exact removal of empty, duplicate and element-wise
    dominated rows (spec: redundant constraints).  Dense block comparison for narrow matrices
    (MSNBC), rarest-column candidate search for wide sparse ones (AOL)."""
    rows = sp.csr_matrix(rows)
    rows.sum_duplicates()
    rows.eliminate_zeros()
    m, n = rows.shape
    nonempty = np.flatnonzero(np.diff(rows.indptr) > 0)
    if len(nonempty) == 0:
        return nonempty
    if n <= 256:
        first = _first_of_each_distinct(rows[nonempty].toarray())
        distinct = nonempty[np.sort(first)]
        dense = rows[distinct].toarray()
        order = np.argsort(-dense.sum(axis=1), kind="stable")
        kept = _maximal_dense(dense, order)
        kept = np.asarray(kept, dtype=np.int64)
        # distinct rows: another row >= a row dominates it; this re-check keeps the scan exact
        # when floating-point row sums tie
        final = kept[_count_ge(dense[kept], dense[kept]) == 1]
        return np.sort(distinct[final])
    sub = rows[nonempty]
    keys = {}
    for r in range(sub.shape[0]):
        s, e = sub.indptr[r], sub.indptr[r + 1]
        keys.setdefault((sub.indices[s:e].tobytes(), sub.data[s:e].tobytes()), r)
    distinct = nonempty[np.sort(np.fromiter(keys.values(), dtype=np.int64))]
    sub = rows[distinct]
    order = np.argsort(-np.asarray(sub.sum(axis=1)).ravel(), kind="stable")
    kept = _maximal_sparse(sub, order)
    return np.sort(distinct[kept])


def prune_dominated(rows: sp.csr_matrix) -> sp.csr_matrix:
    """The condition rows without empty, duplicate and dominated rows (same feasible set)."""
    rows = sp.csr_matrix(rows)
    return rows[dominant_rows(rows)].tocsr()


@dataclass
class Conditions:
    """G x <= h, x >= 0 integer; c = pair totals (objective weights), one column per variable.

    Solvers never assume G holds un-scaled ln t values or h a constant b: the distributed
    solver passes a transformed problem (rows scaled by positive factors, columns permuted).
    """

    G: sp.csr_matrix
    h: np.ndarray
    c: np.ndarray

    def __post_init__(self) -> None:
        self.G = sp.csr_matrix(self.G, dtype=np.float64)
        self.h = np.asarray(self.h, dtype=np.float64)
        self.c = np.asarray(self.c, dtype=np.float64)
        if self.G.shape != (len(self.h), len(self.c)):
            raise ValueError(f"G {self.G.shape} does not match h ({len(self.h)}) and c ({len(self.c)})")
        if np.any(self.h <= 0):
            raise ValueError("every right-hand side h_j must be positive")
        if np.any(self.G.data < 0):
            raise ValueError("condition coefficients must be non-negative")

    @property
    def n(self) -> int:
        return len(self.c)

    def upper_bounds(self) -> np.ndarray:
        """u_i = min_j h_j / G_ji: the largest x_i alone (EDBT invariant x_i <= b / max_j ln t_ij)."""
        scaled = sp.diags(1.0 / self.h) @ self.G
        col_max = np.asarray(scaled.max(axis=0).todense()).ravel()
        with np.errstate(divide="ignore"):
            return np.where(col_max > 0, 1.0 / col_max, np.inf)


def build_conditions(
    log: SearchLog, b: float, min_count: int = 0, cap: int | None = None, prune: bool = True
) -> tuple[Conditions, np.ndarray]:
    """Conditions of a whole log and the map variable -> pair index (unique pairs suppressed,
    pairs with total < min_count cleaned, optional per-user cap applied first)."""
    counts = apply_cap(log.counts, cap)
    totals = np.asarray(counts.sum(axis=0)).ravel()
    keep = (totals > 0) & ~unique_pairs(counts, totals) & (totals >= min_count)
    var_pairs = np.flatnonzero(keep)
    rows = log_t_rows(counts[:, var_pairs], totals[var_pairs])
    rows = prune_dominated(rows) if prune else rows[np.diff(rows.indptr) > 0]
    cond = Conditions(rows, np.full(rows.shape[0], float(b)), totals[var_pairs].astype(np.float64))
    return cond, var_pairs
