"""The paper's local sampling breaks the delta bound (docs/protocol.md, "Decisions": sampling).

CELS Theorem 2, Condition 3 bounds the probability that user u_j appears in the output O:
Pr[u_j sampled] = 1 - prod_i (1 - c_ij / c_i)^{x_i} <= delta (section 3.2.1, eq. 4), which the
solver enforces as sum_i x_i ln t_ij <= b = ln 1/(1 - delta).  That is the global multinomial.
The paper's local sampling lets the owner P_k of u_j run x_i c_i^k / c_i trials over its own
users, each picking u_j with probability c_ij / c_i^k.  With p = c_ij / c_i and s = c_i^k / c_i < 1,

    Pr[u_j not sampled for pair i] = (1 - p/s)^{x_i s} < (1 - p)^{x_i},

so a user whose condition is tight appears with probability above delta.

The instance: one shared pair with c_i = 40; P_1 holds the chosen user u and one other user
(2 each, so s = 0.1, p/s = 1/2); P_2 holds 18 users with 2 each.  Every row has the same
ln t, b is set so that the max-output optimum is x_i = 10 with every condition tight
(delta = 1 - 0.95^10 ~ 0.401): the exact mode puts u in O with probability exactly delta,
the paper mode (one local trial at P_1) with probability 1/2.  Both are computed in closed form
and simulated with the protocol's own samplers (:class:`cels.engine.sampling.StagedSampler`,
:func:`cels.engine.sampling.paper_trials`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

from cels.logs.model import SearchLog
from cels.mechanism.conditions import build_conditions, privacy_bound
from cels.mechanism.sampling import multinomial_sample
from cels.mechanism.solvers import solve
from cels.mechanism.defaults import DEFAULT_THETA
from cels.engine.sampling import StagedSampler, paper_trials, stream_poisson

PAIR = ("flu symptoms", "http://health.example.org/flu")
TIGHTNESS = 1e-9
"""b exceeds x_i ln t by this relative margin, so that round-off cannot cut the optimum to x_i - 1."""


@dataclass
class Instance:
    """Parties' logs over the same pairs, the chosen user (party, row) and the session's b."""

    logs: list[SearchLog]
    party: int
    user: int
    epsilon: float
    delta: float


def tight_instance(user_count: int = 2, own_party: Sequence[int] = (2, 2), other_party: Sequence[int] = (2,) * 18, x: int = 10) -> Instance:
    """The module docstring's instance: ``own_party`` = counts of P_1's users (the first is the
    chosen user), ``other_party`` those of P_2; delta makes the optimum x with tight rows."""
    counts = [list(own_party), list(other_party)]
    if counts[0][0] != user_count or max(counts[0] + counts[1]) != user_count:
        raise ValueError("the chosen user must hold the largest count (its row is the tight one)")
    logs = []
    for k, held in enumerate(counts):
        users = [f"p{k + 1}-user{j}" for j in range(len(held))]
        matrix = sp.csr_matrix(np.asarray(held, dtype=np.int64)[:, None])
        logs.append(SearchLog(users, [PAIR], matrix, {"format": "histogram"}))
    total = sum(map(sum, counts))
    b = x * math.log(total / (total - user_count)) * (1.0 + TIGHTNESS)
    delta = -math.expm1(-b)
    return Instance(logs=logs, party=0, user=0, epsilon=4.0 * b, delta=delta)


def union_log(logs: Sequence[SearchLog]) -> SearchLog:
    """The global log D = D_1 u .. u D_r (users are disjoint, pairs shared by index)."""
    return SearchLog(
        [u for log in logs for u in log.users], list(logs[0].pairs), sp.vstack([log.counts for log in logs]).tocsr()
    )


def optimal_counts(instance: Instance) -> np.ndarray:
    """x from the mechanism's solver (max-output) on the global conditions."""
    b = privacy_bound(instance.epsilon, instance.delta)
    cond, var_pairs = build_conditions(union_log(instance.logs), b)
    x = np.zeros(instance.logs[0].n_pairs, dtype=np.int64)
    x[var_pairs] = solve(cond, "max-output").x
    return x


