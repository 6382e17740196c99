"""Empirical privacy audit of every randomised step (docs/security.md, "Empirical privacy audit").

Every stochastic test bounds bucket probabilities with exact Clopper-Pearson intervals at overall
confidence 1 - 1e-6 (Bonferroni over every bound it may use): a correct mechanism is reported as
violating its claim with probability <= 1e-6.  Draws use fixed seeds (test only: a seeded draw is
not private), so every run is the same and cannot flake.  Each claimed step has a control that
breaks it and must be caught.  The ``audit_long`` cases (``make audit``) rerun the audits with
more draws and more neighbours, the repair on the real AOL slice, and print AUDIT-SUMMARY lines.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import numpy as np
import pytest
import sympy

from cels.audit.audits import (
    REPAIR_CASES,
    REPAIR_EPSILON,
    SAMPLING_DELTA,
    SAMPLING_EPSILON,
    SAMPLING_X,
    SAMPLING_X_VIOLATING,
    audit_noise,
    audit_repair,
    audit_sampling,
    laplace_fit,
    optimum_counts,
    repair_case,
    sampling_log,
    unique_in_neighbour,
    without_user,
)
from cels.audit.exact import (
    discrete_laplace_pmf,
    max_laplace_loss,
    polya_pmf,
    polya_sum_coefficients,
    share_sum_is_geometric,
    vector_laplace_loss,
)
from cels.audit.tester import (
    Partition,
    clopper_pearson_lower,
    clopper_pearson_upper,
    goodness_of_fit,
    stochastic_test,
)
from cels.claims import privacy_accounting
from cels.mechanism.conditions import privacy_bound
from cels.mechanism.noise import discrete_laplace, polya

P_MIN = 1e-6
"""Chi-square tests reject below this p-value (a correct sampler fails with probability 1e-6)."""


def report(audit) -> None:
    print("AUDIT-SUMMARY", json.dumps(audit.summary()))


# ----------------------------------------------------------------------------- the tester
def test_clopper_pearson_bounds_are_exact_at_the_ends() -> None:
    """Closed forms at k = 0 and k = n: upper(0, n) = 1 - a^(1/n), lower(n, n) = a^(1/n)
    (relative tolerance 1e-9); the bounds bracket k/n."""
    a, n = 1e-8, 500
    assert clopper_pearson_upper(0, n, a) == pytest.approx(1 - a ** (1 / n), rel=1e-9)
    assert clopper_pearson_lower(n, n, a) == pytest.approx(a ** (1 / n), rel=1e-9)
    assert clopper_pearson_lower(0, n, a) == 0.0 and clopper_pearson_upper(n, n, a) == 1.0
    assert clopper_pearson_lower(100, n, a) < 0.2 < clopper_pearson_upper(100, n, a)


def test_the_tester_passes_equal_and_certifies_unequal_coins() -> None:
    """Coins of bias 0.5 and 0.5 pass (0, 0)-DP at confidence 1 - 1e-6; biases 0.9 and 0.1
    (true loss ln 9 = 2.197) fail eps = 1 with a certified loss in (1, 2.197]; 4,000 draws each,
    seed 7."""
    rng = np.random.default_rng(7)
    coins = Partition("coin", (0, 1), lambda o: o)
    fair = stochastic_test(list(rng.integers(0, 2, 4000)), list(rng.integers(0, 2, 4000)), [coins], 0.0, 0.0)
    assert fair.passed
    unfair = stochastic_test(list(rng.random(4000) < 0.9), list(rng.random(4000) < 0.1), [coins], 1.0, 0.0)
    assert not unfair.passed and 1.0 < unfair.certified_epsilon <= np.log(9)


def test_the_tester_refuses_unknown_outputs_and_straddling_buckets() -> None:
    """Buckets are fixed before the draws: an output outside them is an error, and so is a bucket
    holding outputs on both sides of the delta event."""
    with pytest.raises(ValueError, match="outside its labels"):
        stochastic_test([0, 5], [0], [Partition("p", (0, 1), lambda o: o)], 1.0, 0.0)
    with pytest.raises(ValueError, match="straddles"):
        stochastic_test([0, 1], [0], [Partition("p", ("all",), lambda o: "all")], 1.0, 0.1, delta_event=lambda o: o == 1)


# ----------------------------------------------------------------------------- a. sampling
def test_sampling_meets_its_probabilistic_dp_claim() -> None:
    """CELS Theorem 2 on a constructed log (5 users, 3 pairs, x = (1, 1, 1) within b = 0.916 for
    every user): sampling D vs D minus j, 5,000 draws each (seed 11), passes (eps, delta) = (2, 0.6)
    probabilistic DP at confidence 1 - 1e-6 over the 36 outputs and the E / not-E halves.  The
    certified loss cannot exceed the exact one, j's load ln 2 (every output without j has ratio
    exactly 1/2), and the point estimate on the halves is within 0.1 of it."""
    audit = audit_sampling(sampling_log(), SAMPLING_X, "j", draws=5000, seed=11)
    result = audit.results["probabilistic_dp"]
    report(audit)
    assert audit.facts["user_load"] == pytest.approx(np.log(2)) and audit.facts["exact_disclosure_probability"] <= SAMPLING_DELTA
    assert result.passed, result.violations
    assert result.certified_epsilon <= np.log(2) and result.certified_delta <= 0.5
    assert result.only_under_b == 0  # D' has no output D cannot give
    assert result.estimated_epsilon["holds_user"] == pytest.approx(np.log(2), abs=0.1)


def test_sampling_control_with_a_violating_x_is_caught() -> None:
    """Control: x = (4, 3, 0) breaks j's condition (load 2.485 > b): P[j sampled] = 0.917 > delta
    and the outputs without j have loss 2.485 > eps.  3,000 draws each (seed 12): the tester must
    certify both at confidence 1 - 1e-6."""
    audit = audit_sampling(sampling_log(), SAMPLING_X_VIOLATING, "j", draws=3000, seed=12)
    result = audit.results["probabilistic_dp"]
    report(audit)
    assert not result.passed
    assert result.certified_delta > SAMPLING_DELTA
    assert any(v.startswith("holds_user:False") for v in result.violations)  # the eps part, outside E


# ----------------------------------------------------------------------------- b. noise
def test_distributed_noise_meets_eps_prime() -> None:
    """x + (sum of 3 Polya shares, scale d/eps' = 1) against x + 1 + the same, 5,000 draws each
    (seed 21): passes pure eps' = 1 at confidence 1 - 1e-6; the exact worst loss is d/scale = 1;
    the 10,000 noise draws fit the exact discrete Laplace (chi-square p >= 1e-6)."""
    audit = audit_noise(draws=5000, seed=21)
    result = audit.results["pure_dp"]
    report(audit)
    assert result.passed, result.violations
    assert audit.facts["exact_max_loss"] == "1" and audit.facts["shares_sum_to_geometric"]
    assert audit.facts["chi_square_p"] >= P_MIN


def test_noise_control_with_half_the_scale_is_caught() -> None:
    """Control: shares of scale d/(2 eps') (true loss 2 eps') claimed as eps' = 1; 3,000 draws
    each (seed 22): the tester certifies a loss above eps' at confidence 1 - 1e-6."""
    audit = audit_noise(draws=3000, seed=22, scale=Fraction(1, 2))
    result = audit.results["pure_dp"]
    report(audit)
    assert not result.passed and 1.0 < result.certified_epsilon <= 2.0
    assert audit.facts["exact_max_loss"] == "2"


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(3, 2), Fraction(1, 3)])
@pytest.mark.parametrize("d", [1, 2, 5])
def test_exact_laplace_loss_is_d_over_scale(scale, d) -> None:
    """Exact (sympy rationals, no tolerance): max_k |ln P(k)/P(k-d)| = d / scale = eps', and
    every single loss is rational; the pmf sums to 1 (symbolic geometric series)."""
    loss = max_laplace_loss(d, scale)
    assert loss.is_Rational and loss == sympy.Rational(d) / sympy.Rational(scale.numerator, scale.denominator)
    k = sympy.Symbol("k", integer=True, nonnegative=True)
    q = sympy.exp(-sympy.Rational(scale.denominator, scale.numerator))
    half = sympy.summation((1 - q) / (1 + q) * q**k, (k, 1, sympy.oo))
    assert sympy.simplify(2 * half + discrete_laplace_pmf(0, scale) - 1) == 0


