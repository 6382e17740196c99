"""Fig. 5 (CELS 6.4): CELS vs Local Sanitization (LS) at r = 2, 4, 8 parties, same b.

CELS: the KL-UMP optimum on the union log with |O| = fraction * |𝕆|.  LS
(:func:`cels.baselines.local.local_sanitize`): the users are split into r shares (seeded random
partition), each party solves its own conditions with the same b and the share
|O| * |D_k| / |D| (clipped at its own |𝕆_k|), the sampled outputs are united.  Both are
measured against the union's true counts.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels.baselines.local import local_sanitize, pair_counts
from cels.experiments import common
from cels.experiments.common import Curve, Dataset, SolveOptions, UnionSolver, plot_utility_vs_b, utility
from cels.mechanism.sanitize import SanitizeParams



def params_for_b(b: float, options: SolveOptions, seed: int | None) -> SanitizeParams:
    """Parameters whose CELS bound min{eps/2, ln 1/(1-delta)} is b: eps = 2b, delta = 1 - e^-b."""
    return options.single_holder_params(2 * b, -math.expm1(-b), seed)


def measure(
    datasets: list[Dataset], b_values: np.ndarray, parties: list[int], fraction: float, options: SolveOptions
) -> list[dict]:
    """One row per (dataset, b, method): method ``CELS`` or ``LS-r``."""
    rng = random.Random(options.seed)
    noise, seed = options.noise, options.seed
    draws_per_point = options.repeats if noise else 1
    grid = [(d, b, r) for d in datasets for b in b_values for r in [0, *parties]]
    rows: list[dict] = []
    solvers: dict[str, UnionSolver] = {}
    splits: dict[tuple[str, int], list] = {}
    for dataset, b, r in tqdm(grid, desc="fig5", unit="point", disable=None if options.progress else True):
        if dataset.label not in solvers:
            solvers[dataset.label] = UnionSolver(dataset.log, integer=options.integer, time_limit=options.time_limit)
        solver = solvers[dataset.label]
        totals = dataset.log.pair_totals()
        max_output = solver.max_output(float(b))
        row = {**dataset.facts(), "b": float(b), "fraction": fraction, "noise": noise.label if noise else "none", "max_output": max_output}
        if r == 0:
            draws, _ = solver.counts(float(b), fraction, noise, options.repeats, rng)
            rows.append({**row, "method": "CELS", "parties": None, **utility(totals, draws)})
            continue
        if (dataset.label, r) not in splits:
            splits[(dataset.label, r)] = dataset.log.split_by_user(r, seed)
        draws, clipped = [], 0
        for k in range(draws_per_point):
            params = params_for_b(float(b), options, seed=(seed * 1000 + k) * 1000)
            out, report = local_sanitize(splits[(dataset.label, r)], params, total_output=fraction * max_output)
            draws.append(pair_counts(out, dataset.log.pairs))
            clipped = sum(p.get("share_clipped", False) for p in report["party_reports"])
        rows.append({**row, "method": f"LS-{r}", "parties": r, "clipped_shares": clipped, **utility(totals, draws)})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """KL (top) and recall (bottom) vs b per dataset; one line per method."""
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def curves(sel: list[dict]) -> list[Curve]:
        return [
            ([r for r in sel if r["method"] == m], {"marker": "o", "linewidth": 2.2 if m == "CELS" else 1.2, "label": m})
            for m in methods
        ]

    title = f"Fig. 5: CELS vs local sanitization, |O|/|𝕆| = {rows[0]['fraction']:g}, noise: {rows[0]['noise']}"
    plot_utility_vs_b(rows, path, curves, title)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_figure_arguments(parser)
    parser.add_argument("--parties", default="2,4,8", help="numbers of LS parties r (comma list)")
    parser.add_argument("--fraction", type=float, default=0.5, help="|O|/|𝕆| of CELS; LS shares this |O|")


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    fraction = common.fraction_from_args(args.fraction, "--fraction")
    datasets, b_values, options = common.figure_inputs(args)
    rows = measure(datasets, b_values, common.int_list(args.parties, "--parties"), fraction, options)
    plot(rows, out_dir / "fig5.png")
    return rows
