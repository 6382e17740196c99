"""Every baseline on the real AOL slice (500 users): the invariants of its release."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from cels.baselines import BASELINES, baseline_rng, read_release, write_release
from cels.baselines.items import item_totals, user_histories
from cels.baselines.pool import pool_words
from cels.logs import LoadOptions, iter_records


@pytest.fixture(scope="module")
def aol_records(aol_path):
    return list(iter_records(aol_path, LoadOptions(format="aol")))


def run(method: str, records, *argv: str):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epsilon", type=float, default=2.0)  # 500 users: small budgets release nothing
    parser.add_argument("--delta", type=float, default=1e-3)
    BASELINES[method].add_arguments(parser.add_argument_group(method))
    return BASELINES[method].run(records, parser.parse_args(list(argv)), baseline_rng(None))


@pytest.mark.realdata
def test_baselines_on_aol(aol_records, tmp_path):
    histories = user_histories(aol_records)
    assert len(histories) == 500

    items, report = run("zealous", aol_records, "--zealous-items", "query,click", "--zealous-m", "1")
    assert report["sizes"]["users"] == 500 and report["privacy"]["delta_run"] <= 1e-3
    for kind in ("query", "click"):
        params = report["privacy"]["per_kind"][kind]
        users_with = Counter(k for h in histories.values() for k in set(item_totals({"u": h}, kind)))
        for item in (i for i in items if i.kind == kind):
            assert item.count > params["tau_prime_run"]
            assert users_with[item.key] >= params["tau"]  # only items held by >= tau users survive
        assert report["sizes"]["per_kind"][kind]["distinct_items_chosen"] <= 500  # m = 1 item per user

    items, report = run("korolova", aol_records, "--epsilon", "10", "--korolova-d", "3", "--korolova-dc", "3")
    log_queries = item_totals(histories, "query")
    assert report["privacy"]["epsilon"] <= 10.0 + 1e-9 and report["privacy"]["delta"] <= 1e-3
    released = {i.query for i in items if i.kind == "query"}
    assert released and all(("query", q, None, None) in log_queries for q in released)
    assert all(i.query in released and i.count > 0 for i in items if i.kind == "click")
    assert report["sizes"]["distinct_queries_kept"] <= 3 * 500

    items, report = run("safelog", aol_records, "--safelog-pool-size", "20000", "--safelog-transitions")
    privacy, sizes = report["privacy"], report["sizes"]
    assert privacy["epsilon"] == pytest.approx(2.0) and privacy["dp_claim"] is False
    words = set(pool_words(5000))
    queries = [i for i in items if i.kind == "query"]
    assert len(queries) == sizes["released_log_queries"] + sizes["released_pool_queries"]
    for item in queries:
        assert ("query", item.query, None, None) in log_queries or set(item.query.split()) <= words
    assert sizes["released_pool_queries"] > 0
    path = tmp_path / "safelog.tsv"
    write_release(items, path)
    assert read_release(path) == items
