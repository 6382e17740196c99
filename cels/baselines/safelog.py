"""Safelog (Zhang et al., Algorithm 1): Korolova's release plus an external query pool.

3. remove queries with count < tau (tau = 5 in the paper; this step is OUTSIDE the paper's
   proof);  4. keep each user's first q_f queries and first c_f clicks;  5. Q+ = Q_clean + Q_p,
   pool queries with count 0 (pool drawn afresh per release, :mod:`cels.baselines.pool`);
6. select q when M(q, Q+) + Lap(b) > K;  7. publish M(q) + Lap(b_q) and click counts
   + Lap(b_c) (candidates as in :mod:`cels.baselines.clicks`);  8. optionally the transitions
   between released queries + Lap(b_t).
Privacy (Theorem 1): epsilon = q_f ln alpha + q_f/b_q + c_f/b_c (+ (q_f - 1)/b_t with
transitions), alpha = max(e^{1/b}/p_g, 1 + 1/(2 e^{(K-1)/b} - 1)).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

from cels.baselines.base import Options, TabledBaseline
from cels.baselines.clicks import CANDIDATE_HELP, click_candidates, release_clicks
from cels.baselines.items import limit_user_activity, query_events, user_histories
from cels.baselines.params import korolova_privacy, safelog_epsilon, safelog_turning_point
from cels.baselines.pool import domain_size, draw_query_pool, inclusion_probability
from cels.baselines.release import ReleasedItem
from cels.baselines.sampling import integer_threshold, noise_above, noisy, zero_count_survivors
from cels.baselines.utility import utility_by_kind
from cels.crypto.streams import CipherRandom
from cels.logs.records import LogRecord


def resolve(
    epsilon: float | None,
    qf: int,
    cf: int,
    K: float | None = None,
    b: float | None = None,
    bq: float | None = None,
    bc: float | None = None,
    pg: float = 1.0,
    bt: float | None = None,
    transitions: bool = False,
) -> dict:
    """Safelog's parameters and its epsilon (Theorem 1) with and without the transition term.

    Missing scales come from ``epsilon`` split evenly over the released parts (selection, query
    counts, click counts[, transitions]): q_f ln alpha = epsilon/parts at K = the turning point
    where e^{1/b}/p_g = 1 + 1/(2e^{(K-1)/b} - 1).  ``K_run`` = ceil(K) is what the release uses.
    """
    if qf < 1 or cf < 0:
        raise ValueError("q_f must be >= 1 and c_f >= 0")
    parts = 3 + bool(transitions)
    if None in (K, b, bq, bc) or (transitions and bt is None):
        if epsilon is None or not epsilon > 0:
            raise ValueError("give --epsilon, or every one of K, b, b_q, b_c (and b_t with transitions)")
        if b is None:
            rate = epsilon / (parts * qf) + math.log(pg)  # 1/b with q_f ln(e^{1/b}/p_g) = epsilon/parts
            if not rate > 0:
                raise ValueError(f"p_g = {pg} is too small: q_f ln(1/p_g) alone exceeds epsilon/{parts}")
            b = 1.0 / rate
        K = safelog_turning_point(b, pg) if K is None else K
        bq = parts * qf / epsilon if bq is None else bq
        bc = parts * max(cf, 1) / epsilon if bc is None else bc
        if transitions and bt is None:
            bt = parts * max(qf - 1, 1) / epsilon
    K_run = integer_threshold(K)
    paper = safelog_epsilon(qf, cf, K_run, b, bq, bc, pg, bt if transitions else None)
    # Without the pool assumption the Korolova et al. (epsilon, delta) analysis still applies.
    fallback = korolova_privacy(qf, cf, K_run, b, bq, bc)
    if transitions:
        fallback["epsilon"] += (qf - 1) / bt
    params = {"qf": qf, "cf": cf, "K": K, "K_run": K_run, "b": b, "bq": bq, "bc": bc, "pg": pg}
    if transitions:
        params["bt"] = bt
    fallback_delta = min(1.0, fallback["delta"])  # a delta of 1 or more guarantees nothing
    return {**params, **paper, "fallback_epsilon_delta": {"epsilon": fallback["epsilon"], "delta": fallback_delta}}


def transition_threshold(n_candidates: int, bt: float) -> int:
    """Smallest integer k >= 0 with n_candidates * Pr[eta > k] <= 1: about one noise-only row expected."""
    p = math.exp(-1.0 / bt)
    if n_candidates <= 1:
        return 0
    return max(0, math.ceil(bt * math.log(n_candidates / (1.0 + p))) - 1)


def release_transitions(
    released: list[str], transitions: Counter, bt: float, threshold: int, rng: CipherRandom
) -> list[ReleasedItem]:
    """Noisy counts of all ordered pairs of distinct released queries; those > threshold are published.

    Pairs with a real transition get count + Lap(b_t); the zero-count pairs are handled by
    :func:`zero_count_survivors` (same law, time proportional to what passes).
    """
    index = {q: i for i, q in enumerate(released)}
    n = len(released)
    out = []
    for (first, second), count in transitions.items():
        if first in index and second in index:
            value = noisy(count, bt, rng)
            if value > threshold:
                out.append(ReleasedItem("query_pair", first, None, second, value))
    for position in zero_count_survivors(n * (n - 1), threshold, bt, rng):
        i, j = divmod(position, n - 1)
        j += j >= i  # skip the diagonal
        pair = (released[i], released[j])
        if pair not in transitions:
            out.append(ReleasedItem("query_pair", pair[0], None, pair[1], noise_above(threshold, bt, rng)))
    return out


def safelog(
    histories: dict[str, list[LogRecord]],
    params: dict,
    tau: int,
    pool: set[str],
    candidates: str,
    rng: CipherRandom,
    transitions: bool = False,
) -> tuple[list[ReleasedItem], dict]:
    """Steps 3-8 of Algorithm 1; returns the items and counts for the report."""
    totals: Counter = Counter()
    for history in histories.values():
        totals.update(query_events(history))
    keep = {q for q, c in totals.items() if c >= tau}
    queries, clicks, moves = limit_user_activity(histories, params["qf"], params["cf"], keep)
    selected = [q for q, m in queries.items() if noisy(m, params["b"], rng) > params["K_run"]]
    pool_only = sorted(pool.difference(queries))  # Q_p queries count 0 in Q+
    from_pool = [pool_only[i] for i in zero_count_survivors(len(pool_only), params["K_run"], params["b"], rng)]
    reduced = selected + from_pool
    items = [ReleasedItem("query", q, None, None, max(0, noisy(queries.get(q, 0), params["bq"], rng))) for q in reduced]
    urls, dp_claim = click_candidates(candidates, reduced, clicks)
    items += release_clicks(urls, clicks, params["bc"], rng) if params["cf"] else []
    counts = {
        "queries_after_prefilter": len(keep),
        "distinct_queries_kept": len(queries),
        "pool_queries_not_in_log": len(pool_only),
        "released_log_queries": len(selected),
        "released_pool_queries": len(from_pool),
        "released_clicks": sum(1 for i in items if i.kind == "click"),
        "candidates_dp": dp_claim,
    }
    if transitions:
        threshold = transition_threshold(len(reduced) * (len(reduced) - 1), params["bt"])
        pairs = release_transitions(reduced, moves, params["bt"], threshold, rng)
        items += pairs
        counts.update(transition_threshold=threshold, released_transitions=len(pairs))
    return items, counts


class Safelog(TabledBaseline):
    """The Safelog baseline for ``cels sanitize --method safelog``."""

    name = "safelog"
    options: Options = (
        ("tau", {"type": int, "default": 5, "help": "pre-filter: drop queries seen fewer than tau times (paper: 5; outside the proof; 1 = off)"}),
        ("qf", {"type": int, "default": 5, "help": "queries kept per user (default 5)"}),
        ("cf", {"type": int, "default": 5, "help": "clicks kept per user (default 5)"}),
        *(
            (name, {"type": float, "default": None, "help": f"{what} (default derived from --epsilon)"})
            for name, what in (
                ("K", "selection threshold (default: turning point for b)"),
                ("b", "selection noise scale"),
                ("bq", "query count noise scale"),
                ("bc", "click count noise scale"),
                ("bt", "transition noise scale"),
            )
        ),
        ("pg", {"type": float, "default": 1.0, "help": "assumed pool inclusion probability p_g in the paper's epsilon (default 1, as its Table 3)"}),
        ("transitions", {"action": "store_true", "help": "also release query transitions (+ (q_f - 1)/b_t to epsilon)"}),
        ("pool-size", {"type": int, "default": 100_000, "help": "draws for the query pool (default 100000)"}),
        ("pool-vocabulary", {"type": int, "default": 5000, "help": "pool words: the most frequent English words of wordfreq (default 5000)"}),
        ("pool-max-n", {"type": int, "default": 3, "help": "pool queries are 1..N-grams (default 3)"}),
        ("candidates", {"default": "navigational", "help": CANDIDATE_HELP}),
    )

    def run(
        self, records: list[LogRecord], args: argparse.Namespace, rng: CipherRandom
    ) -> tuple[list[ReleasedItem], dict]:
        params = resolve(
            getattr(args, "epsilon", None),
            args.safelog_qf,
            args.safelog_cf,
            args.safelog_K,
            args.safelog_b,
            args.safelog_bq,
            args.safelog_bc,
            args.safelog_pg,
            args.safelog_bt,
            args.safelog_transitions,
        )
        histories = user_histories(records)
        size, vocabulary, max_n = args.safelog_pool_size, args.safelog_pool_vocabulary, args.safelog_pool_max_n
        pool = draw_query_pool(size, rng, vocabulary, max_n)
        items, counts = safelog(
            histories, params, args.safelog_tau, pool, args.safelog_candidates, rng, args.safelog_transitions
        )
        pool_pg = inclusion_probability(size, vocabulary, max_n)
        candidates_dp = counts.pop("candidates_dp")
        pool_report = {
            "draws": size,
            "distinct": len(pool),
            "vocabulary": vocabulary,
            "max_n": max_n,
            "domain_size": domain_size(vocabulary, max_n),
            "p_g": pool_pg,
        }
        if pool_pg > 0:
            pool_report["epsilon_at_pool_p_g"] = resolve(
                None,
                params["qf"],
                params["cf"],
                params["K"],
                params["b"],
                params["bq"],
                params["bc"],
                pool_pg,
                params.get("bt"),
                args.safelog_transitions,
            )["epsilon"]
        privacy = {
            "method": "Safelog (Zhang et al.)",
            "definition": "epsilon-differential privacy as claimed by Zhang et al. Theorem 1 (at the stated p_g)",
            **params,
            "tau": args.safelog_tau,
            "pool": pool_report,
            "click_candidates": args.safelog_candidates,
            "dp_claim": candidates_dp and args.safelog_tau <= 1,
            "notes": [
                "the tau pre-filter is outside the paper's proof (dp_claim is false while tau > 1)",
                "the paper's epsilon assumes every possible query enters the pool with probability p_g; "
                "this pool covers only word n-grams (p_g above, 0 for any other query)",
                "fallback_epsilon_delta: the Korolova et al. (epsilon, delta) analysis, which needs no pool",
            ],
            "noise": "discrete Laplace on integer counts; K used as ceil(K)",
        }
        sizes = {"users": len(histories), "records": len(records), **counts}
        kinds = ("query", "click", "query_pair") if args.safelog_transitions else ("query", "click")
        return items, {
            "method": self.name,
            "privacy": privacy,
            "sizes": sizes,
            "utility": utility_by_kind(items, histories, kinds),
        }