@pytest.mark.parametrize("parties", [1, 2, 3, 5])
def test_polya_shares_sum_to_the_geometric_exactly(parties) -> None:
    """Exact: the r-fold convolution of (1/r)_k / k! is 1 for k < 40 (rationals), so r shares
    sum to the discrete Laplace; shape 1/2 with r = 3 (a wrong share) is caught."""
    assert share_sum_is_geometric(Fraction(1, parties), parties)
    assert not share_sum_is_geometric(Fraction(1, 2), 3)
    assert polya_sum_coefficients(Fraction(1, 2), 3, 3) == [1, sympy.Rational(3, 2), sympy.Rational(15, 8)]


def test_samplers_fit_their_exact_pmfs() -> None:
    """Chi-square against the exact pmfs (p >= 1e-6): 20,000 central discrete Laplace draws at
    scale 3/2 (seed 31), 10,000 NB(1/3, q) draws at scale 1 (seed 32, bins 0..8 and the tail)."""
    rng = random.Random(31)
    scale = Fraction(3, 2)
    assert laplace_fit([discrete_laplace(scale, rng) for _ in range(20000)], scale) >= P_MIN
    rng = random.Random(32)
    draws = [polya(Fraction(1, 3), Fraction(1), rng) for _ in range(10000)]
    inner = [float(polya_pmf(k, Fraction(1, 3), 1).evalf(30)) for k in range(9)]
    assert goodness_of_fit(draws, [0.0, *inner, 1 - sum(inner)], 0) >= P_MIN


