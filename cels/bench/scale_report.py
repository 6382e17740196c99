"""What ``cels bench scale`` makes of its points (docs/performance.md, "Scale"): each series' fitted
slopes, the comparison with the paper's Table 5, the CSV rows, the log-log plot and the written
files (cels.bench.scale runs the points)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from cels.bench.engine_targets import LOCAL
from cels.bench.protocol import PAPER_TABLE5_MB
from cels.fileio import atomic_write_json
from cels.protocol.phases import WORK_PHASES

PAPER_POINT = {"pairs": 4_000_000, "parties": 10, "bytes": PAPER_TABLE5_MB["AOL 4M"][10] * 1e6, "key_bits": 512}
"""CELS Table 5's largest run: AOL 4M over r = 10, all parties' bytes (512-bit Paillier, 1024-bit PH)."""


def fitted_slope(pairs: list[float], values: list[float]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line log(value) = intercept + slope log(pairs)
    (natural logs) over at least two distinct sizes; None otherwise."""
    if len(set(pairs)) < 2 or any(v <= 0 for v in values):
        return None
    slope, intercept = np.polyfit(np.log(pairs), np.log(values), 1)
    return float(slope), float(intercept)


def outside_phases_seconds(point: dict[str, Any]) -> float:
    """Online seconds not inside any phase's wall clock: the session's start (StartSession to
    every node, BEGIN, and the initiator's own start -- its log's load and first hashes --
    before its first phase event) and its finish."""
    return point["online_seconds"] - sum(p["wall_seconds"] or 0.0 for p in point["phases"].values())


def series_key(point: dict[str, Any]) -> tuple[str, int, str]:
    """(solve, r, engine): one series (a point of an older file without an engine ran locally)."""
    return point["solve"], point["parties"], point.get("engine", LOCAL)