def exact_probability(instance: Instance, x: np.ndarray) -> float:
    """Global multinomial (= exact mode): 1 - prod_i (1 - c_ij / c_i)^{x_i} (CELS eq. 4)."""
    totals = union_log(instance.logs).pair_totals()
    c_uj = instance.logs[instance.party].counts[instance.user].toarray().ravel()
    held = c_uj > 0
    return -math.expm1(float(np.sum(x[held] * np.log1p(-c_uj[held] / totals[held]))))


def paper_probability(instance: Instance, x: np.ndarray) -> float:
    """Local sampling: 1 - prod_i (1 - c_ij / c_i^k)^{floor(x_i c_i^k / c_i)}."""
    totals = union_log(instance.logs).pair_totals()
    own = instance.logs[instance.party]
    local_totals = own.pair_totals()
    trials = paper_trials(local_totals, totals, x)
    c_uj = own.counts[instance.user].toarray().ravel()
    held = c_uj > 0
    return -math.expm1(float(np.sum(trials[held] * np.log1p(-c_uj[held] / local_totals[held]))))


def _appears(sampled: sp.csr_matrix, user: int) -> bool:
    return sp.csr_matrix(sampled)[user].sum() > 0


def simulate_exact(instance: Instance, x: np.ndarray, runs: int, rng: np.random.Generator, progress: bool = False) -> float:
    """Fraction of runs of the staged protocol (every party's StagedSampler; the secure sum of
    a stage replaced by its value, the plain sum) in which the chosen user appears."""
    totals = union_log(instance.logs).pair_totals()
    hits = 0
    for _ in tqdm(range(runs), desc="exact mode", disable=None if progress else True, leave=False):
        # a copy each: StagedSampler.result() eliminates zeros in arrays it shares with its input
        samplers = [StagedSampler(log.counts.copy(), totals, x, stream_poisson(rng), DEFAULT_THETA) for log in instance.logs]
        while not samplers[0].done:
            stage_total = sum(s.propose()[1] for s in samplers)
            for s in samplers:
                s.settle(stage_total)
        hits += _appears(samplers[instance.party].result(), instance.user)
    return hits / runs


def simulate_paper(instance: Instance, x: np.ndarray, runs: int, rng: np.random.Generator, progress: bool = False) -> float:
    """Fraction of runs of the paper's local sampling (as PartyRole runs it) in which the
    chosen user appears."""
    totals = union_log(instance.logs).pair_totals()
    own = instance.logs[instance.party]
    trials = paper_trials(own.pair_totals(), totals, x)
    hits = sum(
        _appears(multinomial_sample(own.counts, trials, rng), instance.user)
        for _ in tqdm(range(runs), desc="paper mode", disable=None if progress else True, leave=False)
    )
    return hits / runs


def demonstrate(runs: int = 20_000, seed: int | None = None, progress: bool = False) -> dict:
    """Closed forms and simulations of the chosen user's appearance probability in both modes.

    ``tolerance`` = 2 / sqrt(runs), four binomial standard deviations at the worst case p = 1/2.
    """
    instance = tight_instance()
    x = optimal_counts(instance)
    rng = np.random.default_rng(seed)
    users = [log.n_users for log in instance.logs]
    return {
        "delta": instance.delta,
        "paper_mode_appearance_probability": paper_probability(instance, x),
        "exact_mode_appearance_probability": exact_probability(instance, x),
        "tolerance": 2.0 / math.sqrt(runs),
        "paper_mode_simulated": simulate_paper(instance, x, runs, rng, progress),
        "exact_mode_simulated": simulate_exact(instance, x, runs, rng, progress),
        "simulations": runs,
        "epsilon": instance.epsilon,
        "b": privacy_bound(instance.epsilon, instance.delta),
        "x": x.tolist(),
        "instance": {
            "pair_total": int(union_log(instance.logs).pair_totals()[0]),
            "users_per_party": users,
            "chosen_user_count": int(instance.logs[0].counts[0, 0]),
            "chosen_party_total": int(instance.logs[0].pair_totals()[0]),
            "paper_trials_at_chosen_party": int(paper_trials(instance.logs[0].pair_totals(), union_log(instance.logs).pair_totals(), x)[0]),
        },
    }
