"""Fig. 4 (CELS 6.3): KL divergence and recall of distinct pairs vs b, for several |O|/|𝕆|.

CELS's optimal counts do not depend on the number of parties r (the distributed optimum is the
single-holder optimum on the union log), so the paper's average over r = 2, 4, 6, 8, 10 is the
union-log optimum itself; with end-to-end noise the average is over ``repeats`` noise draws.
Every curve is computed without and with the per-user contribution cap (not in the paper).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels.experiments import common
from cels.experiments.common import Dataset, Noise, UnionSolver, label_utility_axes, panels, save_figure, utility

PAPER_B_MAX = 1e-1  # the paper's b range is [1e-5, 1e-1]

HELP = "KL and recall vs b for several |O|/|𝕆|, with and without the cap (CELS Fig. 4)"


def measure(
    datasets: list[Dataset],
    b_values: np.ndarray,
    fractions: list[float],
    caps: list[int | None],
    *,
    noise: Noise | None = None,
    repeats: int = 5,
    seed: int = 0,
    integer: str = "mip",
    time_limit: float = 2.0,
    progress: bool = True,
) -> list[dict]:
    """One row per (dataset, cap, b, |O|/|𝕆|): KL, recall, top-100 coverage, |𝕆| and |O|."""
    rng = random.Random(seed)
    grid = [(d, cap, b, f) for d in datasets for cap in caps for b in b_values for f in fractions]
    rows: list[dict] = []
    solvers: dict[tuple[str, int | None], UnionSolver] = {}
    for dataset, cap, b, fraction in tqdm(grid, desc="fig4", unit="point", disable=not progress):
        key = (dataset.label, cap)
        if key not in solvers:
            solvers[key] = UnionSolver(dataset.log, cap=cap, integer=integer, time_limit=time_limit)
        draws, max_output = solvers[key].counts(float(b), fraction, noise, repeats, rng)
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
    labels = list(dict.fromkeys(r["dataset"] for r in rows))
    fractions = sorted({r["fraction"] for r in rows})
    caps = list(dict.fromkeys(r["cap"] for r in rows))
    fig, axes = panels(len(labels), rows=2)
    colours = dict(zip(fractions, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for col, label in enumerate(labels):
        for metric, ax in zip(("kl", "recall"), axes[:, col]):
            for cap in caps:
                for f in fractions:
                    sel = [r for r in rows if r["dataset"] == label and r["cap"] == cap and r["fraction"] == f]
                    ax.plot(
                        [r["b"] for r in sel],
                        [r[metric] for r in sel],
                        color=colours.get(f),
                        linestyle="-" if cap is None else "--",
                        marker="o" if cap is None else "x",
                        markersize=3,
                        label=f"|O|/|𝕆|={f:g}" + ("" if cap is None else f", cap {cap}"),
                    )
            ax.axvspan(min(r["b"] for r in rows), PAPER_B_MAX, color="0.92", zorder=0)
            label_utility_axes(ax, label, metric)
    axes[0, 0].legend(fontsize=6)
    noise = rows[0]["noise"]
    fig.suptitle(f"Fig. 4: CELS utility vs b (noise: {noise}; grey = the paper's b range)", fontsize=10)
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_figure_arguments(parser)
    parser.add_argument("--fractions", default="0.1,0.5,0.9", help="|O|/|𝕆| values (comma list)")
    parser.add_argument("--cap", type=int, default=1, help="contribution cap K of the capped curves (0: no capped curves)")


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    fractions = [float(v) for v in args.fractions.split(",")]
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"--fractions must lie in (0, 1], got {args.fractions}")
    caps: list[int | None] = [None] + ([args.cap] if args.cap else [])
    datasets, b_values, options = common.figure_inputs(args)
    rows = measure(datasets, b_values, fractions, caps, **options)
    plot(rows, out_dir / "fig4.png")
    return rows
