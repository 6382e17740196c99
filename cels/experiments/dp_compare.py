"""``cels experiment compare --release dp``: the distributed DP histogram of query-url pairs
against the sampled release and the single-holder ZEALOUS and Korolova et al. on the same data
at the same (ε, δ), over a grid of ε and Δ0 (docs/releases.md, docs/experiments.md).

Methods (one row each per input, ε and Δ0; the sampled release once per input and ε):
- ``dp-histogram``: each user keeps at most Δ0 distinct pairs, a pair's distinct-user count n
  gets Z = NB(β) − NB(β), β = r/(r − t), and the pairs with n + Z ≥ τ are released with n + Z
  (partition selection: Korolova et al. WWW 2009; Desfontaines et al. PoPETs 2022; the shares of
  Goryczka and Xiong).  ``--dp-engine protocol`` runs the real session of r parties and the
  solver in memory (cels.inprocess.run_session); ``primitives`` computes the same distribution
  from cels.mechanism.dp_release / dp_histogram on the union log (each user is at exactly one
  party, so the bounded counts do not depend on the split, and r shares X − Y, X, Y ~ NB(1/h),
  h = r − t, sum to the session's total noise); ``auto`` (default) runs the protocol and falls
  back to the primitives if a session fails, saying why in the row (``engine_note``).
- ``sampled``: the CELS sampled release (cels.mechanism.sanitize) at b = min(ε/2, ln 1/(1 − δ)).
  Its output depends on b only, so it is computed once per input and b and reported for every
  ε with that b.
- ``zealous`` (m = Δ0) and ``korolova`` (d = d_c = Δ0) with every other parameter as compare
  derives it from (ε, δ); their click items are the comparable unit.

Measures (cels.mechanism.dp_release.release_utility): pairs released (``released_in_input``:
those that are pairs of the input; Korolova's click candidates are navigational URL guesses,
docs/baselines.md, which need not be), recall of the true top 100 pairs by distinct users, and
the mean relative error |released count − n| / n of the released pairs against the true
distinct-user counts n (before any bound: the bound's bias is part of the error).  The sampled
release and Korolova count events, not distinct users, so part of their error is that too.
DP rows are seeded (DrawKeys.replay: a repeatable measurement, not a private release).

Inputs: MSNBC (first ``--msnbc-users`` users, as compare: 40,829 users = msnbc-200K), the AOL
slice (first ``--aol-users`` users, *not* cleaned: the paper's count filter is data-dependent
and outside any DP claim; ``--aol-clean`` applies it), and :func:`cels.logs.synthetic_log` with
``--synthetic-users`` users (default 74,100: 1,000,443 (user, pair) records, 461,693 distinct
pairs, |D| = 1,413,206).
"""

from __future__ import annotations

import argparse
import functools
import time
import zlib
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cels.baselines import BASELINES, baseline_rng
from cels.crypto.streams import DrawKeys
from cels.experiments import common
from cels.experiments.common import Dataset, baseline_args, dataset_records, panels, save_figure
from cels.logs import LoadOptions, LogRecord, SearchLog, load_log, synthetic_log
from cels.mechanism.conditions import privacy_bound
from cels.mechanism.dp_histogram import share_beta, threshold
from cels.mechanism.dp_release import TOP, DpHistogram, release_utility, sanitize_dp
from cels.mechanism.sanitize import SanitizeParams, sanitize

DEFAULT_BUDGETS = "0.5:1e-6,1:1e-6,2:1e-6"
DEFAULT_MAX_ITEMS = "1,5,20"
DEFAULT_PARTIES = 3
DEFAULT_SYNTHETIC_USERS = 74_100
ENGINES = ("auto", "protocol", "primitives")
DP_METHOD = "dp-histogram"
Pair = tuple[str, str]


