"""What every experiment shares: the real logs, the paper's cleaning, the split into parties,
the b grid, utility of a count vector, and CSV/JSON/PNG output (all files written atomically).

Experiments are measurements, not releases: they take a ``seed`` (default 0) for the party
split and the noise so that a run can be repeated; nothing they write is a private release.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cels import metrics  # noqa: E402
from cels.fileio import atomic_write, atomic_write_json  # noqa: E402
from cels.baselines import BASELINES  # noqa: E402
from cels.logs import LoadOptions, LogRecord, SearchLog, default_data_dir, iter_records, load_log  # noqa: E402
from cels.mechanism.conditions import Conditions, build_conditions  # noqa: E402
from cels.mechanism.noisy_counts import add_noise_and_repair  # noqa: E402
from cels.mechanism.sanitize import SanitizeParams  # noqa: E402
from cels.mechanism.solvers import INTEGER_METHODS, max_output_lp, solve  # noqa: E402

DATA_FILES = {"aol": ("aol-dev.tsv.gz", "aol"), "msnbc": ("msnbc990928.seq.gz", "msnbc")}
AOL_MIN_COUNT = 20  # CELS 6.1: AOL pairs with total count < 20 are removed


@dataclass
class Dataset:
    """One input of an experiment: a label (e.g. ``msnbc-200K``), the cleaned log and its facts."""

    label: str
    name: str
    log: SearchLog
    max_users: int | None = None

    def facts(self) -> dict:
        return {"dataset": self.label, "users": self.log.n_users, "input_size": self.log.size, "pairs": self.log.n_pairs}


def data_path(data_dir: str | Path | None, name: str) -> Path:
    """The real log ``name`` (aol or msnbc) in ``data_dir`` (default $CELS_DATA or ../shared/data)."""
    directory = Path(data_dir) if data_dir else default_data_dir()
    path = directory / DATA_FILES[name][0]
    if not path.is_file():
        raise ValueError(f"{path} is missing (give --data DIR or set CELS_DATA)")
    return path


def clean(log: SearchLog, min_count: int) -> SearchLog:
    """The paper's data cleaning: drop pairs whose total count is below ``min_count`` (and users
    left empty).  Data-dependent preprocessing of the experiment's input, outside the DP claim."""
    keep = np.flatnonzero(log.pair_totals() >= max(min_count, 1))
    counts = log.counts[:, keep].tocsr()
    users = np.flatnonzero(np.diff(counts.indptr) > 0)
    return SearchLog([log.users[j] for j in users], [log.pairs[i] for i in keep], counts[users].tocsr(), dict(log.source))


def load_dataset(data_dir: str | Path | None, name: str, max_users: int | None = None) -> Dataset:
    """AOL (cleaned: total count >= 20) or MSNBC (kept whole), first ``max_users`` users."""
    path = data_path(data_dir, name)
    log = load_log(str(path), LoadOptions(format=DATA_FILES[name][1], max_users=max_users))
    if name == "aol":
        log = clean(log, AOL_MIN_COUNT)
    return Dataset(f"{name}-{_human(log.size)}", name, log, max_users)


