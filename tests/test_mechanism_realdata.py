"""Known answers on the real logs (docs/mechanism.md, "Measured"), every condition checked."""

from __future__ import annotations

import numpy as np
import pytest

from cels.logs import LoadOptions, load_log
from cels.mechanism.conditions import apply_cap, build_conditions, log_t_rows, unique_pairs
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.mechanism.solvers import feasible, max_output_lp, solve

pytestmark = pytest.mark.realdata


@pytest.fixture(scope="module")
def aol(aol_path):
    return load_log(aol_path, LoadOptions(format="aol"))


def all_user_loads(log, x_pairs: np.ndarray, cap=None) -> np.ndarray:
    """sum_i x_i ln t_ij for EVERY user of the log (no pruning)."""
    counts = apply_cap(log.counts, cap)
    totals = np.asarray(counts.sum(axis=0)).ravel()
    released = np.flatnonzero(x_pairs)
    assert not unique_pairs(counts, totals)[released].any()
    return log_t_rows(counts[:, released], totals[released]) @ x_pairs[released]


def test_aol_slice_lp_bound_and_integer_counts(aol):
    cond, var_pairs = build_conditions(aol, 1.0)
    assert len(var_pairs) == 2849
    assert max_output_lp(cond)[0] == pytest.approx(382.6, abs=0.1)
    floor = solve(cond, "max-output", integer="floor")
    assert floor.integer_total == 192
    greedy = solve(cond, "max-output", integer="greedy")
    assert greedy.integer_total >= 0.7 * greedy.max_output_lp
    x = np.zeros(aol.n_pairs)
    x[var_pairs] = greedy.x
    assert np.all(all_user_loads(aol, x) <= 1.0)


def test_aol_sanitize_end_to_end_keeps_every_condition(aol):
    params = SanitizeParams(epsilon=2.0, delta=1 - np.exp(-1.0), objective="kl", output_size=0.5, integer="greedy", seed=3)
    out, report = sanitize(aol, params, progress=False)
    assert report["privacy"]["b"] == pytest.approx(1.0)
    assert report["solver"]["integer_ratio"] >= 0.7
    # the release, mapped back to input pairs, satisfies every user's condition
    index = {p: i for i, p in enumerate(aol.pairs)}
    x = np.zeros(aol.n_pairs)
    for i, total in zip([index[p] for p in out.pairs], np.asarray(out.counts.sum(axis=0)).ravel()):
        x[i] = total
    assert x.sum() == report["solver"]["integer_total"] == out.size
    assert np.all(all_user_loads(aol, x) <= 1.0)
    assert not set(out.users) & set(aol.users)
    assert 0 < report["utility"]["recall"] < 1 and report["utility"]["kl"] > 0


def test_msnbc_pruning_and_cap(msnbc_path):
    first = load_log(msnbc_path, LoadOptions(format="msnbc", max_users=40_829))
    assert first.size == 200_009
    cond, _ = build_conditions(first, 0.1)
    assert cond.G.shape[0] == 32
    sub = first.select_users(np.arange(20_000))
    plain, _ = build_conditions(sub, 0.1)
    capped, capped_pairs = build_conditions(sub, 0.1, cap=1)
    assert round(max_output_lp(plain)[0]) == 26
    assert round(max_output_lp(capped)[0]) == 642
    sol = solve(capped, "max-output", integer="greedy")
    assert sol.integer_total >= 0.9 * sol.max_output_lp
    x = np.zeros(sub.n_pairs)
    x[capped_pairs] = sol.x
    assert np.all(all_user_loads(sub, x, cap=1) <= 0.1)
    assert feasible(capped, sol.x)
