"""Randomness of the baselines: discrete Laplace noise on counts, selection randomness.

Noise on integer counts is the exact discrete Laplace of :mod:`cels.mechanism.noise`
(``Pr[eta = k] ∝ e^{-|k|/scale}``, rational arithmetic), driven by the release's ``rng``:
a :class:`cels.crypto.streams.CipherRandom` (ChaCha20 keyed from :mod:`secrets`; seeded only
for tests and reproduced figures, which are then not private).

Thresholds are compared with integer noisy counts, so every threshold is used as an integer,
rounded up, which keeps each stated bound.  For the discrete Laplace at integer ``k``,
``Pr[eta > k] = p^{k+1} / (1 + p) <= 1/2 e^{-k/scale}``, and the likelihood ratio of
neighbouring counts is at most ``e^{1/scale}``: the two facts the papers' continuous-Laplace
proofs use.

Selection randomness (ZEALOUS item choice, Safelog pool draw, which noise-only items pass a
threshold, and the binomial count of zero-count survivors) comes from the same ``rng``.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from functools import lru_cache

from cels.baselines.params import discrete_retention_probability
from cels.crypto.streams import CipherRandom
from cels.mechanism.noise import discrete_laplace


def baseline_rng(seed: int | None = None) -> CipherRandom:
    """A release's ChaCha20 stream: keyed from ``secrets``, or replayable from ``seed`` (tests,
    reproduced figures; not private)."""
    return CipherRandom(seed)


@lru_cache(maxsize=64)
def exact_scale(scale: float) -> Fraction:
    """The scale as an exact rational, digit for digit of its shortest decimal form."""
    if not scale > 0:
        raise ValueError(f"noise scale must be positive, got {scale!r}")
    return Fraction(repr(float(scale)))


def noisy(count: int, scale: float, rng: random.Random) -> int:
    """count + eta, eta ~ discrete Laplace(scale) (exact sampler)."""
    return int(count) + discrete_laplace(exact_scale(scale), rng)


def integer_threshold(threshold: float) -> int:
    """A real threshold as the integer one that keeps every bound: ceil (noisy > ceil(t) => noisy > t)."""
    return math.ceil(threshold - 1e-9)


def noise_above(threshold: int, scale: float, rng: random.Random) -> int:
    """A draw of eta conditioned on eta > threshold (threshold >= 0 integer).

    Memorylessness: Pr[eta = threshold + j | eta > threshold] = Pr[eta = j | eta > 0], so draw
    until positive (expected < 2.2 draws) and shift.
    """
    while True:
        eta = discrete_laplace(exact_scale(scale), rng)
        if eta > 0:
            return threshold + eta


def zero_count_survivors(n: int, threshold: int, scale: float, rng: CipherRandom) -> list[int]:
    """Indices among ``n`` zero-count candidates whose noise exceeds ``threshold``.

    Each candidate passes independently with Pr[eta > threshold]; the number that pass is
    Binomial(n, Pr) and which ones pass is a uniform subset: the same law as drawing ``n``
    noises, in time proportional to the survivors.  ``n`` and the threshold are public (they
    do not depend on the private log); the binomial draw comes from ``rng``'s numpy Generator
    (the same stream).
    """
    if n <= 0:
        return []
    pass_probability = discrete_retention_probability(0, threshold, scale)
    survivors = int(rng.generator.binomial(n, pass_probability))
    return rng.sample(range(n), survivors)
