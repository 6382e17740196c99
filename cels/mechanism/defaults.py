"""The mechanism's parameter choices and defaults, apart from the code that uses them (no numpy
or scipy here): the session options, the flags and the schemas declare themselves from these
without importing a solver (``cels simulate --help`` stays fast)."""

from __future__ import annotations

BOUNDS = ("cels", "edbt")
"""The privacy bound b of the sampling: CELS eq. 5 or EDBT 2012 Theorem 1 (cels.mechanism.conditions)."""
OBJECTIVES = ("kl", "max-output", "frequent", "diversity")
INTEGER_METHODS = ("mip", "greedy", "floor")
"""How the solver makes the counts integer: HiGHS MIP (with a greedy fill), greedy fill, or floor."""
DEFAULT_BREAKPOINTS = 16
DEFAULT_SUPPORT = 1 / 500
DEFAULT_TIME_LIMIT = 20.0
DEFAULT_BATCH = 64
"""Proposals per round B (the AOL slice: 241 units in 49 rounds; B = 1 takes 3,096 rounds)."""
DEFAULT_THETA = 0.7
"""Exact sampling: a stage draws mu_i = theta * R_i trials of the R_i still missing."""
