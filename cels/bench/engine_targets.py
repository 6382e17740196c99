"""The Ray engine's memory and speed targets (docs/ray.md, "A party on a Ray cluster"),
measured by ``cels bench scale --engine ray --shards P``: each target is a ratio of this run's
figures against the stated threshold, with ``pass`` true, false, or None where this run has
not the points it needs (``why`` says which).

- node RSS flat: a Ray party node's peak RSS at 10x the input (400K -> 4M pairs) within 20 %;
- shard RSS: every user shard's peak RSS at most 20 % over ``C + (S_1 - C) / P``, where S_1 is
  the single shard's peak RSS (P = 1, same input) and the constant C the intercept of the
  least-squares line of S_1 against the input size;
- Ray P = 2 end to end at most 1.15x local at 1M pairs x 3 parties;
- the universe phase (the curve multiplications) keeps >= 85 % of the cores busy: the CPU
  seconds of the party nodes' processes and of their pair-work tasks in that phase over its
  wall clock x cores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NODE_RSS_GROWTH = 1.2
"""Node peak RSS at 10x the input over the peak RSS at the input, at most."""
SHARD_RSS_SLACK = 1.2
"""A shard's peak RSS over C + (S_1 - C) / P, at most."""
RAY_TIME_RATIO = 1.15
"""Ray end-to-end seconds over local, at most."""
TIME_POINT = {"pairs": 1_000_000, "parties": 3, "shards": 2}
"""Where the issue states the Ray / local time ratio."""
UNIVERSE_BUSY = 0.85
"""Busy fraction of the cores in the universe phase, at least."""
LOCAL = "local"


def engine_label(kind: str, shards: int) -> str:
    """A series' engine: ``local`` or ``ray P=2``."""
    return LOCAL if kind == LOCAL else f"ray P={shards}"


def universe_busy(report: dict[str, Any], parties: list[str], cores: int) -> dict[str, Any]:
    """CPU seconds in the universe phase (from the initiator entering the phase to it entering
    the next) over the phase's wall clock x ``cores``.  ``busy_fraction`` counts every process
    below the nodes and the solver (/proc: the party nodes and, when a node started its own Ray
    instance, its raylet and workers): the cores' real use.  Only when a party joined a cluster
    elsewhere (``address`` not "local"), whose workers no /proc here sees, does it count the
    party nodes plus the CPU its pair tasks report, an upper bound: a task's process time
    includes its Ray worker's own threads (measured: 440 s reported against 350 s of the
    workers' processes at 4M pairs)."""
    wall = (report.get("phase_wall_seconds") or {}).get("universe")
    cpu = (report.get("phase_cpu_seconds") or {}).get("universe", {})
    engines = report.get("engine") or {}
    nodes = sum(cpu[p]["process"] for p in parties if p in cpu)
    tasks = sum((engines.get(p) or {}).get("pair_task_cpu_seconds", 0.0) for p in parties)
    trees = sum(c["process"] + c["workers"] for c in cpu.values())
    joined = any((engines.get(p) or {}).get("address", "local") != "local" for p in parties)
    capacity = wall * cores if wall else None
    busy = None if not capacity or not cpu else ((nodes + tasks) if joined else trees) / capacity
    return {
        "wall_seconds": wall,
        "cores": cores,
        "node_cpu_seconds": nodes,
        "pair_task_cpu_seconds": tasks,
        "process_trees_cpu_seconds": trees,
        "busy_fraction": busy,
        "process_trees_busy_fraction": None if not capacity or not cpu else trees / capacity,
    }


def engine_figures(report: dict[str, Any], parties: list[str], cores: int) -> dict[str, Any]:
    """A point's memory and CPU figures: the party nodes' peak RSS, what their engines' workers
    used (cels.engine.Engine.usage), the universe phase's busy fraction."""
    rss = report.get("peak_rss_bytes") or {}
    engines = report.get("engine") or {}
    shards = [b for p in parties for b in (engines.get(p) or {}).get("shard_peak_rss_bytes", [])]
    workers = [b for p in parties for b in (engines.get(p) or {}).get("pair_worker_peak_rss_bytes", {}).values()]
    return {
        "party_node_peak_rss_bytes_max": max((rss[p]["process"] for p in parties if p in rss), default=None),
        "shard_peak_rss_bytes_max": max(shards, default=None),
        "pair_worker_peak_rss_bytes_max": max(workers, default=None),
        "engine_usage": engines,
        "universe_cpu": universe_busy(report, parties, cores),
    }


def _series(points: list[dict[str, Any]], engine: str) -> dict[int, dict[str, Any]]:
    """The points of one engine series that ran, by input size."""
    return {p["pairs"]: p for p in points if p.get("engine", LOCAL) == engine and p["status"] == "ok"}


