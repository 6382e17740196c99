"""The private solve's greedy (cels.mechanism.greedy): the spec's known answers on the AOL
slice, feasibility for every objective, utility against the central optimum, and the
simulator: the transcript is a function of the final x."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from cels.logs import LoadOptions, load_log, synthetic_log
from cels.mechanism.conditions import build_conditions
from cels.mechanism.greedy import ProposalRule, central_run, replay
from cels.mechanism.sanitize import SanitizeParams, solve_with_params
from cels.mechanism.solvers import feasible


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(p.proposals, q.proposals) and np.array_equal(p.accepted, q.accepted) for p, q in zip(a, b))


@pytest.fixture(scope="module")
def aol(aol_path):
    cond, _ = build_conditions(load_log(aol_path, LoadOptions(format="aol")), 1.0)
    return cond


@pytest.mark.realdata
@pytest.mark.parametrize(("batch", "total", "distinct", "rounds"), [(64, 241, 200, 49), (1, 247, 201, 3096)])
def test_aol_known_answers(aol, batch, total, distinct, rounds) -> None:
    """The private-solve measurements on the AOL slice, b = 1, KL-gain rule (docs/protocol.md)."""
    rule = ProposalRule("kl", aol.c, batch=batch)
    x, transcript = central_run(rule, [aol.G], 1.0)
    assert (int(x.sum()), int(np.count_nonzero(x)), len(transcript)) == (total, distinct, rounds)
    assert feasible(aol, x)
    assert same(replay(rule, x), transcript)


@pytest.fixture(scope="module")
def msnbc(msnbc_path):
    cond, _ = build_conditions(load_log(msnbc_path, LoadOptions(format="msnbc", max_users=40_829)), 1.0)
    return cond


@pytest.mark.realdata
@pytest.mark.parametrize(("data", "total", "distinct", "rounds"), [("aol", 243, 188, 74), ("msnbc", 208, 7, 189)])
def test_max_output_known_answers(request, data, total, distinct, rounds) -> None:
    """The max-output rule (top band c_i >= max_A c / 2, deepened), B = 64, b = 1, on the AOL
    slice and MSNBC's first 40,829 users (docs/protocol.md: the KL-gain rule gave 241 and 27)."""
    cond = request.getfixturevalue(data)
    rule = ProposalRule("max-output", cond.c)
    x, transcript = central_run(rule, [cond.G], 1.0)
    assert (int(x.sum()), int(np.count_nonzero(x)), len(transcript)) == (total, distinct, rounds)
    assert feasible(cond, x)
    assert same(replay(rule, x), transcript)


def test_max_output_deepens_the_top_band_only() -> None:
    """c = (6, 10, 4, 1, 5): the band is c >= 5 (pairs 1, 0, 4), each proposed again while it is
    accepted; pair 2 enters once pair 1 has left A (band c >= 3), pair 3 only once every larger
    total has gone."""
    rule = ProposalRule("max-output", np.array([6.0, 10.0, 4.0, 1.0, 5.0]), batch=8)
    state = rule.start()
    assert list(rule.propose(state)) == [1, 0, 4]
    rule.update(state, np.array([1, 0, 4]), np.array([True, True, True]))
    assert list(rule.propose(state)) == [1, 0, 4]  # x does not lower a key: the band deepens
    rule.update(state, np.array([1, 0, 4]), np.array([False, True, True]))
    assert list(rule.propose(state)) == [0, 4, 2]  # 10 rejected: the band is now c >= 3
    rule.update(state, np.array([0, 4, 2]), np.array([False, False, False]))
    assert list(rule.propose(state)) == [3]


@pytest.mark.realdata
@pytest.mark.parametrize(("objective", "ratio"), [("kl", 0.9), ("max-output", 0.84)])
def test_aol_utility_against_the_central_optimum(aol, objective, ratio) -> None:
    """kl: at least 0.9 of central KL-UMP at output size 0.9 (241 vs 242).  max-output: the
    central MIP reaches 284-288 (272 in 5 s); no public proposal rule we measured passes 247
    (KL gain, B = 1); the top-band rule releases 243 (B = 64), 0.84-0.85 of it: 0.9 is not
    reached (docs/protocol.md)."""
    x, _ = central_run(ProposalRule(objective, aol.c), [aol.G], 1.0)
    size = 0.9 if objective == "kl" else None
    central = solve_with_params(aol, SanitizeParams(epsilon=2.0, delta=0.7, objective=objective, output_size=size, time_limit=5))
    assert x.sum() >= ratio * central.integer_total


def fill_in_order(cond, order) -> int:
    """sum x of the one-process greedy that fills each pair of ``order`` to its first rejection."""
    G, x, load = cond.G.tocsc(), np.zeros(cond.n, dtype=np.int64), np.zeros(cond.G.shape[0])
    for i in order:
        users, cost = G.indices[G.indptr[i] : G.indptr[i + 1]], G.data[G.indptr[i] : G.indptr[i + 1]]
        while len(users) and np.all(load[users] + cost <= cond.h[users] * (1 - 1e-9)):
            load[users] += cost
            x[i] += 1
    return int(x.sum())


