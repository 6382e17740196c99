"""Distributed discrete Laplace (private solve, CELS App. C): every party draws the difference of
two Polya NB(1/r, q) variables; the r shares add up to exactly the discrete Laplace.

Goodness of fit: chi-square at level ALPHA over the values with expected count >= 5 (the two
tails merged into one bin each), fixed seeds, so each test is deterministic."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from cels.mechanism.noise import geometric, laplace_share, polya

ALPHA = 0.001


def chi_square_pvalue(draws: list[int], pmf, support: range) -> float:
    """Pearson chi-square of ``draws`` against ``pmf`` on ``support``, the mass below and above
    it in two tail bins."""
    draws_arr = np.asarray(draws)
    n = len(draws_arr)
    probs = np.array([pmf(k) for k in support])
    below = float(sum(pmf(k) for k in range(support.start - 200, support.start)))
    above = 1.0 - below - probs.sum()
    observed = [np.sum(draws_arr < support.start)] + [np.sum(draws_arr == k) for k in support] + [np.sum(draws_arr >= support.stop)]
    expected = n * np.concatenate([[below], probs, [above]])
    keep = expected >= 5
    observed, expected = np.asarray(observed, dtype=float)[keep], expected[keep]
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


@pytest.mark.parametrize("r", [2, 3, 5])
def test_the_sum_of_r_shares_is_the_discrete_laplace(r) -> None:
    """4,000 sums of r shares at scale 2 against P(k) = (1 - q)/(1 + q) q^|k|, q = e^{-1/2}."""
    rng = random.Random(100 + r)
    scale = Fraction(2)
    q = math.exp(-1 / scale)
    sums = [sum(laplace_share(scale, r, rng) for _ in range(r)) for _ in range(4000)]
    pvalue = chi_square_pvalue(sums, lambda k: (1 - q) / (1 + q) * q ** abs(k), range(-8, 9))
    assert pvalue > ALPHA
    assert abs(np.mean(sums)) <= 4.5 * math.sqrt(2 * q / (1 - q) ** 2 / len(sums))


@pytest.mark.parametrize(("shape", "scale"), [(Fraction(1, 3), Fraction(2)), (Fraction(1, 5), Fraction(7, 2))])
def test_one_polya_draw_is_negative_binomial(shape, scale) -> None:
    """5,000 draws against scipy's nbinom(n = shape, p = 1 - q): a single share alone is not the
    discrete Laplace, it is the negative binomial the divisibility argument needs."""
    rng = random.Random(7)
    q = math.exp(-1 / scale)
    draws = [polya(shape, scale, rng) for _ in range(5000)]
    pmf = stats.nbinom(float(shape), 1 - q).pmf
    assert chi_square_pvalue(draws, pmf, range(0, 12)) > ALPHA


def test_geometric_has_ratio_q() -> None:
    rng = random.Random(3)
    scale = Fraction(5, 3)
    q = math.exp(-3 / 5)
    draws = [geometric(scale, rng) for _ in range(5000)]
    assert chi_square_pvalue(draws, lambda k: (1 - q) * q**k if k >= 0 else 0.0, range(0, 10)) > ALPHA


def test_bad_parameters_are_refused() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="shape"):
        polya(Fraction(3, 2), Fraction(2), rng)
    with pytest.raises(ValueError, match="scale"):
        geometric(Fraction(0), rng)
    with pytest.raises(ValueError, match="party"):
        laplace_share(Fraction(2), 0, rng)