# ----------------------------------------------------------------------------- inputs
class Input:
    """One input: its log, the baselines' click records (log order) and the true distinct-user
    count n of every pair (before any bound)."""

    def __init__(self, dataset: Dataset, records: list[LogRecord]) -> None:
        self.dataset = dataset
        self.records = records
        log = dataset.log
        self.users = np.asarray((log.counts > 0).sum(axis=0)).ravel().astype(np.int64)
        self.index = {p: i for i, p in enumerate(log.pairs)}
        top = np.sort(self.users)[::-1][: TOP]
        self.top_floor = int(top[-1]) if len(top) else 0

    @property
    def label(self) -> str:
        return self.dataset.label

    def facts(self) -> dict:
        return {**self.dataset.facts(), "records": int(self.dataset.log.counts.nnz)}

    def utility(self, released: dict[Pair, int]) -> dict:
        """release_utility of ``released`` (pair -> count) against n.  Only the pairs that can
        be in the true top 100 (n at least the 100th largest) and the released ones are passed:
        the ranking and the errors are those over every pair."""
        truth = {self.dataset.log.pairs[i]: int(self.users[i]) for i in np.flatnonzero(self.users >= max(self.top_floor, 1))}
        for pair in released:
            i = self.index.get(pair)
            if i is not None:
                truth[pair] = int(self.users[i])
        release = DpHistogram.of(list(released), list(released.values()), 0)
        out = release_utility(release, truth)
        return {
            "released": out["released"],
            "released_in_input": sum(1 for pair in released if pair in self.index),  # Korolova's guessed clicks may not be
            "recall_top100": out[f"recall_top{TOP}"],
            "relative_error": out["relative_error"],
        }


def load_inputs(args: argparse.Namespace) -> list[Input]:
    """MSNBC, AOL (uncleaned unless --aol-clean) and the synthetic log named by the flags."""

    out = []
    for name in ("msnbc", "aol"):
        spec = getattr(args, f"{name}_users")
        for n in common.int_list(spec, f"--{name}-users") if spec.strip() else []:
            if name == "aol" and not args.aol_clean:
                path = common.data_path(args.data, name)
                log = load_log(str(path), LoadOptions(format=common.DATA_FILES[name][1], max_users=n or None))
                dataset = Dataset(f"{name}-{common._human(log.size)}", name, log, n or None)
            else:
                dataset = common.load_dataset(args.data, name, n or None)
            out.append(Input(dataset, dataset_records(args.data, dataset, dataset.max_users)))
    if args.synthetic_users:
        log = synthetic_log(seed=7, users=args.synthetic_users)
        out.append(Input(Dataset(f"synthetic-{common._human(log.size)}", "synthetic", log), log.records()))
    if not out:
        raise ValueError("no input: give --msnbc-users, --aol-users and/or --synthetic-users")
    return out


# ----------------------------------------------------------------------------- the DP histogram
@functools.lru_cache(maxsize=None)
def dp_threshold(epsilon: float, delta: float, max_items: int, beta: Fraction) -> int:
    return threshold(epsilon, delta, max_items, beta)


def primitive_release(log: SearchLog, epsilon: float, delta: float, max_items: int, parties: int, collusion: int, draws: DrawKeys) -> DpHistogram:
    """The session's release computed from the primitives on the union log: r noise shares per
    pair, τ at β = r/h (cels.mechanism.dp_release.sanitize_dp with ``parties`` and ``collusion``)."""
    return sanitize_dp(log, epsilon, delta, max_items, draws, parties, collusion)[0]


def protocol_release(log: SearchLog, epsilon: float, delta: float, max_items: int, parties: int, collusion: int, seed: int) -> tuple[DpHistogram, dict]:
    """One in-memory session of r parties and the solver with ``--release dp`` (seeded draws:
    a measurement, not a private release).  Uses no Paillier key."""
    from cels.inprocess import run_session
    from cels.protocol.options import SessionOptions

    options = SessionOptions.create(parties, epsilon=epsilon, delta=delta, release="dp", max_items_per_user=max_items, collusion=collusion)
    return run_session(log.split_by_user(parties, seed), options, seed=seed)


def dp_row(item: Input, epsilon: float, delta: float, max_items: int, parties: int, collusion: int, engine: str, seed: int) -> dict:
    """The DP histogram's row: the protocol, or the primitives (``auto``: if the session fails)."""
    run_seed = zlib.crc32(f"{seed}|{item.label}|{epsilon}|{max_items}".encode())
    beta = share_beta(parties, collusion)
    tau = dp_threshold(epsilon, delta, max_items, beta)
    started = time.perf_counter()
    used, note, extra = engine, "", {}
    release = None
    if engine in ("auto", "protocol"):
        from cels.protocol.roles import ProtocolError

        try:
            release, report = protocol_release(item.dataset.log, epsilon, delta, max_items, parties, collusion, run_seed)
            used, extra = "protocol", {"bytes_total": report.get("bytes_total")}
            if release.threshold != tau:
                raise RuntimeError(f"the session's threshold {release.threshold} is not tau = {tau}")
        except (ProtocolError, RuntimeError) as exc:
            if engine == "protocol":
                raise
            used, note = "primitives", f"protocol failed: {str(exc)[:300]}"
    if release is None:
        used = "primitives"
        release = primitive_release(item.dataset.log, epsilon, delta, max_items, parties, collusion, DrawKeys.replay(run_seed, "primitives"))
    released = {(i.query, i.url): i.count for i in release.items}
    return {
        "method": DP_METHOD,
        "engine": used,
        "parties": parties,
        "collusion": collusion,
        "beta": float(beta),
        "threshold": tau,
        **item.utility(released),
        "released_items_all": len(release.items),
        "min_released_count": min(released.values(), default=None),
        "privacy_epsilon": epsilon,
        "privacy_delta": delta,
        "dp_claim": True,
        "user_level_rows": False,
        "seconds": round(time.perf_counter() - started, 2),
        **extra,
        "engine_note": note,
    }


