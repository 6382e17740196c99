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
log(pairs) over the points that ran (docs/performance.md, "Scale").

With ``--engine ray --shards P`` (the flags of ``cels simulate``) every size also runs on the
Ray engine -- each party node on its own Ray instance with P user shards -- and, for P > 1,
with one shard (the single-process figure the shards are measured against), on the same
input right after the local point; each point adds the party nodes' peak RSS, every shard's
and the pair-work workers' peak RSS, and the universe phase's busy cores, and ``targets``
holds the engine's targets as ratios with pass / fail (cels.bench.engine_targets).

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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import grpc
from tqdm import tqdm

from cels.bench.engine_targets import LOCAL, engine_figures, engine_label, engine_targets
from cels.bench.protocol import bench_processes, solve_result
from cels.certs import SOLVER
from cels.engine.options import EngineOptions
from cels.protocol.machines import PARTY
from cels.crypto.key_sizes import DEFAULT_KEY_BITS
from cels.crypto.paillier import PublicKey
from cels.crypto.packing import Packing
from cels.logs.synthetic import SyntheticHistogram, synthetic_histogram
from cels.node.client import SessionAborted
from cels.engine.options import add_engine_arguments, engine_options
from cels.cli.options import DEMO_DELTA
from cels.protocol.options import OPTION, RELEASES, SOLVE_MODES, SessionOptions
from cels.protocol.stages.sums import COUNT_BOUND
from cels.bench.scale_report import outside_phases_seconds, paper_comparison, series_key, series_summary, write_outputs
from cels.protocol.releases import DP_HISTOGRAM, SAMPLED

DEFAULT_PAIRS = "10K,100K,1M,4M"
DEFAULT_PARTIES = "3,10"
DEFAULT_POINT_TIME_LIMIT = 1800.0


