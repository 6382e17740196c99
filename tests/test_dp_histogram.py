"""The DP histogram's threshold, noise shares, padding and accounting (cels.mechanism.dp_histogram).

Every random test has a fixed seed; a statistical assertion states its tolerance (a chi-square
p-value floor, or a number of binomial standard deviations), so a correct sampler fails it with
the stated, negligible chance, and each is chosen so that the nearest wrong answer (an
off-by-one threshold, a share of the wrong shape) fails it.
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import sparse, stats

from cels.audit.exact import discrete_laplace_bins, polya_pmf, polya_sum_coefficients
from cels.crypto.streams import CipherRandom
from cels.mechanism.dp_histogram import (
    compose,
    count_scale,
    delta_prime,
    noise_shares,
    noise_tail,
    padding_count,
    padding_shift,
    pld_epsilon,
    polya_array,
    release_accounting,
    share_beta,
    single_holder_histogram,
    threshold,
)

mp = mpmath.MPContext()
mp.dps = 50
P_FLOOR = 1e-4
"""A chi-square test fails below this p-value: a correct sampler fails one test in 10^4."""

KNOWN = {  # (eps, max_items) -> tau at delta = 1e-6 for beta = 1, 3/2, 2
    (1.0, 1): (15, 16, 17),
    (1.0, 10): (156, 169, 179),
    (1.0, 20): (324, 349, 371),
    (2.0, 10): (79, 85, 91),
}
BETAS = (Fraction(1), Fraction(3, 2), Fraction(2))


def _mpf(x: Fraction) -> mpmath.mpf:
    return mp.mpf(x.numerator) / x.denominator


def closed_form_tau(eps: float, delta: float, max_items: int) -> tuple[int, mpmath.mpf]:
    """1 + ceil(x), x = (Delta_0/eps) ln(1/(delta' (1 + alpha))), and x itself (50 digits)."""
    b = _mpf(count_scale(eps, max_items))
    alpha = mp.exp(-1 / b)
    dp = -mp.expm1(mp.log1p(-mp.mpf(delta)) / max_items)
    x = b * mp.log(1 / (dp * (1 + alpha)))
    return 1 + int(mp.ceil(x)), x


def chi_square(counts: np.ndarray, probs: list[float]) -> float:
    """p-value of observed ``counts`` against ``probs`` (bins with expectation < 5 pooled into the last)."""
    n = counts.sum()
    expected = np.asarray(probs) * n
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    obs, exp = (obs, exp) if exp[-1] > 0 else (obs[:-1], exp[:-1])
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


# -- parameters -------------------------------------------------------------------------------


def test_delta_prime_is_stable_and_exact() -> None:
    assert delta_prime(0.3, 1) == pytest.approx(0.3, rel=1e-15)
    for delta, k in [(1e-6, 10), (1e-300, 7), (0.5, 3), (1e-12, 1000)]:
        exact = 1 - (1 - mp.mpf(delta)) ** (mp.mpf(1) / k)
        assert delta_prime(delta, k) == pytest.approx(float(exact), rel=1e-14)


def test_count_scale_and_share_beta() -> None:
    assert count_scale(1.0, 10) == Fraction(10)
    assert count_scale(0.3, 7) == Fraction(70, 3)  # decimal epsilon taken digit for digit
    assert share_beta(3, 1) == Fraction(3, 2) and share_beta(4, 0) == 1 and share_beta(2, 1) == 2
    for r, t in [(3, 3), (3, 4), (3, -1)]:
        with pytest.raises(ValueError, match="collusion"):
            share_beta(r, t)


# -- the exact tail -------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(20)])
def test_noise_tail_at_beta_one_is_the_discrete_laplace_tail(scale: Fraction) -> None:
    alpha = mp.exp(-1 / _mpf(scale))
    for k in [1, 2, 5, 17, 60]:
        assert mp.almosteq(noise_tail(k, alpha, Fraction(1)), alpha**k / (1 + alpha), rel_eps=mp.mpf("1e-38"))
    # k <= 0 by symmetry: Pr[Z >= -k] = 1 - Pr[Z >= k + 1]
    assert mp.almosteq(noise_tail(-3, alpha, 1), 1 - alpha**4 / (1 + alpha), rel_eps=mp.mpf("1e-38"))


@pytest.mark.parametrize("parties, shares", [(3, 2), (2, 1), (4, 3)])
def test_noise_tail_matches_the_convolved_share_pmf(parties: int, shares: int) -> None:
    """An independent oracle: the pmf of r Polya shares NB(1/h) from cels.audit.exact's exact
    convolution, (1 - q)^(r/h) q^k c_k, summed directly."""
    scale, terms = Fraction(3, 2), 160
    q = mp.exp(-1 / _mpf(scale))
    c = polya_sum_coefficients(Fraction(1, shares), parties, terms)
    p = [(1 - q) ** (mp.mpf(parties) / shares) * q**k * mp.mpf(c[k].p) / mp.mpf(c[k].q) for k in range(terms)]
    for k in [1, 4, 12]:
        direct = mp.fsum(p[y] * mp.fsum(p[k + y :]) for y in range(terms - k))
        assert mp.almosteq(noise_tail(k, q, Fraction(parties, shares)), direct, rel_eps=mp.mpf("1e-25"))


def test_noise_tail_agrees_with_dp_accounting_discrete_laplace() -> None:
    """dp_accounting's discrete Laplace (scipy.stats.dlaplace) cdf as a float oracle at beta = 1."""
    from dp_accounting.pld.privacy_loss_mechanism import DiscreteLaplacePrivacyLoss

    loss = DiscreteLaplacePrivacyLoss(parameter=0.1)  # P(k) ~ exp(-0.1 |k|): scale 10
    alpha = mp.exp(mp.mpf("-0.1"))
    for k in [1, 10, 50, 120]:  # tails down to ~1e-6: 1 - cdf keeps ~1e-9 relative
        assert float(noise_tail(k, alpha, 1)) == pytest.approx(1 - loss.noise_cdf(k - 1), rel=1e-8)


# -- the threshold --------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, max_items", sorted(KNOWN))
@pytest.mark.parametrize("which", range(3))
def test_threshold_known_answers(eps: float, max_items: int, which: int) -> None:
    beta = BETAS[which]
    tau = threshold(eps, 1e-6, max_items, beta)
    assert tau == KNOWN[eps, max_items][which]
    # and it is the least m with Pr[Z >= m - 1] <= delta'
    alpha = mp.exp(-mp.mpf(eps) / max_items)
    dp = -mp.expm1(mp.log1p(-mp.mpf("1e-6")) / max_items)
    assert noise_tail(tau - 1, alpha, beta) <= dp < noise_tail(tau - 2, alpha, beta)


@pytest.mark.parametrize("eps, max_items", sorted(KNOWN))
def test_threshold_at_beta_one_is_the_closed_form(eps: float, max_items: int) -> None:
    assert threshold(eps, 1e-6, max_items) == closed_form_tau(eps, 1e-6, max_items)[0]


_eps = st.floats(0.2, 5.0).map(lambda e: round(e, 3))
_delta = st.floats(-12, -0.6).map(lambda e: 10**e)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(eps=_eps, delta=_delta, max_items=st.integers(1, 30))
def test_threshold_closed_form_property(eps: float, delta: float, max_items: int) -> None:
    assume(max_items / eps <= 40)  # the exact tail's cost grows with the scale
    tau, x = closed_form_tau(eps, delta, max_items)
    assume(abs(x - mp.nint(x)) > 1e-20)  # no exact tie between the two computations
    assert threshold(eps, delta, max_items) == tau


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delta": 0.0}, {"delta": 1.0}, {"delta": -1e-6}, {"delta": float("nan")},
        {"epsilon": 0.0}, {"epsilon": -1.0}, {"epsilon": float("inf")}, {"epsilon": float("nan")},
        {"max_items": 0}, {"max_items": 1.5}, {"max_items": True},
        {"beta": Fraction(0)}, {"beta": Fraction(-1, 2)},
    ],
)  # fmt: skip
def test_threshold_refuses_bad_parameters_in_one_line(kwargs: dict) -> None:
    args = {"epsilon": 1.0, "delta": 1e-6, "max_items": 10, "beta": Fraction(1)} | kwargs
    with pytest.raises(ValueError) as info:
        threshold(**args)
    assert "\n" not in str(info.value)


