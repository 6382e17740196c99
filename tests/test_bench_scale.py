"""`cels bench scale`: the smallest point end to end over node processes, the time limit that
stops a series, the slope fit, and the synthetic generator (exact pair count, seeded)."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest

from cels.bench.scale import parse_sizes
from cels.bench.scale_report import fitted_slope, load_range, paper_comparison, series_summary
from cels.cli import main
from cels.protocol.machines import PARTY
from cels.logs import LoadOptions, load_log
from cels.logs.synthetic import synthetic_histogram

NODES = {"party-1", "party-2", "party-3", "solver"}


def test_smallest_point_end_to_end(tmp_path, capsys) -> None:
    """2K pairs over 3 party nodes and a solver (512-bit keys): JSON, CSV and PNG with the stated fields."""
    out = tmp_path / "scale"
    assert main(["bench", "scale", "--pairs", "2K", "--parties", "3", "--key-bits", "512", "--out", str(out)]) == 0
    result = json.loads((out / "scale.json").read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["machine"]["cores"] == os.cpu_count() and len(result["machine"]["load_average_start"]) == 3
    (point,) = result["points"]
    assert (point["status"], point["solve"], point["parties"], point["pairs"], point["key_bits"]) == ("ok", "private", 3, 2000, 512)
    assert point["load_average_start"] >= 0
    assert point["total_seconds"] == pytest.approx(point["offline_seconds"] + point["online_seconds"])
    # the private solve sums by pairwise masks: no obfuscator stocked, none computed, no offline phase
    assert point["offline_seconds"] == 0 and 0 < point["online_seconds"] < point["point_seconds"]
    assert point["obfuscators"] == {"stocked_per_party": None, "computed_online": None}
    phases = point["phases"]
    assert list(phases) == list(PARTY["private"].phases)
    assert sum(p["bytes"] for p in phases.values()) == point["bytes_total"] > 0
    assert point["wire_bytes_total"] >= point["bytes_total"]  # frames and envelopes on top of the messages
    for phase in phases.values():
        assert phase["wall_seconds"] >= 0 and phase["busy_seconds"] == pytest.approx(sum(phase["busy_seconds_by_node"].values()))
    assert sum(p["wall_seconds"] for p in phases.values()) <= point["online_seconds"] + 0.5  # the phases follow one another
    assert point["outside_phases_seconds"] == pytest.approx(point["online_seconds"] - sum(p["wall_seconds"] for p in phases.values()))
    assert set(point["peak_rss_bytes"]) == NODES
    for node in point["peak_rss_bytes"].values():  # a Python node process with grpc and numpy holds tens of MB
        assert 20e6 < node["process"] < 4e9 and node["worker_processes"] >= 1
    # the local engine: every party's work in its node (no shard, no pair worker); the universe's busy cores measured
    assert point["engine"] == "local" and point["engine_usage"] == {p: {"kind": "local"} for p in NODES - {"solver"}}
    assert point["shard_peak_rss_bytes_max"] is None and point["party_node_peak_rss_bytes_max"] == max(point["peak_rss_bytes"][p]["process"] for p in NODES - {"solver"})
    busy = point["universe_cpu"]
    # every process below the nodes counts (the node's pool workers start with the session and may import in the phase)
    assert busy["pair_task_cpu_seconds"] == 0 and busy["busy_fraction"] == pytest.approx(busy["process_trees_cpu_seconds"] / (busy["wall_seconds"] * os.cpu_count()))
    assert 0 < busy["node_cpu_seconds"] <= busy["process_trees_cpu_seconds"] and "targets" not in result
    (series,) = result["series"]
    assert (series["solve"], series["parties"], series["engine"], series["points"], series["stopped"]) == ("private", 3, "local", 1, None)
    assert series["slope"]["bytes_total"] is None  # one size: no line to fit
    with open(out / "scale.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["engine"], row["solve"], row["parties"], row["pairs"], row["status"]) == ("local", "private", "3", "2000", "ok")
    assert int(row["bytes_total"]) == point["bytes_total"] and float(row["universe_busy_seconds"]) > 0
    assert row["nlp_bytes"] == ""  # the private solve has no NLP phase
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_limit_stops_the_series(tmp_path) -> None:
    """A point over its limit is recorded as such, and the series' larger sizes are skipped."""
    out = tmp_path / "scale"
    argv = ["bench", "scale", "--pairs", "2K,4K", "--parties", "3", "--key-bits", "512", "--point-time-limit", "0.5", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "scale.json").read_text())
    first, second = result["points"]
    assert (first["pairs"], first["status"]) == (2000, "time_limit") and first["point_seconds"] >= 0.5
    assert (second["pairs"], second["status"]) == (4000, "skipped")
    (series,) = result["series"]
    assert series["stopped"]["pairs"] == 2000 and series["stopped"]["status"] == "time_limit" and series["points"] == 0


