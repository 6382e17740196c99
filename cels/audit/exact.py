"""Exact pmfs and privacy losses of the noise (sympy; docs/security.md, "Empirical privacy audit").

With q = exp(-1/s) for a rational scale s, every probability is an exact sympy expression and every
privacy loss ln P(k)/P(k') is an exact rational (sympy folds log(exp(r)) to r):

- discrete Laplace (cels.mechanism.noise.discrete_laplace): P(k) = (1 - q)/(1 + q) q^|k|;
- one Polya draw NB(a, q) (cels.mechanism.noise.polya): P(k) = (a)_k / k! (1 - q)^a q^k;
- the sum of r Polya shares (cels.mechanism.noise.laplace_share): the sum of r independent
  NB(1/r, q) has pmf (1 - q) q^k c_k with c the r-fold convolution of (1/r)_k / k!, so it is the
  geometric NB(1, q) iff c_k = 1 for every k; then the share sum, the difference of two such sums,
  is the discrete Laplace.  :func:`polya_sum_coefficients` computes c exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import sympy


def _q(scale: Fraction | int) -> sympy.Expr:
    return sympy.exp(-1 / sympy.Rational(Fraction(scale).numerator, Fraction(scale).denominator))


def discrete_laplace_pmf(k: int, scale: Fraction | int) -> sympy.Expr:
    """P(Z = k) = (1 - q)/(1 + q) q^|k| exactly."""
    q = _q(scale)
    return (1 - q) / (1 + q) * q ** abs(int(k))


def discrete_laplace_bins(scale: Fraction | int, lo: int, hi: int) -> list[sympy.Expr]:
    """Exact bin probabilities for :func:`cels.audit.tester.goodness_of_fit`: P(Z < lo), P(Z = k)
    for lo <= k <= hi, P(Z > hi) (lo <= 0 <= hi; a tail is q^m / (1 + q) for |Z| >= m >= 1)."""
    if not lo <= 0 <= hi:
        raise ValueError(f"need lo <= 0 <= hi, got {lo}, {hi}")
    q = _q(scale)
    bins = [q ** (1 - lo) / (1 + q), *(discrete_laplace_pmf(k, scale) for k in range(lo, hi + 1)), q ** (hi + 1) / (1 + q)]
    if sympy.simplify(sum(bins) - 1) != 0:
        raise ArithmeticError("the discrete Laplace bins do not add up to 1")
    return bins


def polya_pmf(k: int, shape: Fraction, scale: Fraction | int) -> sympy.Expr:
    """P(NB(shape, q) = k) = (shape)_k / k! (1 - q)^shape q^k exactly."""
    a = sympy.Rational(Fraction(shape).numerator, Fraction(shape).denominator)
    q = _q(scale)
    return sympy.rf(a, k) / sympy.factorial(k) * (1 - q) ** a * q**k


def polya_sum_coefficients(shape: Fraction, parties: int, terms: int) -> list[sympy.Rational]:
    """c_0..c_{terms-1}: the ``parties``-fold convolution of (shape)_k / k! in exact rationals.
    The sum of ``parties`` NB(shape, q) draws has pmf (1 - q)^(parties shape) q^k c_k."""
    a = sympy.Rational(Fraction(shape).numerator, Fraction(shape).denominator)
    base = [sympy.rf(a, k) / sympy.factorial(k) for k in range(terms)]
    out = [sympy.Integer(1)] + [sympy.Integer(0)] * (terms - 1)
    for _ in range(parties):
        out = [sum(out[m] * base[k - m] for m in range(k + 1)) for k in range(terms)]
    return out


def share_sum_is_geometric(shape: Fraction, parties: int, terms: int = 40) -> bool:
    """True iff the first ``terms`` probabilities of a sum of ``parties`` NB(shape) draws are
    exactly the geometric's (1 - q) q^k: shape * parties = 1 and every c_k = 1."""
    return Fraction(shape) * parties == 1 and all(c == 1 for c in polya_sum_coefficients(shape, parties, terms))


def laplace_loss(k: int, shift: int, scale: Fraction | int) -> sympy.Rational:
    """ln P(x + Z = o) / P(x + shift + Z = o) at o = x + k: ln P(k) / P(k - shift), exact."""
    loss = sympy.log(discrete_laplace_pmf(k, scale) / discrete_laplace_pmf(k - shift, scale))
    if not loss.is_Rational:
        raise ArithmeticError(f"the loss at k = {k} did not reduce to a rational: {loss}")
    return loss


def max_laplace_loss(shift: int, scale: Fraction | int) -> sympy.Rational:
    """max_k |ln P(k)/P(k - shift)| over every k: |(|k - shift| - |k|)| / s is constant outside
    [min(0, shift), max(0, shift)], so the window [-|shift| - 1, |shift| + 1] holds every value."""
    span = abs(int(shift)) + 1
    return max(abs(laplace_loss(k, shift, scale)) for k in range(-span, span + 1))


def vector_laplace_loss(x: Sequence[int], x_prime: Sequence[int], output: Sequence[int], scale: Fraction | int) -> sympy.Rational:
    """ln P(x + Z = o) / P(x' + Z = o) for independent per-pair discrete Laplace noise: the sum of
    the per-pair losses, so at most ||x - x'||_1 / s (the L1 sensitivity, not the L-infinity)."""
    return sum(
        (laplace_loss(o - a, b - a, scale) for a, b, o in zip(x, x_prime, output, strict=True)),
        sympy.Integer(0),
    )