def test_threshold_refuses_a_scale_too_large_for_the_exact_tail() -> None:
    with pytest.raises(ValueError, match="terms"):
        threshold(1e-4, 1e-6, 10)


# -- cross-checks with other libraries --------------------------------------------------------


def _opendp_delta(scale: float, opendp_threshold: int, max_items: int) -> float:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=int))
    metric = dp.l01inf_distance(dp.absolute_distance(T=int))
    meas = dp.m.make_laplace_threshold(domain, metric, scale=scale, threshold=opendp_threshold)
    return meas.map((max_items, max_items, 1))[1]  # one user: <= Delta_0 keys, each count <= 1


def test_opendp_map_underreports_by_one_step_opendp_issue_2922() -> None:
    """OpenDP 0.16 keeps a key iff its noisy count >= threshold (shown with noise that is 0 but
    with chance ~1e-43; OpenDP's sampler cannot be seeded), so a count of 1 is kept with chance
    Pr[Z >= threshold - 1]; its privacy map reports Pr[Z > threshold - 1] = Pr[Z >= threshold],
    one step less (opendp/opendp issue 2922).  If this fails after an upgrade, the issue is
    fixed: drop the one-step compensation in the next test."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=int))
    quiet = dp.m.make_laplace_threshold(domain, dp.l01inf_distance(dp.absolute_distance(T=int)), scale=0.01, threshold=3)
    assert quiet({"two": 2, "three": 3}) == {"three": 3}
    alpha = mp.exp(-1)
    assert _opendp_delta(1.0, 3, 1) == pytest.approx(float(noise_tail(3, alpha, 1)), rel=1e-9)
    assert _opendp_delta(1.0, 3, 1) < float(noise_tail(2, alpha, 1)) / 2


@pytest.mark.parametrize("eps, max_items", sorted(KNOWN))
def test_threshold_against_opendp_privacy_map(eps: float, max_items: int) -> None:
    """With the off-by-one above compensated (OpenDP threshold tau - 1 is our release rule at tau),
    OpenDP's (conservatively rounded) joint delta over Delta_0 keys is <= delta at our tau and
    > delta one step lower: our tau is OpenDP's least admissible threshold."""
    tau, scale = threshold(eps, 1e-6, max_items), max_items / eps
    assert _opendp_delta(scale, tau - 1, max_items) <= 1e-6 < _opendp_delta(scale, tau - 2, max_items)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(eps=_eps, delta=_delta, max_items=st.integers(1, 30))
