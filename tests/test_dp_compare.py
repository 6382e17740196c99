"""``cels experiment compare --release dp`` (cels.experiments.dp_compare): the DP histogram
against the sampled release, ZEALOUS and Korolova et al.; tiny inputs, and MSNBC for real."""

from __future__ import annotations

import csv
import json
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from cels.cli import main
from cels.crypto.streams import DrawKeys
from cels.experiments import common
from cels.experiments.dp_compare import DP_METHOD, Input, dp_row, primitive_release, protocol_release
from cels.logs.model import SearchLog
from cels.mechanism.dp_histogram import threshold
from tests.test_experiments import data  # noqa: F401 - the tiny data dir fixture, shared

COLUMNS = {
    "dataset", "users", "input_size", "pairs", "records", "epsilon", "delta", "b", "max_items", "method", "engine",
    "threshold", "released", "released_in_input", "recall_top100", "relative_error", "released_items_all",
    "min_released_count", "privacy_epsilon", "privacy_delta", "dp_claim", "user_level_rows", "seconds",
}  # fmt: skip




def test_compare_dp_table(data, tmp_path):
    argv = ["experiment", "compare", "--release", "dp", "--data", str(data), "--out", str(tmp_path), "--aol-users", "0",
            "--msnbc-users", "0", "--synthetic-users", "2000", "--budgets", "1:1e-6", "--max-items", "1,5", "-q"]  # fmt: skip
    assert main(argv) == 0
    with open(tmp_path / "compare.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        header, rows = set(reader.fieldnames or []), list(reader)
    assert COLUMNS <= header, COLUMNS - header
    assert len(rows) == 3 * (1 + 2 * 3)  # per input: the sampled release, then 3 methods per Δ0
    blob = json.loads((tmp_path / "compare.json").read_text())
    assert blob["meta"]["params"]["release"] == "dp" and len(blob["rows"]) == len(rows)
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {r["dataset"].split("-")[0] for r in rows} == {"msnbc", "aol", "synthetic"}
    for row in rows:
        assert 0 <= float(row["recall_top100"]) <= 1
        assert int(row["released_in_input"]) <= int(row["released"])
        if row["method"] == "sampled":  # b = ln 1/(1 - 1e-6): less than one record per pair
            assert row["released"] == "0" and row["dp_claim"] == "False" and row["max_items"] == ""
        if row["method"] == DP_METHOD:
            assert row["engine"] == "protocol" and row["dp_claim"] == "True"
            if row["max_items"] == "1":  # docs/releases.md: tau = 16 at eps = 1, delta = 1e-6, Delta_0 = 1, r = 3, t = 1
                assert row["threshold"] == "16"
            if row["released"] != "0":  # the same noisy value is tested and released
                assert int(row["min_released_count"]) >= int(row["threshold"])


def _log(holders: dict[tuple[str, str], int]) -> SearchLog:
    """Each pair held by its own ``holders[pair]`` users, once each."""
    rows, cols = [], []
    for col, count in enumerate(holders.values()):
        rows += list(range(len(rows), len(rows) + count))
        cols += [col] * count
    counts = sp.csr_matrix((np.ones(len(rows), dtype=np.int64), (rows, cols)), shape=(len(rows), len(holders)))
    return SearchLog([f"u{j}" for j in range(len(rows))], list(holders), counts, {})


def test_primitives_and_protocol_release_the_same_pairs():
    """Pairs of 300 and 100 users are released by both engines (tau = 16), a pair of one user
    by neither; the counts are n + Z with Z of scale about 1."""
    log = _log({("a", "x"): 300, ("b", "y"): 1, ("c", "z"): 100})
    tau = threshold(1.0, 1e-6, 1, Fraction(3, 2))
    prim = primitive_release(log, 1.0, 1e-6, 1, 3, 1, DrawKeys.replay(5, "primitives"))
    proto, _ = protocol_release(log, 1.0, 1e-6, 1, 3, 1, seed=5)
    for release in (prim, proto):
        assert release.threshold == tau == 16
        got = {(i.query, i.url): i.count for i in release.items}
        assert set(got) == {("a", "x"), ("c", "z")}
        assert abs(got[("a", "x")] - 300) < 20 and abs(got[("c", "z")] - 100) < 20


def test_auto_falls_back_to_the_primitives(monkeypatch):
    from cels.experiments import dp_compare

    def broken(*_args, **_kwargs):
        raise RuntimeError("session aborted: test")

    monkeypatch.setattr(dp_compare, "protocol_release", broken)
    item = Input(common.Dataset("toy", "synthetic", _log({("a", "x"): 300, ("b", "y"): 1})), [])
    row = dp_row(item, 1.0, 1e-6, 1, 3, 1, "auto", seed=0)
    assert row["engine"] == "primitives" and "session aborted: test" in row["engine_note"]
    assert row["released"] == 1 and row["recall_top100"] == 0.5
    with pytest.raises(RuntimeError):
        dp_row(item, 1.0, 1e-6, 1, 3, 1, "protocol", seed=0)


@pytest.mark.realdata
def test_msnbc_releases_all_17_categories(shared_data):
    """MSNBC-200K (40,829 users) at eps = 1, delta = 1e-6, Delta_0 = 1: the real in-memory session
    (r = 3, t = 1) releases every one of the 17 categories (one pair per category)."""
    dataset = common.load_dataset(shared_data, "msnbc", 40829)
    assert dataset.log.n_pairs == 17
    row = dp_row(Input(dataset, []), 1.0, 1e-6, 1, 3, 1, "protocol", seed=0)
    assert row["engine"] == "protocol"
    assert row["released"] == 17 and row["recall_top100"] == 1.0
    assert row["min_released_count"] >= row["threshold"] == 16
