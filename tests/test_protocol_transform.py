"""The secure NLP's transformation (eqs. 7-8) and the solver's slack elimination, and the
demonstration of what the solver learns (docs/protocol.md, "What each role sees")."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from cels.crypto import paillier
from cels.mechanism.conditions import Conditions
from cels.mechanism.solvers import solve
from cels.attacks.solver_reconstruction import demonstrate, reconstruct_rows
from cels.logs import synthetic_log
from cels.protocol.transform import (
    agreed_ell,
    eliminate_slacks,
    fixed_point_packing,
    share_bounds,
    transform_constraints,
)

B = 0.7


def party_rows(rng, shapes, n):
    """Random non-negative sparse ln t rows for each party."""
    return [sp.random(m, n, density=0.3, random_state=rng, data_rvs=lambda k: rng.uniform(0.05, 3.0, k)).tocsr() for m in shapes]


def summed(rows, ell, rng):
    """sum_k A_k [T_k | F_k | B_k] with AF blocks side by side (what P_0 decrypts)."""
    shares = [transform_constraints(r, B, ell, rng) for r in rows]
    return sum(s.at for s in shares), np.hstack([s.af for s in shares]), sum(s.ab for s in shares)


def test_slack_elimination_recovers_every_row_up_to_its_slack_scale() -> None:
    rng = np.random.default_rng(1)
    rows = party_rows(rng, [4, 6, 3], 9)
    ell = agreed_ell(13, 1.5)
    assert ell == 20
    at, af, ab = summed(rows, ell, rng)
    recovered = eliminate_slacks(at, af, ab)
    assert recovered.residual < 1e-10
    true = sp.vstack(rows).toarray()
    # the leak: G_j b / h_j is the exact ln t row (docs/protocol.md, "What each role sees")
    np.testing.assert_allclose(reconstruct_rows(recovered, B), true, atol=1e-8)
    # and the transformed problem has the original optimum
    c = np.arange(1, 10, dtype=float)
    keep = np.flatnonzero(true.any(axis=0))
    original = solve(Conditions(sp.csr_matrix(true[:, keep]), np.full(13, B), c[keep]), "max-output")
    transformed = solve(Conditions(sp.csr_matrix(recovered.G[:, keep]), recovered.h, c[keep]), "max-output")
    assert transformed.lp_objective == pytest.approx(original.lp_objective, rel=1e-8)


def test_broken_transformed_problems_are_refused() -> None:
    rng = np.random.default_rng(2)
    rows = party_rows(rng, [3, 3], 5)
    at, af, ab = summed(rows, 8, rng)
    with pytest.raises(ValueError, match="rank"):
        eliminate_slacks(at, np.hstack([af[:, :5], af[:, :1]]), ab)
    with pytest.raises(ValueError, match="inconsistent"):
        eliminate_slacks(at + rng.normal(size=at.shape), af, ab)
    with pytest.raises(ValueError, match="negative"):
        eliminate_slacks(-at, af, ab)


def test_shares_fit_the_public_packing_bounds() -> None:
    """|A_k T_k| <= A_CLIP (ln c_max + 1) whenever the rows are ln t rows of real counts."""
    rng = np.random.default_rng(3)
    counts = sp.csr_matrix(rng.integers(0, 4, size=(30, 12)))
    totals = np.asarray(counts.sum(axis=0)).ravel() + 1  # another party holds one more
    from cels.mechanism.conditions import log_t_rows

    rows = log_t_rows(counts, totals)
    share = transform_constraints(rows, B, 45, rng)
    at_bound, af_bound, ab_bound = share_bounds(int(totals.max()), B, 30)
    assert np.abs(share.at).max() <= at_bound
    assert np.abs(share.af).max() <= af_bound and np.abs(share.ab).max() <= ab_bound
    key, _ = paillier.generate_keypair(256, allow_insecure_key_bits=True)
    packing = fixed_point_packing(key, at_bound, summands=5)
    assert packing.scale_bits == 32 and packing.offset * 5 < 2**62


def test_the_solver_reconstructs_every_private_row_in_a_real_session() -> None:
    shown = demonstrate(
        synthetic_log(seed=5, users=30), 3, epsilon=8.0, delta=0.9, objective="max-output", key_bits=256, group_bits=1024,
        allow_insecure_key_bits=True,
    )  # fmt: skip
    assert shown["constraint_rows"] > 0
    assert shown["max_abs_error_ln_t"] < 1e-6
    assert shown["counts_recovered_exactly"]
