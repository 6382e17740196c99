"""``cels bench scale``: the cost curve of whole CELS sessions against the input size (issue 14).

For every input size (distinct query-url pairs, default 10K, 100K, 1M, 4M), number of parties r
(default 3 and 10) and phase-3 mode (``--solve``, default private) it generates an AOL-shaped
synthetic histogram (:func:`cels.logs.synthetic.synthetic_histogram`), writes the parties' files
and runs one session over node processes as ``cels bench protocol --runner processes`` does
(:func:`cels.bench.protocol.bench_processes`): for ``--solve transformed`` an offline phase
that stocks the obfuscators of the counts phase's secure sums, then the session (the private
solve masks its sums and has no offline phase).  Each point records the seconds of every
phase (wall clock and busy), its bytes, every node's peak RSS and the offline / online totals.

A (solve, r) series runs from the smallest size up; a point that exceeds ``--point-time-limit``
(default 30 min) or fails stops its series, and the larger sizes are recorded as skipped, with
the fitted curve's extrapolation.  The fitted slope is the least-squares line of log(y) on
log(pairs) over the points that ran (README, "Scale").

Writes ``scale.json``, ``scale.csv`` and the log-log ``scale.png`` into ``--out`` after every
point (atomically), and prints the JSON at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tqdm import tqdm

from cels.bench.protocol import PAPER_TABLE5_MB, bench_processes, solve_result
from cels.protocol.phases import WORK_PHASES, party_phases
from cels.crypto.paillier import DEFAULT_KEY_BITS, Packing, PublicKey
from cels.fileio import atomic_write_json
from cels.logs.synthetic import SyntheticHistogram, synthetic_histogram
from cels.node.client import SessionAborted
from cels.protocol.options import SOLVE_MODES, SessionOptions
from cels.protocol.stages.sums import COUNT_BOUND

DEFAULT_PAIRS = "10K,100K,1M,4M"
DEFAULT_PARTIES = "3,10"
DEFAULT_POINT_TIME_LIMIT = 1800.0


PAPER_POINT = {"pairs": 4_000_000, "parties": 10, "bytes": PAPER_TABLE5_MB["AOL 4M"][10] * 1e6, "key_bits": 512}
"""CELS Table 5's largest run: AOL 4M over r = 10, all parties' bytes (512-bit Paillier, 1024-bit PH)."""
SUFFIXES = {"K": 10**3, "M": 10**6}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scale", help="the cost curve: whole sessions on synthetic AOL-shaped logs of growing size")
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help=f"input sizes in distinct query-url pairs, comma list with K / M (default {DEFAULT_PAIRS})")
    parser.add_argument("--parties", default=DEFAULT_PARTIES, help=f"numbers of parties r, comma list (default {DEFAULT_PARTIES})")
    parser.add_argument("--solve", action="append", choices=SOLVE_MODES, help="phase 3's mode, one series each; repeat for both (default private)")
    parser.add_argument("--key-bits", type=int, default=DEFAULT_KEY_BITS, help="Paillier key bits (default 2048; smaller only for tests)")
    parser.add_argument("--point-time-limit", type=float, default=DEFAULT_POINT_TIME_LIMIT, metavar="SECONDS",
                        help="offline phase + session of one point; past it the series stops (default 1800)")  # fmt: skip
    parser.add_argument("--no-stock", action="store_true", help="no offline phase for --solve transformed: every obfuscator is computed during the session (the private solve has none)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic logs (default 7)")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=0.4)
    parser.add_argument("--out", type=Path, required=True, help="directory for scale.json, scale.csv and scale.png")
    parser.add_argument("--resume", action="store_true", help="keep the points of --out's scale.json that ran or ran out of time (same settings)")
    parser.set_defaults(func=run)


def parse_sizes(text: str, flag: str) -> list[int]:
    """``"10K,1M,2500"`` -> [10000, 1000000, 2500]: positive, increasing, each once."""
    sizes = []
    for item in (v.strip().upper() for v in text.split(",") if v.strip()):
        scale = SUFFIXES.get(item[-1:], 1)
        try:
            value = float(item[:-1] if item[-1:] in SUFFIXES else item) * scale
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a number (e.g. 2500, 10K, 1.5M)") from None
        if value < 1 or value != int(value):
            raise ValueError(f"{flag}: {item!r} is not a positive whole number")
        sizes.append(int(value))
    if not sizes or sorted(set(sizes)) != sizes:
        raise ValueError(f"{flag} must list increasing sizes, each once, got {text!r}")
    return sizes


def fitted_slope(pairs: list[float], values: list[float]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line log(value) = intercept + slope log(pairs)
    (natural logs) over at least two distinct sizes; None otherwise."""
    if len(set(pairs)) < 2 or any(v <= 0 for v in values):
        return None
    slope, intercept = np.polyfit(np.log(pairs), np.log(values), 1)
    return float(slope), float(intercept)