SUFFIXES = {"K": 10**3, "M": 10**6}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench scale`` (cels.cli.bench)."""
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help=f"input sizes in distinct query-url pairs, comma list with K / M (default {DEFAULT_PAIRS})")
    parser.add_argument("--parties", default=DEFAULT_PARTIES, help=f"numbers of parties r, comma list (default {DEFAULT_PARTIES})")
    parser.add_argument("--solve", action="append", choices=SOLVE_MODES, help="phase 3's mode, one series each; repeat for both (default private)")
    parser.add_argument("--release", action="append", choices=RELEASES,
                        help="the release kind, one series each (sampled: one per --solve; dp: the DP histogram, docs/releases.md); repeat for both (default sampled)")
    parser.add_argument("--max-items-per-user", type=int, default=OPTION["max_items_per_user"].default, metavar="D0",
                        help=f"the DP histogram's Delta_0 (default {OPTION['max_items_per_user'].default})")
    parser.add_argument("--key-bits", type=int, default=DEFAULT_KEY_BITS, help="Paillier key bits (default 2048; smaller only for tests)")
    parser.add_argument("--point-time-limit", type=float, default=DEFAULT_POINT_TIME_LIMIT, metavar="SECONDS",
                        help="offline phase + session of one point; past it the series stops (default 1800)")  # fmt: skip
    parser.add_argument("--no-stock", action="store_true", help="no offline phase for --solve transformed: every obfuscator is computed during the session (the private solve has none)")
    parser.add_argument("--log-format", choices=("histogram", "parquet"), default="histogram",
                        help="the parties' input files (default histogram TSV; parquet: row groups the Ray engine's reader tasks read on the cluster)")
    parser.add_argument("--log-seed", type=int, default=7, help="seed of the synthetic logs (default 7; --seed elsewhere replays a session's draws)")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=None, help="default: " + ", ".join(f"{v:g} for --release {k}" for k, v in DEMO_DELTA.items()))
    parser.add_argument("--out", type=Path, required=True, help="directory for scale.json, scale.csv and scale.png")
    parser.add_argument("--resume", action="store_true", help="keep the points of --out's scale.json that ran or ran out of time (same settings)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="sessions per point, the engines in turn on one input; a point is its median run, every run's seconds beside it (default 1)")  # fmt: skip
    add_engine_arguments(parser)
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


def engines(args: argparse.Namespace) -> list[EngineOptions]:
    """The engines this run compares: local; with ``--engine ray`` also Ray at ``--shards P`` and,
    for P > 1, at P = 1 (the single-process figure of the shard target)."""
    given = engine_options(args, {})
    if given.kind == LOCAL:
        return [given]
    return [EngineOptions(), given, *([replace(given, shards=1)] if given.shards > 1 else [])]


def run_point(histogram: SyntheticHistogram, shares: list[Path], solve: str, args: argparse.Namespace, engine: EngineOptions = EngineOptions()) -> dict[str, Any]:
    """One session on ``shares`` on ``engine``; its figures, or its status if it failed or ran out of time."""
    parties = len(shares)
    kind = {"release": DP_HISTOGRAM.name, "max_items_per_user": args.max_items_per_user} if solve == "dp" else {"solve": solve}
    delta = args.delta if args.delta is not None else DEMO_DELTA[kind.get("release", SAMPLED.name)]
    options = SessionOptions.create(parties, epsilon=args.epsilon, delta=delta, key_bits=args.key_bits, **kind)
    # the private solve sums by pairwise masks: it encrypts nothing, so it has no offline phase
    stock = None if args.no_stock or solve in ("private", "dp") else {options.parties[0]: sum_obfuscators(histogram.pairs, parties, args.key_bits)}
    point: dict[str, Any] = {
        "solve": solve, "parties": parties, "engine": engine_label(engine.kind, engine.shards), "engine_options": asdict(engine),
        **histogram.shape(), "key_bits": args.key_bits, "load_average_start": os.getloadavg()[0],
    }  # fmt: skip
    start = time.perf_counter()
    try:
        result = bench_processes(shares, options, ["--format", args.log_format], stock, timeout=args.point_time_limit, party_flags=engine.argv())
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
        for name in PARTY[solve].phases
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
        "largest_message_bytes": (figures["wire"] or {}).get("largest_message_bytes"),
        "phases": phases,
        "peak_rss_bytes": rss,
        "peak_rss_bytes_max": max((r["process"] for r in rss.values()), default=None),
        "peak_rss_with_workers_bytes_max": max((r["process"] + r["workers"] for r in rss.values()), default=None),
        **engine_figures(report, [n for n in rss if n != SOLVER], os.cpu_count() or 1),
        "obfuscators": {
            "stocked_per_party": None if stock is None else next(iter(stock.values())),
            "computed_online": offline.get("computed_online"),
        },
        "solver": figures["solver"],
        "output_records": (figures["sizes"] or {}).get("output_records", (figures["sizes"] or {}).get("output_items")),
    }


def generate_and_run(pairs: int, parties: int, solve: str, args: argparse.Namespace, todo: dict[str, EngineOptions]) -> dict[str, dict[str, Any]]:
    """Generate the synthetic input, write the parties' files, run the point on each engine
    of ``todo`` (label -> engine) one after another; a point that failed (not one over its
    time limit) is run once more -- the machine is shared, and a node that misses a Status
    poll under load should not end a series -- and the retry's result is kept with the first
    failure under ``retried_after``."""
    start = time.perf_counter()
    histogram = synthetic_histogram(pairs, seed=args.log_seed)
    generated = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="cels-scale-") as tmp:
        start = time.perf_counter()
        shares = histogram.write_shares(tmp, parties, args.log_format)
        written = time.perf_counter() - start
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in todo}
        for _ in range(args.repeat):  # the engines in turn, so a change in the machine's load falls on each alike
            for label, engine in todo.items():
                point = run_point(histogram, shares, solve, args, engine)
                if point["status"] == "failed":
                    point = run_point(histogram, shares, solve, args, engine) | {"retried_after": point["error"]}
                runs[label].append(point)
        return {label: median_run(mine) | {"generate_seconds": generated, "write_seconds": written} for label, mine in runs.items()}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's figures: its one run, or (``--repeat``) the run of median total seconds among
    those that ran (the lower of the middle two), with every run's seconds and status in order
    under ``repeats``; if none ran, the first run."""
    ran = sorted((p for p in runs if p["status"] == "ok"), key=lambda p: p["total_seconds"])
    point = ran[(len(ran) - 1) // 2] if ran else runs[0]
    if len(runs) == 1:
        return point
    figures = ("status", "total_seconds", "online_seconds", "point_seconds", "load_average_start")
    return point | {"repeats": [{key: run[key] for key in figures if key in run} for run in runs]}


def resumed_points(args: argparse.Namespace, settings: dict[str, Any]) -> dict[tuple[str, int, str, int], dict[str, Any]]:
    """With ``--resume``: the points of ``--out``'s scale.json that ran or ran out of time,
    by (solve, r, engine, pairs), if that run had the same settings (else a ValueError naming the key).
    They are kept, also those of series this run does not ask for, unless another engine
    this run compares lacks that size (then every engine runs it again)."""
    path = args.out / "scale.json"
    if not args.resume or not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    for key, value in settings.items():
        if earlier.get(key, 1 if key == "repeat" else None) != value:  # a file from before --repeat ran each point once
            raise ValueError(f"--resume: {path} has {key} = {earlier.get(key)!r}, this run {value!r}")
    return {(*series_key(p), p["pairs"]): p for p in earlier["points"] if p["status"] in ("ok", "time_limit")}


def record(result: dict[str, Any], point: dict[str, Any], sizes: list[int], out: Path) -> None:
    """Add a point, refit the series and write every output again."""
    if point["status"] == "ok":
        point.setdefault("outside_phases_seconds", outside_phases_seconds(point))
    result["points"].append(point)
    result["series"] = series_summary(result["points"], sizes)
    result["paper_table5"] = paper_comparison(result["points"], result["series"])
    ray = [e for e in result["engines"] if e["kind"] == "ray"]  # the one asked for first, then P = 1
    if ray:
        result["targets"] = engine_targets(result["points"], engine_label("ray", ray[0]["shards"]), engine_label("ray", 1), ray[0]["shards"])
    result["machine"]["load_average_now"] = list(os.getloadavg())
    write_outputs(result, out)


DP_SESSION_RATIO = 0.25
"""The DP release's session against the sampled release's (private solve) on the same input: at most this."""
DP_4M_SECONDS = 120.0
"""The DP release at 4M pairs x 10 parties: a session of at most this many seconds."""


def dp_targets(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DP release's targets, one row per (parties, pairs, engine) it ran on: its online
    seconds against the sampled release's (private solve) on the same input, and at 4M x 10
    its seconds against :data:`DP_4M_SECONDS`."""
    ok = {(p["solve"], p["parties"], p["pairs"], p.get("engine", LOCAL)): p for p in points if p["status"] == "ok"}
    rows = []
    for (mode, parties, pairs, engine), point in sorted(ok.items(), key=lambda kv: kv[0][1:]):
        if mode != "dp":
            continue
        row: dict[str, Any] = {"parties": parties, "pairs": pairs, "engine": engine, "dp_seconds": point["online_seconds"]}
        sampled = ok.get(("private", parties, pairs, engine))
        if sampled is not None:
            row |= {"sampled_seconds": sampled["online_seconds"], "ratio": point["online_seconds"] / sampled["online_seconds"]}
            row["ratio_passes"] = row["ratio"] <= DP_SESSION_RATIO
        if (parties, pairs) == (10, 4_000_000):
            row["passes_120_s"] = point["online_seconds"] <= DP_4M_SECONDS
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.pairs, "--pairs")
    parties = parse_sizes(args.parties, "--parties")
    releases = list(dict.fromkeys(args.release or ["sampled"]))
    solves = (list(dict.fromkeys(args.solve or ["private"])) if "sampled" in releases else []) + (["dp"] if "dp" in releases else [])  # a series per mode
    if args.point_time_limit <= 0:
        raise ValueError("--point-time-limit must be > 0 seconds")
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, not {args.repeat}")
    if min(parties) < 2:
        raise ValueError("--parties: a session needs r >= 2")
    compared = {engine_label(e.kind, e.shards): e for e in engines(args)}
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
        "engines": [asdict(e) for e in compared.values()],
        "point_time_limit_seconds": args.point_time_limit,
        "repeat": args.repeat,
        "offline": "none" if args.no_stock else "private: none (masked sums); transformed: obfuscators of the secure sums stocked under P_1's node key before each session",
        "synthetic": {"generator": "cels.logs.synthetic.synthetic_histogram", "seed": args.log_seed, "format": args.log_format},
        "points": [],
        "series": [],
    }
    kept = resumed_points(args, {k: result[k] for k in ("key_bits", "point_time_limit_seconds", "repeat", "offline", "synthetic")})
    if kept:
        result["resumed"] = {"points_kept": len(kept), "machine_before": json.loads((args.out / "scale.json").read_text())["machine"]}
    with tqdm(total=len(sizes) * len(parties) * len(solves) * len(compared), desc="scale points", unit="point", file=sys.stderr, disable=None) as bar:
        for solve in solves:  # (solve, r) after (solve, r), each from its smallest size up, every engine on each size's input
            for r in parties:
                stopped: set[str] = set()
                for n in sizes:
                    bar.set_postfix_str(f"{solve}, r = {r}, {n} pairs")
                    running = {label: e for label, e in compared.items() if label not in stopped}
                    # a size the file lacks on one engine runs again on all: the engines compared ran in one invocation
                    fresh = generate_and_run(n, r, solve, args, running) if any((solve, r, label, n) not in kept for label in running) else {}
                    for label in compared:
                        if label in stopped:
                            point = {"solve": solve, "parties": r, "engine": label, "pairs": n, "status": "skipped", "error": "an earlier point of this series stopped it"}
                        else:
                            point = fresh.get(label) or kept[(solve, r, label, n)]
                            if point["status"] != "ok":
                                stopped.add(label)
                        record(result, point, sizes, args.out)
                        bar.update(1)
    if "dp" in solves:
        result["dp_targets"] = dp_targets(result["points"])
        write_outputs(result, args.out)
    ran = {(*series_key(p), p["pairs"]) for p in result["points"]}
    for key, point in kept.items():  # a resumed file's other series stay in it
        if key not in ran:
            record(result, point, sizes, args.out)
    print(json.dumps(result, indent=2))
    return 0
