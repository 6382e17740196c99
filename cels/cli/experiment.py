"""``cels experiment {fig4,fig5,fig6,table5,compare} [--data DIR] --out DIR``: the paper's
experiments (CELS section 6) on the real logs; CSV + JSON + PNG per experiment in DIR.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from cels.experiments.common import meta, write_table

EXPERIMENTS = {
    "fig4": "cels.experiments.fig4",
    "fig5": "cels.experiments.fig5",
    "fig6": "cels.experiments.fig6",
    "table5": "cels.experiments.table5",
    "compare": "cels.experiments.compare",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("experiment")
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, module_name in EXPERIMENTS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
        p.add_argument("--seed", type=int, default=0, help="seed of the party split and the noise (default 0)")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        module.add_arguments(p)
        p.set_defaults(func=run, experiment_module=module_name)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = importlib.import_module(args.experiment_module).run(args, out_dir)
    params = {k: v for k, v in vars(args).items() if k not in ("func", "experiment_module")}
    write_table(rows, out_dir, args.experiment, meta(args.experiment, params, started))
    files = sorted(str(p) for p in out_dir.glob(f"{args.experiment}.*"))
    print(json.dumps({"experiment": args.experiment, "rows": len(rows), "files": files, "seconds": round(time.perf_counter() - started, 1)}))
    return 0
