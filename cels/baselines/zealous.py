"""ZEALOUS (Götz et al., Fig. 1): per-user item choice, two thresholds, Laplace noise.

1. per user, choose up to m distinct items (seeded random choice, or the first m in log order);
2. histogram: c_k = number of users that chose item k;
3. drop c_k < tau;  4. add Lap(lambda);  5. drop noisy counts <= tau';  6. publish the rest with
   the same noisy count.
Items: keywords, queries, clicks (query-url pairs) and query pairs.  Several item types share
the budget evenly (basic composition: epsilon and delta add up).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from tqdm import tqdm

from cels.baselines.base import Options, TabledBaseline, budget
from cels.baselines.items import ITEM_KINDS, distinct_items, item_totals, user_histories
from cels.baselines.params import (
    zealous_indistinguishability,
    zealous_indistinguishability_delta,
    zealous_probabilistic,
    zealous_probabilistic_delta,
)
from cels.baselines.release import ReleasedItem
from cels.baselines.sampling import integer_threshold, noisy
from cels.baselines.utility import item_utility
from cels.logs.records import LogRecord

MODES = ("probabilistic", "indistinguishability")


def resolve(
    epsilon: float,
    delta: float,
    m: int,
    users: int,
    mode: str = "probabilistic",
    tau: int | None = None,
    lam: float | None = None,
) -> dict:
    """Parameters for one item type: Theorem 3 + Prop. 4, or Theorem 2 (epsilon', delta').

    Adds ``tau_prime_run`` = ceil(tau') (noisy counts are integers) and the delta it reaches.
    """
    if mode == "probabilistic":
        params = zealous_probabilistic(epsilon, delta, m, users, tau=tau, lam=lam)
        run = integer_threshold(params["tau_prime"])
        params["delta_run"] = zealous_probabilistic_delta(params["lambda"], params["tau"], run, users, m)
    elif mode == "indistinguishability":
        if tau not in (None, 1) or lam is not None:
            raise ValueError("the indistinguishability setting fixes tau = 1 and lambda = 2m/epsilon'")
        params = zealous_indistinguishability(epsilon, delta, m)
        run = integer_threshold(params["tau_prime"])
        params["delta_prime_run"] = zealous_indistinguishability_delta(m, params["lambda"], run)
    else:
        raise ValueError(f"unknown ZEALOUS mode {mode!r}; choose from {', '.join(MODES)}")
    params["tau_prime_run"] = run
    return params


def choose_items(
    histories: dict[str, list[LogRecord]], kind: str, m: int, rng: random.Random, first: bool = False
) -> dict[str, list]:
    """Step 1: per user up to m distinct items, a uniform random subset or the first m."""
    chosen = {}
    for user, history in tqdm(
        histories.items(), desc=f"zealous: choose {kind}s", unit="user", disable=None, leave=False
    ):
        items = distinct_items(history, kind)
        chosen[user] = items[:m] if first or len(items) <= m else rng.sample(items, m)
    return chosen


def zealous(
    histories: dict[str, list[LogRecord]],
    kind: str,
    m: int,
    tau: int,
    lam: float,
    tau_prime: int,
    rng: random.Random,
    first: bool = False,
) -> tuple[list[ReleasedItem], Counter]:
    """Steps 1-6 of Fig. 1 for one item type; also returns the step-2 histogram."""
    histogram: Counter = Counter()
    for items in choose_items(histories, kind, m, rng, first).values():
        histogram.update(items)
    released = []
    for (item_kind, query, url, next_query), users in histogram.items():
        if users < tau:
            continue
        count = noisy(users, lam, rng)
        if count > tau_prime:
            released.append(ReleasedItem(item_kind, query, url, next_query, count))
    return released, histogram


class Zealous(TabledBaseline):
    """The ZEALOUS baseline for ``cels sanitize --method zealous``."""

    name = "zealous"
    options: Options = (
        ("items", {"default": "click", "help": f"comma-separated item types from {', '.join(ITEM_KINDS)} (default click)"}),
        ("m", {"type": int, "default": 1, "help": "items chosen per user (default 1: best coverage, Götz et al. 6.2)"}),
        ("mode", {"choices": MODES, "default": "probabilistic", "help": "probabilistic DP (Theorem 3) or indistinguishability (Theorem 2)"}),
        ("tau", {"type": int, "default": None, "help": "first threshold (default: better of floor/ceil of lambda, Prop. 4)"}),
        ("lambda", {"type": float, "default": None, "help": "Laplace scale (default 2m/epsilon per item type)"}),
        ("first-m", {"action": "store_true", "help": "choose each user's first m items in log order instead of a random m"}),
    )

    def run(
        self, records: list[LogRecord], args: argparse.Namespace, rng: random.Random
    ) -> tuple[list[ReleasedItem], dict]:
        epsilon, delta = budget(args)
        kinds = [k.strip() for k in args.zealous_items.split(",") if k.strip()]
        unknown = [k for k in kinds if k not in ITEM_KINDS]
        if not kinds or unknown:
            raise ValueError(
                f"--zealous-items: unknown item type(s) {unknown or kinds}; choose from {', '.join(ITEM_KINDS)}"
            )
        histories = user_histories(records)
        share = len(kinds)
        items: list[ReleasedItem] = []
        per_kind: dict[str, dict] = {}
        sizes: dict = {"users": len(histories), "records": len(records), "per_kind": {}}
        utility: dict = {}
        for kind in kinds:
            params = resolve(
                epsilon / share,
                delta / share,
                args.zealous_m,
                max(len(histories), 1),
                args.zealous_mode,
                args.zealous_tau,
                args.zealous_lambda,
            )
            released, histogram = zealous(
                histories,
                kind,
                args.zealous_m,
                params["tau"],
                params["lambda"],
                params["tau_prime_run"],
                rng,
                args.zealous_first_m,
            )
            items.extend(released)
            per_kind[kind] = params
            sizes["per_kind"][kind] = {
                "distinct_items_chosen": len(histogram),
                "at_least_tau": sum(1 for c in histogram.values() if c >= params["tau"]),
                "released": len(released),
                "released_total_count": sum(i.count for i in released),
            }
            utility[kind] = item_utility(released, item_totals(histories, kind))
        probabilistic = args.zealous_mode == "probabilistic"
        privacy = {
            "method": "ZEALOUS (Götz et al.)",
            "definition": "(epsilon, delta)-probabilistic differential privacy"
            if probabilistic
            else "(epsilon', delta')-indistinguishability",
            "epsilon": epsilon,
            "delta": delta,
            "delta_run": sum(p["delta_run" if probabilistic else "delta_prime_run"] for p in per_kind.values()),
            "composition": f"budget split evenly over {share} item type(s); epsilon and delta add up",
            "noise": "discrete Laplace on integer user counts; tau' used as ceil(tau')",
            "dp_claim": True,
            "per_kind": per_kind,
        }
        return items, {"method": self.name, "privacy": privacy, "sizes": sizes, "utility": utility}
