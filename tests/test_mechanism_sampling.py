"""Multinomial sampling, pseudonyms, the exact discrete Laplace sampler and noise repair."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from cels.logs.model import SearchLog
from cels.mechanism.conditions import build_conditions
from cels.mechanism.examples import figure1_log
from cels.mechanism.noise import bernoulli_exp, discrete_laplace, discrete_laplace_variance
from cels.mechanism.noisy_counts import add_noise_and_repair
from cels.mechanism.sampling import make_rng, multinomial_sample, released_log
from cels.mechanism.solvers import feasible

ALPHA = 0.001  # significance level of the goodness-of-fit tests (fixed seeds: deterministic)


def test_multinomial_follows_figure1_probabilities():
    """Chi-square test at level ALPHA: google (15,7,17)/39, book (3,1)/4, car (2,5)/7."""
    log = figure1_log()
    x = np.array([0, 4000, 39000, 0, 7000])
    sampled = multinomial_sample(log, x, make_rng(11)).toarray()
    for pair, probs in ((2, [15, 7, 17]), (1, [3, 0, 1]), (4, [0, 2, 5])):
        observed = sampled[:, pair]
        expected = x[pair] * np.array(probs) / sum(probs)
        held = expected > 0
        assert np.all(observed[~held] == 0)
        assert chisquare(observed[held], expected[held]).pvalue > ALPHA


def test_sampled_totals_and_seed_reproducibility():
    log = figure1_log()
    x = np.array([0, 3, 20, 0, 4])
    a = multinomial_sample(log, x, make_rng(5))
    np.testing.assert_array_equal(np.asarray(a.sum(axis=0)).ravel(), x)
    np.testing.assert_array_equal(a.toarray(), multinomial_sample(log, x, make_rng(5)).toarray())


def test_sampling_rejects_a_count_for_an_unheld_pair():
    log = SearchLog(["a"], [("q", "u"), ("r", "v")], sp.csr_matrix(np.array([[1, 0]])))
    with pytest.raises(ValueError, match="no user holds"):
        multinomial_sample(log, np.array([0, 1]), make_rng(0))


def test_released_log_pseudonyms_and_kept_ids():
    log = figure1_log()
    sampled = multinomial_sample(log, np.array([0, 3, 20, 0, 4]), make_rng(2))
    fresh = released_log(log, sampled)
    assert not set(fresh.users) & set(log.users) and len(set(fresh.users)) == fresh.n_users
    assert all(len(u) == 16 for u in fresh.users)
    kept = released_log(log, sampled, keep_user_ids=True)
    assert set(kept.users) <= set(log.users)
    assert kept.source == log.source and fresh.size == 27
    assert sorted(fresh.pairs) == sorted([log.pairs[i] for i in (1, 2, 4)])


small_logs = st.integers(2, 6).flatmap(
    lambda m: st.integers(1, 5).flatmap(
        lambda n: st.lists(st.lists(st.integers(0, 5), min_size=n, max_size=n), min_size=m, max_size=m)
    )
)


@settings(max_examples=40, deadline=None)
@given(small_logs, st.integers(0, 2**32 - 1))
def test_sampling_invariants(matrix, seed):
    counts = sp.csr_matrix(np.array(matrix, dtype=np.int64))
    log = SearchLog([str(j) for j in range(counts.shape[0])], [(str(i), "") for i in range(counts.shape[1])], counts)
    cond, var_pairs = build_conditions(log, 50.0)
    x = np.zeros(log.n_pairs, dtype=np.int64)
    x[var_pairs] = np.random.default_rng(seed).integers(0, 30, size=len(var_pairs))
    sampled = multinomial_sample(log, x, make_rng(seed))
    np.testing.assert_array_equal(np.asarray(sampled.sum(axis=0)).ravel(), x)  # sum_j x_ij = x_i
    held = log.counts.toarray() > 0
    assert not np.any((sampled.toarray() > 0) & ~held)  # nobody output for a pair not held
    unique = np.setdiff1d(np.arange(log.n_pairs), var_pairs)
    assert not sampled.toarray()[:, unique].any()  # no unique pair in the output


def test_bernoulli_exp_frequency():
    rng = random.Random(4)
    n = 20000
    for gamma, p in ((Fraction(1, 2), math.exp(-0.5)), (Fraction(5, 2), math.exp(-2.5))):
        hits = sum(bernoulli_exp(gamma, rng) for _ in range(n))
        assert abs(hits / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n)


def test_discrete_laplace_mean_and_variance():
    """Mean within 4.5 standard errors of 0; variance within 8% (about 5 standard errors)."""
    rng = random.Random(9)
    n, scale = 20000, Fraction(2)
    draws = np.array([discrete_laplace(scale, rng) for _ in range(n)], dtype=np.float64)
    var = discrete_laplace_variance(2.0)
    assert var == pytest.approx(2 * math.exp(-0.5) / (1 - math.exp(-0.5)) ** 2)
    assert abs(draws.mean()) <= 4.5 * math.sqrt(var / n)
    assert abs(draws.var() - var) <= 0.08 * var
    # shape: P(0) = (1 - q) / (1 + q), q = e^{-1/scale}
    q = math.exp(-0.5)
    p0 = (1 - q) / (1 + q)
    assert abs(np.mean(draws == 0) - p0) <= 4.5 * math.sqrt(p0 * (1 - p0) / n)


def test_discrete_laplace_rational_scale():
    rng = random.Random(1)
    draws = [discrete_laplace(Fraction(3, 7), rng) for _ in range(3000)]
    assert all(isinstance(d, int) for d in draws)
    q = math.exp(-7 / 3)
    assert abs(np.mean(np.array(draws) == 0) - (1 - q) / (1 + q)) < 0.03


def test_noise_then_repair_keeps_every_condition():
    cond, _ = build_conditions(figure1_log(), 17.33)
    x = np.array([3, 20, 4])
    for seed in range(20):
        noisy, info = add_noise_and_repair(cond, x, 1.0, 5, random.Random(seed))
        assert feasible(cond, noisy) and np.all(noisy >= 0) and noisy.dtype == np.int64
        assert info["total_after_repair"] == noisy.sum() and info["scale"] == 5.0
    with pytest.raises(ValueError):
        add_noise_and_repair(cond, x, 0.0, 5)