def test_chi_square_control_with_wrong_shares_is_caught() -> None:
    """Control: r = 3 shares of NB(1/2) - NB(1/2) (the sum is NB(3/2) - NB(3/2), not Laplace),
    10,000 draws (seed 33): the fit against the exact discrete Laplace gives p < 1e-6."""
    rng = random.Random(33)
    scale = Fraction(1)
    wrong = [sum(polya(Fraction(1, 2), scale, rng) - polya(Fraction(1, 2), scale, rng) for _ in range(3)) for _ in range(10000)]
    assert laplace_fit(wrong, scale) < P_MIN


def test_per_pair_noise_loss_adds_up_over_pairs() -> None:
    """Exact: per-pair Lap(d/eps') on counts that move by d in EVERY pair (L-infinity d, L1 n d)
    has loss n eps' at output x, not eps': two pairs, d = 1, eps' = 1 give loss exactly 2.  (So d
    must bound the L1 move; docs/security.md, "End-to-end DP: what holds".)"""
    assert vector_laplace_loss((0, 0), (1, 1), (0, 0), 1) == 2
    assert vector_laplace_loss((0, 0), (1, 0), (0, 0), 1) == 1


# ----------------------------------------------------------------------------- c. repair
@pytest.mark.parametrize(("case", "path", "draws"), [
    ("unique", "sanitize", 4000), ("capacity", "sanitize", 4000), ("unique", "private", 3000), ("capacity", "private", 3000),
])
def test_noise_and_repair_is_not_end_to_end_dp(case, path, draws) -> None:
    """Noise + repair (add_noise_and_repair, or the private noise pass with 3 Polya shares) then
    sampling, on D (base + j) vs D' (base); the noise-free optimum moves by d = 1 in L1 and the
    noise is Lap(d/eps'), eps' = 1.  unique: j and k share pair A, unique to k in D'.  capacity:
    j is pair B's fourth holder, x_B <= 3 in D, <= 2 in D'.  Seed 41, confidence 1 - 1e-6: the
    tester certifies a loss above eps + eps' = 3 on outputs WITHOUT j's records (so outside the
    delta event) and above eps' for the counts alone; D draws outputs D' never gives.  Hence
    no report claims an end-to-end bound for this path (cels.claims)."""
    audit = audit_repair(repair_case(case), "j", path=path, draws=draws, seed=41)
    report(audit)
    end_to_end, counts = audit.results["end_to_end"], audit.results["count_step"]
    assert audit.facts["optimum_move_l1"] == audit.facts["d"] == 1
    assert not end_to_end.passed and end_to_end.certified_epsilon > REPAIR_EPSILON + 1.0
    assert "(False," in end_to_end.certified_epsilon_at  # an output without j's records
    assert not counts.passed and counts.certified_epsilon > 1.0
    assert end_to_end.only_under_a > draws // 2 and end_to_end.only_under_b == 0
    privacy = privacy_accounting(
        epsilon=REPAIR_EPSILON, delta=0.5, b=1.0, bound="cels", noise_epsilon=1.0, sensitivity=1.0, cap=None,
        setting="single" if path == "sanitize" else "private", seeded=False,
    )
    assert privacy["end_to_end"] is False and "no end-to-end bound is claimed" in privacy["against_recipients"]


