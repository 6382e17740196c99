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

- ``kl``: largest marginal gain c_i ln((x_i + 2)/(x_i + 1)) (the gain of one unit in CELS
  eq. 9's sum_i c_i ln(x_i + 1)).
- ``max-output``: the top band, deepened -- the active pairs with c_i >= max_A c / 2, largest
  c_i first, each proposed again every round until rejected; smaller totals wait until the
  band has left A.  Every unit is worth 1, so nothing calls for spreading; a unit's only public
  cost hint is c_i (a holder pays at least ln(c_i / (c_i - 1)) ~ 1/c_i).
- ``frequent`` (F-UMP, EDBT section 5.2): only the frequent pairs (c_i / |D| >= support), largest
  c_i / (x_i + 1) first -- the D'Hondt divisor rule, which apportions units in proportion to c,
  the target x_i / |O| = c_i / |D| of F-UMP.
- ``diversity`` (D-UMP, EDBT eq. 7): pairs still at 0, largest c_i first (a large total spreads
  over more users, so its ln t_ij are small), and x_i <= 1: an accepted pair leaves A.

Output size: an absolute S stops the rounds at sum x = S; without one the rounds run until
A is empty.  A fractional output size (a share of the LP bound) is refused: no node can compute
the LP bound without the constraint rows.

Noise pass (noise on the counts, CELS 3.3 / App. C; no end-to-end bound: docs/security.md): after the first pass, the parties' noise shares
add up to z (discrete Laplace per pair, :func:`cels.mechanism.noise.laplace_share`); the noisy
target is x' = max(x + z, 0).  Units z removes are dropped (dropping keeps every condition,
all ln t_ij >= 0); the rounds restart from min(x, x') with every pair below its target active
and propose its missing units through the same rule (size S no longer applies), so the release
x'' satisfies min(x, x') <= x'' <= x' and every condition, and its transcript is again a
function of the public (x, z, x'').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.mechanism.defaults import DEFAULT_BATCH

MAX_OUTPUT_BAND = 2.0
"""max-output proposes only the active pairs whose total is within this factor of the largest
active total (docs/protocol.md, "Private solve": the rules measured)."""
LOAD_SLACK = 1e-9
"""Relative margin below b a tentative load must keep (float sums of ln t in another order
must still pass the exact check sum_i x_i ln t_ij <= b)."""


@dataclass
class GreedyState:
    """The public state of the rounds: counts x, active set A, and in the noise pass the noisy
    target x' (None in the first pass)."""

    x: np.ndarray
    active: np.ndarray
    target: np.ndarray | None = None


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
        if self.size is not None and (self.size < 1 or self.size != int(self.size)):
            raise ValueError(
                f"--output-size {self.size}: the private solve takes an absolute count >= 1; a fraction of the "
                "LP bound needs every constraint row (use --solve transformed)"
            )
        if self.objective == "frequent" and self.frequent is None:
            raise ValueError("the frequent rule needs the frequent pairs")

    def start(self) -> GreedyState:
        """x = 0 and A = every active pair (the frequent ones for F-UMP)."""
        active = np.ones(len(self.c), dtype=bool) if self.frequent is None else np.asarray(self.frequent, dtype=bool).copy()
        return GreedyState(np.zeros(len(self.c), dtype=np.int64), active)

    def noise_pass(self, x: np.ndarray, noise: np.ndarray) -> GreedyState:
        """The noise pass's start: target x' = max(x + z, 0), counts min(x, x'), A = the pairs
        below their target (every pair, whatever the objective: the noise covers them all)."""
        x = np.asarray(x, dtype=np.int64)
        noise = np.asarray(noise, dtype=np.int64)
        if x.shape != (len(self.c),) or noise.shape != x.shape:
            raise ValueError(f"noise pass over {len(self.c)} pairs: x has shape {x.shape}, z {noise.shape}")
        target = np.maximum(x + noise, 0)
        start = np.minimum(x, target)
        return GreedyState(start, target > start, target)

    def propose(self, state: GreedyState) -> np.ndarray:
        """The round's proposals: up to B active pair indices, best first, by the objective's
        rule (docs/protocol.md, "Private solve", Rules).  max-output takes only the top band
        c_i >= max_A c / 2 and never lowers a pair's key as x_i grows: with every unit worth 1,
        the band's likely-cheap pairs are filled before any smaller total is tried."""
        x = state.x
        budget = self.batch if self.size is None or state.target is not None else min(self.batch, self.size - int(x.sum()))
        candidates = np.flatnonzero(state.active)
        if budget <= 0 or not len(candidates):
            return np.zeros(0, dtype=np.int64)
        c, xc = self.c[candidates].astype(np.float64), x[candidates]
        if self.objective == "kl":
            key = c * np.log((xc + 2) / (xc + 1))
        elif self.objective == "max-output":
            band = c >= c.max() / MAX_OUTPUT_BAND
            candidates, key = candidates[band], c[band]
        elif self.objective == "frequent":
            key = c / (xc + 1)
        else:
            key = c
        order = np.lexsort((candidates, -key))  # largest key first, then smallest index
        return candidates[order[:budget]]

    def update(self, state: GreedyState, proposals: np.ndarray, accepted: np.ndarray) -> None:
        """Accepted: x_i += 1; rejected: i leaves A for good.  First pass, diversity: every
        proposal leaves; noise pass: a pair at its target leaves."""
        state.x[proposals[accepted]] += 1
        state.active[proposals[~accepted]] = False
        if state.target is not None:
            state.active[proposals[state.x[proposals] >= state.target[proposals]]] = False
        elif self.objective == "diversity":
            state.active[proposals[accepted]] = False


def greedy_walk(rows: sp.csc_matrix, loads: np.ndarray, proposals: np.ndarray, limit: float, veto: np.ndarray | None = None) -> np.ndarray:
    """The rejections (bool per proposal) of one walk over ``proposals`` in order, from the users'
    loads L_j = sum_i x_i ln t_ij: a proposal that would take one of ``rows``' users above
    ``limit`` is rejected, any other is added tentatively unless ``veto`` rejects it elsewhere
    (a user shard's walk, whose party rejects what any of its shards rejects)."""
    tentative = loads.copy()
    out = np.zeros(len(proposals), dtype=bool)
    for q, i in enumerate(proposals):
        lo, hi = rows.indptr[i], rows.indptr[i + 1]
        users, cost = rows.indices[lo:hi], rows.data[lo:hi]
        if np.any(tentative[users] + cost > limit):
            out[q] = True
        elif veto is None or not veto[q]:
            tentative[users] += cost
    return out


def verdicts(rows: sp.csc_matrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
    """One party's verdicts (0 = fits, 1 = rejects): :func:`greedy_walk` with the slack's limit."""
    return greedy_walk(rows, loads, proposals, b * (1 - LOAD_SLACK)).astype(np.uint64)


@dataclass
class Round:
    """One round of the transcript: the proposals in order and which were accepted."""

    proposals: np.ndarray
    accepted: np.ndarray


def central_run(
    rule: ProposalRule, party_rows: Sequence[sp.spmatrix], b: float, state: GreedyState | None = None
) -> tuple[np.ndarray, list[Round]]:
    """The private solve with every party's rows in one process (the reference the protocol
    must reproduce exactly), from ``state`` (default: the first pass's start): returns x and
    the transcript."""
    state = state or rule.start()
    rows = [sp.csc_matrix(r, dtype=np.float64) for r in party_rows]
    transcript = []
    while len(proposals := rule.propose(state)):
        rejected = np.zeros(len(proposals), dtype=bool)
        for r in rows:
            rejected |= verdicts(r, r @ state.x.astype(np.float64), proposals, b) != 0
        transcript.append(Round(proposals, ~rejected))
        rule.update(state, proposals, ~rejected)
    return state.x, transcript


def replay(rule: ProposalRule, final_x: np.ndarray, state: GreedyState | None = None) -> list[Round]:
    """The transcript from the public inputs and the published x alone (the simulator), from
    ``state`` (default: the first pass's start)."""
    state = state or rule.start()
    transcript = []
    while len(proposals := rule.propose(state)):
        accepted = final_x[proposals] > state.x[proposals]
        transcript.append(Round(proposals, accepted))
        rule.update(state, proposals, accepted)
    if not np.array_equal(state.x, final_x):
        raise ValueError("this x is not the outcome of the private greedy under this rule")
    return transcript
