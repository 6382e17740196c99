"""Fig. 4 (CELS 6.3): KL divergence and recall of distinct pairs vs b, for several |O|/|𝕆|.

CELS's optimal counts do not depend on the number of parties r (the distributed optimum is the
single-holder optimum on the union log), so the paper's average over r = 2, 4, 6, 8, 10 is the
union-log optimum itself; with noise on the counts the average is over ``repeats`` noise draws.
Every curve is computed without and with the per-user contribution cap (not in the paper).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels.experiments import common
from cels.experiments.common import Curve, Dataset, SolveOptions, UnionSolver, plot_utility_vs_b, utility

PAPER_B_MAX = 1e-1  # the paper's b range is [1e-5, 1e-1]



def measure(
    datasets: list[Dataset], b_values: np.ndarray, fractions: list[float], caps: list[int | None], options: SolveOptions
) -> list[dict]:
    """One row per (dataset, cap, b, |O|/|𝕆|): KL, recall, top-100 coverage, |𝕆| and |O|."""
    rng = random.Random(options.seed)
    noise = options.noise
    grid = [(d, cap, b, f) for d in datasets for cap in caps for b in b_values for f in fractions]
    rows: list[dict] = []
    solvers: dict[tuple[str, int | None], UnionSolver] = {}
    for dataset, cap, b, fraction in tqdm(grid, desc="fig4", unit="point", disable=None if options.progress else True):
        key = (dataset.label, cap)
        if key not in solvers:
            solvers[key] = UnionSolver(dataset.log, cap=cap, integer=options.integer, time_limit=options.time_limit)
        draws, max_output = solvers[key].counts(float(b), fraction, noise, options.repeats, rng)
        rows.append(
            {
                **dataset.facts(),
                "variables": solvers[key].cond.n,
                "cap": cap,
                "b": float(b),
                "fraction": fraction,
                "noise": noise.label if noise else "none",
                "max_output": max_output,
                "output_target": fraction * max_output,
                **utility(dataset.log.pair_totals(), draws),
            }
        )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """KL (top) and recall (bottom) vs b, one column per dataset; colour = |O|/|𝕆|, dashed = cap."""
    fractions = sorted({r["fraction"] for r in rows})
    caps = list(dict.fromkeys(r["cap"] for r in rows))
    colours = dict(zip(fractions, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))

    def curves(sel: list[dict]) -> list[Curve]:
        return [
            (
                [r for r in sel if r["cap"] == cap and r["fraction"] == f],
                {
                    "color": colours.get(f),
                    "linestyle": "-" if cap is None else "--",
                    "marker": "o" if cap is None else "x",
                    "label": f"|O|/|𝕆|={f:g}" + ("" if cap is None else f", cap {cap}"),
                },
            )
            for cap in caps
            for f in fractions
        ]

    title = f"Fig. 4: CELS utility vs b (noise: {rows[0]['noise']}; grey = the paper's b range)"
    plot_utility_vs_b(rows, path, curves, title, legend_fontsize=6, shade_b_max=PAPER_B_MAX)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_figure_arguments(parser)
    parser.add_argument("--fractions", default="0.1,0.5,0.9", help="|O|/|𝕆| values (comma list)")
    parser.add_argument("--cap", type=int, default=1, help="contribution cap K of the capped curves (0: no capped curves)")


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    fractions = [common.fraction_from_args(float(v), "--fractions") for v in args.fractions.split(",")]
    caps: list[int | None] = [None] + ([args.cap] if args.cap else [])
    datasets, b_values, options = common.figure_inputs(args)
    rows = measure(datasets, b_values, fractions, caps, options)
    plot(rows, out_dir / "fig4.png")
    return rows