# ----------------------------------------------------------------------------- the other methods
def baseline_row(item: Input, name: str, epsilon: float, delta: float, max_items: int, seed: int) -> dict:
    """ZEALOUS (m = Δ0) or Korolova (d = d_c = Δ0), otherwise as compare runs them."""

    args = baseline_args(epsilon, delta)
    if name == "zealous":
        args.zealous_m = max_items
    else:
        args.korolova_d = args.korolova_dc = max_items
    started = time.perf_counter()
    items, report = BASELINES[name].run(item.records, args, baseline_rng(seed))
    clicks = {(i.query, i.url): i.count for i in items if i.kind == "click"}
    privacy = report["privacy"]
    return {
        "method": name,
        "engine": "single holder",
        "threshold": privacy.get("K_run", privacy.get("per_kind", {}).get("click", {}).get("tau_prime_run")),
        **item.utility(clicks),
        "released_items_all": len(items),
        "min_released_count": min(clicks.values(), default=None),
        "privacy_epsilon": privacy.get("epsilon"),
        "privacy_delta": privacy.get("delta_run", privacy.get("delta", 0.0)),
        "dp_claim": privacy.get("dp_claim", True),
        "user_level_rows": False,
        "seconds": round(time.perf_counter() - started, 2),
    }


def sampled_counts(item: Input, epsilon: float, delta: float, seed: int) -> tuple[dict[Pair, int], str]:
    """The sampled release's pair totals (empty, with the reason, if no pair can be released)."""
    try:
        out, _ = sanitize(item.dataset.log, SanitizeParams(epsilon=epsilon, delta=delta, seed=seed), progress=False)
    except ValueError as exc:
        return {}, str(exc)
    return {p: int(c) for p, c in zip(out.pairs, out.pair_totals().tolist()) if c > 0}, ""


def sampled_row(released: dict[Pair, int], note: str, item: Input, epsilon: float, delta: float, seconds: float) -> dict:
    return {
        "method": "sampled",
        "engine": "single holder",
        **item.utility(released),
        "released_items_all": len(released),
        "min_released_count": min(released.values(), default=None),
        "privacy_epsilon": epsilon,
        "privacy_delta": delta,
        "dp_claim": False,  # only the sampling step is DP, given the exact counts (CELS 3.3)
        "user_level_rows": True,
        "seconds": round(seconds, 2),
        "engine_note": note,
    }


