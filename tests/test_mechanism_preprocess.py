"""App. C preprocessing: after it, no remaining user moves the optimal counts by more than d in
L1 (Lap(d/eps') per pair is eps'-DP only for an L1 sensitivity d)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from cels.logs.model import SearchLog
from cels.mechanism.conditions import build_conditions
from cels.mechanism.preprocess import preprocess
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.mechanism.solvers import solve


def counts_of(log: SearchLog) -> tuple[np.ndarray, np.ndarray]:
    cond, var_pairs = build_conditions(log, 2.0)
    x = np.zeros(log.n_pairs)
    if cond.n:
        x[var_pairs] = solve(cond, "max-output", integer="greedy").x
    return x, var_pairs


def random_log(seed: int) -> SearchLog:
    rng = np.random.default_rng(seed)
    dense = rng.integers(0, 4, size=(9, 6)) * (rng.random((9, 6)) < 0.5)
    dense[0] = [9, 0, 0, 9, 0, 0]  # a heavy user
    return SearchLog([f"u{j}" for j in range(9)], [(f"q{i}", "") for i in range(6)], sp.csr_matrix(dense))


@pytest.mark.parametrize("seed", [0, 3, 6])  # 3 and 6 keep a user moving two counts by 1 under a per-pair check
def test_remaining_users_move_counts_by_at_most_d_in_l1(seed):
    log = random_log(seed)
    d = 1
    kept, info = preprocess(log, counts_of, d, progress=False)
    assert kept.n_users == log.n_users - info["dropped_users"]
    x, _ = counts_of(kept)
    for j in range(kept.n_users):
        without, _ = counts_of(kept.select_users(np.delete(np.arange(kept.n_users), j)))
        assert np.abs(without - x).sum() <= d


def test_large_d_drops_nobody_and_sanitize_reports_it():
    log = random_log(0)
    kept, info = preprocess(log, counts_of, 10_000, progress=False)
    assert info["dropped_users"] == 0 and kept.n_users == log.n_users
    params = SanitizeParams(epsilon=4, delta=0.9, noise_epsilon=1, sensitivity=2, preprocess=True, objective="max-output", seed=1)
    _, report = sanitize(log, params, progress=False)
    assert report["solver"]["integer_method"] == "greedy" != report["solver"]["integer_requested"]  # the time-limited MIP is not a function of D
    assert report["preprocess"]["solves"] >= 1 and "bounded in L1 by App. C" in report["privacy"]["against_recipients"]
