"""The experiment runners (cels experiment ...) on tiny inputs, and their building blocks."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from cels.cli import main
from cels.experiments import common
from cels.experiments.common import Dataset, UnionSolver, b_grid, clean
from cels.logs import write_synthetic
from cels.logs.model import SearchLog
from cels.mechanism.conditions import build_conditions
from cels.mechanism.solvers import feasible, solve

MSNBC_NAMES = "frontpage news tech local opinion on-air misc weather msn-news health living business msn-sports sports summary bbs travel"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny data dir in the real files' formats: synthetic AOL (300 users), MSNBC (600 users)."""
    root = tmp_path_factory.mktemp("data")
    write_synthetic(root / "aol-dev.tsv.gz", seed=4, users=300, pairs=40)
    rng = np.random.default_rng(2)
    lines = ["% Different categories found in input file:", "", MSNBC_NAMES, "", "", "% Sequences:", ""]
    for _ in range(600):
        lines.append(" ".join(str(v) for v in rng.choice(17, size=rng.integers(1, 8), p=np.r_[0.3, [0.7 / 16] * 16]) + 1) + " ")
    (root / "msnbc990928.seq.gz").write_bytes(gzip.compress(("\r\n".join(lines) + "\r\n").encode()))
    return root


def run_cli(*argv: str) -> None:
    assert main(["experiment", *argv, "-q"]) == 0


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def check_outputs(out: Path, name: str, columns: set[str], n_rows: int) -> list[dict]:
    header, rows = read_csv(out / f"{name}.csv")
    assert columns <= set(header), columns - set(header)
    assert len(rows) == n_rows
    blob = json.loads((out / f"{name}.json").read_text())
    assert blob["meta"]["experiment"] == name and len(blob["rows"]) == n_rows
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return blob["rows"]


UTILITY = {"kl", "recall", "top100_coverage", "output_total", "kl_std", "recall_std"}


def test_fig4_files_and_columns(data, tmp_path):
    run_cli("fig4", "--data", str(data), "--out", str(tmp_path), "--aol-users", "0", "--msnbc-users", "300",
            "--b-min", "0.1", "--b-max", "10", "--per-decade", "1", "--fractions", "0.5,1", "--integer", "greedy")  # fmt: skip
    rows = check_outputs(tmp_path, "fig4", {"dataset", "cap", "b", "fraction", "max_output", "noise", *UTILITY}, 2 * 2 * 3 * 2)
    # |𝕆| is exactly linear in b (spec invariant), for each input and cap
    for label, cap in {(r["dataset"], r["cap"]) for r in rows}:
        sel = sorted((r for r in rows if r["dataset"] == label and r["cap"] == cap and r["fraction"] == 1), key=lambda r: r["b"])
        assert [r["max_output"] for r in sel] == pytest.approx([sel[0]["max_output"] * r["b"] / sel[0]["b"] for r in sel], rel=1e-6)
        assert all(r["output_total"] <= r["output_target"] + 1e-9 for r in sel)


def test_fig4_with_noise_averages_the_draws(data, tmp_path):
    run_cli("fig4", "--data", str(data), "--out", str(tmp_path), "--aol-users", "", "--msnbc-users", "300",
            "--b-min", "1", "--b-max", "1", "--fractions", "0.5", "--cap", "0", "--integer", "greedy",
            "--noise-epsilon", "1", "--sensitivity", "3", "--repeats", "4")  # fmt: skip
    (row,) = json.loads((tmp_path / "fig4.json").read_text())["rows"]
    assert row["noise"] == "Lap(3/1)" and row["draws"] == 4 and row["cap"] is None


def test_fig5_cels_and_ls_rows(data, tmp_path):
    run_cli("fig5", "--data", str(data), "--out", str(tmp_path), "--aol-users", "0", "--msnbc-users", "",
            "--b-min", "1", "--b-max", "10", "--per-decade", "1", "--parties", "2,4", "--integer", "greedy")  # fmt: skip
    rows = check_outputs(tmp_path, "fig5", {"method", "parties", "b", "clipped_shares", *UTILITY}, 2 * 3)
    assert {r["method"] for r in rows} == {"CELS", "LS-2", "LS-4"}
    for row in rows:  # CELS's |O| = fraction * |𝕆|; LS shares that |O| and never exceeds it
        assert 0 < row["output_total"] <= row["fraction"] * row["max_output"] + 1e-9


