"""``cels bench mechanism --json FILE [--data DIR]``: load, prune, solve and sample on real logs.

Cases (each in a fresh process so its peak RSS is its own):
- AOL slice at b = 1: every objective, integer total / LP bound;
- MSNBC first 20,000 users at b = 0.1, with and without the cap K = 1;
- the whole MSNBC file (990k users): load -> prune -> O-UMP (target: < 60 s, < 4 GB).
Prints the JSON and writes it atomically to FILE.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels.fileio import atomic_write_json
from cels.logs import LoadOptions, default_data_dir, load_log
from cels.mechanism.conditions import build_conditions
from cels.mechanism.sampling import make_rng, multinomial_sample
from cels.mechanism.defaults import OBJECTIVES
from cels.mechanism.solvers import feasible, solve
from cels.workers import worker_pool

AOL_FILE = "aol-dev.tsv.gz"
MSNBC_FILE = "msnbc990928.seq.gz"


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def run_case(path: str, fmt: str, b: float, objectives: tuple[str, ...], max_users: int | None, cap: int | None, time_limit: float) -> dict:
    """One case: load, build + prune the conditions, solve each objective, sample once."""
    t0 = time.perf_counter()
    log = load_log(path, LoadOptions(format=fmt, max_users=max_users))
    t1 = time.perf_counter()
    cond, var_pairs = build_conditions(log, b, cap=cap)
    t2 = time.perf_counter()
    out: dict = {
        "file": Path(path).name, "format": fmt, "max_users": max_users, "cap": cap, "b": b,
        "users": log.n_users, "pairs": log.n_pairs, "size": log.size,
        "nonunique_pairs": int(len(var_pairs)), "rows_after_pruning": int(cond.G.shape[0]),
        "load_seconds": round(t1 - t0, 3), "conditions_prune_seconds": round(t2 - t1, 3), "objectives": {},
    }  # fmt: skip
    first = None
    for objective in objectives:
        t = time.perf_counter()
        sol = solve(cond, objective, time_limit=time_limit, integer="mip")
        out["objectives"][objective] = {
            "solve_seconds": round(time.perf_counter() - t, 3),
            "lp_objective": sol.lp_objective,
            "max_output_lp": sol.max_output_lp,
            "lp_total": sol.lp_total,
            "integer_total": sol.integer_total,
            "integer_ratio": round(sol.integer_ratio, 4),
            "integer_ratio_to_max_output": round(sol.integer_total / sol.max_output_lp, 4) if sol.max_output_lp else None,
            "integer_method": sol.integer_method,
            "integer_source": sol.integer_source,
            "feasible": feasible(cond, sol.x),
        }
        first = first or sol
    x = np.zeros(log.n_pairs, dtype=np.int64)
    x[var_pairs] = first.x
    t = time.perf_counter()
    multinomial_sample(log, x, make_rng(1))
    out["sample_seconds"] = round(time.perf_counter() - t, 3)
    out["total_seconds"] = round(time.perf_counter() - t0, 3)
    out["peak_rss_bytes"] = _peak_rss_bytes()
    return out


def cases(data: Path, time_limit: float) -> list[tuple[str, tuple]]:
    aol, msnbc = str(data / AOL_FILE), str(data / MSNBC_FILE)
    return [
        ("aol_slice_b1", (aol, "aol", 1.0, OBJECTIVES, None, None, time_limit)),
        ("msnbc_20k_b0.1", (msnbc, "msnbc", 0.1, OBJECTIVES, 20_000, None, time_limit)),
        ("msnbc_20k_b0.1_cap1", (msnbc, "msnbc", 0.1, ("max-output",), 20_000, 1, time_limit)),
        ("msnbc_full_b0.1_oump", (msnbc, "msnbc", 0.1, ("max-output",), None, None, time_limit)),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench mechanism`` (cels.cli.bench)."""
    parser.add_argument("--json", required=True, metavar="FILE", help="where to write the JSON result")
    parser.add_argument("--data", default=None, metavar="DIR", help="directory of the real logs (default $CELS_DATA or ../shared/data)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="MIP time limit per objective (seconds)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data = Path(args.data) if args.data else default_data_dir()
    for name in (AOL_FILE, MSNBC_FILE):
        if not (data / name).is_file():
            raise ValueError(f"{data / name} is missing (set --data or CELS_DATA)")
    result: dict = {"data": str(data), "cases": {}}
    todo = cases(data, args.time_limit)
    for name, case_args in tqdm(todo, desc="bench mechanism", unit="case", file=sys.stderr):
        with worker_pool(1) as pool:
            result["cases"][name] = pool.submit(run_case, *case_args).result()
    full = result["cases"]["msnbc_full_b0.1_oump"]
    result["msnbc_full_target"] = {
        "load_prune_oump_seconds": round(full["load_seconds"] + full["conditions_prune_seconds"] + full["objectives"]["max-output"]["solve_seconds"], 3),
        "peak_rss_bytes": full["peak_rss_bytes"],
        "meets_60s_4GB": bool(full["total_seconds"] < 60 and full["peak_rss_bytes"] < 4 * 2**30),
    }
    atomic_write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0
