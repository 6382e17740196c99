"""The secure NLP's constraint transformation (CELS section 4.2.1, eqs. 7-8, Algorithm 2).

Party P_k turns its rows ``T_k x <= b`` into ``T_k x + F_k y = B_k`` with random positive slack
coefficients F_k (eq. 7) and pre-multiplies by its random l x m_k matrix A_k (eq. 8); the sum
over parties ``A T x + A F y = A B`` reaches the solver P_0.  Algorithm 2 line 6 (a ciphertext
raised to a ciphertext) is impossible with Paillier, so A_k T_k is computed here in the clear
inside P_k and encrypted afterwards (docs/protocol.md, Decisions).

The solver undoes the slacks: AF has full column rank, so ``(AF)^+ [AT | AB] = F^-1 [T | B]``
and ``F^-1 T x <= F^-1 B`` are the original conditions, every row scaled by an unknown positive
factor.  This is exactly the leak docs/protocol.md describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.crypto import paillier
from cels.crypto.packing import MAX_ENCODED_BOUND, Packing
from cels.mechanism.sampling import make_rng

SLACK_RANGE = (1.0, 2.0)
"""F_k's diagonal is drawn uniformly from this range (positive, well away from zero)."""

A_CLIP = 8.0
"""Entries of A_k are standard Gaussians clipped to [-8, 8] (P(|z| > 8) ~ 1e-15), so that every
entry of a share has a public bound and P_1's packing fits every party's plaintext."""


@dataclass(frozen=True)
class TransformedShare:
    """P_k's plaintext contribution to the encrypted sum: A_k T_k, A_k F_k and A_k B_k."""

    at: np.ndarray  # l x n
    af: np.ndarray  # l x m_k
    ab: np.ndarray  # l


MAX_ELL = 2**32 - 1
"""The most rows of A a session can agree (NlpKey.ell is a uint32)."""


def agreed_ell(rows: int, ell_ratio: float) -> int:
    """Rows l of A (Algorithm 2's "l >= m"): ceil(ell_ratio * m), at least m + 1."""
    if ell_ratio < 1.0:
        raise ValueError(f"ell_ratio must be >= 1, got {ell_ratio}")
    return max(math.ceil(ell_ratio * rows), rows + 1)


def transform_constraints(
    rows: sp.csr_matrix, b: float, ell: int, rng: np.random.Generator | None = None
) -> TransformedShare:
    """Eqs. 7-8 for one party: draw A_k (l x m_k, Gaussian) and F_k from ``rng`` (default: a
    fresh ChaCha20 stream), return A_k [T_k | F_k | B_k]."""
    m_k = rows.shape[0]
    if ell < m_k:
        raise ValueError(f"l = {ell} rows of A cannot hide {m_k} constraint rows")
    rng = rng or make_rng()
    a = np.clip(rng.standard_normal((ell, m_k)), -A_CLIP, A_CLIP)
    f = rng.uniform(*SLACK_RANGE, size=m_k)
    at = np.asarray((sp.csr_matrix(rows).T @ a.T).T) if m_k else np.zeros((ell, rows.shape[1]))
    return TransformedShare(at=at, af=a * f, ab=b * a.sum(axis=1))


def share_bounds(max_total: int, b: float, max_rows: int) -> tuple[float, float, float]:
    """Public bounds on |entries| of A_k T_k (and the count row), A_k F_k and A_k B_k.

    A column of T_k sums -ln(1 - c_ij/c_i) over P_k's users; with every c_ij <= c_i - 1 and
    sum_j c_ij <= c_i that is at most ln c_i + 1, so |(A_k T_k)_si| <= A_CLIP (ln c_max + 1).
    Only the first depends on ``max_total`` (which the solver learns from the count row).
    """
    at = max(A_CLIP * (math.log(max(max_total, 1)) + 1.0), float(max_total))
    return at, A_CLIP * SLACK_RANGE[1], A_CLIP * b * max(max_rows, 1)


def share_packings(public_key: paillier.PublicKey, max_total: int, b: float, shape_rows: list[int], parties: int) -> dict[str, Packing]:
    """The packings of a session's encrypted shares: ``at`` and ``ab`` summed over ``parties``,
    ``af`` one party's block.  Parties and solver derive them alike (docs/protocol.md)."""
    at_bound, af_bound, ab_bound = share_bounds(max_total, b, max(shape_rows, default=1))
    return {
        "at": fixed_point_packing(public_key, at_bound, parties),
        "ab": fixed_point_packing(public_key, ab_bound, parties),
        "af": fixed_point_packing(public_key, af_bound, 1),
    }