def test_threshold_against_google_partition_selection(eps: float, delta: float, max_items: int) -> None:
    """python-dp's Laplace partition selection keeps n + Lap(b) above tau_G = 1 - b ln(2 delta')
    (b = Delta_0/eps; continuous noise).  The discrete tail alpha^k/(1 + alpha) exceeds the
    continuous one, e^{-k/b}/2, by 2/(1 + alpha) in (1, 2): b ln(2/(1 + alpha)) in (0, 1/2) more
    steps, so tau is ceil(tau_G) or ceil(tau_G) + 1 (the tolerance), never below."""
    from pydp.algorithms.partition_selection import create_partition_strategy

    assume(max_items / eps <= 40)
    tau_g = create_partition_strategy("laplace", eps, delta, max_items).threshold
    assume(abs(tau_g - round(tau_g)) > 1e-6)  # float ties
    assert math.ceil(tau_g) <= threshold(eps, delta, max_items) <= math.ceil(tau_g) + 1


# -- accounting ---------------------------------------------------------------------------------


def test_pld_epsilon_of_pure_parts_equals_basic_composition() -> None:
    """dp-accounting's PLD (pessimistic, discretised at 1e-4 per mechanism: the tolerance) at
    delta = 0 equals the sum of the pure epsilons; at a positive delta it is no larger."""
    from dp_accounting import dp_event, pld

    parts = [(1.0, 10), (0.5, 10), (0.5, 10), (0.25, 1)]
    basic = compose([(e, 0.0) for e, _ in parts])
    assert basic == (2.25, 0.0)
    assert pld_epsilon(parts) == pytest.approx(basic[0], abs=1e-4 * len(parts))
    assert pld_epsilon(parts, delta=1e-6) <= basic[0] + 1e-4 * len(parts)
    single = pld.PLDAccountant()
    single.compose(dp_event.DiscreteLaplaceDpEvent(noise_parameter=0.1, sensitivity=10))
    assert single.get_epsilon(0.0) == pytest.approx(pld_epsilon([(1.0, 10)]), abs=1e-4) == pytest.approx(1.0, abs=1e-4)
    assert compose([(1.0, 1e-6), (0.1, 1e-6), (0.1, 1e-6)]) == pytest.approx((1.2, 3e-6))