@pytest.mark.realdata
def test_max_output_reaches_0_9_only_in_the_lp_order(aol) -> None:
    """Why the public rules measured stay below 0.9 of the max-output MIP (284-288, so >= 256-260)
    on the AOL slice: filling in an order that knows each pair's private costs stays at 242 / 246;
    only the LP relaxation's order, which needs every row, passes it (docs/protocol.md, "What
    reaching 0.9 takes")."""
    G = aol.G.tocsc()
    heaviest = fill_in_order(aol, np.argsort(G.max(axis=0).toarray().ravel(), kind="stable"))
    summed = fill_in_order(aol, np.argsort(np.asarray(G.sum(axis=0)).ravel(), kind="stable"))
    lp = linprog(-np.ones(aol.n), A_ub=G, b_ub=aol.h, method="highs")
    relaxed = fill_in_order(aol, np.argsort(-lp.x, kind="stable"))  # the LP's x, not its prices: the
    # dual optimum is not unique, and the price order moves with the HiGHS version (267 -> 252)
    assert (heaviest, summed) == (242, 246)
    assert relaxed >= 260


@pytest.mark.parametrize("objective", ["kl", "max-output", "frequent", "diversity"])
@pytest.mark.parametrize("parties", [1, 3])
def test_every_objective_stays_feasible_and_replays(objective, parties) -> None:
    log = synthetic_log(seed=5, users=80)
    cond, _ = build_conditions(log, np.log(10))
    shares = [cond.G[k::parties] for k in range(parties)]  # rows split over parties (users are disjoint)
    frequent = cond.c / cond.c.sum() >= np.median(cond.c / cond.c.sum()) if objective == "frequent" else None
    rule = ProposalRule(objective, cond.c, batch=8, frequent=frequent)
    x, transcript = central_run(rule, shares, np.log(10))
    assert x.sum() > 0 and feasible(cond, x)
    if objective == "diversity":
        assert x.max() == 1
    if objective == "frequent":
        assert not np.any(x[~frequent])
    assert same(replay(rule, x), transcript)


def test_an_absolute_size_stops_the_rounds() -> None:
    cond, _ = build_conditions(synthetic_log(seed=5, users=80), np.log(10))
    x, _ = central_run(ProposalRule("kl", cond.c, batch=8, size=13), [cond.G], np.log(10))
    assert x.sum() == 13


def test_replay_refuses_an_x_the_greedy_cannot_reach() -> None:
    cond, _ = build_conditions(synthetic_log(seed=5, users=80), np.log(10))
    frequent = cond.c / cond.c.sum() >= np.median(cond.c / cond.c.sum())
    rule = ProposalRule("frequent", cond.c, batch=8, frequent=frequent)
    x, _ = central_run(rule, [cond.G], np.log(10))
    x[np.flatnonzero(~frequent)[0]] = 1  # a pair the rule never proposes
    with pytest.raises(ValueError, match="not the outcome"):
        replay(rule, x)


@pytest.mark.parametrize("objective", ["kl", "max-output", "frequent", "diversity"])
def test_the_noise_pass_stays_feasible_below_its_target_and_replays(objective) -> None:
    """x'' lies between min(x, x') and x' = max(x + z, 0), keeps every condition, and its
    transcript is a function of (x, z, x'')."""
    cond, _ = build_conditions(synthetic_log(seed=6, users=80), np.log(10))
    shares = [cond.G[k::3] for k in range(3)]
    frequent = cond.c / cond.c.sum() >= np.median(cond.c / cond.c.sum()) if objective == "frequent" else None
    rule = ProposalRule(objective, cond.c, batch=8, frequent=frequent)
    x, _ = central_run(rule, shares, np.log(10))
    z = np.random.default_rng(3).integers(-3, 4, size=len(x))  # adds units under every rule (max-output: 2)
    target = np.maximum(x + z, 0)
    noisy, transcript = central_run(rule, shares, np.log(10), rule.noise_pass(x, z))
    assert feasible(cond, noisy)
    assert np.all(np.minimum(x, target) <= noisy) and np.all(noisy <= target)
    assert np.any(noisy > x), "no noise unit was added: the test does not exercise the rounds"
    assert same(replay(rule, noisy, rule.noise_pass(x, z)), transcript)


def test_zero_noise_leaves_x_as_it_is() -> None:
    cond, _ = build_conditions(synthetic_log(seed=5, users=80), np.log(10))
    rule = ProposalRule("kl", cond.c, batch=8)
    x, _ = central_run(rule, [cond.G], np.log(10))
    again, transcript = central_run(rule, [cond.G], np.log(10), rule.noise_pass(x, np.zeros_like(x)))
    assert np.array_equal(again, x) and transcript == []


@pytest.mark.parametrize("size", [0.9, 0, 2.5])
def test_a_fractional_output_size_is_refused_naming_the_flag(size) -> None:
    with pytest.raises(ValueError, match="--output-size .*--solve transformed"):
        ProposalRule("kl", np.ones(3), size=size)
