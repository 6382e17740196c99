"""The optimisation models behind the optimal counts (EDBT section 5, CELS App. B): the LP and
HiGHS MIP over the privacy conditions, and each objective's model and value (max-output, KL,
frequent pairs, diversity); :mod:`cels.mechanism.solvers` solves them and makes the counts integer."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from cels.mechanism.conditions import Conditions

log = logging.getLogger(__name__)

def lp(c: np.ndarray, A_ub, b_ub, A_eq=None, b_eq=None, bounds=None) -> np.ndarray:
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status != 0:
        raise ValueError(f"LP solver failed: {res.message}")
    return res.x


# ----------------------------------------------------------------------------- models
@dataclass
class Model:
    """A minimisation model over z = [x (n), auxiliaries]; rows of A_ub/A_eq act on z."""

    cost: np.ndarray
    A_ub: sp.csr_matrix
    b_ub: np.ndarray
    A_eq: sp.csr_matrix | None
    b_eq: np.ndarray | None
    lower: np.ndarray
    upper: np.ndarray
    n_x: int
    total_row: int | None  # index in A_eq of sum x = |O| (relaxed to <= for integers)

    def lp(self) -> np.ndarray:
        return lp(self.cost, self.A_ub, self.b_ub, self.A_eq, self.b_eq, list(zip(self.lower, self.upper)))

    def mip(self, integer_upper: np.ndarray, time_limit: float) -> tuple[np.ndarray | None, dict]:
        """HiGHS MIP with x integer and sum x <= |O|: its point (None when no integer point
        was found) and how it stopped (:func:`mip_stop`)."""
        upper = self.upper.copy()
        upper[: self.n_x] = np.minimum(upper[: self.n_x], integer_upper)
        cons = [LinearConstraint(self.A_ub, -np.inf, self.b_ub)]
        if self.A_eq is not None:
            lo = self.b_eq.copy()
            if self.total_row is not None:
                lo[self.total_row] = -np.inf
            cons.append(LinearConstraint(self.A_eq, lo, self.b_eq))
        integrality = np.zeros(len(self.cost))
        integrality[: self.n_x] = 1
        res = milp(
            self.cost,
            integrality=integrality,
            bounds=Bounds(self.lower, upper),
            constraints=cons,
            options={"time_limit": float(time_limit), "disp": False},
        )
        log.info("MIP status %s: %s", res.status, res.message)
        stop = mip_stop(res, time_limit)
        if res.x is None:
            return None, stop
        return np.maximum(np.round(res.x[: self.n_x]), 0), stop


MIP_TIME_LIMIT_STATUS = 1
"""scipy.optimize.milp's status when HiGHS stopped at the time (or iteration) limit."""


def mip_stop(res: Any, time_limit: float) -> dict:
    """How the MIP stopped, for the report: ``mip_status`` ("optimal", "time limit", ...) and
    ``mip_gap`` (HiGHS' relative gap between the best point and the dual bound; 0 when optimal).
    A MIP stopped at its time limit is a WARNING: the counts may be below the optimum."""
    gap = getattr(res, "mip_gap", None)
    stop = {"mip_status": {0: "optimal", MIP_TIME_LIMIT_STATUS: "time limit"}.get(res.status, f"status {res.status}: {res.message}"),
            "mip_gap": None if gap is None else float(gap), "mip_time_limit": float(time_limit)}  # fmt: skip
    if res.status == MIP_TIME_LIMIT_STATUS:
        log.warning(mip_stop_notice(stop))
    return stop


def mip_stop_notice(extras: dict) -> str | None:
    """One line when a solution's MIP stopped at its time limit (None otherwise)."""
    if extras.get("mip_status") != "time limit":
        return None
    gap = extras.get("mip_gap")
    gap_text = f"MIP gap {gap:.2%}" if gap is not None and math.isfinite(gap) else "no MIP gap known (no bound)"
    return (f"the MIP stopped at its time limit of {extras['mip_time_limit']:g} s, not at the optimum ({gap_text}); "
            "the counts are the best integer point found (--time-limit gives it more)")


def with_aux(cond: Conditions, n_aux: int) -> sp.csr_matrix:
    return sp.hstack([cond.G, sp.csr_matrix((cond.G.shape[0], n_aux))]).tocsr()


def kl_breakpoints(limit: np.ndarray, K: int) -> np.ndarray:
    """K breakpoints per variable on [0, limit_i], equally spaced in ln(x + 1) (n x K)."""
    steps = np.linspace(0.0, 1.0, K)
    return np.power(limit[:, None] + 1.0, steps[None, :]) - 1.0


