"""``cels bench read [--input PATH] [--pairs N] [--json FILE]``: reading a Parquet log, the
columnar reader against the row reader, in one run (docs/formats.md, "Parquet").

Both build the histogram c_ij of the same file: ``ParquetReader.histogram`` (each record batch
numbered through its distinct values with pyarrow, row by row only where a batch has a bad row)
and ``SearchLog.from_records(ParquetReader.records())`` (every row a Python record).  Each runs
``--repeat`` times, in turn; the fastest CPU and wall seconds of each are kept, with rows per
CPU second and the speed-up.  The two histograms must be equal (users, pairs, counts, in order),
or the benchmark fails.  Without ``--input`` the log is a synthetic AOL-shaped one of
``--pairs`` pairs (cels.logs.synthetic), written as Parquet to a temporary directory.  Prints
the JSON and, with ``--json``, writes it atomically.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cels.fileio import atomic_write_json
from cels.logs import LoadOptions, SearchLog, parse_columns
from cels.logs.parquet import ParquetReader
from cels.logs.synthetic import synthetic_histogram


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench read`` (cels.cli.bench)."""
    parser.add_argument("--input", type=Path, default=None, help="a Parquet file or dataset directory (default: a synthetic log of --pairs pairs)")
    parser.add_argument("--columns", default=None, help="column names, e.g. user=AnonID,query=Query,url=ClickURL")
    parser.add_argument("--pairs", type=int, default=400_000, help="pairs of the synthetic log (default 400000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each reader, in turn; the fastest is kept (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here (atomically)")
    parser.set_defaults(func=run)


def timed(read: Callable[[], SearchLog], repeat: int) -> tuple[SearchLog, dict[str, float]]:
    """``read()``'s log and its fastest CPU and wall seconds over ``repeat`` runs."""
    best = {"cpu_seconds": float("inf"), "wall_seconds": float("inf")}
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        log = read()
        best = {"cpu_seconds": min(best["cpu_seconds"], time.process_time() - cpu), "wall_seconds": min(best["wall_seconds"], time.perf_counter() - wall)}
    return log, best


def compare(path: Path, options: LoadOptions, repeat: int) -> dict[str, Any]:
    """Both readers on ``path``; a ValueError if their histograms differ."""
    columnar, columnar_time = timed(lambda: ParquetReader(path, options).histogram(), repeat)
    rows, rows_time = timed(lambda: SearchLog.from_records(ParquetReader(path, options).records()), repeat)
    same = columnar.users == rows.users and columnar.pairs == rows.pairs and (columnar.counts != rows.counts).nnz == 0
    if not same:
        raise ValueError(f"the columnar and the row reader disagree on {path}")
    n_rows = sum(group.rows for group in ParquetReader(path, options).row_groups)
    return {
        "rows": n_rows, "users": columnar.n_users, "pairs": columnar.n_pairs, "size": columnar.size,
        "columnar": columnar_time | {"rows_per_cpu_second": n_rows / max(columnar_time["cpu_seconds"], 1e-9)},
        "row_by_row": rows_time | {"rows_per_cpu_second": n_rows / max(rows_time["cpu_seconds"], 1e-9)},
        "cpu_speedup": rows_time["cpu_seconds"] / max(columnar_time["cpu_seconds"], 1e-9),
        "same_histogram": same,
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, not {args.repeat}")
    options = LoadOptions("parquet", columns=parse_columns(args.columns, by_name=True) if args.columns else None)
    with tempfile.TemporaryDirectory(prefix="cels-read-") as tmp:
        path = args.input
        if path is None:
            path = synthetic_histogram(args.pairs).write_shares(tmp, 1, "parquet")[0]
        result = {"benchmark": "read", "input": str(args.input) if args.input else f"synthetic, {args.pairs} pairs", "repeat": args.repeat,
                  **compare(path, options, args.repeat)}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json is not None:
        atomic_write_json(args.json, result)
    return 0