def test_release_accounting() -> None:
    acc = release_accounting(1.0, 1e-6, 10, 0.1, 3, 1)
    assert json.loads(json.dumps(acc))["party"] == pytest.approx([1.2, 3e-6])
    assert acc["recipient"] == (1.0, 1e-6)
    assert acc["threshold"] == 169 and acc["beta"] == 1.5
    assert acc["delta_prime"] == delta_prime(1e-6, 10)
    assert acc["padding_shift"] == padding_shift(10, 0.1, 1e-6)
    assert pld_epsilon([(1.0, 10), (0.1, 10), (0.1, 10)]) == pytest.approx(acc["party"][0], abs=3e-4)  # dp-accounting agrees
    assert "dp-accounting" in acc["accountant"] and "basic composition" in acc["accountant"]
    assert {"max_items", "collusion", "padding_epsilon", "parties"} <= set(acc)


def test_the_plain_words_name_the_item_kinds_that_ran() -> None:
    """A histogram of queries told partners they learn "how many pairs each party holds"."""
    from cels.claims import dp_release_accounting
    from cels.mechanism.item_kinds import ItemKinds

    for text, kinds in (("pairs", "query-url pairs"), ("queries", "queries"), ("pairs,queries:2", "query-url pairs and queries")):
        acc = release_accounting(1.0, 1e-6, ItemKinds.parse(text, 1), 0.1, 3, 1)
        plain = " ".join(dp_release_accounting(acc, parties=3, seeded=False)["plain"])
        assert f"how many {kinds} each party holds" in plain, (text, plain)
        assert "pair each" not in plain and "hashed item" in plain


# -- noise shares -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, scale",
    [(Fraction(1, 2), Fraction(3)), (Fraction(1, 3), Fraction(7, 3)), (Fraction(2, 3), Fraction(2)), (Fraction(1), Fraction(3, 2))],
)
def test_polya_array_matches_the_exact_pmf(shape: Fraction, scale: Fraction) -> None:
    draws = polya_array(40_000, shape, scale, CipherRandom(seed=11).generator)
    assert draws.dtype == np.int64 and draws.min() >= 0
    top = 40
    probs = [float(polya_pmf(k, shape, scale)) for k in range(top)]
    counts = np.bincount(np.minimum(draws, top), minlength=top + 1)
    assert chi_square(counts, [*probs, 1 - sum(probs)]) > P_FLOOR