def node_rss_flat(points: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """The party node's peak RSS at the largest size n whose 10 n ran too, over that at n."""
    series = _series(points, engine)
    starts = [n for n in series if 10 * n in series and series[n].get("party_node_peak_rss_bytes_max")]
    if not starts:
        return {"threshold": NODE_RSS_GROWTH, "pass": None, "why": "needs two sizes 10x apart (400K and 4M pairs)"}
    n = max(starts)
    before, after = series[n]["party_node_peak_rss_bytes_max"], series[10 * n]["party_node_peak_rss_bytes_max"]
    ratio = after / before
    return {"from_pairs": n, "to_pairs": 10 * n, "from_bytes": before, "to_bytes": after, "ratio": ratio,
            "threshold": NODE_RSS_GROWTH, "pass": ratio <= NODE_RSS_GROWTH}  # fmt: skip


def shard_rss(points: list[dict[str, Any]], engine: str, single: str, shards: int) -> dict[str, Any]:
    """Every shard against C + (S_1 - C) / P at each size where both series ran (module doc)."""
    out: dict[str, Any] = {"shards": shards, "threshold": SHARD_RSS_SLACK}
    if shards == 1:
        return out | {"pass": None, "why": "P = 1: one shard is the single-process figure (run --shards 2 or more)"}
    ones = {n: p["shard_peak_rss_bytes_max"] for n, p in _series(points, single).items() if p.get("shard_peak_rss_bytes_max")}
    if len(ones) < 2:
        return out | {"pass": None, "why": f"needs the {single} series at two sizes or more (the constant is the intercept of its line)"}
    slope, constant = np.polyfit(list(ones), list(ones.values()), 1)
    rows = []
    for n, p in sorted(_series(points, engine).items()):
        if n in ones and p.get("shard_peak_rss_bytes_max"):
            predicted = constant + (ones[n] - constant) / shards
            rows.append({"pairs": n, "single_bytes": ones[n], "predicted_bytes": predicted,
                         "measured_max_bytes": p["shard_peak_rss_bytes_max"], "ratio": p["shard_peak_rss_bytes_max"] / predicted})  # fmt: skip
    if not rows:
        return out | {"pass": None, "why": f"no size where both {engine} and {single} ran"}
    return out | {"constant_bytes": float(constant), "slope_bytes_per_pair": float(slope), "points": rows,
                  "ratio": max(r["ratio"] for r in rows), "pass": all(r["ratio"] <= SHARD_RSS_SLACK for r in rows)}  # fmt: skip


def ray_time(points: list[dict[str, Any]], engine: str, parties: int) -> dict[str, Any]:
    """Ray end-to-end seconds over local at the issue's point (1M pairs), else at the largest
    size both ran (``at_issue_point`` false): the points' (each its median run's, with
    ``--repeat``); then also each pair of runs made in turn (run k on Ray over run k locally),
    sorted, to show the spread the verdict sits in."""
    ray, local = _series(points, engine), _series(points, LOCAL)
    common = sorted(set(ray) & set(local))
    if not common:
        return {"threshold": RAY_TIME_RATIO, "pass": None, "why": "needs a size where both the local and the Ray series ran"}
    n = TIME_POINT["pairs"] if TIME_POINT["pairs"] in common else common[-1]
    ratio = ray[n]["total_seconds"] / local[n]["total_seconds"]
    shards = ray[n].get("engine_options", {}).get("shards")
    verdict = {"pairs": n, "parties": parties, "shards": shards, "at_issue_point": (n, parties, shards) == tuple(TIME_POINT.values()),
               "ray_seconds": ray[n]["total_seconds"], "local_seconds": local[n]["total_seconds"], "ratio": ratio,
               "threshold": RAY_TIME_RATIO, "pass": ratio <= RAY_TIME_RATIO}  # fmt: skip
    pairs = [(a["total_seconds"], b["total_seconds"]) for a, b in zip(ray[n].get("repeats", []), local[n].get("repeats", [])) if a["status"] == b["status"] == "ok"]
    return verdict | ({"paired_ratios": sorted(a / b for a, b in pairs)} if pairs else {})


def universe_target(points: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """The busy fraction of every size of the series; the verdict at the largest."""
    busy = {n: p["universe_cpu"]["busy_fraction"] for n, p in sorted(_series(points, engine).items()) if (p.get("universe_cpu") or {}).get("busy_fraction") is not None}
    if not busy:
        return {"threshold": UNIVERSE_BUSY, "pass": None, "why": "no point with the universe phase's CPU seconds"}
    n = max(busy)
    return {"by_pairs": {str(k): v for k, v in busy.items()}, "pairs": n, "ratio": busy[n], "threshold": UNIVERSE_BUSY, "pass": busy[n] >= UNIVERSE_BUSY}


def engine_targets(points: list[dict[str, Any]], engine: str, single: str, shards: int) -> list[dict[str, Any]]:
    """Per (solve, r) with points of the Ray series ``engine``: every target, the local series'
    figures beside the Ray ones where the target is not Ray's alone (node RSS, busy cores)."""
    out = []
    for solve, parties in dict.fromkeys((p["solve"], p["parties"]) for p in points if p.get("engine") == engine):
        group = [p for p in points if (p["solve"], p["parties"]) == (solve, parties)]
        out.append({
            "solve": solve, "parties": parties, "engine": engine,
            "node_rss_flat": node_rss_flat(group, engine), "node_rss_flat_local": node_rss_flat(group, LOCAL),
            "shard_rss": shard_rss(group, engine, single, shards),
            "ray_vs_local_seconds": ray_time(group, engine, parties),
            "universe_busy": universe_target(group, engine), "universe_busy_local": universe_target(group, LOCAL),
        })  # fmt: skip
    return out
