"""The DP sampling mechanism: conditions, solvers, noise, sampling, preprocessing, recipe."""

from cels.mechanism.conditions import (
    Conditions,
    build_conditions,
    log_t_rows,
    privacy_bound,
    prune_dominated,
    unique_pairs,
)
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.mechanism.solvers import Solution, feasible, solve

__all__ = [
    "Conditions",
    "SanitizeParams",
    "Solution",
    "build_conditions",
    "feasible",
    "log_t_rows",
    "privacy_bound",
    "prune_dominated",
    "sanitize",
    "solve",
    "unique_pairs",
]
