"""Distributed sampling of the output given the optimal counts x (docs/protocol.md, phase 4: sampling).

``exact`` (default): the staged Poisson protocol.  In a stage every party draws, for each of
its users holding pair i, Poisson(mu_i * c_ij / c_i); a secure sum reveals only the stage total
N_i ~ Poisson(mu_i) (whatever the data); the draws are kept when N_i <= R_i (then R_i -= N_i)
and discarded otherwise, until every R_i = 0.  Given N_i the draws are N_i i.i.d. trials with
owner probabilities c_ij / c_i (Poisson splitting), so the union is exactly the global
multinomial with sum_j x_ij = x_i.

``paper``: the paper's local sampling (CELS section 4.2.2): P_k runs x_i * c_i^k / c_i trials
over its own users, floored so that the union never exceeds x_i.  It is not the global
multinomial (docs/protocol.md explains why); kept to reproduce the paper's figures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from cels.mechanism.defaults import DEFAULT_THETA


def stage_means(remaining: np.ndarray, theta: float = DEFAULT_THETA) -> np.ndarray:
    """mu_i of a stage: theta * R_i, and 1 when R_i = 1 (docs/protocol.md, phase 4: sampling)."""
    if not 0.0 < theta <= 1.0:
        raise ValueError(f"theta must be in (0, 1], got {theta}")
    remaining = np.asarray(remaining, dtype=np.int64)
    return np.where(remaining == 1, 1.0, theta * remaining)


PoissonDraws = Callable[[sp.csr_matrix, np.ndarray, int], np.ndarray]
"""(counts, rate per entry, stage) -> one Poisson draw per entry."""


def stream_poisson(rng: np.random.Generator) -> PoissonDraws:
    """Every stage's draws from one stream, in entry order."""
    return lambda _counts, rate, _stage: rng.poisson(rate)


class StagedSampler:
    """One party's side of the exact staged Poisson protocol.

    ``local_counts`` are this party's c_ij (users x pairs), ``totals`` the global c_i and ``x``
    the optimal counts, all over the same pair index.  Each stage: :meth:`propose` draws and
    returns (pairs in the stage, this party's stage totals) for the secure sum; :meth:`settle`
    takes the summed totals N_i and keeps or discards the draws.  ``poisson(counts, rate,
    stage)`` makes a stage's draws, one per entry of the counts (a party's user buckets,
    cels.engine.user_draws, or one stream: :func:`stream_poisson`).
    """

    def __init__(
        self,
        local_counts: sp.csr_matrix,
        totals: np.ndarray,
        x: np.ndarray,
        poisson: PoissonDraws,
        theta: float = DEFAULT_THETA,
    ) -> None:
        self.counts = sp.csr_matrix(local_counts, dtype=np.int64)
        self.counts.sum_duplicates()
        self.totals = np.asarray(totals, dtype=np.int64)
        self.remaining = np.asarray(x, dtype=np.int64).copy()
        if self.remaining.shape != self.totals.shape or self.counts.shape[1] != self.totals.shape[0]:
            raise ValueError("counts, totals and x must cover the same pairs")
        if np.any(self.remaining < 0):
            raise ValueError("x must be non-negative")
        if np.any((self.remaining > 0) & (self.totals <= 0)):
            raise ValueError("x_i > 0 for a pair with total count 0")
        self.poisson, self.theta = poisson, theta
        self.sampled = np.zeros_like(self.counts.data)  # x_ij aligned with counts.data
        self.stage = 0
        self._pending: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def done(self) -> bool:
        return not np.any(self.remaining > 0)

    def propose(self) -> tuple[np.ndarray, np.ndarray]:
        """Draw this stage: returns (pairs with R_i > 0, this party's draw total per pair)."""
        if self._pending is not None:
            raise RuntimeError("stage already proposed and not settled")
        pairs = np.flatnonzero(self.remaining > 0)
        mu = np.zeros(self.totals.shape[0])
        mu[pairs] = stage_means(self.remaining[pairs], self.theta)
        cols = self.counts.indices
        rate = np.zeros(cols.shape[0])
        safe = self.totals[cols] > 0
        rate[safe] = mu[cols[safe]] * self.counts.data[safe] / self.totals[cols[safe]]
        draws = self.poisson(self.counts, rate, self.stage).astype(np.int64)
        local = np.bincount(cols, weights=draws, minlength=self.totals.shape[0]).astype(np.int64)
        self._pending = (pairs, draws)
        return pairs, local[pairs]

    def settle(self, stage_totals: np.ndarray) -> np.ndarray:
        """Apply the summed stage totals N_i (for the proposed pairs); returns accepted mask."""
        if self._pending is None:
            raise RuntimeError("no stage proposed")
        pairs, draws = self._pending
        stage_totals = np.asarray(stage_totals, dtype=np.int64)
        if stage_totals.shape != pairs.shape or np.any(stage_totals < 0):
            raise ValueError(f"expected {pairs.shape[0]} non-negative stage totals")
        accepted = stage_totals <= self.remaining[pairs]
        keep = np.zeros(self.totals.shape[0], dtype=bool)
        keep[pairs[accepted]] = True
        self.sampled += np.where(keep[self.counts.indices], draws, 0)
        self.remaining[pairs[accepted]] -= stage_totals[accepted]
        self._pending = None
        self.stage += 1
        return accepted

    def result(self) -> sp.csr_matrix:
        """x_ij for this party's users (users x pairs)."""
        out = sp.csr_matrix(
            (self.sampled.copy(), self.counts.indices.copy(), self.counts.indptr.copy()), shape=self.counts.shape
        )
        out.eliminate_zeros()  # in place: on copies, so the party's own counts stay intact
        return out


def paper_trials(local_totals: np.ndarray, totals: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The paper's local trial counts floor(x_i * c_i^k / c_i) (CELS 4.2.2 "local sampling")."""
    local_totals = np.asarray(local_totals, dtype=np.int64)
    totals = np.asarray(totals, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    out = np.zeros_like(x)
    held = totals > 0
    out[held] = (x[held] * local_totals[held]) // totals[held]
    return out
