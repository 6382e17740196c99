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

import numpy as np
import scipy.sparse as sp

from cels.mechanism.conditions import Conditions
from cels.mechanism.models import Model, diversity_model, frequent_model, kl_model, kl_value, lp, objective_fns
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


def max_output_lp(cond: Conditions) -> tuple[float, np.ndarray]:
    """|𝕆|: the O-UMP LP optimum max sum x s.t. G x <= h, x >= 0 (CELS App. B.1)."""
    _check_columns(cond)
    if cond.n == 0:
        return 0.0, np.zeros(0)
    x = lp(-np.ones(cond.n), cond.G, cond.h, bounds=(0, None))
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
    model: Model | None = None
    if objective == "max-output":
        x_lp, lp_obj = x_max, max_out
    elif objective == "diversity":
        model = diversity_model(cond)
        x_lp = model.lp() if cond.n else np.zeros(0)
        lp_obj = float(x_lp.sum())
    else:
        size = resolve_output_size(output_size, max_out)
        if objective == "kl":
            model, _, _ = kl_model(cond, size, breakpoints)
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
            model, freq = frequent_model(cond, size, support)
            z = model.lp()
            x_lp = z[: cond.n]
            lp_obj = float(model.cost @ z)
            extras.update(support=support, frequent_pairs=int(len(freq)))
    value, gain = objective_fns(objective, cond, size, support)
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
    model: Model | None,
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
            model = Model(-np.ones(cond.n), cond.G, cond.h, None, None, np.zeros(cond.n), np.full(cond.n, np.inf), cond.n, None)
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