def test_fast_shares_match_the_scalar_sampler_and_the_share_pmf() -> None:
    """The vectorised path (a CipherRandom) against cels.mechanism.noise.laplace_share (a plain
    random.Random takes it): each against the exact pmf of X - Y, and the two against each other."""
    scale, h, lim = Fraction(2), 2, 12
    fast = noise_shares(30_000, scale, h, CipherRandom(seed=5))
    slow = noise_shares(3_000, scale, h, random.Random(5))
    p = [float(polya_pmf(k, Fraction(1, h), scale)) for k in range(80)]
    share = {j: sum(p[y] * p[y + abs(j)] for y in range(80 - abs(j))) for j in range(-lim, lim + 1)}
    probs = [1 - sum(share.values()), *share.values()]  # |j| > lim pooled first
    for draws in (fast, slow):
        assert draws.dtype == np.int64
        counts = np.bincount(np.where(np.abs(draws) > lim, 0, draws + lim + 1), minlength=2 * lim + 2)
        assert chi_square(counts, probs) > P_FLOOR
    table = np.array([np.bincount(np.clip(d, -5, 5) + 5, minlength=11) for d in (fast, slow)])
    assert stats.chi2_contingency(table[:, table.min(axis=0) > 0]).pvalue > P_FLOOR


@pytest.mark.parametrize("h, scale", [(2, Fraction(3)), (3, Fraction(10, 3))])
def test_h_fast_shares_add_up_to_the_discrete_laplace(h: int, scale: Fraction) -> None:
    rng = CipherRandom(seed=h)
    total = sum(noise_shares(30_000, scale, h, rng) for _ in range(h))
    lo, hi = -15, 15
    bins = [float(b) for b in discrete_laplace_bins(scale, lo, hi)]
    counts = np.bincount(np.clip(total, lo - 1, hi + 1) - lo + 1, minlength=hi - lo + 3)
    assert chi_square(counts, bins) > P_FLOOR


def test_noise_shares_replay_from_a_seed() -> None:
    one, two = (noise_shares(1000, Fraction(10), 3, CipherRandom(seed=9)) for _ in range(2))
    assert np.array_equal(one, two) and one.shape == (1000,)


# -- padding ----------------------------------------------------------------------------------


def test_padding_shift_closed_form() -> None:
    for eps, k, delta in [(1.0, 1, 1e-6), (1.0, 10, 1e-6), (0.5, 3, 1e-3), (1.0, 2, 0.9)]:
        alpha = math.exp(-eps / k)
        by_hand = k - 1 + max(1, math.ceil(k / eps * math.log(1 / (delta * (1 + alpha)))))
        mu = padding_shift(k, eps, delta)
        assert mu == by_hand
        assert alpha ** (mu - k + 1) / (1 + alpha) <= delta and (mu == k or alpha ** (mu - k) / (1 + alpha) > delta)
    assert padding_shift(1, 1.0, 1e-6) == 14 and padding_shift(10, 1.0, 1e-6) == 141


def _padded_pmf(size: int, mu: int, alpha: mpmath.mpf) -> dict[int, mpmath.mpf]:
    weights = {size + mu + j: alpha ** abs(j) for j in range(-mu, mu + 1)}
    norm = mp.fsum(weights.values())
    return {o: w / norm for o, w in weights.items()}


@pytest.mark.parametrize("eps, max_items, delta", [(1.0, 1, 1e-6), (0.5, 4, 1e-3), (1.0, 10, 0.05)])
def test_padded_size_is_epsilon_delta_dp(eps: float, max_items: int, delta: float) -> None:
    """The hockey-stick divergence of |S| + D between sizes n and n + k, k <= Delta_0, both ways."""
    mu, alpha = padding_shift(max_items, eps, delta), mp.exp(-mp.mpf(eps) / max_items)
    for k in range(1, max_items + 1):
        p, q = _padded_pmf(0, mu, alpha), _padded_pmf(k, mu, alpha)
        for a, b in [(p, q), (q, p)]:
            div = mp.fsum(max(0, a[o] - mp.exp(eps) * b.get(o, 0)) for o in a)
            assert div <= delta