def test_a_series_is_extrapolated_to_every_size_in_the_file() -> None:
    """A resumed run asking for 10K-1M still guesses the 4M point of a series that stopped
    earlier (Table 5's comparison reads it), from the fitted line: bytes = 50 pairs^1.3."""
    point = lambda solve, n: {"solve": solve, "parties": 10, "pairs": n, "status": "ok", "error": None,
                               "total_seconds": 1e-3 * n, "online_seconds": 1e-3 * n, "bytes_total": 50.0 * n**1.3}  # fmt: skip
    points = [point("private", n) for n in (10_000, 100_000, 1_000_000, 4_000_000)] + [point("transformed", n) for n in (10_000, 100_000)]
    series = {s["solve"]: s for s in series_summary(points, [10_000, 100_000, 1_000_000])}
    guess = series["transformed"]["extrapolated"]
    assert set(guess) == {"1000000", "4000000"} and series["private"]["extrapolated"] == {}
    assert guess["4000000"]["bytes_total"] == pytest.approx(50.0 * 4e6**1.3)
    assert paper_comparison(points, list(series.values()))["transformed"] == {"bytes": pytest.approx(50.0 * 4e6**1.3), "measured": False}


def test_the_plot_states_the_load_at_each_point_start() -> None:
    """The title's load is the range over the points that ran (a skipped one has none); a point
    kept from an older file without its own load counts with that run's start load."""
    machine = {"load_average_start": [0.3, 0.2, 0.1]}
    ran = [{"status": "ok", "load_average_start": 0.2}, {"status": "time_limit", "load_average_start": 1.46}, {"status": "skipped"}]
    assert load_range({"machine": machine, "points": ran}) == "load 0.2-1.5 at the points' start"
    kept = {"status": "ok"}  # an older file's point: no load of its own
    resumed = {"machine": machine, "resumed": {"machine_before": {"load_average_start": [2.0, 0, 0]}}, "points": [kept, ran[0]]}
    assert load_range(resumed) == "load 0.2-2.0 at the points' start"
    assert load_range({"machine": machine, "points": [ran[2]]}) == "load 0.3 at the points' start"


def test_fitted_slope_on_known_curves() -> None:
    pairs = [1e4, 1e5, 1e6, 4e6]
    slope, intercept = fitted_slope(pairs, [3.0 * n**1.05 for n in pairs])
    assert slope == pytest.approx(1.05) and intercept == pytest.approx(math.log(3.0))
    # least squares, not end points: the fit of log y = 2 + 1 log x + (+e, -e, +e, -e) keeps slope ~1
    noisy = [math.exp(2.0 + math.log(n) + e) for n, e in zip(pairs, (0.1, -0.1, 0.1, -0.1))]
    expected = np.polyfit(np.log(pairs), np.log(noisy), 1)[0]
    assert fitted_slope(pairs, noisy)[0] == pytest.approx(expected) and abs(expected - 1.0) < 0.05
    assert fitted_slope([1e4], [2.0]) is None and fitted_slope([1e4, 1e4], [2.0, 3.0]) is None


def test_parse_sizes() -> None:
    assert parse_sizes("10K,100K,1M,4M", "--pairs") == [10_000, 100_000, 1_000_000, 4_000_000]
    assert parse_sizes("2500, 1.5M", "--pairs") == [2500, 1_500_000]
    for bad in ("1M,10K", "10K,10K", "ten", "0", "1.5"):
        with pytest.raises(ValueError, match="--pairs"):
            parse_sizes(bad, "--pairs")


@pytest.mark.parametrize("pairs", [2, 2999, 20_000])
def test_synthetic_histogram_has_exactly_the_requested_pairs(pairs) -> None:
    h = synthetic_histogram(pairs, seed=3)
    assert h.pairs == pairs and set(np.unique(h.pair).tolist()) == set(range(pairs))
    keys = h.user * pairs + h.pair
    assert np.all(np.diff(keys) > 0)  # sorted by user then pair, no (user, pair) twice
    assert h.count.min() >= 1 and np.array_equal(np.unique(h.user), np.arange(h.users))


def test_synthetic_histogram_shape_is_aol_like() -> None:
    """Within stated tolerances of the AOL slice: ~98 % of pairs held by one user, ~1.38 per
    entry, ~300 pairs per user, a heavy tail of users."""
    h = synthetic_histogram(200_000, seed=1)
    shape = h.shape()
    assert 0.005 < shape["shared_pairs"] / h.pairs < 0.05
    assert 1.3 < h.count.mean() < 1.5
    assert 550 < shape["users"] <= 667
    per_user = np.bincount(h.user)
    assert per_user.max() > 10 * np.median(per_user)