# ----------------------------------------------------------------------------- the grid
def measure(
    inputs: Sequence[Input],
    budgets: Sequence[tuple[float, float]],
    max_items: Sequence[int],
    *,
    parties: int = DEFAULT_PARTIES,
    collusion: int = 1,
    engine: str = "auto",
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    """One row per (input, ε, δ, Δ0, method); the sampled release one row per (input, ε, δ)."""
    if engine not in ENGINES:
        raise ValueError(f"--dp-engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    share_beta(parties, collusion)
    methods = (DP_METHOD, "zealous", "korolova")
    grid = [(item, eps, dl, None, "sampled") for item in inputs for eps, dl in budgets]
    grid += [(item, eps, dl, d0, m) for item in inputs for eps, dl in budgets for d0 in max_items for m in methods]
    grid.sort(key=lambda g: (inputs.index(g[0]), g[1], g[2], -1 if g[3] is None else g[3]))
    sampled: dict[tuple[str, float], tuple[dict, str, float]] = {}
    rows = []
    for item, epsilon, delta, d0, method in tqdm(grid, desc="compare dp", unit="run", disable=None if progress else True):
        b = privacy_bound(epsilon, delta)
        head = {**item.facts(), "epsilon": epsilon, "delta": delta, "b": b, "max_items": d0}
        if method == "sampled":
            if (item.label, b) not in sampled:  # the output depends on b only
                started = time.perf_counter()
                released, note = sampled_counts(item, epsilon, delta, seed)
                sampled[(item.label, b)] = (released, note, time.perf_counter() - started)
            rows.append({**head, **sampled_row(*sampled[(item.label, b)][:2], item, epsilon, delta, sampled[(item.label, b)][2])})
        elif method == DP_METHOD:
            rows.append({**head, **dp_row(item, epsilon, delta, d0, parties, collusion, engine, seed)})
        else:
            rows.append({**head, **baseline_row(item, method, epsilon, delta, d0, seed)})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Pairs released, top-100 recall and relative error per method; one column per input,
    one bar group per (ε, Δ0)."""
    labels = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    measures = {"released": "pairs released", "recall_top100": "recall of the top 100", "relative_error": "mean relative error"}
    fig, axes = panels(len(labels), rows=len(measures), width=5.5, height=2.6)
    width = 0.8 / len(methods)
    for col, label in enumerate(labels):
        mine = [r for r in rows if r["dataset"] == label]
        groups = list(dict.fromkeys((r["epsilon"], r["max_items"]) for r in mine if r["max_items"] is not None))
        for ax, (metric, name) in zip(axes[:, col], measures.items()):
            for k, method in enumerate(methods):
                values = []
                for eps, d0 in groups:
                    row = next((r for r in mine if r["method"] == method and r["epsilon"] == eps and r["max_items"] in (d0, None)), None)
                    value = None if row is None else row[metric]
                    values.append(np.nan if value is None else value)
                ax.bar(np.arange(len(groups)) + k * width, values, width, label=method)
            ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
            ax.set_xticklabels([f"ε={e:g}\nΔ0={d}" for e, d in groups], fontsize=6)
            ax.set_ylabel(name, fontsize=8)
            if metric == "released":
                ax.set_yscale("symlog", linthresh=1)
            ax.set_title(label, fontsize=9)
    axes[0, 0].legend(fontsize=7)
    delta, dp = rows[0]["delta"], next((r for r in rows if r["method"] == "dp-histogram"), rows[0])
    fig.suptitle(f"DP histogram (r = {dp.get('parties')}, t = {dp.get('collusion')}) vs sampled release vs ZEALOUS / Korolova et al. "
                 f"(click pairs, δ = {delta:g})", fontsize=10)  # fmt: skip
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags only ``--release dp`` reads (compare adds the shared ones)."""
    parser.add_argument("--max-items", default=DEFAULT_MAX_ITEMS, metavar="D0,..", help=f"--release dp: Δ0 values (default {DEFAULT_MAX_ITEMS})")
    parser.add_argument("--collusion", type=int, default=1, metavar="T", help="--release dp: t of the DP histogram (default 1)")
    parser.add_argument("--dp-engine", choices=ENGINES, default="auto", help="--release dp: run the DP histogram as an in-memory session "
                        "(protocol), from its primitives (same distribution), or the session with the primitives if it fails (auto, default)")  # fmt: skip
    parser.add_argument("--synthetic-users", type=int, default=DEFAULT_SYNTHETIC_USERS, metavar="N",
                        help=f"--release dp: users of the synthetic log (default {DEFAULT_SYNTHETIC_USERS:,}: ~1M (user, pair) records; 0 = none)")  # fmt: skip
    parser.add_argument("--aol-clean", action="store_true", help="--release dp: apply the paper's AOL cleaning (count >= 20; outside the DP claim)")


def run(args: argparse.Namespace, out_dir: Path, budgets: list[tuple[float, float]]) -> list[dict]:
    if args.parties < 2:
        raise ValueError(f"--parties: the DP histogram needs r >= 2 parties, got {args.parties}")
    max_items = common.int_list(args.max_items, "--max-items")
    if 0 in max_items:
        raise ValueError("--max-items: every Δ0 must be >= 1")
    if args.synthetic_users < 0 or args.synthetic_users == 1:
        raise ValueError(f"--synthetic-users must be 0 or >= 2, got {args.synthetic_users}")
    rows = measure(
        load_inputs(args), budgets, max_items, parties=args.parties, collusion=args.collusion, engine=args.dp_engine,
        seed=args.seed, progress=not args.quiet,
    )  # fmt: skip
    plot(rows, out_dir / "compare.png")
    return rows
