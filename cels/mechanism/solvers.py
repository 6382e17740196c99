"""Optimal output counts x under the privacy conditions G x <= h (EDBT section 5, CELS App. B).

One LP/MIP layer on scipy's HiGHS (``linprog`` / ``milp``) for four objectives:

- ``max-output`` (O-UMP): max sum_i x_i; its LP optimum is |𝕆|, the largest output size.
- ``kl`` (CELS App. B, eq. 9-10): max sum_i c_i ln(x_i + 1) with sum_i x_i = |O|, solved as a
  piecewise-linear LP with K breakpoints per variable on [0, u_i], u_i = min_j h_j / G_ji.
- ``frequent`` (F-UMP, EDBT 5.2): min sum over frequent pairs (c_i/|D| >= s) of |x_i/|O| - c_i/|D||.
- ``diversity`` (D-UMP, EDBT eq. 7): max number of pairs with x_i = 1 (0/1 program): exact HiGHS
  MIP when small, the repaired SPE heuristic (EDBT Algorithm 2) plus greedy add-back otherwise.

Integer counts: ``floor`` (the papers), ``greedy`` (floor, then add single units where the
objective gains most per unit of normalised slack used; never breaks a condition) or ``mip``
(HiGHS MIP with a time limit, keeping the better of MIP and greedy).  Nothing here assumes
that G holds un-scaled ln t values or that h is constant (the distributed solver passes a
row-scaled, column-permuted problem).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from cels.mechanism.conditions import Conditions
from cels.mechanism.defaults import DEFAULT_BREAKPOINTS, DEFAULT_SUPPORT, DEFAULT_TIME_LIMIT, INTEGER_METHODS, OBJECTIVES

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_FRACTION = 0.5
DIVERSITY_EXACT_MAX_VARS = 5000
_MARGIN = 1e-12  # relative safety margin when adding a unit (keeps G x <= h exact in floats)


@dataclass
class Solution:
    """Solver output: integer counts x (one per variable of the Conditions) and LP facts."""

    objective: str
    x: np.ndarray
    x_lp: np.ndarray
    lp_objective: float
    max_output_lp: float
    output_size: float
    integer_method: str
    """The integer method that ran (``--integer``: mip, greedy or floor)."""
    integer_source: str
    """Which candidate x is: with ``mip`` the MIP and the greedy fill both run and the better
    one is kept, so x may come from ``greedy``."""
    integer_objective: float
    extras: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def integer_total(self) -> int:
        return int(self.x.sum())

    @property
    def lp_total(self) -> float:
        return float(self.x_lp.sum())

    @property
    def integer_ratio(self) -> float:
        """integer total / LP total (the LP's |O|; |𝕆| for max-output)."""
        return self.integer_total / self.lp_total if self.lp_total > 0 else 1.0

    def summary(self) -> dict:
        return {
            "objective": self.objective,
            "lp_objective": self.lp_objective,
            "lp_total": self.lp_total,
            "max_output_lp": self.max_output_lp,
            "output_size": self.output_size,
            "integer_source": self.integer_source,
            "integer_objective": self.integer_objective,
            "integer_total": self.integer_total,
            "integer_ratio": self.integer_ratio,
            "integer_ratio_to_max_output": self.integer_total / self.max_output_lp if self.max_output_lp > 0 else 1.0,
            "seconds": self.seconds,
            **self.extras,
        }


def feasible(cond: Conditions, x: np.ndarray) -> bool:
    """True when x >= 0 and every condition G x <= h holds (no tolerance)."""
    x = np.asarray(x)
    return bool(np.all(x >= 0) and np.all(cond.G @ x.astype(np.float64) <= cond.h))


def _check_columns(cond: Conditions) -> None:
    empty = np.flatnonzero(np.diff(cond.G.tocsc().indptr) == 0)
    if len(empty):
        raise ValueError(f"variable {int(empty[0])} appears in no condition (its count would be unbounded)")


def _lp(c: np.ndarray, A_ub, b_ub, A_eq=None, b_eq=None, bounds=None) -> np.ndarray:
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status != 0:
        raise ValueError(f"LP solver failed: {res.message}")
    return res.x


def max_output_lp(cond: Conditions) -> tuple[float, np.ndarray]:
    """|𝕆|: the O-UMP LP optimum max sum x s.t. G x <= h, x >= 0 (CELS App. B.1)."""
    _check_columns(cond)
    if cond.n == 0:
        return 0.0, np.zeros(0)
    x = _lp(-np.ones(cond.n), cond.G, cond.h, bounds=(0, None))
    return float(x.sum()), x


def resolve_output_size(output_size: float | None, max_output: float) -> float:
    """--output-size rule: F <= 1 is a fraction of |𝕆|, F > 1 an absolute count."""
    if output_size is None:
        output_size = DEFAULT_OUTPUT_FRACTION
    if not output_size > 0:
        raise ValueError(f"output size must be positive, got {output_size}")
    size = output_size * max_output if output_size <= 1 else float(output_size)
    if size > max_output * (1 + 1e-9):
        raise ValueError(f"output size {size:g} exceeds the maximum |O| = {max_output:.4f} allowed by the conditions")
    return min(size, max_output)


# ----------------------------------------------------------------------------- models
@dataclass
class _Model:
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
        return _lp(self.cost, self.A_ub, self.b_ub, self.A_eq, self.b_eq, list(zip(self.lower, self.upper)))

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


def _with_aux(cond: Conditions, n_aux: int) -> sp.csr_matrix:
    return sp.hstack([cond.G, sp.csr_matrix((cond.G.shape[0], n_aux))]).tocsr()


def _breakpoints(limit: np.ndarray, K: int) -> np.ndarray:
    """K breakpoints per variable on [0, limit_i], equally spaced in ln(x + 1) (n x K)."""
    steps = np.linspace(0.0, 1.0, K)
    return np.power(limit[:, None] + 1.0, steps[None, :]) - 1.0


def _kl_model(cond: Conditions, size: float, K: int) -> tuple[_Model, np.ndarray, np.ndarray]:
    """CELS eq. 10 in incremental form: x_i = sum_s d_is, 0 <= d_is <= a_s - a_{s-1}."""
    n = cond.n
    limit = np.minimum(cond.upper_bounds(), size)
    a = _breakpoints(limit, K)
    length = np.diff(a, axis=1)  # n x (K-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(length > 0, np.diff(np.log1p(a), axis=1) / length, 0.0)
    m = K - 1
    n_d = n * m
    link = sp.hstack([sp.identity(n, format="csr"), -sp.kron(sp.identity(n), np.ones((1, m)), format="csr")])
    total = sp.hstack([sp.csr_matrix(np.ones((1, n))), sp.csr_matrix((1, n_d))])
    model = _Model(
        cost=np.concatenate([np.zeros(n), -(cond.c[:, None] * slope).ravel()]),
        A_ub=_with_aux(cond, n_d),
        b_ub=cond.h,
        A_eq=sp.vstack([link, total]).tocsr(),
        b_eq=np.concatenate([np.zeros(n), [size]]),
        lower=np.zeros(n + n_d),
        upper=np.concatenate([limit, length.ravel()]),
        n_x=n,
        total_row=n,
    )
    return model, a, slope


def _frequent_model(cond: Conditions, size: float, support: float) -> tuple[_Model, np.ndarray]:
    """EDBT F-UMP ILP: y_i >= |x_i/|O| - c_i/|D|| for the frequent pairs, sum x = |O|."""
    n = cond.n
    p = cond.c / cond.c.sum()
    freq = np.flatnonzero(p >= support)
    k = len(freq)
    sel = sp.csr_matrix((np.ones(k) / size, (np.arange(k), freq)), shape=(k, n))
    eye = sp.identity(k, format="csr")
    A_ub = sp.vstack(
        [_with_aux(cond, k), sp.hstack([sel, -eye]), sp.hstack([-sel, -eye])]
    ).tocsr()
    model = _Model(
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


def _diversity_model(cond: Conditions) -> _Model:
    """EDBT eq. 7: max sum y_i, G y <= h, y in {0, 1}."""
    return _Model(
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


def _support_distance(p: np.ndarray, freq: np.ndarray, x: np.ndarray, size: float) -> float:
    return float(np.abs(np.asarray(x, dtype=np.float64)[freq] / size - p[freq]).sum())


def _objective_fns(
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

    return (lambda x: -_support_distance(p, freq, x, size)), freq_gain


# ----------------------------------------------------------------------------- integer steps
def greedy_fill(
    cond: Conditions,
    x: np.ndarray,
    gain: Callable[[np.ndarray], np.ndarray],
    *,
    total: float = math.inf,
    upper: np.ndarray | None = None,
) -> np.ndarray:
    """Add single units, largest gain per unit of normalised slack sum_j G_ji / slack_j first,
    while every condition keeps holding, sum x <= total and x <= upper (spec: greedy fill)."""
    x = np.asarray(x, dtype=np.int64).copy()
    G = cond.G.tocsc()
    starts = G.indptr[:-1]
    has = np.diff(G.indptr) > 0
    rows = G.indices
    margin = _MARGIN * cond.h
    while x.sum() + 1 <= total + 1e-9:
        slack = cond.h - cond.G @ x.astype(np.float64)
        room = slack - margin
        fits_nz = G.data <= room[rows]
        fits = np.ones(cond.n, dtype=bool)
        fits[has] = np.logical_and.reduceat(fits_nz, starts[has])
        if upper is not None:
            fits &= x < upper
        g = gain(x)
        fits &= g > 0
        if not fits.any():
            break
        with np.errstate(divide="ignore"):
            ratio = G.data / np.maximum(slack[rows], 1e-300)
        cost = np.zeros(cond.n)
        cost[has] = np.add.reduceat(ratio, starts[has])
        score = np.where(fits, g / np.maximum(cost, 1e-300), -np.inf)
        x[int(np.argmax(score))] += 1
    return x


def repair(cond: Conditions, x: np.ndarray) -> np.ndarray:
    """Reduce counts until every condition holds: each violated row j scales the counts on its
    support by h_j / (G x)_j (floored); non-violated rows only lose (spec: noise repair)."""
    x = np.maximum(np.asarray(x, dtype=np.int64), 0)
    G = cond.G.tocsr()
    while not feasible(cond, x):
        load = G @ x.astype(np.float64)
        factor = np.where(load > cond.h, cond.h / np.maximum(load, 1e-300) * (1 - 1e-12), 1.0)
        per_var = np.ones(cond.n)
        viol = np.flatnonzero(factor < 1)
        sub = G[viol].tocoo()
        np.minimum.at(per_var, sub.col, factor[viol][sub.row])
        x = np.floor(x * per_var).astype(np.int64)
    return x


def spe(cond: Conditions) -> np.ndarray:
    """EDBT Algorithm 2 (Sensitive Pair Eliminating), repaired: start from y = 1, repeatedly drop
    the still-active pair with the largest normalised coefficient max_j G_ji / h_j, stop once
    every condition holds."""
    scaled = (sp.diags(1.0 / cond.h) @ cond.G).tocsc()
    col_max = np.asarray(scaled.max(axis=0).todense()).ravel()
    y = np.ones(cond.n, dtype=np.int64)
    load = scaled @ y.astype(np.float64)
    for i in np.argsort(-col_max, kind="stable"):
        if np.all(load <= 1.0) and feasible(cond, y):
            break
        y[i] = 0
        s, e = scaled.indptr[i], scaled.indptr[i + 1]
        load[scaled.indices[s:e]] -= scaled.data[s:e]
    return y


# ----------------------------------------------------------------------------- entry point
def solve(
    cond: Conditions,
    objective: str = "kl",
    *,
    output_size: float | None = None,
    breakpoints: int = DEFAULT_BREAKPOINTS,
    support: float = DEFAULT_SUPPORT,
    time_limit: float = DEFAULT_TIME_LIMIT,
    integer: str = "mip",
) -> Solution:
    """Optimal integer output counts for one objective (see module docstring).

    ``output_size`` (kl, frequent): <= 1 a fraction of |𝕆|, > 1 an absolute |O|.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if integer not in INTEGER_METHODS:
        raise ValueError(f"integer must be one of {INTEGER_METHODS}, got {integer!r}")
    if breakpoints < 2:
        raise ValueError(f"breakpoints must be >= 2, got {breakpoints}")
    started = time.perf_counter()
    max_out, x_max = max_output_lp(cond)
    extras: dict = {}
    size = max_out
    model: _Model | None = None
    if objective == "max-output":
        x_lp, lp_obj = x_max, max_out
    elif objective == "diversity":
        model = _diversity_model(cond)
        x_lp = model.lp() if cond.n else np.zeros(0)
        lp_obj = float(x_lp.sum())
    else:
        size = resolve_output_size(output_size, max_out)
        if objective == "kl":
            model, _, _ = _kl_model(cond, size, breakpoints)
            z = model.lp()
            x_lp = z[: cond.n]
            lp_obj = float(-(model.cost @ z))
            true = kl_value(cond.c, x_lp)
            extras.update(
                breakpoints=breakpoints,
                kl_piecewise_objective=lp_obj,
                kl_true_objective=true,
                kl_piecewise_gap=true - lp_obj,
                kl_piecewise_rel_gap=(true - lp_obj) / true if true > 0 else 0.0,
            )
        else:
            model, freq = _frequent_model(cond, size, support)
            z = model.lp()
            x_lp = z[: cond.n]
            lp_obj = float(model.cost @ z)
            extras.update(support=support, frequent_pairs=int(len(freq)))
    value, gain = _objective_fns(objective, cond, size, support)
    total = size if objective in ("kl", "frequent") else math.inf
    x, source = _integer(cond, objective, model, x_lp, value, gain, total, integer, time_limit, extras)
    if not feasible(cond, x):  # cannot happen: every step keeps the conditions
        raise RuntimeError("integer solution breaks a privacy condition")
    return Solution(
        objective=objective,
        x=x,
        x_lp=x_lp,
        lp_objective=lp_obj,
        max_output_lp=max_out,
        output_size=float(x_lp.sum()) if objective in ("max-output", "diversity") else size,
        integer_method=integer,
        integer_source=source,
        integer_objective=-value(x) if objective == "frequent" else value(x),
        extras=extras,
        seconds=time.perf_counter() - started,
    )


def _integer(
    cond: Conditions,
    objective: str,
    model: _Model | None,
    x_lp: np.ndarray,
    value: Callable[[np.ndarray], float],
    gain: Callable[[np.ndarray], np.ndarray],
    total: float,
    integer: str,
    time_limit: float,
    extras: dict,
) -> tuple[np.ndarray, str]:
    """Integer counts from the LP solution by the chosen method (best feasible candidate)."""
    floor = repair(cond, np.floor(x_lp + 1e-9).astype(np.int64))
    if integer == "floor":
        return floor, "floor"
    upper = np.ones(cond.n, dtype=np.int64) if objective == "diversity" else None
    if objective == "diversity":
        start = np.maximum(floor, spe(cond))
        start = start if feasible(cond, start) else spe(cond)
    else:
        start = floor
    best = greedy_fill(cond, start, gain, total=total, upper=upper)
    method = "greedy"
    if integer == "mip" and cond.n and (objective != "diversity" or cond.n <= DIVERSITY_EXACT_MAX_VARS):
        if model is None:  # max-output
            model = _Model(-np.ones(cond.n), cond.G, cond.h, None, None, np.zeros(cond.n), np.full(cond.n, np.inf), cond.n, None)
        t0 = time.perf_counter()
        found, stop = model.mip(np.floor(cond.upper_bounds()), time_limit)
        extras["mip_seconds"] = time.perf_counter() - t0
        extras.update(stop)
        if found is not None:
            found = repair(cond, found.astype(np.int64))
            found = greedy_fill(cond, found, gain, total=total, upper=upper)
            extras["mip_objective"] = value(found)
            if value(found) > value(best):
                best, method = found, "mip"
    return best, method