def test_synthetic_histogram_is_seeded_and_files_read_back(tmp_path) -> None:
    one, two, other = synthetic_histogram(3000, seed=5), synthetic_histogram(3000, seed=5), synthetic_histogram(3000, seed=6)
    for field in ("user", "pair", "count", "n_words", "picks"):
        assert np.array_equal(getattr(one, field), getattr(two, field))
    assert not np.array_equal(one.count, other.count) or not np.array_equal(one.user, other.user)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths, again = one.write_shares(tmp_path / "a", 3), two.write_shares(tmp_path / "b", 3)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]  # same seed, same files
    logs = [load_log(p, LoadOptions(format="histogram")) for p in paths]
    assert len({pair for log in logs for pair in log.pairs}) == 3000  # exactly the pairs asked for
    assert sum(log.size for log in logs) == one.size
    users = [set(log.users) for log in logs]
    assert sum(map(len, users)) == len(set().union(*users)) == one.users  # every user at exactly one party
    (tmp_path / "c").mkdir()
    lakes = one.write_shares(tmp_path / "c", 3, "parquet")  # the same shares as Parquet (--log-format parquet)
    assert [p.name for p in lakes] == ["party-1.parquet", "party-2.parquet", "party-3.parquet"]
    for log, lake in zip(logs, lakes):
        again = load_log(lake, LoadOptions(format="parquet"))
        assert again.users == log.users and again.pairs == log.pairs and (again.counts != log.counts).nnz == 0


def test_resume_keeps_earlier_points_and_refuses_other_settings(tmp_path, capsys) -> None:
    """--resume reruns nothing that ran or ran out of time; a different key size is refused."""
    out = tmp_path / "scale"
    argv = ["bench", "scale", "--pairs", "2K", "--parties", "3", "--key-bits", "512", "--point-time-limit", "0.5", "--out", str(out)]
    assert main(argv) == 0
    first = json.loads((out / "scale.json").read_text())
    assert main([*argv, "--resume"]) == 0
    again = json.loads((out / "scale.json").read_text())
    assert again["points"] == first["points"] and again["resumed"]["points_kept"] == 1
    other = [a if a != "3" else "2" for a in argv]  # another series (r = 2): the r = 3 point stays, and is drawn
    assert main([*other, "--resume", "--solve", "transformed"]) == 0
    both = json.loads((out / "scale.json").read_text())
    assert {(p["solve"], p["parties"]) for p in both["points"]} == {("private", 3), ("transformed", 2)} and first["points"][0] in both["points"]
    capsys.readouterr()
    assert main([a if a != "512" else "1024" for a in argv] + ["--resume"]) == 2  # bad input
    assert "--resume" in capsys.readouterr().err and json.loads((out / "scale.json").read_text()) == both


@pytest.mark.slow
def test_a_ray_series_beside_the_local_one(tmp_path, capsys) -> None:
    """--engine ray: the same input on the local engine and then on Ray (P = 1, so no extra
    single-shard series); the Ray point has its shard's and pair workers' peak RSS and the
    pair tasks' CPU seconds, as every party node's session summary reported them."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    out = tmp_path / "scale"
    assert main(["bench", "scale", "--pairs", "1K", "--parties", "2", "--key-bits", "512", "--engine", "ray", "--out", str(out)]) == 0
    result = json.loads((out / "scale.json").read_text())
    capsys.readouterr()
    local, ray = result["points"]
    assert (local["engine"], ray["engine"], local["status"], ray["status"]) == ("local", "ray P=1", "ok", "ok")
    assert local["pairs"] == ray["pairs"] and local["size"] == ray["size"]  # the same input
    for usage in ray["engine_usage"].values():
        assert (usage["kind"], usage["shards"], len(usage["shard_peak_rss_bytes"])) == ("ray", 1, 1)
        assert usage["pair_tasks"] >= 1 and usage["pair_task_cpu_seconds"] > 0 and usage["pair_worker_peak_rss_bytes"]
    assert 20e6 < ray["shard_peak_rss_bytes_max"] < 4e9 and 20e6 < ray["pair_worker_peak_rss_bytes_max"] < 4e9  # a Python worker with numpy
    assert ray["universe_cpu"]["pair_task_cpu_seconds"] == pytest.approx(sum(u["pair_task_cpu_seconds"] for u in ray["engine_usage"].values()))
    (targets,) = result["targets"]
    assert targets["ray_vs_local_seconds"]["ratio"] == pytest.approx(ray["total_seconds"] / local["total_seconds"])
    assert targets["shard_rss"]["pass"] is None and targets["node_rss_flat"]["pass"] is None  # P = 1, one size
