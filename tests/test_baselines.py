"""Behaviour of the baseline sanitizers on small hand-made logs: invariants and noise statistics.

Statistical checks compare an observed frequency with the exact discrete-Laplace probability
(:func:`discrete_retention_probability`) and allow 4.5 binomial standard deviations (a false
alarm about once in 150,000 runs).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import pytest

from cels.baselines import BASELINES, ReleasedItem, baseline_rng, read_release, write_release
from cels.baselines.clicks import click_candidates, load_candidate_file, navigational_url, parse_candidates
from cels.baselines.items import distinct_items, limit_user_activity, user_histories
from cels.baselines.korolova import korolova
from cels.baselines.params import discrete_retention_probability
from cels.baselines.pool import domain_size, draw_query_pool, inclusion_probability, pool_words
from cels.baselines.safelog import release_transitions, safelog, transition_threshold
from cels.baselines.sampling import zero_count_survivors
from cels.baselines.zealous import choose_items, zealous
from cels.logs.records import LogError, LogRecord


def within_binomial(hits: int, trials: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(hits - trials * p) <= sigmas * math.sqrt(trials * p * (1 - p)) + 1


def records_of(rows: list[tuple[str, str, str | None]]) -> list[LogRecord]:
    return [LogRecord(u, q, url, 1, n) for n, (u, q, url) in enumerate(rows, start=1)]


def crowd(items: int, users_per_item: int, prefix: str = "q") -> list[LogRecord]:
    """``items`` queries, each posed (and clicked) by its own ``users_per_item`` users."""
    rows = [
        (f"{prefix}{k}-u{i}", f"{prefix} {k}", f"http://{prefix}{k}.example/")
        for k in range(items)
        for i in range(users_per_item)
    ]
    return records_of(rows)


def parsed(method: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-3)
    BASELINES[method].add_arguments(parser.add_argument_group(method))
    return parser.parse_args(list(argv))


# ----------------------------------------------------------------------------- ZEALOUS


def test_zealous_users_contribute_at_most_m_of_their_own_items():
    rows = [(f"u{j}", f"query {j % 7} {i}", f"http://x/{i}") for j in range(40) for i in range(j % 9)]
    histories = user_histories(records_of(rows))
    for first in (False, True):
        chosen = choose_items(histories, "query", 3, baseline_rng(5), first)
        for user, items in chosen.items():
            own = distinct_items(histories[user], "query")
            assert len(items) == min(3, len(own)) == len(set(items))
            assert set(items) <= set(own)
            if first:
                assert items == own[:3]


def test_zealous_random_choice_is_uniform():
    histories = user_histories(records_of([("u", f"q{i}", None) for i in range(4)]))
    picks = Counter()
    rng = baseline_rng(11)
    for _ in range(4000):
        picks.update(choose_items(histories, "query", 1, rng)["u"])
    assert all(within_binomial(n, 4000, 0.25) for n in picks.values())


def test_zealous_never_releases_an_item_below_tau():
    # tau' far below tau and large noise: only the first threshold keeps rare items out
    records = crowd(300, 2, "rare") + crowd(300, 6, "common")
    released, histogram = zealous(
        user_histories(records), "query", 1, tau=5, lam=20.0, tau_prime=-1000, rng=baseline_rng(1)
    )
    assert {histogram[i.key] for i in released} == {6}
    assert len(released) == 300


@pytest.mark.parametrize(("users", "lam", "tau_prime"), [(2, 1.0, 3), (3, 1.0, 3), (4, 1.0, 3), (12, 4.0, 14)])
def test_zealous_retention_follows_the_discrete_formula(users, lam, tau_prime):
    trials = 1500
    released, _ = zealous(user_histories(crowd(trials, users)), "click", 1, 1, lam, tau_prime, baseline_rng(2))
    p = discrete_retention_probability(users, tau_prime, lam)
    assert within_binomial(len(released), trials, p)
    assert all(i.count > tau_prime for i in released)


def test_zealous_run_splits_the_budget_over_item_types():
    records = crowd(50, 30)
    items, report = BASELINES["zealous"].run(
        records, parsed("zealous", "--zealous-items", "query,click,keyword"), baseline_rng(3)
    )
    per_kind = report["privacy"]["per_kind"]
    assert sum(p["epsilon"] for p in per_kind.values()) == pytest.approx(1.0)
    assert sum(p["delta"] for p in per_kind.values()) == pytest.approx(1e-3)
    assert report["privacy"]["delta_run"] <= 1e-3
    assert {i.kind for i in items} <= {"query", "click", "keyword"}
    for kind, params in per_kind.items():
        assert all(i.count > params["tau_prime_run"] for i in items if i.kind == kind)
    with pytest.raises(ValueError, match="unknown item type"):
        BASELINES["zealous"].run(records, parsed("zealous", "--zealous-items", "urls"), baseline_rng(3))


def test_query_pairs_are_consecutive_distinct_queries():
    history = records_of([("u", "a", "x"), ("u", "a", "y"), ("u", "b", None), ("u", "a", None)])
    assert distinct_items(history, "query_pair") == [("query_pair", "a", None, "b"), ("query_pair", "b", None, "a")]
    assert [k[1] for k in distinct_items(history, "keyword")] == ["a", "b"]


# ----------------------------------------------------------------------------- Korolova et al.


def test_user_activity_limits():
    rows = [("u1", f"q{i}", f"http://{i}/" if i % 2 else None) for i in range(10)] + [("u2", "q0", "http://0/")]
    queries, clicks, moves = limit_user_activity(user_histories(records_of(rows)), 4, 2)
    assert queries == Counter({"q0": 2, "q1": 1, "q2": 1, "q3": 1})
    assert clicks == Counter({("q1", "http://1/"): 1, ("q3", "http://3/"): 1, ("q0", "http://0/"): 1})
    assert sum(moves.values()) == 3  # at most q_f - 1 transitions per user


def test_korolova_selection_probability():
    params = {"d": 1, "dc": 1, "K": 6.0, "K_run": 6, "b": 2.0, "bq": 1.0, "bc": 1.0}
    trials = 1200
    items, counts = korolova(user_histories(crowd(trials, 5)), params, "none", baseline_rng(8))
    assert within_binomial(counts["released_queries"], trials, discrete_retention_probability(5, 6, 2.0))
    assert {i.kind for i in items} == {"query"} and all(i.count >= 0 for i in items)


def test_korolova_run_defaults_meet_the_budget_and_candidates_are_flagged():
    records = crowd(20, 400)
    items, report = BASELINES["korolova"].run(records, parsed("korolova"), baseline_rng(4))
    privacy = report["privacy"]
    assert privacy["epsilon"] <= 1.0 + 1e-9 and privacy["delta"] <= 1e-3
    assert privacy["dp_claim"] is True
    queries = {i.query for i in items if i.kind == "query"}
    assert len(queries) == 20  # 400 users each: Pr[miss] = 1/2 e^{-277/15} per query
    assert all(i.query in queries for i in items if i.kind == "click")
    _, report = BASELINES["korolova"].run(
        records, parsed("korolova", "--korolova-candidates", "log-top:3"), baseline_rng(4)
    )
    assert report["privacy"]["dp_claim"] is False
    assert report["sizes"]["released_clicks"] >= 15  # the true urls, 400 clicks each


def test_click_candidates():
    assert navigational_url("google") == "http://www.google.com/"
    assert navigational_url("myspace.com") == "http://www.myspace.com/"
    assert navigational_url("www.ebay.com") == "http://www.ebay.com/"
    assert navigational_url("?!") is None
    for bad in ("log-top:0", "file:", "top"):
        with pytest.raises(ValueError, match="click candidates"):
            parse_candidates(bad)
    log = Counter({("a", "http://1/"): 5, ("a", "http://2/"): 9, ("b", "http://3/"): 1})
    urls, dp = click_candidates("log-top:1", ["a"], log)
    assert (urls, dp) == ({"a": ["http://2/"]}, False)


def test_candidate_file(tmp_path):
    path = tmp_path / "cands.tsv"
    path.write_text("Google \thttp://www.google.com/\ngoogle\thttp://mail.google.com/\n", encoding="utf-8")
    assert load_candidate_file(str(path)) == {"google": ["http://www.google.com/", "http://mail.google.com/"]}
    urls, dp = click_candidates(f"file:{path}", ["google", "yahoo"], Counter())
    assert dp is True and list(urls) == ["google"]
    path.write_text("google\thttp://a/\nyahoo\n", encoding="utf-8")
    with pytest.raises(LogError) as err:
        load_candidate_file(str(path))
    assert err.value.line == 2 and str(path) in str(err.value)


# ----------------------------------------------------------------------------- Safelog


def test_query_pool_is_drawn_from_the_word_list_afresh():
    words = set(pool_words(500))
    pool = draw_query_pool(2000, baseline_rng(1), vocabulary=500, max_n=2)
    assert len(pool) > 1990
    assert all(1 <= len(q.split()) <= 2 and set(q.split()) <= words for q in pool)
    assert draw_query_pool(2000, baseline_rng(1), 500, 2) == pool
    assert len(pool & draw_query_pool(2000, baseline_rng(2), 500, 2)) < 20
    assert domain_size(500, 2) == 500 + 500**2
    assert inclusion_probability(2000, 500, 2) == pytest.approx(1 - (1 - 1 / 250_500) ** 2000, rel=1e-9)


def test_zero_count_survivors_follow_the_tail_probability():
    p = discrete_retention_probability(0, 10, 10.0)
    rng = baseline_rng(9)
    runs = [zero_count_survivors(2000, 10, 10.0, rng) for _ in range(10)]
    assert within_binomial(sum(map(len, runs)), 20000, p)
    assert all(len(set(r)) == len(r) and all(0 <= i < 2000 for i in r) for r in runs)


def test_safelog_pool_queries_appear_at_the_release_probability():
    params = {"qf": 2, "cf": 1, "K": 10.0, "K_run": 10, "b": 10.0, "bq": 10.0, "bc": 10.0}
    pool = draw_query_pool(20000, baseline_rng(3), vocabulary=2000, max_n=2)
    histories = user_histories(crowd(30, 1))
    items, counts = safelog(histories, params, 1, pool, "none", baseline_rng(4))
    released_pool = [i for i in items if i.query in pool]
    assert len(released_pool) == counts["released_pool_queries"]
    assert within_binomial(
        counts["released_pool_queries"], counts["pool_queries_not_in_log"], discrete_retention_probability(0, 10, 10.0)
    )


def test_safelog_prefilter_and_transitions():
    rows = [(f"u{j}", q, None) for j in range(40) for q in ("alpha", "beta", "gamma")] + [("v", "rare", None)]
    params = {"qf": 3, "cf": 0, "K": 5.0, "K_run": 5, "b": 1.0, "bq": 1.0, "bc": 1.0, "bt": 1.0}
    items, counts = safelog(user_histories(records_of(rows)), params, 5, set(), "none", baseline_rng(5), transitions=True)
    assert "rare" not in {i.query for i in items}
    assert counts["queries_after_prefilter"] == 3
    pairs = {(i.query, i.next_query) for i in items if i.kind == "query_pair"}
    assert {("alpha", "beta"), ("beta", "gamma")} <= pairs


def test_transition_threshold_expects_about_one_noise_row():
    for n, bt in [(10**6, 4.0), (5000, 16.0), (30, 1.0)]:
        k = transition_threshold(n, bt)
        assert n * discrete_retention_probability(0, k, bt) <= 1
        assert k == 0 or n * discrete_retention_probability(0, k - 1, bt) > 1


def test_noise_only_transitions_are_released_at_the_tail_rate():
    released = [f"q{i}" for i in range(60)]
    rows = release_transitions(released, Counter({("q0", "q1"): 1000}), 3.0, 4, baseline_rng(6))
    fake = [r for r in rows if (r.query, r.next_query) != ("q0", "q1")]
    assert within_binomial(len(fake), 60 * 59 - 1, discrete_retention_probability(0, 4, 3.0))
    assert all(r.query != r.next_query and r.count > 4 for r in fake)
    assert ("q0", "q1") in {(r.query, r.next_query) for r in rows}


def test_safelog_run_report():
    records = crowd(10, 60)
    items, report = BASELINES["safelog"].run(
        records, parsed("safelog", "--safelog-pool-size", "3000", "--safelog-transitions"), baseline_rng(7)
    )
    privacy = report["privacy"]
    assert privacy["epsilon"] == pytest.approx(1.0)
    assert privacy["epsilon_with_transitions"] - privacy["epsilon_without_transitions"] == pytest.approx(
        4 / privacy["bt"]
    )
    assert privacy["dp_claim"] is False  # tau = 5 pre-filter is outside the proof
    assert privacy["pool"]["p_g"] < 1e-6 and privacy["pool"]["epsilon_at_pool_p_g"] > privacy["epsilon"]
    assert set(report["utility"]) == {"query", "click", "query_pair"}
    _, report = BASELINES["safelog"].run(
        records, parsed("safelog", "--safelog-tau", "1", "--safelog-pool-size", "10"), baseline_rng(7)
    )
    assert report["privacy"]["dp_claim"] is True


# ----------------------------------------------------------------------------- release file


def test_release_round_trip_and_errors(tmp_path):
    items = [
        ReleasedItem("keyword", "car", None, None, 3),
        ReleasedItem("query", "used car", None, None, 0),
        ReleasedItem("click", "used car", "http://cars.example/", None, 12),
        ReleasedItem("query_pair", "car", None, "used car", 7),
    ]
    path = tmp_path / "out.tsv"
    write_release(items, path)
    assert path.read_text(encoding="utf-8").splitlines()[0] == "type\tquery\turl\tnext_query\tcount"
    assert read_release(path) == items
    with pytest.raises(LogError) as err:
        write_release([ReleasedItem("query", "a\tb")], path)
    assert (err.value.line, err.value.field) == (2, "query")
    assert read_release(path) == items  # the failed write left the old file alone
    path.write_text("type\tquery\turl\tnext_query\tcount\nquery\tx\t\t\tmany\n", encoding="utf-8")
    with pytest.raises(LogError) as err:
        read_release(path)
    assert (err.value.line, err.value.field) == (2, "count")


def test_utility_report_known_answer():
    from cels.baselines.utility import item_utility

    totals = Counter({("query", "a", None, None): 3, ("query", "b", None, None): 1})
    released = [ReleasedItem("query", "a", None, None, 3), ReleasedItem("query", "pool words", None, None, 2)]
    report = item_utility(released, totals)
    # CELS eq. 2 over the log's items: |O| = 3, n = 2
    kl = 0.75 * math.log(0.75 * 5 / 4) + 0.25 * math.log(0.25 * 5 / 1)
    assert report["kl"] == pytest.approx(kl)
    assert (report["recall"], report["released_not_in_log"], report["top_100"]["coverage"]) == (0.5, 1, 0.5)
