"""A stochastic tester for (epsilon, delta)-DP claims (docs/security.md, "Empirical privacy audit").

After the stochastic tester of Google's differential-privacy library (Wilson et al., "Differentially
private SQL with bounded user contribution", PoPETs 2020, section 5.3) and Gilbert and McMillan,
"Property testing for differential privacy" (Allerton 2018): draw M(A) and M(B) many times on
neighbouring inputs A and B, histogram the outputs into buckets fixed before the draws, and test
every bucket S in both orders against the claim

    P[M(A) in S] <= e^eps P[M(B) in S] + delta_S.

Each bucket probability gets exact one-sided Clopper-Pearson bounds (binomial tails through
``scipy.stats.beta``).  A violation is *certified* when lower_A(S) > e^eps upper_B(S) + delta_S.
Every one-sided bound the test may use holds with probability >= 1 - alpha / m (m bounds in all,
Bonferroni, alpha = 1 - confidence), so a mechanism that meets the claim is reported as violating
it with probability at most alpha.  The certified epsilon is the largest
ln((lower_A(S) - delta_S) / upper_B(S)) over buckets and orders: a loss the data proves.

Two claim shapes:

- approximate (eps, delta)-DP: delta_S = delta for every bucket, both orders;
- probabilistic (eps, delta)-DP with a *delta event* E (CELS eq. 4: the outputs of M(A) holding a
  record of the user A has and B lacks): P[M(A) in E] <= delta, every bucket outside E keeps the pure
  bound (delta_S = 0) in both orders, buckets inside E the approximate one (PDP implies it).

Passing is evidence, not proof: only the given buckets are tested.  A certified violation is proof
at the stated confidence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import beta, chisquare

DEFAULT_CONFIDENCE = 1 - 1e-6
MIN_ESTIMATE_COUNT = 30
"""Buckets seen fewer times than this in either sample are left out of the point estimate."""


@dataclass(frozen=True)
class Partition:
    """Buckets fixed before the draws: ``key(output)`` must be one of ``labels``."""

    name: str
    labels: Sequence[Hashable]
    key: Callable[[Any], Hashable]


@dataclass
class Result:
    """What one test run proves (bounds at ``confidence``, Bonferroni over ``bounds``)."""

    claimed_epsilon: float
    claimed_delta: float
    confidence: float
    draws: tuple[int, int]
    bounds: int
    certified_epsilon: float
    """The largest loss the data proves (0 when none is proven)."""
    certified_epsilon_at: str
    certified_delta: float | None
    """Probabilistic claims: the lower bound on P[M(A) in E]."""
    estimated_epsilon: dict[str, float]
    """Per partition: max |ln(p_A(S) / p_B(S))| over its buckets seen >= MIN_ESTIMATE_COUNT times
    in both samples (buckets seen under one mechanism only are counted in only_under_a / _b)."""
    only_under_a: int
    """Draws of M(A) in buckets never seen under M(B) (the finest partition)."""
    only_under_b: int
    violations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations

    def summary(self) -> dict:
        return {
            "claimed_epsilon": self.claimed_epsilon,
            "claimed_delta": self.claimed_delta,
            "confidence": self.confidence,
            "draws": list(self.draws),
            "bounds": self.bounds,
            "certified_epsilon": round(self.certified_epsilon, 4),
            "certified_epsilon_at": self.certified_epsilon_at,
            "certified_delta": None if self.certified_delta is None else round(self.certified_delta, 4),
            "estimated_epsilon": {k: round(v, 4) for k, v in self.estimated_epsilon.items()},
            "only_under_a": self.only_under_a,
            "only_under_b": self.only_under_b,
            "passed": self.passed,
            "violations": self.violations[:5],
        }


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """Exact one-sided lower bound: P[p < bound] <= alpha for k successes in n trials."""
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """Exact one-sided upper bound: P[p > bound] <= alpha for k successes in n trials."""
    return 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))


def _histogram(outputs: Sequence[Any], partition: Partition) -> Counter:
    counts = Counter(partition.key(o) for o in outputs)
    unknown = set(counts) - set(partition.labels)
    if unknown:
        raise ValueError(f"partition {partition.name}: outputs outside its labels, e.g. {next(iter(unknown))!r}")
    return counts


def stochastic_test(
    outputs_a: Sequence[Any],
    outputs_b: Sequence[Any],
    partitions: Sequence[Partition],
    epsilon: float,
    delta: float,
    *,
    delta_event: Callable[[Any], bool] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Result:
    """Test the claim on draws of M(A) and M(B) (module docstring).  ``delta_event`` given: the
    probabilistic claim with E = {o : delta_event(o)}, which every partition's buckets must
    respect (a bucket lies wholly inside or outside E); otherwise the approximate claim."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n_a, n_b = len(outputs_a), len(outputs_b)
    if n_a == 0 or n_b == 0:
        raise ValueError("need draws of both mechanisms")
    bounds = 4 * sum(len(p.labels) for p in partitions) + (delta_event is not None)
    alpha = (1 - confidence) / bounds
    growth = math.exp(epsilon)
    violations: list[str] = []
    best, best_at = 0.0, ""
    estimate: dict[str, float] = {}
    inside_a = [delta_event(o) for o in outputs_a] if delta_event is not None else None
    certified_delta = None
    if inside_a is not None:
        certified_delta = clopper_pearson_lower(sum(inside_a), n_a, alpha)
        if certified_delta > delta:
            violations.append(f"P[M(A) in E] >= {certified_delta:.4f} > delta = {delta:g}")
    only = [0, 0]
    for index, part in enumerate(partitions):
        hist = (_histogram(outputs_a, part), _histogram(outputs_b, part))
        if index == 0:
            only = [sum(c for s, c in hist[0].items() if s not in hist[1]), sum(c for s, c in hist[1].items() if s not in hist[0])]
        in_event = _event_labels(outputs_a, outputs_b, part, delta_event)
        for label in set(hist[0]) | set(hist[1]):
            slack = delta if delta_event is None or label in in_event else 0.0
            k, n = (hist[0][label], hist[1][label]), (n_a, n_b)
            if min(k) >= MIN_ESTIMATE_COUNT:
                loss = abs(math.log((k[0] / n_a) / (k[1] / n_b)))
                estimate[part.name] = max(estimate.get(part.name, 0.0), loss)
            for first, second in ((0, 1), (1, 0)):
                low = clopper_pearson_lower(k[first], n[first], alpha)
                high = clopper_pearson_upper(k[second], n[second], alpha)
                if low <= slack:
                    continue
                proven = math.log((low - slack) / high)
                order = "A>B" if first == 0 else "B>A"
                if proven > best:
                    best, best_at = proven, f"{part.name}:{label!r} ({order})"
                if low > growth * high + slack:
                    violations.append(f"{part.name}:{label!r} ({order}): {low:.4g} > e^{epsilon:g} * {high:.4g} + {slack:g}")
    return Result(
        claimed_epsilon=epsilon,
        claimed_delta=delta,
        confidence=confidence,
        draws=(n_a, n_b),
        bounds=bounds,
        certified_epsilon=best,
        certified_epsilon_at=best_at,
        certified_delta=certified_delta,
        estimated_epsilon=estimate,
        only_under_a=only[0],
        only_under_b=only[1],
        violations=violations,
    )


