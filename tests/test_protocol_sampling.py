"""The exact staged Poisson sampling (docs/protocol.md, "Decisions": Sampling) and the paper's local trials.

The parties' StagedSamplers are driven with plaintext stage sums here (the secure sum only
hides the summands; tests/test_protocol_session.py runs the same code over the protocol).
Statistical tests use fixed seeds and significance level alpha = 0.001.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from cels.engine.sampling import StagedSampler, paper_trials, stage_means, stream_poisson

ALPHA = 1e-3

# one pair; users of three parties with counts 5 | 3, 1 | 2  (c_i = 11)
PARTY_COUNTS = [np.array([[5]]), np.array([[3], [1]]), np.array([[2]])]
X = 6


def run_staged(party_counts, x, rng, theta=0.7):
    """All parties' stages with plaintext sums; returns (per-party x_ij, stage totals)."""
    totals = sum(c.sum(axis=0) for c in party_counts)
    samplers = [StagedSampler(sp.csr_matrix(c), totals, x, stream_poisson(rng), theta) for c in party_counts]
    stage_totals = []
    while not samplers[0].done:
        proposals = [s.propose() for s in samplers]
        n = sum(local for _pairs, local in proposals)
        stage_totals.append((proposals[0][0], n))
        for s in samplers:
            s.settle(n)
    return [s.result() for s in samplers], stage_totals


def multinomial_pmf(counts, x, probs) -> float:
    coef = math.factorial(x) / math.prod(math.factorial(k) for k in counts)
    return coef * math.prod(p**k for p, k in zip(probs, counts))


def test_staged_union_is_the_global_multinomial() -> None:
    """Chi-square on the joint outcome of the 4 users: Multinomial(6, (5, 3, 1, 2) / 11)."""
    rng = np.random.default_rng(20261121)
    reps = 4000
    outcomes = {}
    for _ in range(reps):
        results, _ = run_staged(PARTY_COUNTS, np.array([X]), rng)
        draw = tuple(int(v) for res in results for v in res.toarray().ravel())
        assert sum(draw) == X  # sum_j x_ij = x_i exactly, every time
        outcomes[draw] = outcomes.get(draw, 0) + 1
    probs = np.array([5, 3, 1, 2]) / 11
    cells = [c for c in itertools.product(range(X + 1), repeat=4) if sum(c) == X]
    expected = np.array([reps * multinomial_pmf(c, X, probs) for c in cells])
    observed = np.array([outcomes.get(c, 0) for c in cells])
    rare = expected < 5  # pool the rare cells into one
    obs = np.append(observed[~rare], observed[rare].sum())
    exp = np.append(expected[~rare], expected[rare].sum())
    _, p = stats.chisquare(obs, exp)
    assert p > ALPHA


@pytest.mark.parametrize(
    "party_counts",
    [
        [np.array([[9]]), np.array([[1]])],  # concentrated
        [np.array([[1], [1], [1], [1], [1]]), np.array([[1], [1], [1], [1], [1]])],  # spread out
    ],
)
def test_first_stage_total_is_poisson_whatever_the_data(party_counts) -> None:
    """N_1 ~ Poisson(theta * x) for any split of the same c_i = 10 (x = 10, mu = 7)."""
    rng = np.random.default_rng(7)
    totals = sum(c.sum(axis=0) for c in party_counts)
    mu = stage_means(np.array([10]))[0]
    draws = []
    for _ in range(3000):
        samplers = [StagedSampler(sp.csr_matrix(c), totals, np.array([10]), stream_poisson(rng)) for c in party_counts]
        draws.append(sum(s.propose()[1][0] for s in samplers))
    draws = np.array(draws)
    edges = list(range(3, 13))  # bins: <=3, 4, ..., 12, >=13
    obs = [np.sum(draws <= 3)] + [np.sum(draws == k) for k in edges[1:]] + [np.sum(draws >= 13)]
    cdf = stats.poisson(mu).cdf
    probs = [cdf(3)] + [stats.poisson(mu).pmf(k) for k in edges[1:]] + [1 - cdf(12)]
    _, p = stats.chisquare(obs, np.array(probs) * len(draws))
    assert mu == pytest.approx(7.0)
    assert p > ALPHA


def test_stage_means_and_acceptance() -> None:
    np.testing.assert_allclose(stage_means(np.array([1, 2, 10])), [1.0, 1.4, 7.0])
    sampler = StagedSampler(sp.csr_matrix(np.array([[2, 1]])), np.array([3, 2]), np.array([2, 0]), stream_poisson(np.random.default_rng(1)))
    pairs, _local = sampler.propose()
    np.testing.assert_array_equal(pairs, [0])  # pairs with R_i = 0 are not sampled
    accepted = sampler.settle(np.array([5]))  # N_i > R_i: all parties discard the stage
    assert not accepted[0] and sampler.remaining[0] == 2 and sampler.result().nnz == 0


def test_stage_count_is_logarithmic() -> None:
    rng = np.random.default_rng(3)
    _, stages = run_staged([np.array([[40]]), np.array([[60]])], np.array([1000]), rng)
    assert len(stages) < 40


def test_paper_trials_floor_the_local_share() -> None:
    # x = 7, c = 10 split 5 / 3 / 2: trials 3, 2, 1 (sum 6 <= 7, never above x)
    np.testing.assert_array_equal(
        [paper_trials(np.array([k]), np.array([10]), np.array([7]))[0] for k in (5, 3, 2)], [3, 2, 1]
    )


def test_result_leaves_the_party_counts_intact() -> None:
    # a user sampled zero times must not be dropped from the party's own count matrix
    counts = sp.csr_matrix(np.array([[2, 2, 0], [1, 0, 3]]))
    before = counts.toarray().copy()
    sampler = StagedSampler(counts, np.array([3, 2, 3]), np.array([0, 0, 0]), stream_poisson(np.random.default_rng(0)))
    assert sampler.result().nnz == 0
    np.testing.assert_array_equal(counts.toarray(), before)
    np.testing.assert_array_equal(sampler.counts.toarray(), before)