def sum_obfuscators(pairs: int, parties: int, key_bits: int) -> int:
    """Obfuscators one party spends under P_1's key (CELS Algorithm 1): the counts phase's two
    secure sums over the universe of ``pairs`` -- the counts (|c_i| <= COUNT_BOUND) and the
    0/1 "held whole" vector -- packed as :class:`Packing` packs them, one per ciphertext, plus
    2 % and 64 for the sampling's small sums.  The offline phase stocks this many."""
    stand_in = PublicKey(1 << (key_bits - 1) | 1, 2)  # Packing reads only the key's size
    blocks = sum(Packing.for_values(stand_in, bound, parties).blocks(pairs) for bound in (COUNT_BOUND, 1))
    return math.ceil(blocks * 1.02) + 64


def machine() -> dict[str, Any]:
    """Cores, memory and the load average: the machine is shared, so the load says how much of it the run had."""
    return {
        "cores": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
        "load_average_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def run_point(histogram: SyntheticHistogram, shares: list[Path], solve: str, args: argparse.Namespace) -> dict[str, Any]:
    """One session on ``shares``; its figures, or its status if it failed or ran out of time."""
    parties = len(shares)
    options = SessionOptions.create(parties, epsilon=args.epsilon, delta=args.delta, key_bits=args.key_bits, solve=solve)
    # the private solve sums by pairwise masks: it encrypts nothing, so it has no offline phase
    stock = None if args.no_stock or solve == "private" else {options.parties[0]: sum_obfuscators(histogram.pairs, parties, args.key_bits)}
    point: dict[str, Any] = {"solve": solve, "parties": parties, **histogram.shape(), "key_bits": args.key_bits, "load_average_start": os.getloadavg()[0]}
    start = time.perf_counter()
    try:
        result = bench_processes(shares, options, ["--format", "histogram"], stock, timeout=args.point_time_limit)
    except (SessionAborted, TimeoutError, RuntimeError, grpc.RpcError) as exc:  # aborted, over time, a node died or did not answer
        seconds = time.perf_counter() - start
        over = seconds >= args.point_time_limit
        error = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
        return {**point, "status": "time_limit" if over else "failed", "point_seconds": seconds, "error": error}
    report = result["report"]
    figures = solve_result(result, parties)
    offline = figures["offline"] or {}
    walls = report.get("phase_wall_seconds", {})
    phases = {
        name: {
            "wall_seconds": walls.get(name),
            "busy_seconds": entry["seconds_total"],
            "busy_seconds_by_node": entry["seconds"],
            "bytes": entry["bytes_total"],
            "bytes_by_node": entry["bytes"],
        }
        for name in party_phases(solve)
        if (entry := figures["phases"].get(name)) is not None
    }
    rss = report.get("peak_rss_bytes", {})
    online = figures["online"]["wall_seconds"]
    return {
        **point,
        "status": "ok",
        "point_seconds": time.perf_counter() - start,
        "offline_seconds": offline.get("seconds", 0.0),
        "online_seconds": online,
        "total_seconds": offline.get("seconds", 0.0) + online,
        "bytes_total": figures["bytes_total"],
        "wire_bytes_total": (figures["wire"] or {}).get("bytes_total"),
        "phases": phases,
        "peak_rss_bytes": rss,
        "peak_rss_bytes_max": max((r["process"] for r in rss.values()), default=None),
        "peak_rss_with_workers_bytes_max": max((r["process"] + r["workers"] for r in rss.values()), default=None),
        "obfuscators": {
            "stocked_per_party": None if stock is None else next(iter(stock.values())),
            "computed_online": offline.get("computed_online"),
        },
        "solver": figures["solver"],
        "output_records": (figures["sizes"] or {}).get("output_records"),
    }


def outside_phases_seconds(point: dict[str, Any]) -> float:
    """Online seconds not inside any phase's wall clock: the session's start (StartSession to
    every node, BEGIN, and the initiator's own start -- its log's load and first hashes --
    before its first phase event) and its finish."""
    return point["online_seconds"] - sum(p["wall_seconds"] or 0.0 for p in point["phases"].values())


def series_summary(points: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Per (solve, r): the fitted slopes of total and online seconds and of bytes, why the
    series stopped, and the fitted curve at the sizes it did not reach (this run's and every
    size in the file, so a resumed run keeps the 4M guesses of the series it did not run)."""
    sizes = sorted(set(sizes) | {p["pairs"] for p in points})
    out = []
    for key in dict.fromkeys((p["solve"], p["parties"]) for p in points):
        mine = [p for p in points if (p["solve"], p["parties"]) == key]
        ran = [p for p in mine if p["status"] == "ok"]
        x = [p["pairs"] for p in ran]
        fits = {what: fitted_slope(x, [p[what] for p in ran]) for what in ("total_seconds", "online_seconds", "bytes_total")}
        stopped = next((p for p in mine if p["status"] in ("time_limit", "failed")), None)
        reached = {p["pairs"] for p in ran}
        out.append({
            "solve": key[0], "parties": key[1], "points": len(ran),
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
        if s["parties"] != PAPER_POINT["parties"]:
            continue
        measured = [p for p in points if (p["solve"], p["parties"], p["pairs"], p["status"]) == (s["solve"], s["parties"], PAPER_POINT["pairs"], "ok")]
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
                                     "outside_phases_seconds")}  # fmt: skip
    for name in WORK_PHASES:  # every phase a point can have, in protocol order
        phase = point.get("phases", {}).get(name, {})
        row |= {f"{name}_wall_seconds": phase.get("wall_seconds"), f"{name}_busy_seconds": phase.get("busy_seconds"), f"{name}_bytes": phase.get("bytes")}
    return row


def plot(result: dict[str, Any], path: Path) -> None:
    """Log-log seconds (offline + online) and bytes against pairs: one line per (solve, r)
    with its fitted slope in the legend, Table 5's 405 MB beside the 4M x 10 point, and an x
    where a series ran out of time."""
    from cels.experiments.common import panels, save_figure

    fig, axes = panels(2, width=5.6, height=4.2)
    styles = {"private": "-", "transformed": "--"}
    parties = sorted({p["parties"] for p in result["points"]})  # also a resumed file's other series
    colours = {r: f"C{k}" for k, r in enumerate(parties)}  # colour: r; line style: the solve
    for s in result["series"]:
        mine = [p for p in result["points"] if (p["solve"], p["parties"]) == (s["solve"], s["parties"])]
        ran = [p for p in mine if p["status"] == "ok"]
        colour = colours[s["parties"]]
        for ax, what in zip(axes[0], ("total_seconds", "bytes_total")):
            slope = s["slope"][what]
            label = f"{s['solve']}, r = {s['parties']}" + ("" if slope is None else f" (slope {slope:.2f})")
            ax.plot([p["pairs"] for p in ran], [p[what] for p in ran], styles.get(s["solve"], ":"), marker="o", color=colour, label=label)
        for p in mine:
            if p["status"] == "time_limit":
                axes[0, 0].plot([p["pairs"]], [p["point_seconds"]], "x", color=colour, markersize=9)
    axes[0, 1].plot([PAPER_POINT["pairs"] * 1.12], [PAPER_POINT["bytes"]], "*", color="k", markersize=12,
                    label="paper Table 5: AOL 4M, r = 10, 512-bit keys (405 MB)")  # fmt: skip
    titles = ("seconds (offline + online); x: over the time limit", "bytes of protocol messages (all nodes)")
    for ax, title in zip(axes[0], titles):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("distinct query-url pairs")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
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


def generate_and_run(pairs: int, parties: int, solve: str, args: argparse.Namespace) -> dict[str, Any]:
    """Generate the synthetic input, write the parties' files, run the point; a point that
    failed (not one over its time limit) is run once more -- the machine is shared, and a
    node that misses a Status poll under load should not end a series -- and the retry's
    result is kept with the first failure under ``retried_after``."""
    start = time.perf_counter()
    histogram = synthetic_histogram(pairs, seed=args.seed)
    generated = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="cels-scale-") as tmp:
        start = time.perf_counter()
        shares = histogram.write_shares(tmp, parties)
        written = time.perf_counter() - start
        point = run_point(histogram, shares, solve, args)
        if point["status"] == "failed":
            point = run_point(histogram, shares, solve, args) | {"retried_after": point["error"]}
        return point | {"generate_seconds": generated, "write_seconds": written}


def resumed_points(args: argparse.Namespace, settings: dict[str, Any]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """With ``--resume``: the points of ``--out``'s scale.json that ran or ran out of time,
    by (solve, r, pairs), if that run had the same settings (else a ValueError naming the key).
    They are kept, also those of series this run does not ask for."""
    path = args.out / "scale.json"
    if not args.resume or not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    for key, value in settings.items():
        if earlier.get(key) != value:
            raise ValueError(f"--resume: {path} has {key} = {earlier.get(key)!r}, this run {value!r}")
    return {(p["solve"], p["parties"], p["pairs"]): p for p in earlier["points"] if p["status"] in ("ok", "time_limit")}


def record(result: dict[str, Any], point: dict[str, Any], sizes: list[int], out: Path) -> None:
    """Add a point, refit the series and write every output again."""
    if point["status"] == "ok":
        point.setdefault("outside_phases_seconds", outside_phases_seconds(point))
    result["points"].append(point)
    result["series"] = series_summary(result["points"], sizes)
    result["paper_table5"] = paper_comparison(result["points"], result["series"])
    result["machine"]["load_average_now"] = list(os.getloadavg())
    write_outputs(result, out)


def run(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.pairs, "--pairs")
    parties = parse_sizes(args.parties, "--parties")
    solves = list(dict.fromkeys(args.solve or ["private"]))
    if args.point_time_limit <= 0:
        raise ValueError("--point-time-limit must be > 0 seconds")
    if min(parties) < 2:
        raise ValueError("--parties: a session needs r >= 2")
    if args.key_bits < DEFAULT_KEY_BITS:
        print(f"cels bench scale: WARNING: {args.key_bits}-bit keys are NOT secure (tests only)", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "scale",
        "machine": machine(),
        "key_bits": args.key_bits,
        "pairs": sizes,
        "parties": parties,
        "solves": solves,
        "point_time_limit_seconds": args.point_time_limit,
        "offline": "none" if args.no_stock else "private: none (masked sums); transformed: obfuscators of the secure sums stocked under P_1's node key before each session",
        "synthetic": {"generator": "cels.logs.synthetic.synthetic_histogram", "seed": args.seed},
        "points": [],
        "series": [],
    }
    kept = resumed_points(args, {k: result[k] for k in ("key_bits", "point_time_limit_seconds", "offline", "synthetic")})
    if kept:
        result["resumed"] = {"points_kept": len(kept), "machine_before": json.loads((args.out / "scale.json").read_text())["machine"]}
    with tqdm(total=len(sizes) * len(parties) * len(solves), desc="scale points", unit="point", file=sys.stderr, disable=None) as bar:
        for solve in solves:  # series after series, each from its smallest size up
            for r in parties:
                stopped = False
                for n in sizes:
                    bar.set_postfix_str(f"{solve}, r = {r}, {n} pairs")
                    if stopped:
                        point = {"solve": solve, "parties": r, "pairs": n, "status": "skipped", "error": "an earlier point of this series stopped it"}
                    else:
                        point = kept.get((solve, r, n)) or generate_and_run(n, r, solve, args)
                        stopped = point["status"] != "ok"
                    record(result, point, sizes, args.out)
                    bar.update(1)
    ran = {(p["solve"], p["parties"], p["pairs"]) for p in result["points"]}
    for key, point in kept.items():  # a resumed file's other series stay in it
        if key not in ran:
            record(result, point, sizes, args.out)
    print(json.dumps(result, indent=2))
    return 0
