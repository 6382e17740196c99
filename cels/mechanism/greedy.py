"""The monotone greedy behind the private solve (docs/protocol.md, "Private solve").

Public state: the totals c of the active (non-unique, cleaned) pairs, the integer counts x
(start 0) and the active set A (start: every active pair).  Each round a public rule
R(c, x, A, t) proposes up to B distinct active pairs in order, each for one more unit; every
party accepts a proposal only if every one of its users still satisfies its condition
sum_i x_i ln t_ij <= b (CELS eq. 5) with it; a proposal every party accepts adds 1 to x_i, a
rejected pair leaves A for good.  So x stays feasible for every party, and the whole transcript
is a function of the final x (:func:`replay`): a proposal was accepted iff the final count
exceeds the count it was proposed at.

Rules (one per objective, all deterministic, ties broken by index):

- ``kl`` and ``max-output``: largest marginal gain c_i ln((x_i + 2)/(x_i + 1)) (the gain of
  one unit in CELS eq. 9's sum_i c_i ln(x_i + 1)).
- ``frequent`` (F-UMP, EDBT section 5.2): only the frequent pairs (c_i / |D| >= support), largest
  c_i / (x_i + 1) first -- the D'Hondt divisor rule, which apportions units in proportion to c,
  the target x_i / |O| = c_i / |D| of F-UMP.
- ``diversity`` (D-UMP, EDBT eq. 7): pairs still at 0, largest c_i first (a large total spreads
  over more users, so its ln t_ij are small), and x_i <= 1: an accepted pair leaves A.

Output size: an absolute S stops the rounds at sum x = S; without one the rounds run until
A is empty.  A fractional output size (a share of the LP bound) is refused: no node can compute
the LP bound without the constraint rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

DEFAULT_BATCH = 64
"""Proposals per round B (the AOL slice: 241 units in 49 rounds; B = 1 takes 3,096 rounds)."""
LOAD_SLACK = 1e-9
"""Relative margin below b a tentative load must keep (float sums of ln t in another order
must still pass the exact check sum_i x_i ln t_ij <= b)."""


@dataclass(frozen=True)
class ProposalRule:
    """R(c, x, A, t) for one objective over the active pairs' totals ``c``."""

    objective: str
    c: np.ndarray
    batch: int = DEFAULT_BATCH
    size: int | None = None
    frequent: np.ndarray | None = None  # F-UMP: which active pairs are frequent

    def __post_init__(self) -> None:
        if self.objective not in ("kl", "max-output", "frequent", "diversity"):
            raise ValueError(f"no proposal rule for objective {self.objective!r}")
        if self.batch < 1:
            raise ValueError(f"the round batch must be >= 1, got {self.batch}")
        if self.size is not None and self.size < 1:
            raise ValueError(f"the output size must be an absolute count >= 1, got {self.size}")
        if self.objective == "frequent" and self.frequent is None:
            raise ValueError("the frequent rule needs the frequent pairs")

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        """x = 0 and A = every active pair (the frequent ones for F-UMP)."""
        active = np.ones(len(self.c), dtype=bool) if self.frequent is None else np.asarray(self.frequent, dtype=bool).copy()
        return np.zeros(len(self.c), dtype=np.int64), active

    def propose(self, x: np.ndarray, active: np.ndarray) -> np.ndarray:
        """The round's proposals: up to B active pair indices, best first."""
        budget = self.batch if self.size is None else min(self.batch, self.size - int(x.sum()))
        candidates = np.flatnonzero(active)
        if budget <= 0 or not len(candidates):
            return np.zeros(0, dtype=np.int64)
        c, xc = self.c[candidates].astype(np.float64), x[candidates]
        if self.objective in ("kl", "max-output"):
            key = c * np.log((xc + 2) / (xc + 1))
        elif self.objective == "frequent":
            key = c / (xc + 1)
        else:
            key = c
        order = np.lexsort((candidates, -key))  # largest key first, then smallest index
        return candidates[order[:budget]]

    def update(self, x: np.ndarray, active: np.ndarray, proposals: np.ndarray, accepted: np.ndarray) -> None:
        """Accepted: x_i += 1; rejected: i leaves A for good (diversity: every proposal leaves)."""
        x[proposals[accepted]] += 1
        active[proposals[~accepted]] = False
        if self.objective == "diversity":
            active[proposals[accepted]] = False


def verdicts(rows: sp.csc_matrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
    """One party's verdicts (0 = fits, 1 = rejects), walking the proposals in order with its users'
    loads L_j = sum_i x_i ln t_ij and adding each fitting proposal tentatively."""
    tentative = loads.copy()
    limit = b * (1 - LOAD_SLACK)
    out = np.zeros(len(proposals), dtype=np.uint64)
    for q, i in enumerate(proposals):
        lo, hi = rows.indptr[i], rows.indptr[i + 1]
        users, cost = rows.indices[lo:hi], rows.data[lo:hi]
        if np.any(tentative[users] + cost > limit):
            out[q] = 1
        else:
            tentative[users] += cost
    return out


@dataclass
class Round:
    """One round of the transcript: the proposals in order and which were accepted."""

    proposals: np.ndarray
    accepted: np.ndarray


def central_run(rule: ProposalRule, party_rows: Sequence[sp.spmatrix], b: float) -> tuple[np.ndarray, list[Round]]:
    """The private solve with every party's rows in one process (the reference the protocol
    must reproduce exactly): returns x and the transcript."""
    x, active = rule.start()
    rows = [sp.csc_matrix(r, dtype=np.float64) for r in party_rows]
    transcript = []
    while len(proposals := rule.propose(x, active)):
        rejected = np.zeros(len(proposals), dtype=bool)
        for r in rows:
            rejected |= verdicts(r, r @ x.astype(np.float64), proposals, b) != 0
        transcript.append(Round(proposals, ~rejected))
        rule.update(x, active, proposals, ~rejected)
    return x, transcript


def replay(rule: ProposalRule, final_x: np.ndarray) -> list[Round]:
    """The transcript from the public inputs and the published x alone (the simulator)."""
    x, active = rule.start()
    transcript = []
    while len(proposals := rule.propose(x, active)):
        accepted = final_x[proposals] > x[proposals]
        transcript.append(Round(proposals, accepted))
        rule.update(x, active, proposals, accepted)
    if not np.array_equal(x, final_x):
        raise ValueError("this x is not the outcome of the private greedy under this rule")
    return transcript
