"""``cels bench engine``: the same seeded release in process and on Ray with P user shards
(docs/ray.md, "A party on a Ray cluster"; issue 25's "same output").

One command runs the same seeded session (``--seed``: every party's draws replayed, so the
release is NOT private) over node processes on 127.0.0.1, first with every party's work in
its process, then with it on a local Ray instance of each party node for each P of
``--shards``, and prints JSON: per run the SHA-256 of the release file, the wall clock, the
seconds of every phase and every node's peak RSS; ``same_output`` is whether every hash is the
local one.  Default input: the AOL slice (``$CELS_DATA/aol-dev.tsv.gz``) over r = 3 parties.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cels.bench.protocol import bench_processes
from cels.cli.options import DEMO_BUDGET, SESSION_FLAGS, add_option_arguments, session_values
from cels.fileio import atomic_write_json
from cels.logs import load_log
from cels.logs.options import LoadOptions, default_data_dir
from cels.protocol.options import SessionOptions

AOL_SLICE = "aol-dev.tsv.gz"
DEFAULT_SHARDS = "1,2,4"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench engine`` (cels.cli.bench)."""
    parser.add_argument("--input", type=Path, help=f"AOL-format log (default: $CELS_DATA/{AOL_SLICE})")
    parser.add_argument("--max-users", type=int, help="keep the first N users of the input")
    parser.add_argument("--parties", type=int, default=3, help="number of parties r (default 3)")
    parser.add_argument("--shards", default=DEFAULT_SHARDS, help=f"user shards P of the Ray runs, comma list (default {DEFAULT_SHARDS})")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="the replay seed of every party's draws (default 1; the releases are NOT private)")
    parser.add_argument("--json", type=Path, help="also write the JSON here (atomically)")
    add_option_arguments(parser, SESSION_FLAGS, DEMO_BUDGET)
    parser.set_defaults(func=run)


def shard_counts(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4] (positive, each once, in order)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--shards must be a comma list of positive integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--shards must be a comma list of positive integers, not {text!r}")
    return list(dict.fromkeys(values))


def release_run(shares: list, options: SessionOptions, flags: list[str], label: str) -> dict[str, Any]:
    """One session over node processes with ``flags`` on every party node
    (cels.bench.protocol.bench_processes): the release's hash and the session's costs."""
    print(f"cels bench engine: {label} ...", file=sys.stderr, flush=True)
    result = bench_processes(shares, options, ["--format", "histogram"], None, party_flags=flags)
    report = result["report"]
    return {
        "run": label,
        "sha256": result["release_sha256"],
        "wall_seconds": result["wall_seconds"],
        "session_wall_seconds": report["wall_seconds"],
        "phase_wall_seconds": report.get("phase_wall_seconds"),
        "peak_rss_bytes": report.get("peak_rss_bytes"),
        "released_records": report["sizes"].get("output_records"),
    }


def run(args: argparse.Namespace) -> int:
    shards = shard_counts(args.shards)
    path = args.input or default_data_dir() / AOL_SLICE
    if not path.is_file():
        raise ValueError(f"{path} is missing (give --input or set CELS_DATA)")
    log = load_log(path, LoadOptions(format="aol", max_users=args.max_users))
    options = SessionOptions.create(args.parties, **session_values(args))
    shares = log.split_by_user(args.parties)
    for share in shares:  # written as histogram TSV: lossless for any input
        share.source = {"format": "histogram"}
    seed = ["--seed", str(args.seed)]
    runs = [release_run(shares, options, seed, "local")]
    for p in shards:
        runs.append(release_run(shares, options, [*seed, "--engine", "ray", "--shards", str(p)], f"ray P={p}"))
    local = runs[0]
    out = {
        "benchmark": "engine",
        "input": str(path),
        "users": log.n_users,
        "pairs": log.n_pairs,
        "size": log.size,
        "parties": args.parties,
        "key_bits": options.key_bits,
        "solve": options.solve,
        "seed": args.seed,
        "runs": runs,
        "same_output": all(r["sha256"] == local["sha256"] for r in runs),
        "wall_ratio_to_local": {r["run"]: r["wall_seconds"] / local["wall_seconds"] for r in runs[1:]},
    }
    text = json.dumps(out, indent=2, default=float)
    print(text)
    if args.json is not None:
        atomic_write_json(args.json, json.loads(text))
    return 0 if out["same_output"] else 1