def _human(n: int) -> str:
    """|D| as the paper labels inputs: 200K, 4.7M."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{round(n / 1000)}K" if n >= 1000 else str(n)


def b_grid(b_min: float, b_max: float, per_decade: int) -> np.ndarray:
    """Log-spaced b values from b_min to b_max, ``per_decade`` points per factor of 10."""
    if not 0 < b_min <= b_max:
        raise ValueError(f"need 0 < b-min <= b-max, got {b_min}, {b_max}")
    if per_decade < 1:
        raise ValueError(f"points per decade must be >= 1, got {per_decade}")
    steps = max(1, round(math.log10(b_max / b_min) * per_decade))
    return np.unique(np.round(np.logspace(math.log10(b_min), math.log10(b_max), steps + 1), 12))


@dataclass
class Noise:
    """The paper's noise Lap(d/eps') on the optimal counts (CELS 3.3; the paper: d = 30, eps' = 1)."""

    noise_epsilon: float
    sensitivity: float

    @property
    def label(self) -> str:
        return f"Lap({self.sensitivity:g}/{self.noise_epsilon:g})"


class UnionSolver:
    """CELS's optimal counts on the union log.  The distributed optimum equals the single-holder
    optimum on the union (the protocol solves the same conditions), so it does not depend on r.

    The condition rows ln t_ij do not depend on b and pruning keeps the same rows for any
    constant right-hand side, so they are built once (at b = 1) and reused with h = b.
    """

    def __init__(self, log: SearchLog, *, cap: int | None = None, integer: str = "mip", time_limit: float = 2.0) -> None:
        self.log = log
        self.cond, self.var_pairs = build_conditions(log, 1.0, cap=cap)
        self.integer = integer
        self.time_limit = time_limit

    def conditions(self, b: float) -> Conditions:
        return Conditions(self.cond.G, np.full(self.cond.G.shape[0], float(b)), self.cond.c)

    def max_output(self, b: float) -> float:
        """|𝕆| at b (the O-UMP LP optimum)."""
        return max_output_lp(self.conditions(b))[0] if self.cond.n else 0.0

    def counts(
        self, b: float, fraction: float, noise: Noise | None = None, repeats: int = 1, rng: random.Random | None = None
    ) -> tuple[list[np.ndarray], float]:
        """([x over the log's pairs], |𝕆|) for |O| = fraction * |𝕆| by KL-UMP (CELS App. B);
        with ``noise``: ``repeats`` draws of Lap(d/eps') added and repaired, one x per draw."""
        if self.cond.n == 0:
            return [np.zeros(self.log.n_pairs, dtype=np.int64)], 0.0
        cond = self.conditions(b)
        sol = solve(cond, "kl", output_size=fraction, integer=self.integer, time_limit=self.time_limit)
        draws = [sol.x]
        if noise is not None:
            draws = [add_noise_and_repair(cond, sol.x, noise.noise_epsilon, noise.sensitivity, rng)[0] for _ in range(repeats)]
        out = []
        for x_var in draws:
            x = np.zeros(self.log.n_pairs, dtype=np.int64)
            x[self.var_pairs] = x_var
            out.append(x)
        return out, sol.max_output_lp


@dataclass(frozen=True)
class SolveOptions:
    """How an experiment solves and samples: the noise on the counts (None: none), noise draws
    averaged per point, the seed of the party split and the noise, the integer method, the
    MIP time limit per solve and whether a progress bar shows."""

    noise: Noise | None = None
    repeats: int = 5
    seed: int = 0
    integer: str = "mip"
    time_limit: float = 2.0
    progress: bool = True

    def single_holder_params(self, epsilon: float, delta: float, seed: int | None) -> SanitizeParams:
        """The single-holder mechanism's parameters at (epsilon, delta) (LS parties use them)."""
        return SanitizeParams(
            epsilon=epsilon,
            delta=delta,
            noise_epsilon=self.noise.noise_epsilon if self.noise else None,
            sensitivity=self.noise.sensitivity if self.noise else None,
            integer=self.integer,
            time_limit=self.time_limit,
            seed=seed,
        )


def utility(totals: np.ndarray, draws: Sequence[np.ndarray]) -> dict:
    """KL (CELS eq. 2), recall of distinct pairs, top-100 coverage and |O| of counts x against
    c: the mean over the draws, with the standard deviation of KL and recall."""
    per = [
        (metrics.kl_divergence(totals, x), metrics.recall(totals, x), metrics.top_j(totals, x, 100)["coverage"], float(np.sum(x)))
        for x in draws
    ]
    kl, rec, top, size = np.array(per).T
    return {
        "kl": float(kl.mean()),
        "recall": float(rec.mean()),
        "top100_coverage": float(top.mean()),
        "output_total": float(size.mean()),
        "kl_std": float(kl.std()),
        "recall_std": float(rec.std()),
        "draws": len(per),
    }


def write_table(rows: Sequence[dict], out_dir: Path, name: str, meta: dict) -> None:
    """``name.csv`` (one row per measurement) and ``name.json`` (meta + rows), atomically."""
    if not rows:
        raise ValueError(f"experiment {name} produced no rows")
    write_csv(rows, out_dir / f"{name}.csv")
    atomic_write_json(out_dir / f"{name}.json", {"meta": meta, "rows": list(rows)})


def write_csv(rows: Sequence[dict], path: Path) -> None:
    """One CSV row per dict (columns: every key, in first-seen order; floats to 6 digits), atomically."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    with atomic_write(path) as fh:
        fh.write(buffer.getvalue())


def _cell(value: object) -> object:
    return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)


def save_figure(fig: plt.Figure, path: Path) -> None:
    """PNG via a temporary sibling (atomic), then close the figure."""
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)


def panels(n: int, rows: int = 1, width: float = 4.2, height: float = 3.2) -> tuple[plt.Figure, np.ndarray]:
    """A rows x n grid of axes (always 2-D)."""
    fig, axes = plt.subplots(rows, n, figsize=(width * n, height * rows), squeeze=False)
    return fig, axes


Curve = tuple[list[dict], dict]
"""One line of a utility panel: its rows in b order and its matplotlib style."""


def plot_utility_vs_b(
    rows: list[dict],
    path: Path,
    curves: Callable[[list[dict]], Iterable[Curve]],
    title: str,
    *,
    legend_fontsize: int = 7,
    shade_b_max: float | None = None,
) -> None:
    """KL (top) and recall (bottom) vs log-scale b, one column per dataset (Fig. 4 and 5);
    ``curves(rows of one dataset)`` gives its lines; ``shade_b_max`` shades b up to it grey."""
    labels = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = panels(len(labels), rows=2)
    for col, label in enumerate(labels):
        lines = list(curves([r for r in rows if r["dataset"] == label]))
        for metric, ax in zip(("kl", "recall"), axes[:, col]):
            for sel, style in lines:
                ax.plot([r["b"] for r in sel], [r[metric] for r in sel], markersize=3, **style)
            if shade_b_max is not None:
                ax.axvspan(min(r["b"] for r in rows), shade_b_max, color="0.92", zorder=0)
            ax.set_xscale("log")
            ax.set_xlabel("b")
            ax.set_ylabel("KL divergence" if metric == "kl" else "recall of distinct pairs")
            ax.set_title(f"{label} ({metric})", fontsize=9)
    axes[0, 0].legend(fontsize=legend_fontsize)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def meta(command: str, params: dict, started: float) -> dict:
    """The run's parameters and wall time (stored in every JSON)."""
    return {"experiment": command, "params": _jsonable(params), "seconds": round(time.perf_counter() - started, 2)}


def _jsonable(params: dict) -> dict:
    return json.loads(json.dumps(params, default=lambda v: list(v) if isinstance(v, Iterable) else str(v)))


# ----------------------------------------------------------------------------- command line
DEFAULT_AOL_USERS = "250,500"
DEFAULT_MSNBC_USERS = "40829,0"


def int_list(text: str, flag: str) -> list[int]:
    """``"2,4,8"`` -> [2, 4, 8] with a clear error naming the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma list of integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"{flag} must list non-negative integers, got {text!r}")
    return values


def add_dataset_arguments(parser: argparse.ArgumentParser, aol: str = DEFAULT_AOL_USERS, msnbc: str = DEFAULT_MSNBC_USERS) -> None:
    """--data, the input sizes (first N users; 0 = all, empty = skip the dataset)."""
    parser.add_argument("--data", default=None, metavar="DIR", help="directory of the real logs (default $CELS_DATA or ../shared/data)")
    parser.add_argument("--aol-users", default=aol, metavar="N,..", help=f"AOL inputs: first N users, 0 = all (default {aol}; '' = none)")
    parser.add_argument("--msnbc-users", default=msnbc, metavar="N,..", help=f"MSNBC inputs: first N users, 0 = all (default {msnbc}; '' = none)")


def add_solver_arguments(parser: argparse.ArgumentParser, grid: bool = True) -> None:
    """The b grid, the integer method and the noise on the counts."""
    if grid:
        parser.add_argument("--b-min", type=float, default=1e-5, help="smallest b (default 1e-5, the paper's)")
        parser.add_argument("--b-max", type=float, default=10.0, help="largest b (default 10; the paper stops at 0.1)")
        parser.add_argument("--per-decade", type=int, default=2, help="b values per factor of 10 (default 2)")
    parser.add_argument("--integer", choices=INTEGER_METHODS, default="mip", help="integer counts (default mip)")
    parser.add_argument("--time-limit", type=float, default=2.0, metavar="SEC", help="MIP time limit per solve (default 2)")
    parser.add_argument("--noise-epsilon", type=float, default=None, metavar="E'", help="add Lap(d/E') to the counts (paper: 1)")
    parser.add_argument("--sensitivity", type=float, default=None, metavar="d", help="sensitivity d of the counts (paper: 30)")
    parser.add_argument("--repeats", type=int, default=5, help="noise draws averaged per point (default 5)")


def datasets_from_args(args: argparse.Namespace) -> list[Dataset]:
    """The inputs named by --aol-users / --msnbc-users."""
    out = []
    for name in ("aol", "msnbc"):
        spec = getattr(args, f"{name}_users")
        for n in int_list(spec, f"--{name}-users") if spec.strip() else []:
            out.append(load_dataset(args.data, name, n or None))
    if not out:
        raise ValueError("no input: give --aol-users and/or --msnbc-users")
    return out


def b_values_from_args(args: argparse.Namespace) -> np.ndarray:
    return b_grid(args.b_min, args.b_max, args.per_decade)


def fraction_from_args(value: float, flag: str) -> float:
    """An |O|/|𝕆| value, checked to lie in (0, 1]."""
    if not 0 < value <= 1:
        raise ValueError(f"{flag} must lie in (0, 1], got {value}")
    return value


def solve_options_from_args(args: argparse.Namespace) -> SolveOptions:
    """The noise, --repeats, --seed, --integer, --time-limit and -q of a run."""
    return SolveOptions(
        noise=noise_from_args(args), repeats=args.repeats, seed=args.seed, integer=args.integer,
        time_limit=args.time_limit, progress=not args.quiet,
    )  # fmt: skip


def noise_from_args(args: argparse.Namespace) -> Noise | None:
    if (args.noise_epsilon is None) != (args.sensitivity is None):
        raise ValueError("--noise-epsilon and --sensitivity go together (noise Lap(d/eps'))")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.noise_epsilon is None:
        return None
    if not (args.noise_epsilon > 0 and args.sensitivity > 0):
        raise ValueError("--noise-epsilon and --sensitivity must be positive")
    return Noise(args.noise_epsilon, args.sensitivity)


def add_figure_arguments(parser: argparse.ArgumentParser) -> None:
    """The data and solver flags every utility figure (Fig. 4, Fig. 5) takes."""
    add_dataset_arguments(parser)
    add_solver_arguments(parser)


def figure_inputs(args: argparse.Namespace) -> tuple[list[Dataset], np.ndarray, SolveOptions]:
    """(datasets, b values, solve options of ``measure``) from the figure flags."""
    return datasets_from_args(args), b_values_from_args(args), solve_options_from_args(args)


def dataset_records(data_dir: str | None, dataset: Dataset, max_users: int | None) -> list[LogRecord]:
    """The dataset's click records in log order (the same users and cleaned pairs as its log)."""
    users, pairs = set(dataset.log.users), set(dataset.log.pairs)
    fmt = DATA_FILES[dataset.name][1]
    records = iter_records(str(data_path(data_dir, dataset.name)), LoadOptions(format=fmt, max_users=max_users))
    return [rec for rec in records if rec.user in users and rec.url is not None and (rec.query, rec.url) in pairs]


def baseline_args(epsilon: float, delta: float) -> argparse.Namespace:
    """Every baseline's own defaults derived from (ε, δ), as ``cels sanitize --method X`` does."""
    parser = argparse.ArgumentParser(add_help=False)
    for baseline in BASELINES.values():
        baseline.add_arguments(parser.add_argument_group(baseline.name))
    args = parser.parse_args([])
    args.epsilon, args.delta = epsilon, delta
    return args
