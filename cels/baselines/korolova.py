"""Korolova et al. (WWW 2009), Algorithm A: release queries and clicks with noisy thresholds.

1. keep each user's first d query events and first d_c clicks;  2. M(q) = occurrences;
3. Select-Queries: q is released when M(q) + Lap(b) > K;  4. publish M(q) + Lap(b_q) (fresh
draw);  5. clicks: <q, u, #clicks + Lap(b_c)> for candidate URLs of each released query (see
:mod:`cels.baselines.clicks` for the candidate set).
Privacy: epsilon = d ln alpha + d/b_q + d_c/b_c, delta = (d/2) e^{(d-K)/b}.
"""

from __future__ import annotations

import argparse
import random

from cels.baselines.base import Options, TabledBaseline, budget
from cels.baselines.clicks import CANDIDATE_HELP, click_candidates, parse_candidates, release_clicks
from cels.baselines.items import limit_user_activity, user_histories
from cels.baselines.params import korolova_optimum, korolova_privacy
from cels.baselines.release import ReleasedItem
from cels.baselines.sampling import integer_threshold, noisy
from cels.baselines.utility import utility_by_kind
from cels.logs.records import LogRecord


def resolve(
    epsilon: float,
    delta: float,
    d: int,
    dc: int = 0,
    K: float | None = None,
    b: float | None = None,
    bq: float | None = None,
    bc: float | None = None,
) -> dict:
    """K, b, alpha, epsilon, delta.  Missing K, b: the optimum of the slides at the budget left
    after the count terms, epsilon_select = epsilon - d/b_q - d_c/b_c (b_q, b_c None: not released).

    ``K_run`` = ceil(K) is the threshold used on integer noisy counts; the accounting uses it.
    """
    epsilon_counts = (d / bq if bq else 0.0) + (dc / bc if bc else 0.0)
    epsilon_select = epsilon - epsilon_counts
    if (K is None or b is None) and not epsilon_select > 0:
        raise ValueError(
            f"d/b_q + d_c/b_c = {epsilon_counts:.4g} leaves no budget of epsilon = {epsilon} for Select-Queries"
        )
    if K is None or b is None:
        K_opt, b_opt = korolova_optimum(epsilon_select, delta, d)
        K = K_opt if K is None else K
        b = b_opt if b is None else b
    K_run = integer_threshold(K)
    if K_run <= d:
        raise ValueError(f"K = {K} must exceed d = {d} (Korolova et al.: K > d)")
    privacy = korolova_privacy(d, dc, K_run, b, bq, bc)
    return {
        "d": d,
        "dc": dc,
        "K": K,
        "b": b,
        "bq": bq,
        "bc": bc,
        "K_run": K_run,
        **privacy,
        "epsilon_target": epsilon,
        "delta_target": delta,
    }


def korolova(
    histories: dict[str, list[LogRecord]], params: dict, candidates: str, rng: random.Random
) -> tuple[list[ReleasedItem], dict]:
    """Steps 1-5; returns the released queries and clicks, and counts for the report."""
    queries, clicks, _ = limit_user_activity(histories, params["d"], params["dc"])
    selected = [q for q, m in queries.items() if noisy(m, params["b"], rng) > params["K_run"]]
    released = [ReleasedItem("query", q, None, None, max(0, noisy(queries[q], params["bq"], rng))) for q in selected]
    urls, dp_claim = click_candidates(candidates, selected, clicks)
    released_clicks = release_clicks(urls, clicks, params["bc"], rng) if params["bc"] else []
    return released + released_clicks, {
        "distinct_queries_kept": len(queries),
        "released_queries": len(selected),
        "click_candidates": sum(len(u) for u in urls.values()),
        "released_clicks": len(released_clicks),
        "candidates_dp": dp_claim,
    }


class Korolova(TabledBaseline):
    """The Korolova et al. baseline for ``cels sanitize --method korolova``."""

    name = "korolova"
    options: Options = (
        ("d", {"type": int, "default": 5, "help": "query events kept per user (default 5)"}),
        ("dc", {"type": int, "default": 5, "help": "clicks kept per user (default 5)"}),
        ("K", {"type": float, "default": None, "help": "selection threshold (default: optimum for epsilon/3)"}),
        ("b", {"type": float, "default": None, "help": "selection noise scale (default: optimum d/(epsilon/3))"}),
        ("bq", {"type": float, "default": None, "help": "query count noise scale (default 3d/epsilon)"}),
        ("bc", {"type": float, "default": None, "help": "click count noise scale (default 3dc/epsilon)"}),
        ("candidates", {"default": "navigational", "help": CANDIDATE_HELP}),
    )

    def run(
        self, records: list[LogRecord], args: argparse.Namespace, rng: random.Random
    ) -> tuple[list[ReleasedItem], dict]:
        epsilon, delta = budget(args)
        d, dc = args.korolova_d, args.korolova_dc
        with_clicks = parse_candidates(args.korolova_candidates)[0] != "none" and dc > 0
        parts = 3 if with_clicks else 2
        bq = args.korolova_bq or parts * d / epsilon
        bc = (args.korolova_bc or parts * dc / epsilon) if with_clicks else None
        params = resolve(epsilon, delta, d, dc if with_clicks else 0, args.korolova_K, args.korolova_b, bq, bc)
        histories = user_histories(records)
        items, counts = korolova(histories, params, args.korolova_candidates, rng)
        privacy = {
            "method": "Korolova et al. (WWW 2009)",
            "definition": "(epsilon, delta)-differential privacy (user level)",
            **params,
            "click_candidates": args.korolova_candidates,
            "dp_claim": counts.pop("candidates_dp"),
            "noise": "discrete Laplace on integer counts; K used as ceil(K)",
        }
        sizes = {"users": len(histories), "records": len(records), **counts}
        return items, {
            "method": self.name,
            "privacy": privacy,
            "sizes": sizes,
            "utility": utility_by_kind(items, histories, ("query", "click")),
        }
