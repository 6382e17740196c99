"""`cels bench scale --engine ray`: the engine targets' ratios and verdicts on known figures
(cels.bench.engine_targets; no Ray needed), the engines one run compares, the per-phase CPU
seconds of the node processes, and a party's engine usage in its session summary."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from cels.bench.engine_targets import engine_figures, engine_targets, node_rss_flat, ray_time, shard_rss, universe_busy, universe_target
from cels.bench.scale import engines
from cels.engine.options import EngineOptions
from cels.node.cluster import PhaseCpu
from cels.node.telemetry import NodeTelemetry
from cels.protocol.wire.codec import table_of

MB = 2**20
PARTIES = ["party-1", "party-2", "party-3"]


def point(engine: str, pairs: int, **figures) -> dict:
    shards = int(engine.rsplit("=", 1)[1]) if "=" in engine else 1
    return {"solve": "private", "parties": 3, "engine": engine, "engine_options": {"shards": shards}, "pairs": pairs, "status": "ok", **figures}


def test_node_rss_flat_compares_the_largest_tenfold_step() -> None:
    """400K -> 4M (not 40K -> 400K): 1.3x fails the 20 % bound, 1.15x passes; no tenfold step: not measured."""
    grown = [point("ray P=2", n, party_node_peak_rss_bytes_max=b) for n, b in ((40_000, 100 * MB), (400_000, 1000 * MB), (1_000_000, 1100 * MB), (4_000_000, 1300 * MB))]
    verdict = node_rss_flat(grown, "ray P=2")
    assert (verdict["from_pairs"], verdict["to_pairs"]) == (400_000, 4_000_000)
    assert verdict["ratio"] == pytest.approx(1.3) and verdict["pass"] is False
    grown[-1]["party_node_peak_rss_bytes_max"] = 1150 * MB
    assert node_rss_flat(grown, "ray P=2")["pass"] is True
    assert node_rss_flat(grown[1:3], "ray P=2")["pass"] is None  # 400K and 1M only
    assert node_rss_flat(grown, "local")["pass"] is None  # another series' points do not count


def test_shard_rss_against_one_over_p_plus_the_fitted_constant() -> None:
    """S_1 = 180 MiB + 50 B/pair: the constant is the line's intercept; shards at half the
    rows pass within 20 %, shards 30 % over the prediction fail."""
    constant, per_pair = 180 * MB, 50.0
    sizes = (400_000, 1_000_000, 4_000_000)
    single = [point("ray P=1", n, shard_peak_rss_bytes_max=constant + per_pair * n) for n in sizes]
    halves = [point("ray P=2", n, shard_peak_rss_bytes_max=1.05 * (constant + per_pair * n / 2)) for n in sizes]
    verdict = shard_rss(single + halves, "ray P=2", "ray P=1", 2)
    assert verdict["constant_bytes"] == pytest.approx(constant) and verdict["slope_bytes_per_pair"] == pytest.approx(per_pair)
    assert [r["predicted_bytes"] for r in verdict["points"]] == pytest.approx([constant + per_pair * n / 2 for n in sizes])
    assert verdict["ratio"] == pytest.approx(1.05) and verdict["pass"] is True
    heavy = [dict(p, shard_peak_rss_bytes_max=1.3 * (constant + per_pair * p["pairs"] / 2)) for p in halves]
    assert shard_rss(single + heavy, "ray P=2", "ray P=1", 2)["pass"] is False
    assert shard_rss(single[:1] + halves, "ray P=2", "ray P=1", 2)["pass"] is None  # one size: no line, no constant
    assert shard_rss(single, "ray P=1", "ray P=1", 1)["pass"] is None  # P = 1 is the reference itself


def test_ray_time_at_the_issue_point_else_the_largest_common_size() -> None:
    local = [point("local", n, total_seconds=s) for n, s in ((100_000, 10.0), (1_000_000, 100.0), (4_000_000, 400.0))]
    ray = [point("ray P=2", n, total_seconds=s) for n, s in ((100_000, 20.0), (1_000_000, 110.0))]
    verdict = ray_time(local + ray, "ray P=2", 3)
    assert (verdict["pairs"], verdict["at_issue_point"], verdict["ratio"], verdict["pass"]) == (1_000_000, True, pytest.approx(1.1), True)
    verdict = ray_time(local + ray[:1], "ray P=2", 3)
    assert (verdict["pairs"], verdict["at_issue_point"], verdict["ratio"], verdict["pass"]) == (100_000, False, 2.0, False)
    assert ray_time(local, "ray P=2", 3)["pass"] is None


def test_universe_busy_counts_the_process_trees_or_a_joined_clusters_tasks() -> None:
    """Ray instances of the nodes' own: every process below the nodes and the solver, 13 s /
    (10 s x 2 cores) = 0.65; a party on a cluster it joined: node CPU 6 s + the pair tasks'
    8 s = 0.7."""
    report = {
        "phase_wall_seconds": {"universe": 10.0},
        "phase_cpu_seconds": {"universe": {"solver": {"process": 1.0, "workers": 0.0}, **{p: {"process": c, "workers": 2.0} for p, c in zip(PARTIES, (3.0, 2.0, 1.0))}}},
        "engine": {p: {"kind": "ray", "pair_task_cpu_seconds": t, "shard_peak_rss_bytes": [s, s + 1], "pair_worker_peak_rss_bytes": {"h:1": 7 * s}}
                   for p, t, s in zip(PARTIES, (4.0, 3.0, 1.0), (10, 20, 30))},
        "peak_rss_bytes": {"solver": {"process": 999}, **{p: {"process": b} for p, b in zip(PARTIES, (5, 9, 7))}},
    }  # fmt: skip
    busy = universe_busy(report, PARTIES, 2)
    assert (busy["node_cpu_seconds"], busy["pair_task_cpu_seconds"], busy["process_trees_cpu_seconds"]) == (6.0, 8.0, 13.0)
    assert busy["busy_fraction"] == pytest.approx(0.65) == busy["process_trees_busy_fraction"]
    report["engine"]["party-2"]["address"] = "10.0.0.5:6379"
    assert universe_busy(report, PARTIES, 2)["busy_fraction"] == pytest.approx(0.7)
    del report["engine"]["party-2"]["address"]
    figures = engine_figures(report, PARTIES, 2)
    assert (figures["party_node_peak_rss_bytes_max"], figures["shard_peak_rss_bytes_max"], figures["pair_worker_peak_rss_bytes_max"]) == (9, 31, 210)
    assert universe_busy({"phase_wall_seconds": {}}, PARTIES, 2)["busy_fraction"] is None  # no universe phase seen
    points = [point("ray P=2", n, universe_cpu={"busy_fraction": f}) for n, f in ((10_000, 0.5), (40_000, 0.9))]
    assert universe_target(points, "ray P=2")["pass"] is True  # the verdict is the largest size's
    assert universe_target(points[:1], "ray P=2") | {"by_pairs": None} == {"by_pairs": None, "pairs": 10_000, "ratio": 0.5, "threshold": 0.85, "pass": False}


def test_engine_targets_per_solve_and_parties_with_ray_points() -> None:
    points = [point("local", 10_000, total_seconds=1.0), point("ray P=2", 10_000, total_seconds=1.2)]
    (targets,) = engine_targets(points, "ray P=2", "ray P=1", 2)
    assert (targets["solve"], targets["parties"], targets["engine"]) == ("private", 3, "ray P=2")
    assert targets["ray_vs_local_seconds"]["ratio"] == pytest.approx(1.2) and targets["ray_vs_local_seconds"]["pass"] is False
    assert {targets[k]["pass"] for k in ("node_rss_flat", "shard_rss", "universe_busy")} == {None}  # not measured in this run
    assert engine_targets(points[:1], "ray P=2", "ray P=1", 2) == []


def engine_args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"engine": None, "engine_address": None, "shards": None, "max_in_flight": None, **given})


def test_a_run_compares_local_ray_p_and_the_single_shard() -> None:
    assert engines(engine_args()) == [EngineOptions()]
    ray = EngineOptions(kind="ray", shards=2, max_in_flight=3)
    assert engines(engine_args(engine="ray", shards=2, max_in_flight=3)) == [EngineOptions(), ray, EngineOptions(kind="ray", shards=1, max_in_flight=3)]
    assert engines(engine_args(engine="ray")) == [EngineOptions(), EngineOptions(kind="ray")]
    assert ray.argv() == ["--engine", "ray", "--shards", "2", "--max-in-flight", "3"]  # the defaults are the node's too
    assert EngineOptions().argv() == []
    with pytest.raises(ValueError, match="the engine flags: engine.shards"):
        engines(engine_args(engine="ray", shards=0))


class ScriptedCluster:
    """cpu_seconds() answers from a script: node pid 10; worker 11 throughout, 12 born in the
    second phase, 13 gone after the first."""

    nodes = {"party-1": SimpleNamespace(process=SimpleNamespace(pid=10))}

    def __init__(self) -> None:
        self.snapshots = iter([{10: 1.0, 11: 2.0, 13: 5.0}, {10: 1.5, 11: 4.0}, {10: 4.0, 11: 5.0, 12: 0.5}])

    def cpu_seconds(self) -> dict:
        return {"party-1": next(self.snapshots)}


def test_phase_cpu_is_each_tree_between_the_phase_marks() -> None:
    cpu = PhaseCpu(ScriptedCluster())
    cpu.mark("load")
    cpu.mark("universe")
    assert cpu.seconds() == {
        "load": {"party-1": {"process": 0.5, "workers": 2.0}},  # worker 13 ended: its seconds are not counted
        "universe": {"party-1": {"process": 2.5, "workers": 1.5}},  # worker 12 is new: all of its 0.5 s
    }


def test_a_party_engine_usage_is_in_its_session_summary() -> None:
    telemetry = NodeTelemetry("party-1", "party")
    telemetry.session_created("s1", "party-1")
    (before,) = telemetry.sessions()
    assert not before.HasField("engine")
    usage = {"kind": "ray", "shards": 2, "shard_peak_rss_bytes": [1 << 30, 5], "pair_task_cpu_seconds": 1.5, "pair_worker_peak_rss_bytes": {"h:1": 7}}
    telemetry.session_engine("s1", usage)
    telemetry.session_engine("unknown", usage)  # a session the node does not remember: nothing
    (after,) = telemetry.sessions()
    assert table_of(after.engine) == usage


def test_a_resumed_run_reruns_a_size_on_every_engine_it_compares(tmp_path, monkeypatch, capsys) -> None:
    """A scale.json with a local 1K point, resumed with --engine ray --shards 2: 1K runs again on
    local, Ray P = 2 and P = 1 together (a local point of an earlier invocation is not compared
    with Ray), then 2K; resumed once more, nothing runs."""
    from cels.bench import scale
    from cels.cli import main

    calls = []

    def fake(pairs, parties, solve, args, todo):
        calls.append((pairs, list(todo)))
        return {label: point(label, pairs, parties=parties, status="ok", total_seconds=1.0, online_seconds=1.0, bytes_total=10 * pairs, phases={},
                             load_average_start=0.0, engine_options={"shards": engine.shards}, called=len(calls)) for label, engine in todo.items()}  # fmt: skip

    monkeypatch.setattr(scale, "generate_and_run", fake)
    argv = ["bench", "scale", "--parties", "3", "--key-bits", "512", "--out", str(tmp_path)]
    assert main([*argv, "--pairs", "1K"]) == 0 and calls == [(1000, ["local"])]
    ray = [*argv, "--pairs", "1K,2K", "--engine", "ray", "--shards", "2", "--resume"]
    assert main(ray) == 0
    assert calls[1:] == [(1000, ["local", "ray P=2", "ray P=1"]), (2000, ["local", "ray P=2", "ray P=1"])]
    result = json.loads((tmp_path / "scale.json").read_text())
    assert sorted((p["engine"], p["pairs"], p["called"]) for p in result["points"]) == [
        ("local", 1000, 2), ("local", 2000, 3), ("ray P=1", 1000, 2), ("ray P=1", 2000, 3), ("ray P=2", 1000, 2), ("ray P=2", 2000, 3)]  # fmt: skip
    assert result["targets"][0]["ray_vs_local_seconds"]["ratio"] == 1.0
    assert main(ray) == 0 and len(calls) == 3
    capsys.readouterr()


def test_a_repeated_point_is_its_median_run_and_the_time_target_shows_each_pair() -> None:
    """--repeat 3: a point's figures are its median run's (the lower middle of two ran when one
    failed), every run's seconds kept in order; the time target divides the medians and lists
    the ratio of each pair of runs made in turn."""
    from cels.bench.scale import median_run

    local = [point("local", 1_000_000, total_seconds=s, online_seconds=s, run=k) for k, s in enumerate((52.0, 50.0, 55.0))]
    ray = [point("ray P=2", 1_000_000, total_seconds=s, online_seconds=s, run=k) for k, s in enumerate((60.0, 57.0, 66.0))]
    ray[2] |= {"status": "failed"}
    local_point, ray_point = median_run(local), median_run(ray)
    assert (local_point["run"], local_point["total_seconds"]) == (0, 52.0)
    assert (ray_point["run"], ray_point["total_seconds"]) == (1, 57.0)
    assert [r["total_seconds"] for r in ray_point["repeats"]] == [60.0, 57.0, 66.0] and ray_point["repeats"][2]["status"] == "failed"
    verdict = ray_time([local_point, ray_point], "ray P=2", 3)
    assert verdict["ratio"] == pytest.approx(57 / 52) and verdict["pass"] is True
    assert verdict["paired_ratios"] == pytest.approx([57 / 50, 60 / 52])
    assert median_run(local[:1]) == local[0] and "paired_ratios" not in ray_time(local[:1] + ray[:1], "ray P=2", 3)


def test_repeated_runs_take_the_engines_in_turn_on_one_input(monkeypatch) -> None:
    """generate_and_run with --repeat 2 runs local, Ray, local, Ray on the same shares, retries
    a failed run once, and keeps each engine's median run."""
    from cels.bench import scale

    calls = []

    def fake(histogram, shares, solve, args, engine):
        calls.append((engine.kind, tuple(shares)))
        failed = len(calls) == 2
        return point(engine.kind, histogram.pairs, status="failed" if failed else "ok", error="x" if failed else None, total_seconds=float(len(calls)))

    monkeypatch.setattr(scale, "run_point", fake)
    args = argparse.Namespace(log_seed=7, log_format="histogram", repeat=2)
    points = scale.generate_and_run(1000, 2, "private", args, {"local": EngineOptions(), "ray P=2": EngineOptions(kind="ray", shards=2)})
    assert [kind for kind, _ in calls] == ["local", "ray", "ray", "local", "ray"] and len({shares for _, shares in calls}) == 1
    assert [r["total_seconds"] for r in points["local"]["repeats"]] == [1.0, 4.0] and points["local"]["total_seconds"] == 1.0
    assert [r["total_seconds"] for r in points["ray P=2"]["repeats"]] == [3.0, 5.0] and points["ray P=2"]["retried_after"] == "x"