def implied_at_packing(received: Packing, public_key: paillier.PublicKey, parties: int) -> Packing:
    """The packing of AT that the received one's own bound offset / 2^scale_bits implies.

    AT's bound depends on max c_i, which the solver learns only from AT's last row, so it
    checks AT's packing in two steps: here, that it is what :func:`fixed_point_packing` gives
    for its own bound (honest packings are; raises ValueError for a bound no packing has);
    after decrypting, :func:`check_count_row`."""
    if received.scale_bits > FRACTION_BITS or not 0 < received.offset <= MAX_ENCODED_BOUND:
        raise ValueError(f"packing.scale_bits {received.scale_bits} or packing.offset {received.offset} out of range")
    return fixed_point_packing(public_key, received.offset / 2**received.scale_bits, parties)


def check_count_row(packing: Packing, counts: np.ndarray) -> None:
    """AT's decrypted last row must be non-negative integer counts that the packing's bound covers."""
    if np.any(counts < 0) or np.any(counts != np.rint(counts)):
        raise ValueError("its count row is not non-negative integers (a forged plaintext)")
    bound = packing.offset / 2**packing.scale_bits
    needed = share_bounds(int(counts.max(initial=1)), 0.0, 1)[0]
    if bound < needed:
        raise ValueError(f"packing bound {bound:.6g} is below {needed:.6g}, what its count row needs")


FRACTION_BITS = 32
"""Fixed-point fractional bits of the NLP shares (absolute error 2^-33 per entry)."""


def fixed_point_packing(public_key: paillier.PublicKey, bound: float, summands: int) -> Packing:
    """Fixed-point packing for |v| <= bound with FRACTION_BITS fractional bits (fewer if the
    64-bit decoding needs it: bound * 2^scale * summands < 2^62) and ``summands`` sums."""
    room = 61 - math.ceil(math.log2(bound + 1.0)) - summands.bit_length()
    scale_bits = max(0, min(FRACTION_BITS, room))
    return Packing.for_values(public_key, bound, summands, scale_bits)


@dataclass(frozen=True)
class Recovered:
    """The solver's view after eliminating the slacks: ``G x <= h`` (rows = F^-1 T, F^-1 B)."""

    G: np.ndarray
    h: np.ndarray
    residual: float  # ||AF X - [AT | AB]|| / ||[AT | AB]||, X the least-squares solution


def eliminate_slacks(at: np.ndarray, af: np.ndarray, ab: np.ndarray, tolerance: float = 1e-6) -> Recovered:
    """Solve ``AF X = [AT | AB]`` (AF of full column rank): X = F^-1 [T | B] (Algorithm 2 line 13).

    Raises ValueError when AF is rank deficient or the system is inconsistent beyond
    ``tolerance`` (a corrupted or wrongly assembled transformed problem).
    """
    ell, m = af.shape
    rhs = np.column_stack([at, ab])
    if m == 0:
        return Recovered(np.zeros((0, at.shape[1])), np.zeros(0), 0.0)
    x, _res, rank, _sv = np.linalg.lstsq(af, rhs, rcond=None)
    if rank < m:
        raise ValueError(f"AF has rank {rank} < {m} columns: slacks cannot be eliminated")
    residual = float(np.linalg.norm(af @ x - rhs) / max(np.linalg.norm(rhs), 1e-300))
    if residual > tolerance:
        raise ValueError(f"transformed constraints inconsistent: relative residual {residual:.3g}")
    g, h = x[:, :-1], x[:, -1]
    if np.any(h <= 0):
        raise ValueError("transformed constraints have a non-positive right-hand side")
    # F^-1 T >= 0 (ln t >= 0).  Entries within the round-off of the fixed-point encoding are
    # zeros of T; clearing them loosens a row by at most that round-off, so h is tightened by
    # a relative margin well above it (and every party checks its exact rows on the solution).
    scale = np.maximum(np.abs(g).max(axis=1, initial=0.0), h)[:, None]
    if np.any(g < -tolerance * scale):
        raise ValueError("transformed constraints have negative coefficients")
    noise = max(100.0 * residual, 1e-12)
    g = np.where(g <= noise * scale, 0.0, g)
    margin = min(max(1e-9, 1e3 * residual), 1e-4)
    return Recovered(G=g, h=h * (1.0 - margin), residual=residual)