def test_compare_table(data, tmp_path):
    run_cli("compare", "--data", str(data), "--out", str(tmp_path), "--aol-users", "0", "--msnbc-users", "",
            "--budgets", "10:0.5", "--parties", "2", "--integer", "greedy")  # fmt: skip
    columns = {"method", "user_level_rows", "privacy_epsilon", "dp_claim", "released_items", "query_kl", "query_recall", *UTILITY}
    rows = check_outputs(tmp_path, "compare", columns, 5)
    by = {r["method"]: r for r in rows}
    assert set(by) == {"CELS", "LS-2", "zealous", "korolova", "safelog"}
    assert by["CELS"]["user_level_rows"] and by["LS-2"]["user_level_rows"]
    assert not any(by[m]["user_level_rows"] for m in ("zealous", "korolova", "safelog"))
    assert by["CELS"]["dp_claim"] is False  # no end-to-end noise: only the sampling step is DP
    assert by["CELS"]["output_total"] > 0


def test_table5_and_fig6_sessions(data, tmp_path):
    common_args = ["--data", str(data), "--aol-users", "", "--parties", "2", "--key-bits", "512"]
    run_cli("table5", "--out", str(tmp_path), "--msnbc-users", "150", *common_args)
    rows = check_outputs(tmp_path, "table5", {"parties", "seconds", "bytes_total", "megabytes_total", "seconds_nlp"}, 1)
    assert rows[0]["bytes_total"] > 0 and rows[0]["party_bytes_min"] > 0
    assert "| r = 2 |" in (tmp_path / "table5.md").read_text()
    run_cli("fig6", "--out", str(tmp_path), "--msnbc-users", "150", "--fixed-r", "2", *common_args)
    rows = check_outputs(tmp_path, "fig6", {"parties", "seconds", "cpu_seconds", "input_size"}, 1)
    assert all(0 < r["cpu_seconds"] for r in rows)


# ----------------------------------------------------------------------------- building blocks
def test_split_by_user_is_a_seeded_partition(data):
    log = common.load_dataset(data, "msnbc", 200).log
    parts = log.split_by_user(3, seed=9)
    users = [u for p in parts for u in p.users]
    assert sorted(users) == sorted(log.users) and len(set(users)) == log.n_users
    assert max(p.n_users for p in parts) - min(p.n_users for p in parts) <= 1
    assert all(p.pairs == log.pairs for p in parts)
    assert sum(p.size for p in parts) == log.size
    assert [p.users for p in log.split_by_user(3, seed=9)] == [p.users for p in parts]
    assert [p.users for p in log.split_by_user(3, seed=10)] != [p.users for p in parts]
    assert [p.users for p in log.split_by_user(3)] == [log.users[k::3] for k in range(3)]  # no seed: j mod r
    with pytest.raises(ValueError, match="cannot split"):
        log.split_by_user(log.n_users + 1, seed=0)


def test_clean_drops_rare_pairs_and_empty_users():
    log = SearchLog(["a", "b", "c"], [("p", "1"), ("q", "2")], sp.csr_matrix(np.array([[15, 1], [6, 0], [0, 2]], dtype=np.int64)))
    cleaned = clean(log, 20)
    assert cleaned.pairs == [("p", "1")] and cleaned.users == ["a", "b"]
    assert cleaned.pair_totals().tolist() == [21]


def test_b_grid():
    grid = b_grid(1e-5, 1e-1, 2)
    assert len(grid) == 9 and grid[0] == pytest.approx(1e-5) and grid[-1] == pytest.approx(1e-1)
    assert np.all(np.diff(np.log10(grid)) == pytest.approx(0.5))
    with pytest.raises(ValueError):
        b_grid(1.0, 0.1, 2)


def test_union_solver_equals_building_at_each_b(data):
    log = common.load_dataset(data, "aol").log
    solver = UnionSolver(log, integer="floor")
    for b in (0.3, 3.0):
        cond, var_pairs = build_conditions(log, b)
        expected = np.zeros(log.n_pairs, dtype=np.int64)
        expected[var_pairs] = solve(cond, "kl", output_size=0.5, integer="floor").x
        (x,), max_output = solver.counts(b, 0.5)
        assert np.array_equal(x, expected)
        assert feasible(cond, x[var_pairs])


def test_recall_non_decreasing_in_b(data):
    """Known trend (CELS Fig. 4e-f): weaker privacy (larger b) keeps more distinct pairs.
    KL-UMP at |O| = |𝕆|/2 on the tiny AOL-shaped log: from at most 2 pairs to all of them."""
    dataset: Dataset = common.load_dataset(data, "aol")
    solver = UnionSolver(dataset.log, integer="greedy")
    kept = [np.count_nonzero(solver.counts(b, 0.5)[0][0]) for b in b_grid(0.01, 100, 3)]
    assert kept[0] <= 2 and kept[-1] == dataset.log.n_pairs
    assert all(a <= b for a, b in zip(kept, kept[1:])), kept


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    assert main(["experiment", "fig4", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "aol-dev.tsv.gz is missing" in capsys.readouterr().err
    assert main(["experiment", "compare", "--out", str(tmp_path / "o"), "--budgets", "1:2", "-q"]) == 2
    assert "--budgets" in capsys.readouterr().err
