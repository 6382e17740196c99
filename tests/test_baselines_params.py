"""Known answers for the baselines' parameter calculations: ZEALOUS Prop. 4 and Tables 1-2,
Korolova et al.'s optimal K and b, Safelog Table 3 (docs/baselines.md, "What was measured")."""

from __future__ import annotations

import math

import pytest

from cels.baselines import korolova, safelog, zealous
from cels.baselines.params import (
    discrete_retention_probability,
    korolova_optimum,
    pool_release_probability,
    retention_probability,
    safelog_alpha,
    safelog_epsilon,
    safelog_turning_point,
    zealous_indistinguishability,
    zealous_indistinguishability_delta,
    zealous_probabilistic,
    zealous_probabilistic_delta,
    zealous_tau_prime,
)

U = 500_000


@pytest.mark.parametrize(
    ("epsilon", "m", "lam", "tau", "tau_prime"),
    [(1, 2, 4.0, 4, 78.5753), (5, 1, 0.4, 1, 8.7348), (2, 1, 1.0, 1, 20.3370), (1, 6, 12.0, 12, 235.7259)],
)
def test_zealous_probabilistic_rows(epsilon, m, lam, tau, tau_prime):
    out = zealous_probabilistic(epsilon, 0.001, m, U)
    assert out["lambda"] == pytest.approx(lam)
    assert out["tau"] == tau == math.ceil(2 * m / epsilon)  # Prop. 4's choice
    assert out["tau_prime"] == pytest.approx(tau_prime, abs=5e-5)


def test_zealous_table2_tau_prime_row():
    # Table 2: m = 2, epsilon = 1, delta = 0.001 (the caption's 0.01 is a typo)
    row = [zealous_tau_prime(4.0, tau, 0.001, U, 2) for tau in (1, 3, 4, 5, 7, 9)]
    assert [round(v, 1) for v in row] == [81.1, 78.7, 78.6, 78.7, 79.3, 80.3]
    assert min(range(6), key=row.__getitem__) == 2  # minimal at tau = 4 = lambda


@pytest.mark.parametrize(
    ("lam", "tau_prime", "delta_prime"), [(1, 100, 1.38e-41), (5, 100, 1.40e-8), (5, 200, 2.89e-17)]
)
def test_zealous_table1_delta_prime(lam, tau_prime, delta_prime):
    assert zealous_indistinguishability_delta(5, lam, tau_prime) == pytest.approx(delta_prime, rel=5e-3)


@pytest.mark.parametrize(("lam", "tau_prime", "delta"), [(1, 100, 1.3e-37), (1, 200, 4.7e-81), (5, 200, 6.5e-12)])
def test_zealous_table1_probabilistic_delta(lam, tau_prime, delta):
    # Table 1's delta column is eq. (5) with tau = 1, U = 500k, m = 5 (its 3.2e-3 entry computes to 3.15e-3)
    assert zealous_probabilistic_delta(lam, 1, tau_prime, U, 5) == pytest.approx(delta, rel=0.03)


def test_zealous_indistinguishability_inverts_delta_prime():
    out = zealous_indistinguishability(10.0, 1.38e-41, 5)
    assert (out["tau"], out["lambda"]) == (1, 1.0)
    assert out["tau_prime"] == pytest.approx(100.0, abs=1e-3)  # Table 1: lambda = 1, tau' = 100
    assert zealous_indistinguishability_delta(5, out["lambda"], out["tau_prime"]) == pytest.approx(1.38e-41)


@pytest.mark.parametrize(("count", "p"), [(2, 0.18394), (3, 0.5), (4, 0.81606)])
def test_zealous_retention_probability(count, p):
    assert retention_probability(count, 3, 1) == pytest.approx(p, abs=5e-6)


def test_discrete_retention_matches_direct_sum_and_nears_continuous():
    scale, q = 1.7, math.exp(-1 / 1.7)
    mass = {k: (1 - q) / (1 + q) * q ** abs(k) for k in range(-200, 201)}
    for count, threshold in [(2, 3), (3, 3), (4, 3), (0, 0.5), (10, 3.2)]:
        direct = sum(v for k, v in mass.items() if count + k > threshold)
        assert discrete_retention_probability(count, threshold, scale) == pytest.approx(direct, abs=1e-12)
    # the discrete law approaches the continuous one as the scale grows
    assert discrete_retention_probability(30, 30.5, 200) == pytest.approx(
        retention_probability(30, 30.5, 200), abs=3e-3
    )


def test_zealous_resolve_rounds_tau_prime_up_and_keeps_delta():
    out = zealous.resolve(1.0, 0.001, 2, U)
    assert out["tau_prime_run"] == 79
    assert out["delta_run"] <= 0.001
    with pytest.raises(ValueError, match="below 2m/epsilon"):
        zealous_probabilistic(1.0, 0.001, 2, U, lam=3.0)


@pytest.mark.parametrize(
    ("d", "K", "b"),
    [
        (1, 5.70, 0.43),
        (5, 31.99, 2.17),
        (10, 66.99, 4.34),
        (20, 140.0, 8.69),
        (40, 292.04, 17.37),
        (80, 608.16, 34.74),
        (160, 1264.49, 69.49),
    ],
)
def test_korolova_optimum_rows(d, K, b):
    K_opt, b_opt = korolova_optimum(math.log(10), 1e-5, d)
    assert round(K_opt, 2) == pytest.approx(K)
    assert round(b_opt, 2) == pytest.approx(b)
    # at the optimum the selection spends epsilon and delta exactly (before K is rounded up)
    out = korolova.resolve(math.log(10), 1e-5, d)
    assert out["epsilon_select"] == pytest.approx(math.log(10), rel=1e-9)
    assert out["delta"] <= 1e-5


def test_korolova_count_terms_leave_the_rest_to_selection():
    out = korolova.resolve(1.0, 1e-3, 5, 5, bq=15.0, bc=15.0)
    assert out["epsilon_select"] == pytest.approx(1 / 3, rel=1e-6)
    assert out["epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert out["epsilon"] == pytest.approx(5 * math.log(out["alpha"]) + 5 / 15 + 5 / 15)
    with pytest.raises(ValueError, match="no budget"):
        korolova.resolve(1.0, 1e-3, 5, 5, bq=5.0, bc=5.0)


@pytest.mark.parametrize(("qf", "eps"), [(10, 4.27), (50, 21.36), (100, 42.73), (150, 64.09), (200, 85.45)])
def test_safelog_table3_epsilon_row(qf, eps):
    assert round(safelog_epsilon(qf, qf, 10, 10, 10, 10)["epsilon"], 2) == eps


def test_safelog_pool_release_probability_and_transitions_term():
    assert pool_release_probability(10, 10) == pytest.approx(0.18394, abs=5e-6)
    out = safelog_epsilon(100, 100, 10, 10, 10, 10, bt=10)
    assert out["epsilon_with_transitions"] - out["epsilon_without_transitions"] == pytest.approx(99 / 10)
    # a smaller p_g raises alpha by 1/p_g once e^{1/b}/p_g dominates
    assert safelog_alpha(10, 10, 0.5) == pytest.approx(2 * math.exp(0.1))


def test_safelog_turning_point_balances_alpha():
    K = safelog_turning_point(10.0)
    assert 1 + 1 / (2 * math.exp((K - 1) / 10) - 1) == pytest.approx(math.exp(0.1))


@pytest.mark.parametrize("transitions", [False, True])
def test_safelog_defaults_spend_the_budget(transitions):
    out = safelog.resolve(1.0, 5, 5, transitions=transitions)
    assert out["epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert ("epsilon_with_transitions" in out) is transitions
