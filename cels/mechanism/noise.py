"""Exact discrete noise samplers: the noise on the optimal counts (CELS 3.3; its repair is
:mod:`cels.mechanism.noisy_counts`), the parties' shares of distributed noise, the baselines'
noisy counts.

Counts are integers, so the noise is the discrete Laplace (two-sided geometric) distribution
P(k) proportional to exp(-|k| / scale), sampled exactly with the rational-arithmetic algorithm
of Canonne, Kamath and Steinke (NeurIPS 2020, Algorithms 1-2): only uniform integers from the
ChaCha20 stream (:class:`cels.crypto.streams.CipherRandom`, keyed from ``secrets``; seeded only
for non-private, reproducible runs), no floating-point inverse CDF (Mironov 2012).
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np



def _bernoulli(p: Fraction, rng: random.Random) -> bool:
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: random.Random) -> bool:
    """Exact Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS Algorithm 1)."""
    if gamma < 0:
        raise ValueError("gamma must be non-negative")
    while gamma > 1:  # exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma)))
        if not bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def geometric(scale: Fraction, rng: random.Random) -> int:
    """One exact sample of the geometric P(k) = (1 - q) q^k, k >= 0, q = exp(-1/scale)
    (the one-sided part of CKS Algorithm 2)."""
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError("scale must be positive")
    t, s = scale.numerator, scale.denominator  # scale = t / s
    while True:
        u = rng.randrange(t)
        if not bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), rng):
            v += 1
        return (u + t * v) // s


def discrete_laplace(scale: Fraction, rng: random.Random) -> int:
    """One exact sample of the discrete Laplace with P(k) ~ exp(-|k|/scale) (CKS Algorithm 2)."""
    while True:
        y = geometric(scale, rng)
        negative = rng.randrange(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def polya(shape: Fraction, scale: Fraction, rng: random.Random) -> int:
    """One exact sample of the Polya (negative binomial) NB(shape, q), q = exp(-1/scale),
    0 < shape <= 1: P(k) = (shape)_k / k! (1 - q)^shape q^k.

    Rejection from the geometric: a geometric k is kept with probability
    (shape)_k / k! = prod_{i=1..k} (i - 1 + shape) / i <= 1 (one exact rational coin per
    factor), which leaves P(k) proportional to (shape)_k / k! q^k.  Expected tries
    (1 - q)^(shape - 1)."""
    shape = Fraction(shape)
    if not 0 < shape <= 1:
        raise ValueError(f"the Polya shape must be in (0, 1], got {shape}")
    while True:
        k = geometric(scale, rng)
        if all(_bernoulli((i - 1 + shape) / i, rng) for i in range(1, k + 1)):
            return k


def laplace_share(scale: Fraction, parties: int, rng: random.Random) -> int:
    """One party's share of a distributed discrete Laplace: the difference of two
    NB(1/r, q) draws.  NB is infinitely divisible, so the r shares add up to
    NB(1, q) - NB(1, q), the difference of two geometrics, which is exactly the discrete
    Laplace of ``scale`` (Goryczka and Xiong, "A comprehensive comparison of multiparty secure
    additions with differential privacy", the Polya-share geometric mechanism)."""
    if parties < 1:
        raise ValueError(f"need at least one party, got {parties}")
    shape = Fraction(1, parties)
    return polya(shape, scale, rng) - polya(shape, scale, rng)


def discrete_laplace_variance(scale: float) -> float:
    """Var = 2 e^{-1/scale} / (1 - e^{-1/scale})^2 (for tests and reports)."""
    q = np.exp(-1.0 / scale)
    return float(2 * q / (1 - q) ** 2)


def noise_scale(noise_epsilon: float, sensitivity: float) -> Fraction:
    """d / eps' as an exact rational (decimal inputs are taken digit for digit)."""
    if not noise_epsilon > 0:
        raise ValueError(f"noise epsilon must be positive, got {noise_epsilon}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity d must be positive, got {sensitivity}")
    return Fraction(str(sensitivity)) / Fraction(str(noise_epsilon))
