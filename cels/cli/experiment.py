"""``cels experiment {fig4,fig5,fig6,table5,compare} [--data DIR] --out DIR``: the paper's
experiments (CELS section 6) on the real logs; CSV + JSON + PNG per experiment in DIR.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from cels.cli.options import DeferredParser

EXPERIMENTS = {
    "fig4": "KL and recall vs b for several |O|/|𝕆|, with and without the cap (CELS Fig. 4)",
    "fig5": "CELS vs Local Sanitization at r = 2, 4, 8, same b and |O| (CELS Fig. 5)",
    "fig6": "session time vs parties r and vs input size, in-memory protocol (CELS Fig. 6)",
    "table5": "total bytes of a session vs parties r per input size (CELS Table 5)",
    "compare": "CELS, LS, ZEALOUS, Korolova et al., Safelog on the same data and (ε, δ); --release dp: the DP histogram",
}
"""Experiment -> its one-line help; its module is ``cels.experiments.<name>`` (flags: its
``add_arguments``, imported only when its parser parses: :class:`DeferredParser`)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("experiment")
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT", parser_class=DeferredParser)
    for name, help in EXPERIMENTS.items():
        p = sub.add_parser(name, help=help, module=f"cels.experiments.{name}")
        p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
        p.add_argument("--seed", type=int, default=0, help="seed of the party split and the noise (default 0)")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cels.experiments.common import meta, write_table

    started = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = importlib.import_module(f"cels.experiments.{args.experiment}").run(args, out_dir)
    params = {k: v for k, v in vars(args).items() if k != "func"}
    write_table(rows, out_dir, args.experiment, meta(args.experiment, params, started))
    files = sorted(str(p) for p in out_dir.glob(f"{args.experiment}.*"))
    print(json.dumps({"experiment": args.experiment, "rows": len(rows), "files": files, "seconds": round(time.perf_counter() - started, 1)}))
    return 0