def kl_model(cond: Conditions, size: float, K: int) -> tuple[Model, np.ndarray, np.ndarray]:
    """CELS eq. 10 in incremental form: x_i = sum_s d_is, 0 <= d_is <= a_s - a_{s-1}."""
    n = cond.n
    limit = np.minimum(cond.upper_bounds(), size)
    a = kl_breakpoints(limit, K)
    length = np.diff(a, axis=1)  # n x (K-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(length > 0, np.diff(np.log1p(a), axis=1) / length, 0.0)
    m = K - 1
    n_d = n * m
    link = sp.hstack([sp.identity(n, format="csr"), -sp.kron(sp.identity(n), np.ones((1, m)), format="csr")])
    total = sp.hstack([sp.csr_matrix(np.ones((1, n))), sp.csr_matrix((1, n_d))])
    model = Model(
        cost=np.concatenate([np.zeros(n), -(cond.c[:, None] * slope).ravel()]),
        A_ub=with_aux(cond, n_d),
        b_ub=cond.h,
        A_eq=sp.vstack([link, total]).tocsr(),
        b_eq=np.concatenate([np.zeros(n), [size]]),
        lower=np.zeros(n + n_d),
        upper=np.concatenate([limit, length.ravel()]),
        n_x=n,
        total_row=n,
    )
    return model, a, slope


def frequent_model(cond: Conditions, size: float, support: float) -> tuple[Model, np.ndarray]:
    """EDBT F-UMP ILP: y_i >= |x_i/|O| - c_i/|D|| for the frequent pairs, sum x = |O|."""
    n = cond.n
    p = cond.c / cond.c.sum()
    freq = np.flatnonzero(p >= support)
    k = len(freq)
    sel = sp.csr_matrix((np.ones(k) / size, (np.arange(k), freq)), shape=(k, n))
    eye = sp.identity(k, format="csr")
    A_ub = sp.vstack(
        [with_aux(cond, k), sp.hstack([sel, -eye]), sp.hstack([-sel, -eye])]
    ).tocsr()
    model = Model(
        cost=np.concatenate([np.zeros(n), np.ones(k)]),
        A_ub=A_ub,
        b_ub=np.concatenate([cond.h, p[freq], -p[freq]]),
        A_eq=sp.csr_matrix(np.concatenate([np.ones(n), np.zeros(k)])[None, :]),
        b_eq=np.array([size]),
        lower=np.zeros(n + k),
        upper=np.full(n + k, np.inf),
        n_x=n,
        total_row=0,
    )
    return model, freq


def diversity_model(cond: Conditions) -> Model:
    """EDBT eq. 7: max sum y_i, G y <= h, y in {0, 1}."""
    return Model(
        cost=-np.ones(cond.n),
        A_ub=cond.G,
        b_ub=cond.h,
        A_eq=None,
        b_eq=None,
        lower=np.zeros(cond.n),
        upper=np.ones(cond.n),
        n_x=cond.n,
        total_row=None,
    )


# ----------------------------------------------------------------------------- objectives
def kl_value(c: np.ndarray, x: np.ndarray) -> float:
    """The true concave KL objective sum_i c_i ln(x_i + 1) (CELS App. B.1)."""
    return float(np.dot(c, np.log1p(np.asarray(x, dtype=np.float64))))


def support_distance(p: np.ndarray, freq: np.ndarray, x: np.ndarray, size: float) -> float:
    return float(np.abs(np.asarray(x, dtype=np.float64)[freq] / size - p[freq]).sum())


def objective_fns(
    objective: str, cond: Conditions, size: float, support: float
) -> tuple[Callable[[np.ndarray], float], Callable[[np.ndarray], np.ndarray]]:
    """(value to maximise, per-variable gain of one more unit) for an objective."""
    c = cond.c

    def kl_gain(x: np.ndarray) -> np.ndarray:
        return c * (np.log1p(x + 1.0) - np.log1p(x))

    if objective == "kl":
        return (lambda x: kl_value(c, x)), kl_gain
    if objective == "max-output":
        return (lambda x: float(np.sum(x))), (lambda x: 1.0 + 1e-9 * kl_gain(x) / max(c.max(), 1.0))
    if objective == "diversity":
        return (lambda x: float(np.count_nonzero(x))), (lambda x: (x == 0).astype(np.float64))
    p = c / c.sum()
    freq = np.flatnonzero(p >= support)

    def freq_gain(x: np.ndarray) -> np.ndarray:
        """sum x = |O| is a constraint of F-UMP, so every unit gains (in [1, 3]); units that
        reduce the support distance most come first, then (tie-break) the KL gain."""
        now = np.abs(x[freq] / size - p[freq])
        after = np.abs((x[freq] + 1) / size - p[freq])
        gain = 2.0 + 1e-9 * kl_gain(x) / max(c.max(), 1.0)
        gain[freq] += size * (now - after)
        return gain

    return (lambda x: -support_distance(p, freq, x, size)), freq_gain


# ----------------------------------------------------------------------------- integer steps