# ----------------------------------------------------------------------------- make audit
@pytest.mark.audit_long
@pytest.mark.parametrize("removed", sorted(sampling_log().users))
def test_long_sampling_every_neighbour(removed) -> None:
    """Every user of the constructed log as the removed neighbour, 20,000 draws each (seed 51):
    the (2, 0.6) claim passes at confidence 1 - 1e-6, certified loss <= the user's exact load."""
    audit = audit_sampling(sampling_log(), SAMPLING_X, removed, draws=20000, seed=51)
    report(audit)
    result = audit.results["probabilistic_dp"]
    assert result.passed, result.violations
    assert result.certified_epsilon <= audit.facts["user_load"]


@pytest.mark.audit_long
@pytest.mark.realdata
def test_long_sampling_on_the_aol_slice(aol_path) -> None:
    """The AOL slice's own conditions at (eps, delta) = (2, 0.6): x = the greedy max-output
    optimum, the removed user the one with the largest load; 1,500 draws each (seed 52), buckets
    E / not E: passes, certified loss <= the exact load."""
    from cels.logs import LoadOptions, load_log

    aol = load_log(aol_path, LoadOptions(format="aol"))
    b = privacy_bound(SAMPLING_EPSILON, SAMPLING_DELTA)
    x = optimum_counts(aol, b)
    from cels.audit.audits import user_load

    holders = np.flatnonzero(np.asarray(aol.counts[:, x > 0].sum(axis=1)).ravel())
    removed = max((aol.users[j] for j in holders), key=lambda u: user_load(aol, x, u))
    audit = audit_sampling(aol, x, removed, draws=1500, seed=52, every_output=False)
    report(audit)
    result = audit.results["probabilistic_dp"]
    assert result.passed, result.violations
    assert audit.facts["user_load"] <= b and result.certified_epsilon <= audit.facts["user_load"]


@pytest.mark.audit_long
@pytest.mark.parametrize(("d", "noise_epsilon", "parties"), [(1, 1.0, 3), (2, 1.0, 3), (1, 0.5, 3), (3, 2.0, 3), (1, 1.0, 1)])
def test_long_noise(d, noise_epsilon, parties) -> None:
    """More sensitivities, eps' and r, 20,000 draws each (seed 61): passes; its control (half the
    scale) fails; the noise fits the exact pmf."""
    audit = audit_noise(x=10, d=d, noise_epsilon=noise_epsilon, parties=parties, draws=20000, seed=61)
    report(audit)
    assert audit.results["pure_dp"].passed and audit.facts["chi_square_p"] >= P_MIN
    half = audit_noise(x=10, d=d, noise_epsilon=noise_epsilon, parties=parties, draws=20000, seed=62,
                       scale=Fraction(str(d)) / Fraction(str(noise_epsilon)) / 2)
    report(half)
    assert not half.results["pure_dp"].passed


@pytest.mark.audit_long
@pytest.mark.parametrize("case", sorted(REPAIR_CASES))
@pytest.mark.parametrize("path", ["sanitize", "private"])
def test_long_repair(case, path) -> None:
    """The repair cases with 15,000 draws each (seed 71): the certified losses grow with the
    draws (the true loss is infinite)."""
    audit = audit_repair(repair_case(case), "j", path=path, draws=15000, seed=71)
    report(audit)
    assert audit.results["end_to_end"].certified_epsilon > REPAIR_EPSILON + 1.0


@pytest.mark.audit_long
@pytest.mark.realdata
def test_long_repair_on_the_aol_slice(aol_path) -> None:
    """The AOL slice at b = 1 (eps = 2, delta = 1 - 1/e): user j and a released pair i held by j
    and one other user, so i is no variable of D minus j (its count there is 0 exactly).
    add_noise_and_repair with d = 1, 300 draws each (seed 72), buckets: x_i split by E.  The repair
    on 2,849 noisy pairs floors most counts, so x_i >= 1 is rare under D; the test checks it occurs
    (a release D' can never give) and that D' gives nothing D cannot; no eps is certified at this N."""
    from cels.logs import LoadOptions, load_log

    aol = load_log(aol_path, LoadOptions(format="aol"))
    delta = 1 - float(np.exp(-1.0))
    user, pair = unique_in_neighbour(aol, privacy_bound(2.0, delta))
    audit = audit_repair(aol, user, path="sanitize", draws=300, seed=72, epsilon=2.0, delta=delta, sensitivity=1, watch=[pair])
    report(audit)
    result = audit.results["count_step"]
    assert result.only_under_a > 0 and result.only_under_b == 0


def test_without_user_keeps_the_pairs() -> None:
    """D' = D minus one user keeps the pair index (the audits compare counts pair by pair)."""
    data = repair_case("unique")
    assert without_user(data, "j").pairs == data.pairs and "j" not in without_user(data, "j").users
