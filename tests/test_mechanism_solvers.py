"""Solvers: EDBT Fig. 1 known answers (O-UMP, D-UMP breakpoints) and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from cels.logs.model import SearchLog
from cels.mechanism.conditions import Conditions, build_conditions
from cels.mechanism.examples import figure1_log
from cels.mechanism.solvers import (
    INTEGER_METHODS,
    OBJECTIVES,
    feasible,
    greedy_fill,
    max_output_lp,
    repair,
    resolve_output_size,
    solve,
    spe,
)


def figure1(b: float) -> Conditions:
    return build_conditions(figure1_log(), b)[0]


def test_oump_lp_figure1_is_linear_in_b():
    for b in (0.01, 1.0, math.log(2), 7.5):
        value, x = max_output_lp(figure1(b))
        assert value == pytest.approx(1.8128574 * b, rel=1e-7)
        np.testing.assert_allclose(x, [0.1330432 * b, 1.6798142 * b, 0.0], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("b,expected", [(math.log(2), [0, 1, 0]), (math.log(20), [0, 5, 0])])
def test_oump_floor_figure1(b, expected):
    sol = solve(figure1(b), "max-output", integer="floor")
    np.testing.assert_array_equal(sol.x, expected)
    if b == math.log(2):
        np.testing.assert_allclose(sol.x_lp, [0.092219, 1.164358, 0.0], atol=5e-7)


@pytest.mark.parametrize(
    "b,optimum",
    [(0.5725, 0), (0.57252, 1), (1.5404, 1), (1.54045, 2), (2.11296, 2), (2.11297, 3)],
)
def test_dump_breakpoints_figure1(b, optimum):
    sol = solve(figure1(b), "diversity", integer="mip", time_limit=5)
    assert sol.integer_total == optimum
    assert feasible(figure1(b), sol.x)
    if b == 1.54045:  # below 1.825 only {book, car} fits
        np.testing.assert_array_equal(sol.x, [1, 0, 1])


def test_spe_is_feasible_and_repaired():
    for b in (0.3, 0.6, 1.6, 2.2, 5.0):
        cond = figure1(b)
        y = spe(cond)
        assert feasible(cond, y) and set(np.unique(y)) <= {0, 1}
    assert spe(figure1(2.2)).sum() == 3


def test_figure1_sampling_counts_need_b_17_32():
    cond = figure1(17.32)
    x = np.array([3, 20, 4])
    assert not feasible(cond, x)
    assert feasible(figure1(17.33), x)


def test_output_size_rule_and_errors():
    assert resolve_output_size(0.5, 10.0) == 5.0
    assert resolve_output_size(7, 10.0) == 7.0
    assert resolve_output_size(1, 10.0) == 10.0
    with pytest.raises(ValueError, match="exceeds the maximum"):
        resolve_output_size(11, 10.0)
    with pytest.raises(ValueError):
        resolve_output_size(0, 10.0)


def test_kl_piecewise_gap_shrinks_with_breakpoints():
    rng = np.random.default_rng(3)
    counts = sp.csr_matrix(rng.integers(0, 6, size=(12, 10)) * (rng.random((12, 10)) < 0.6))
    log = SearchLog([str(j) for j in range(12)], [(str(i), "") for i in range(10)], counts)
    cond, _ = build_conditions(log, 2.0)
    gaps = [solve(cond, "kl", output_size=0.8, breakpoints=k, integer="floor").extras["kl_piecewise_gap"] for k in (2, 3, 5, 9, 17, 33)]
    assert all(g >= -1e-7 for g in gaps)
    assert all(a >= b - 1e-7 for a, b in zip(gaps, gaps[1:])), gaps
    assert gaps[-1] < 0.05 * gaps[0]


def test_greedy_fill_and_repair_keep_conditions():
    cond = figure1(3.0)
    x = greedy_fill(cond, np.zeros(3, dtype=np.int64), lambda x: np.ones(3))
    assert feasible(cond, x) and not any(feasible(cond, x + np.eye(3, dtype=np.int64)[i]) for i in range(3))
    fixed = repair(cond, np.array([10, 10, 10]))
    assert feasible(cond, fixed) and np.all(fixed <= 10) and np.all(fixed >= 0)


def test_frequent_objective_targets_supports():
    cond = figure1(5.0)
    sol = solve(cond, "frequent", output_size=0.5, support=0.1, integer="greedy")
    assert sol.extras["frequent_pairs"] == 2  # google 39/50, car 7/50 (book 4/50 < 0.1)
    assert feasible(cond, sol.x) and sol.integer_total <= math.floor(sol.output_size + 1e-9)
    assert sol.lp_objective >= 0


def test_bad_objective_and_integer_method():
    with pytest.raises(ValueError):
        solve(figure1(1.0), "nope")
    with pytest.raises(ValueError):
        solve(figure1(1.0), "kl", integer="round")


def test_scaled_permuted_rows_give_the_same_solution():
    """The distributed solver passes rows scaled by unknown positive factors, columns permuted."""
    cond = figure1(4.0)
    scale = np.array([3.0, 0.25])
    perm = np.array([2, 0, 1])
    moved = Conditions(sp.diags(scale) @ cond.G[:, perm], cond.h * scale, cond.c[perm])
    for objective in OBJECTIVES:
        a = solve(cond, objective, integer="greedy")
        b = solve(moved, objective, integer="greedy")
        assert a.lp_objective == pytest.approx(b.lp_objective, rel=1e-6)
        assert a.max_output_lp == pytest.approx(b.max_output_lp, rel=1e-9)
        assert feasible(moved, b.x)


small_logs = st.integers(2, 6).flatmap(
    lambda m: st.integers(1, 5).flatmap(
        lambda n: st.lists(st.lists(st.integers(0, 5), min_size=n, max_size=n), min_size=m, max_size=m)
    )
)


@settings(max_examples=25, deadline=None)
@given(small_logs, st.floats(0.05, 3.0), st.sampled_from(OBJECTIVES), st.sampled_from(INTEGER_METHODS))
def test_solver_invariants(matrix, b, objective, integer):
    counts = sp.csr_matrix(np.array(matrix, dtype=np.int64))
    log = SearchLog([str(j) for j in range(counts.shape[0])], [(str(i), "") for i in range(counts.shape[1])], counts)
    full, var_pairs = build_conditions(log, b, prune=False)
    cond, _ = build_conditions(log, b)
    if cond.n == 0:
        return
    sol = solve(cond, objective, integer=integer, time_limit=2)
    assert feasible(full, sol.x), "output breaks a condition of an (unpruned) user"
    assert sol.x.dtype == np.int64 and np.all(sol.x >= 0)
    u = b / full.G.toarray().max(axis=0)
    assert np.all(sol.x <= u + 1e-9) and np.all(sol.x_lp <= u * (1 + 1e-7) + 1e-9)
    assert sol.max_output_lp <= b * log.size + 1e-9
    doubled = max_output_lp(build_conditions(log, 2 * b)[0])[0]
    assert doubled == pytest.approx(2 * sol.max_output_lp, rel=1e-6, abs=1e-9)
    floor = solve(cond, objective, integer="floor")
    if objective in ("max-output", "diversity"):
        assert sol.integer_total >= floor.integer_total


def test_a_mip_stopped_at_its_time_limit_says_so_with_its_gap(caplog):
    """The max-output MIP used to stop at its time limit without a word (issue 23)."""
    rng = np.random.default_rng(1)
    G = sp.random(120, 300, density=0.3, random_state=rng, data_rvs=lambda n: rng.uniform(0.05, 1.0, n)).tocsr()
    cond = Conditions(G, np.full(120, 3.7), np.ones(300))
    with caplog.at_level("WARNING", logger="cels.mechanism.solvers"):
        sol = solve(cond, "max-output", time_limit=0.2)
    summary = sol.summary()
    assert summary["mip_status"] == "time limit" and summary["mip_time_limit"] == 0.2 and summary["mip_gap"] > 0
    assert f"the MIP stopped at its time limit of 0.2 s, not at the optimum (MIP gap {summary['mip_gap']:.2%})" in caplog.text
    assert solve(figure1(math.log(20)), "max-output", time_limit=5).summary()["mip_status"] == "optimal"