def series_summary(points: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Per (solve, r, engine): the fitted slopes of total and online seconds and of bytes, why the
    series stopped, and the fitted curve at the sizes it did not reach (this run's and every
    size in the file, so a resumed run keeps the 4M guesses of the series it did not run)."""
    sizes = sorted(set(sizes) | {p["pairs"] for p in points})
    out = []
    for key in dict.fromkeys(map(series_key, points)):
        mine = [p for p in points if series_key(p) == key]
        ran = [p for p in mine if p["status"] == "ok"]
        x = [p["pairs"] for p in ran]
        fits = {what: fitted_slope(x, [p[what] for p in ran]) for what in ("total_seconds", "online_seconds", "bytes_total")}
        stopped = next((p for p in mine if p["status"] in ("time_limit", "failed")), None)
        reached = {p["pairs"] for p in ran}
        out.append({
            "solve": key[0], "parties": key[1], "engine": key[2], "points": len(ran),
            "slope": {what: None if fit is None else fit[0] for what, fit in fits.items()},
            "stopped": None if stopped is None else {"pairs": stopped["pairs"], "status": stopped["status"], "error": stopped["error"]},
            "extrapolated": {
                str(n): {what: math.exp(fit[1]) * n ** fit[0] for what, fit in fits.items() if fit is not None}
                for n in sizes if n not in reached and any(fit is not None for fit in fits.values())
            },
        })  # fmt: skip
    return out


def paper_comparison(points: list[dict[str, Any]], series: list[dict[str, Any]]) -> dict[str, Any]:
    """Table 5's 405 MB (AOL 4M, r = 10, 512-bit keys) next to this run's 4M x 10 point, measured
    or extrapolated from its series."""
    out: dict[str, Any] = {"paper": {**PAPER_POINT, "source": "CELS Table 5 (all parties' total bandwidth)"}}
    for s in series:
        if s["parties"] != PAPER_POINT["parties"] or s.get("engine", LOCAL) != LOCAL:  # the engine moves no byte
            continue
        measured = [p for p in points if (*series_key(p), p["pairs"], p["status"]) == (s["solve"], s["parties"], LOCAL, PAPER_POINT["pairs"], "ok")]
        guess = s["extrapolated"].get(str(PAPER_POINT["pairs"]), {}).get("bytes_total")
        out[s["solve"]] = (
            {"bytes": measured[0]["bytes_total"], "measured": True} if measured
            else {"bytes": guess, "measured": False} if guess is not None else None
        )  # fmt: skip
    return out


def csv_row(point: dict[str, Any]) -> dict[str, Any]:
    """A point as one flat CSV row (per-node figures stay in the JSON)."""
    row = {k: point.get(k) for k in ("solve", "parties", "pairs", "users", "entries", "size", "shared_pairs", "key_bits", "status",
                                     "point_seconds", "offline_seconds", "online_seconds", "total_seconds", "bytes_total",
                                     "wire_bytes_total", "peak_rss_bytes_max", "peak_rss_with_workers_bytes_max",
                                     "party_node_peak_rss_bytes_max", "shard_peak_rss_bytes_max", "pair_worker_peak_rss_bytes_max",
                                     "outside_phases_seconds")}  # fmt: skip
    row = {"engine": point.get("engine", LOCAL), **row, "universe_busy_fraction": (point.get("universe_cpu") or {}).get("busy_fraction")}
    for name in WORK_PHASES:  # every phase a point can have, in protocol order
        phase = point.get("phases", {}).get(name, {})
        row |= {f"{name}_wall_seconds": phase.get("wall_seconds"), f"{name}_busy_seconds": phase.get("busy_seconds"), f"{name}_bytes": phase.get("bytes")}
    return row


def plot(result: dict[str, Any], path: Path) -> None:
    """Log-log seconds (offline + online), bytes and peak RSS against pairs: one line per
    (solve, r, engine) with its fitted slope in the legend (a repeated point's runs as dashes
    beside its median), Table 5's 405 MB beside the 4M x
    10 point, and an x where a series ran out of time; the RSS panel has the party node's peak
    (every engine) and, for Ray, the largest shard's and pair-work worker's."""
    from cels.experiments.common import panels, save_figure

    fig, axes = panels(3, width=5.6, height=4.2)
    styles = {"private": "-", "transformed": "--"}
    groups = sorted({(p["parties"], p.get("engine", LOCAL)) for p in result["points"]})  # also a resumed file's other series
    colours = {g: f"C{k}" for k, g in enumerate(groups)}  # colour: r and engine; line style: the solve
    rss_kinds = {"party_node_peak_rss_bytes_max": ("node", "o"), "shard_peak_rss_bytes_max": ("largest shard", "s"),
                 "pair_worker_peak_rss_bytes_max": ("largest pair worker", "^")}  # fmt: skip
    for s in result["series"]:
        engine = s.get("engine", LOCAL)
        mine = [p for p in result["points"] if series_key(p) == (s["solve"], s["parties"], engine)]
        ran = [p for p in mine if p["status"] == "ok"]
        colour = colours[(s["parties"], engine)]
        for ax, what in zip(axes[0], ("total_seconds", "bytes_total")):
            slope = s["slope"][what]
            label = f"{s['solve']}, r = {s['parties']}, {engine}" + ("" if slope is None else f" (slope {slope:.2f})")
            ax.plot([p["pairs"] for p in ran], [p[what] for p in ran], styles.get(s["solve"], ":"), marker="o", color=colour, label=label)
        runs = [(p["pairs"], run["total_seconds"]) for p in ran for run in p.get("repeats", []) if run["status"] == "ok"]
        if runs:  # --repeat: every run of a point beside its median
            axes[0, 0].plot(*zip(*runs), "_", color=colour, markersize=12, alpha=0.7)
        for what, (name, marker) in rss_kinds.items():
            drawn = [p for p in ran if p.get(what)]
            if drawn:
                axes[0, 2].plot([p["pairs"] for p in drawn], [p[what] / 2**20 for p in drawn], styles.get(s["solve"], ":"), marker=marker,
                                color=colour, label=f"{name}: {s['solve']}, r = {s['parties']}, {engine}")  # fmt: skip
        for p in mine:
            if p["status"] == "time_limit":
                axes[0, 0].plot([p["pairs"]], [p["point_seconds"]], "x", color=colour, markersize=9)
    axes[0, 1].plot([PAPER_POINT["pairs"] * 1.12], [PAPER_POINT["bytes"]], "*", color="k", markersize=12,
                    label="paper Table 5: AOL 4M, r = 10, 512-bit keys (405 MB)")  # fmt: skip
    titles = ("seconds (offline + online; a repeated point: its median, each run a dash); x: over the time limit", "bytes of protocol messages (all nodes)",
              "peak RSS (MiB): party node, Ray shard, Ray pair worker")  # fmt: skip
    for ax, title in zip(axes[0], titles):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("distinct query-url pairs")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # the RSS panel is empty without a node's figures
            ax.legend(fontsize=7)
    fig.suptitle(f"cels bench scale: {result['key_bits']}-bit keys, {result['machine']['cores']} cores ({load_range(result)})", fontsize=10)
    save_figure(fig, path)


def load_range(result: dict[str, Any]) -> str:
    """The 1-minute load at the start of the points (each point's own; a point kept from an
    older file without one: the load at that run's start), as the plot's title states it."""
    before = result.get("resumed", {}).get("machine_before", result["machine"])["load_average_start"][0]
    loads = [p.get("load_average_start", before) for p in result["points"] if p["status"] != "skipped"] or [before]
    low, high = min(loads), max(loads)
    return f"load {low:.1f} at the points' start" if f"{low:.1f}" == f"{high:.1f}" else f"load {low:.1f}-{high:.1f} at the points' start"


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """scale.json, scale.csv and scale.png (each atomically)."""
    from cels.experiments.common import write_csv

    atomic_write_json(out / "scale.json", result)
    if result["points"]:
        write_csv([csv_row(p) for p in result["points"]], out / "scale.csv")
        plot(result, out / "scale.png")