def test_padding_count_distribution() -> None:
    """10,000 draws against the exact truncated pmf (chi-square), mean mu within 5 sd, every D in
    [0, 2 mu], the outputs a neighbour cannot give (D < Delta_0) within delta + 5 binomial sd."""
    eps, k, delta, n = 1.0, 2, 0.05, 10_000
    mu, rng = padding_shift(k, eps, delta), CipherRandom(seed=21)
    assert mu == 7
    draws = np.array([padding_count(k, eps, delta, rng) for _ in range(n)])
    assert draws.min() >= 0 and draws.max() <= 2 * mu
    pmf = _padded_pmf(0, mu, mp.exp(-mp.mpf(eps) / k))
    assert chi_square(np.bincount(draws, minlength=2 * mu + 1), [float(pmf[o]) for o in range(2 * mu + 1)]) > P_FLOOR
    sd = math.sqrt(float(mp.fsum(pmf[o] * (o - mu) ** 2 for o in pmf)) / n)
    assert abs(draws.mean() - mu) <= 5 * sd
    assert (draws < k).sum() <= n * delta + 5 * math.sqrt(n * delta)


# -- the single-holder reference --------------------------------------------------------------


@pytest.mark.parametrize("beta", [Fraction(1), Fraction(3, 2)])
def test_single_holder_releases_a_lone_item_rarely_and_a_common_one_always(beta: Fraction) -> None:
    """20,000 items held by one user each: released with chance Pr[Z >= tau - 1] <= delta'
    (binomial, 5 sd: an off-by-one tau, Pr[Z >= tau - 2], is > 9 sd off); 100 items held by 100
    users each: all released."""
    eps, delta, k, lone = 1.0, 1e-2, 1, 20_000
    users = [{("lone", i)} for i in range(lone)] + [{("common", i)} for i in range(100) for _ in range(100)]
    out = single_holder_histogram(users, eps, delta, k, beta, CipherRandom(seed=31))
    tau = threshold(eps, delta, k, beta)
    alpha = mp.exp(-mp.mpf(eps) / k)
    p, p_wrong = (float(noise_tail(tau - j, alpha, beta)) for j in (1, 2))
    assert p <= delta_prime(delta, k) < p_wrong
    released = sum(1 for key in out if key[0] == "lone")
    assert abs(released - lone * p) <= 5 * math.sqrt(lone * p)
    assert released <= lone * delta_prime(delta, k) + 5 * math.sqrt(lone * delta)
    assert all(("common", i) in out for i in range(100)) and min(out.values()) >= tau


def test_single_holder_caps_users_and_takes_a_csr_matrix() -> None:
    """1,000 users with 5 items each keep 2 (eps = 50: the noise is 0 but with chance ~1e-10 per
    item): counts sum to 2,000, each about 1000 * 2/5 (5 sd); a CSR matrix gives the same release."""
    users = [set(range(5)) for _ in range(1000)]
    out = single_holder_histogram(users, 50.0, 1e-6, 2, Fraction(1), CipherRandom(seed=41))
    assert sum(out.values()) == 2000 and set(out) == set(range(5))
    assert all(abs(v - 400) <= 5 * math.sqrt(1000 * 0.4 * 0.6) for v in out.values())
    rows = [[0, 2, 3], [1], [0, 1, 2, 4]] * 50
    columns = [i for r in rows for i in r]
    matrix = sparse.csr_matrix(([1] * len(columns), columns, np.cumsum([0, *map(len, rows)])), shape=(150, 5))
    args = (2.0, 1e-3, 2, Fraction(3, 2))
    from_sets = single_holder_histogram([set(r) for r in rows], *args, CipherRandom(seed=5))
    assert single_holder_histogram(matrix, *args, CipherRandom(seed=5)) == from_sets and from_sets
