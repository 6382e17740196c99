"""One table: CELS, Local Sanitization, ZEALOUS, Korolova et al. and Safelog on the same data
at the same (ε, δ): KL (CELS eq. 2), recall of distinct pairs, top-100 coverage, output size
and whether user-level rows survive; the same measures on the query marginal (``query_*``).

The common unit is the query-url pair (a click): CELS and LS release (user, pair, count) rows;
the baselines release aggregate click items with noisy counts.  Every method is measured
against the same true pair totals c_i of the input.  Each row carries the method's own privacy
accounting: CELS/LS without ``--noise-epsilon`` protect only the sampling step (CELS 3.3).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels import metrics
from cels.baselines import BASELINES, baseline_rng
from cels.baselines.local import local_sanitize, pair_counts
from cels.experiments import common, dp_compare
from cels.experiments.common import Dataset, SolveOptions, UnionSolver, baseline_args, dataset_records, panels, save_figure, utility
from cels.logs import LogRecord
from cels.mechanism.conditions import privacy_bound
from cels.protocol.releases import DP_HISTOGRAM, KINDS, SAMPLED, release_kind

BASELINE_NAMES = ("zealous", "korolova", "safelog")



def query_utility(dataset: Dataset, x: np.ndarray, released_queries: dict[str, int] | None = None) -> dict:
    """KL, recall and top-100 coverage of the query marginal: true c_q = sum of the query's pair
    totals; released x_q = the method's query items if it published any, else its pair counts
    summed per query (MSNBC: one pair per query, so this is the baselines' fair unit there)."""
    truth: dict[str, float] = {}
    out: dict[str, float] = {}
    for (query, _), c, xi in zip(dataset.log.pairs, dataset.log.pair_totals(), x):
        truth[query] = truth.get(query, 0) + c
        out[query] = out.get(query, 0) + xi
    if released_queries:
        out = released_queries
    return {
        "query_kl": metrics.kl_divergence(truth, out),
        "query_recall": metrics.recall(truth, out),
        "query_top100_coverage": metrics.top_j(truth, out, 100)["coverage"],
    }


def baseline_row(name: str, records: list[LogRecord], dataset: Dataset, epsilon: float, delta: float, seed: int) -> dict:
    """Run one baseline; x = its noisy click counts on the input's pairs (0 when not released)."""
    items, report = BASELINES[name].run(records, baseline_args(epsilon, delta), baseline_rng(seed))
    clicks = {(i.query, i.url): i.count for i in items if i.kind == "click"}
    queries = {i.query: i.count for i in items if i.kind == "query"}
    x = np.array([clicks.get(p, 0) for p in dataset.log.pairs], dtype=np.int64)
    privacy = report["privacy"]
    return {
        "method": name,
        "user_level_rows": False,
        "released_items": len(items),
        "released_clicks": len(clicks),
        "privacy_epsilon": privacy.get("epsilon"),
        "privacy_delta": privacy.get("delta_run", privacy.get("delta", 0.0)),
        "dp_claim": privacy.get("dp_claim", True),
        **utility(dataset.log.pair_totals(), [x]),
        **query_utility(dataset, x, queries),
    }


def measure(
    datasets: list[tuple[Dataset, list[LogRecord]]],
    budgets: list[tuple[float, float]],
    options: SolveOptions,
    *,
    fraction: float = 0.5,
    parties: int = 4,
) -> list[dict]:
    """One row per (dataset, budget, method) (``options.repeats`` unused: one draw per run)."""
    noise, seed = options.noise, options.seed
    methods = ["CELS", f"LS-{parties}", *BASELINE_NAMES]
    grid = [(d, rec, eps, dl, m) for d, rec in datasets for eps, dl in budgets for m in methods]
    rows = []
    solvers: dict[str, UnionSolver] = {}
    for dataset, records, epsilon, delta, method in tqdm(grid, desc="compare", unit="run", disable=None if options.progress else True):
        b = privacy_bound(epsilon, delta)
        head = {**dataset.facts(), "epsilon": epsilon, "delta": delta, "b": b}
        if method in BASELINE_NAMES:
            rows.append({**head, **baseline_row(method, records, dataset, epsilon, delta, seed)})
            continue
        solver = solvers.setdefault(dataset.label, UnionSolver(dataset.log, integer=options.integer, time_limit=options.time_limit))
        params = options.single_holder_params(epsilon, delta, seed)
        if method == "CELS":
            draws, _ = solver.counts(b, fraction, noise, 1, random.Random(seed))
            x, users = draws[0], None
        else:
            parts = dataset.log.split_by_user(parties, seed)
            out, _ = local_sanitize(parts, params, total_output=fraction * solver.max_output(b))
            x, users = pair_counts(out, dataset.log.pairs), out.n_users
        rows.append(
            {
                **head,
                "method": method,
                "user_level_rows": True,
                "released_items": int(np.count_nonzero(x)),
                "released_clicks": int(np.count_nonzero(x)),
                "privacy_epsilon": epsilon + (noise.noise_epsilon if noise else 0.0),
                "privacy_delta": delta,
                "dp_claim": noise is not None,
                "output_users": users,
                **utility(dataset.log.pair_totals(), [x]),
                **query_utility(dataset, x),
            }
        )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Bars of KL and recall per method, one group per (dataset, ε, δ)."""
    groups = list(dict.fromkeys((r["dataset"], r["epsilon"], r["delta"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = panels(1, rows=3, width=max(6.0, 1.2 * len(groups)), height=2.6)
    width = 0.8 / len(methods)
    names = {"kl": "KL divergence (pairs)", "recall": "recall of distinct pairs", "query_kl": "KL divergence (queries)"}
    for ax, metric in zip(axes[:, 0], names):
        for k, method in enumerate(methods):
            values = [next((r[metric] for r in rows if (r["dataset"], r["epsilon"], r["delta"]) == g and r["method"] == method), 0) for g in groups]
            ax.bar(np.arange(len(groups)) + k * width, values, width, label=method)
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{d}\nε={e:g}, δ={dl:g}" for d, e, dl in groups], fontsize=7)
        ax.set_ylabel(names[metric])
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("CELS vs local sanitization vs ZEALOUS / Korolova et al. / Safelog (click pairs)", fontsize=10)
    save_figure(fig, path)


def parse_budgets(text: str) -> list[tuple[float, float]]:
    """``"1:0.001,10:0.5"`` -> [(1.0, 0.001), (10.0, 0.5)]."""
    out = []
    for item in text.split(","):
        eps, sep, delta = item.partition(":")
        try:
            pair = (float(eps), float(delta))
        except ValueError:
            raise ValueError(f"--budgets: {item!r} is not EPSILON:DELTA") from None
        if not sep or not pair[0] > 0 or not 0 < pair[1] < 1:
            raise ValueError(f"--budgets: {item!r} needs epsilon > 0 and 0 < delta < 1")
        out.append(pair)
    return out


DEFAULT_BUDGETS = "1:0.001,10:0.01,10:0.5"
DEFAULT_PARTIES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_dataset_arguments(parser, aol="0", msnbc="40829")
    common.add_solver_arguments(parser, grid=False)
    parser.add_argument("--release", choices=tuple(KINDS), default=SAMPLED.name,
                        help="sampled (default): this table; dp: the DP histogram against the sampled release, ZEALOUS and "
                        "Korolova et al. over epsilon and Delta_0 (cels.experiments.dp_compare)")  # fmt: skip
    parser.add_argument("--budgets", default=None, metavar="E:D,..",
                        help=f"(epsilon, delta) pairs (default {DEFAULT_BUDGETS}; --release dp: {dp_compare.DEFAULT_BUDGETS})")  # fmt: skip
    parser.add_argument("--fraction", type=float, default=0.5, help="|O|/|𝕆| of CELS; LS shares this |O|")
    parser.add_argument("--parties", type=int, default=None,
                        help=f"parties of the LS run (default {DEFAULT_PARTIES}); --release dp: r of the DP histogram (default {dp_compare.DEFAULT_PARTIES})")  # fmt: skip
    dp_compare.add_arguments(parser)


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    if release_kind(getattr(args, "release", SAMPLED.name)) is DP_HISTOGRAM:
        args.budgets = args.budgets or dp_compare.DEFAULT_BUDGETS
        args.parties = dp_compare.DEFAULT_PARTIES if args.parties is None else args.parties
        return dp_compare.run(args, out_dir, parse_budgets(args.budgets))
    args.budgets = args.budgets or DEFAULT_BUDGETS
    args.parties = DEFAULT_PARTIES if args.parties is None else args.parties
    fraction = common.fraction_from_args(args.fraction, "--fraction")
    budgets = parse_budgets(args.budgets)
    datasets = []
    for dataset in common.datasets_from_args(args):
        records = dataset_records(args.data, dataset, dataset.max_users)
        datasets.append((dataset, records))
    rows = measure(datasets, budgets, common.solve_options_from_args(args), fraction=fraction, parties=args.parties)
    plot(rows, out_dir / "compare.png")
    return rows
