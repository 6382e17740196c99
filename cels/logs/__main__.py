"""``python -m cels.logs PATH --format F [--columns ...] [--max-users N]``: time one log load, print JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from cels.logs.bench import bench_load
from cels.logs.formats import FORMATS, parse_columns
from cels.logs.options import LoadOptions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cels.logs", description="time one log load; prints JSON")
    parser.add_argument("path")
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--columns", type=parse_columns, help="tsv: user=1,query=2,url=4[,count=N]")
    parser.add_argument("--max-users", type=int)
    args = parser.parse_args(argv)
    options = LoadOptions(format=args.format, columns=args.columns, max_users=args.max_users)
    print(json.dumps(bench_load(args.path, options), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