def _event_labels(
    outputs_a: Sequence[Any], outputs_b: Sequence[Any], part: Partition, delta_event: Callable[[Any], bool] | None
) -> set[Hashable]:
    """The buckets inside E; raises if a bucket holds outputs on both sides of E."""
    if delta_event is None:
        return set()
    sides: dict[Hashable, set[bool]] = {}
    for o in (*outputs_a, *outputs_b):
        sides.setdefault(part.key(o), set()).add(bool(delta_event(o)))
    mixed = [label for label, s in sides.items() if len(s) > 1]
    if mixed:
        raise ValueError(f"partition {part.name}: bucket {mixed[0]!r} straddles the delta event")
    return {label for label, s in sides.items() if True in s}


def goodness_of_fit(draws: Sequence[int], bins: Sequence[float], lo: int) -> float:
    """Pearson chi-square p-value of integer draws against exact bin probabilities: ``bins[0]``
    = P(k < lo), then one bin per integer lo, lo + 1, ..., and the last bin P(k > lo + len - 3).
    Bins of probability 0 are left out (0.0 if a draw falls in one)."""
    hi = lo + len(bins) - 3
    if abs(sum(bins) - 1) > 1e-12:
        raise ValueError(f"bin probabilities add up to {sum(bins)!r}, not 1")
    counts = Counter(min(max(k, lo - 1), hi + 1) for k in draws)
    observed = [counts[k] for k in range(lo - 1, hi + 2)]
    if any(o and not p for o, p in zip(observed, bins)):
        return 0.0  # a draw where the pmf is 0
    kept = [(o, p * len(draws)) for o, p in zip(observed, bins) if p > 0]
    return float(chisquare([o for o, _ in kept], [e for _, e in kept]).pvalue)
