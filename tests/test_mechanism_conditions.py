"""Privacy conditions: the EDBT Fig. 1 known answers and exact pruning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from cels.logs.model import SearchLog
from cels.mechanism.conditions import (
    Conditions,
    apply_cap,
    build_conditions,
    log_t_rows,
    privacy_bound,
    prune_dominated,
    unique_pairs,
)
from cels.mechanism.examples import figure1_log
from cels.mechanism.solvers import feasible, max_output_lp

LN_T = np.array(
    [
        [1.386294, 0.485508, 0.0],
        [0.0, 0.197826, 0.336472],
        [0.287682, 0.572519, 1.252763],
    ]
)


def test_privacy_bound_cels_and_edbt():
    assert privacy_bound(1.0, 0.01) == pytest.approx(-math.log(0.99))
    assert privacy_bound(1.0, 0.9) == pytest.approx(0.5)
    assert privacy_bound(1.0, 0.9, "edbt") == pytest.approx(1.0)
    assert privacy_bound(2.0, 1 - math.exp(-1)) == pytest.approx(1.0)


@pytest.mark.parametrize("eps,delta", [(0, 0.1), (-1, 0.1), (1, 0), (1, 1), (1, 1.5), (float("nan"), 0.1)])
def test_privacy_bound_rejects_bad_parameters(eps, delta):
    with pytest.raises(ValueError):
        privacy_bound(eps, delta)


def test_figure1_unique_pairs_and_ln_t_table():
    log = figure1_log()
    assert list(np.flatnonzero(unique_pairs(log.counts))) == [0, 3]  # pregnancy, diabetes
    cond, var_pairs = build_conditions(log, 1.0, prune=False)
    assert list(var_pairs) == [1, 2, 4]  # book, google, car
    np.testing.assert_allclose(cond.G.toarray(), LN_T, atol=5e-7)
    np.testing.assert_array_equal(cond.c, [4, 39, 7])


def test_figure1_pruning_drops_dominated_user():
    cond, _ = build_conditions(figure1_log(), 1.0)
    # user 082 (0, .197826, .336472) is dominated by 083
    np.testing.assert_allclose(cond.G.toarray(), LN_T[[0, 2]], atol=5e-7)


def test_log_t_rows_against_global_totals_and_rejects_unique():
    local = sp.csr_matrix(np.array([[1, 2]]))
    rows = log_t_rows(local, np.array([4, 3]))
    np.testing.assert_allclose(rows.toarray(), [[math.log(4 / 3), math.log(3)]])
    with pytest.raises(ValueError, match="unique"):
        log_t_rows(local, np.array([1, 3]))


def test_cap_applies_per_cell():
    capped = apply_cap(sp.csr_matrix(np.array([[5, 1], [2, 0]])), 2)
    np.testing.assert_array_equal(capped.toarray(), [[2, 1], [2, 0]])


def test_conditions_reject_nonpositive_rhs():
    with pytest.raises(ValueError):
        Conditions(sp.csr_matrix(np.ones((1, 2))), np.array([0.0]), np.ones(2))


small_logs = st.integers(2, 7).flatmap(
    lambda m: st.integers(1, 6).flatmap(
        lambda n: st.lists(st.lists(st.integers(0, 4), min_size=n, max_size=n), min_size=m, max_size=m)
    )
)


def _log(matrix) -> SearchLog:
    counts = sp.csr_matrix(np.array(matrix, dtype=np.int64))
    return SearchLog([f"u{j}" for j in range(counts.shape[0])], [(f"q{i}", "u") for i in range(counts.shape[1])], counts)


@settings(max_examples=60, deadline=None)
@given(small_logs, st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=8, max_size=8))
def test_pruning_preserves_the_feasible_set(matrix, points):
    log = _log(matrix)
    full, var_pairs = build_conditions(log, 1.0, prune=False)
    pruned, _ = build_conditions(log, 1.0)
    assert pruned.G.shape[0] <= full.G.shape[0]
    for point in points:
        x = np.array(point[: len(var_pairs)], dtype=np.int64)
        assert feasible(full, x) == feasible(pruned, x)
    if len(var_pairs):
        assert max_output_lp(full)[0] == pytest.approx(max_output_lp(pruned)[0], rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=20, max_size=20), min_size=2, max_size=30))
def test_sparse_and_dense_pruning_agree(matrix):
    """The wide-matrix path (> 256 columns) finds the same maximal rows as the dense one."""
    dense = sp.csr_matrix(np.array(matrix, dtype=np.float64))
    wide = sp.hstack([dense, sp.csr_matrix((dense.shape[0], 300))]).tocsr()
    a = prune_dominated(dense).toarray()
    b = prune_dominated(wide).toarray()[:, :20]
    assert sorted(map(tuple, a)) == sorted(map(tuple, b))
    # no kept row is dominated by another kept row; every input row is dominated by a kept one
    for r in range(len(a)):
        others = np.delete(a, r, axis=0)
        assert not (others >= a[r]).all(axis=1).any()
    for row in np.array(matrix, dtype=np.float64):
        assert not row.any() or (a >= row).all(axis=1).any()
