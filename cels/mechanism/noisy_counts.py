"""Noise on the optimal counts (CELS 3.3): x_i <- x_i + Lap(d / eps'), then repair.

The paper calls this end-to-end DP; the repair reads the private conditions again, so CELS
claims no end-to-end bound for the repaired counts (docs/security.md, "End-to-end DP: what
holds").  The noise samplers themselves are exact (:mod:`cels.mechanism.noise`).
"""

from __future__ import annotations

import random

import numpy as np

from cels.crypto.streams import CipherRandom
from cels.mechanism.conditions import Conditions
from cels.mechanism.noise import discrete_laplace, noise_scale
from cels.mechanism.solvers import repair


def add_noise_and_repair(
    cond: Conditions,
    x: np.ndarray,
    noise_epsilon: float,
    sensitivity: float,
    rng: random.Random | None = None,
) -> tuple[np.ndarray, dict]:
    """x_i + Lap(d/eps') per variable, negatives -> 0, then reduce counts until every condition
    holds (:func:`cels.mechanism.solvers.repair`); ``rng`` defaults to a fresh ChaCha20 stream.
    Returns (x_noisy, info)."""
    rng = rng or CipherRandom()
    scale = noise_scale(noise_epsilon, sensitivity)
    noise = np.array([discrete_laplace(scale, rng) for _ in range(len(x))], dtype=np.int64)
    noisy = np.maximum(np.asarray(x, dtype=np.int64) + noise, 0)
    repaired = repair(cond, noisy)
    info = {
        "noise_epsilon": noise_epsilon,
        "sensitivity": sensitivity,
        "scale": float(scale),
        "noise_l1": int(np.abs(noise).sum()),
        "clipped_negative": int(np.count_nonzero(np.asarray(x) + noise < 0)),
        "total_before": int(np.sum(x)),
        "total_noisy": int(noisy.sum()),
        "total_after_repair": int(repaired.sum()),
        "repaired_units": int((noisy - repaired).sum()),
    }
    return repaired, info
