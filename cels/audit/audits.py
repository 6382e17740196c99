"""The privacy audits of docs/security.md, "Empirical privacy audit": each randomised step of the
mechanism run many times on neighbouring inputs and handed to :func:`cels.audit.tester.stochastic_test`.

- :func:`audit_sampling`: the multinomial sampling given x (CELS Theorem 2, (eps, delta)-probabilistic
  DP with the delta event "the output holds a record of user j").
- :func:`audit_noise`: x + the sum of r Polya shares against x + d + the same noise (eps'-DP for L1
  sensitivity d), with the exact pmf and loss of :mod:`cels.audit.exact`.
- :func:`audit_repair`: noise + repair (``add_noise_and_repair``, or the private mode's noise pass
  through :mod:`cels.mechanism.greedy`) on neighbouring logs whose noise-free optimum moves by
  d: the repair's caps come from the data, so outputs possible under D are impossible under D'.

Seeds are for tests only: a seeded draw is reproducible and therefore not private.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from cels.audit.exact import discrete_laplace_bins, max_laplace_loss, share_sum_is_geometric
from cels.audit.tester import DEFAULT_CONFIDENCE, Partition, Result, goodness_of_fit, stochastic_test
from cels.logs.model import SearchLog
from cels.mechanism.conditions import Conditions, build_conditions, privacy_bound
from cels.mechanism.greedy import ProposalRule, central_run
from cels.crypto.streams import CipherRandom
from cels.mechanism.noise import laplace_share, noise_scale
from cels.mechanism.noisy_counts import add_noise_and_repair
from cels.mechanism.sampling import make_rng, multinomial_sample
from cels.mechanism.solvers import solve

NOISE_PARTIES = 3
"""r in the distributed-noise audit (Polya shares summed, cels.mechanism.noise.laplace_share)."""


@dataclass
class Audit:
    """One audit: the tests it ran (claim name -> Result) and the facts it computed."""

    name: str
    results: dict[str, Result]
    facts: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"audit": self.name, **self.facts, **{k: r.summary() for k, r in self.results.items()}}


def toy_log(users: dict[str, dict[str, int]], pairs: Sequence[str]) -> SearchLog:
    """A small log from {user: {pair: c_ij}} (pair names double as query and url)."""
    rows = [[held.get(p, 0) for p in pairs] for held in users.values()]
    return SearchLog(list(users), [(p, p) for p in pairs], sp.csr_matrix(np.array(rows, dtype=np.int64)))


# ----------------------------------------------------------------------------- sampling
SAMPLING_PAIRS = ("P1", "P2", "P3")
SAMPLING_USERS = {
    "j": {"P1": 1, "P2": 1},
    "k": {"P1": 1, "P3": 1},
    "l": {"P1": 1, "P2": 1},
    "m": {"P2": 1, "P3": 1},
    "n": {"P2": 1, "P3": 1},
}
"""Every pair has >= 3 holders, so removing any one user keeps every pair samplable."""
SAMPLING_EPSILON, SAMPLING_DELTA = 2.0, 0.6
"""b = min(eps/2, ln 1/(1 - delta)) = 0.916 (CELS eq. 6)."""
SAMPLING_X = np.array([1, 1, 1], dtype=np.int64)
"""Feasible for every user at b: the largest load sum_i x_i ln t_ij is ln 1.5 + ln 1.5 = 0.811."""
SAMPLING_X_VIOLATING = np.array([4, 3, 0], dtype=np.int64)
"""User j's load 4 ln 1.5 + 3 ln(4/3) = 2.49 > b: P[j sampled] = 0.92 > delta, loss 2.49 > eps."""


def user_load(log: SearchLog, x: np.ndarray, user: str) -> float:
    """sum_i x_i ln t_ij for one user (CELS eq. 5), t_ij = c_i / (c_i - c_ij)."""
    j = log.users.index(user)
    totals = log.pair_totals().astype(np.float64)
    held = log.counts[j].toarray().ravel()
    return float(sum(x[i] * -math.log1p(-held[i] / totals[i]) for i in np.flatnonzero(held * x)))


def _records(users: Sequence[str], sampled: sp.csr_matrix) -> tuple:
    """A sampled matrix as its records (user id, pair index, count), sorted: the labelled output."""
    coo = sampled.tocoo()
    return tuple(sorted((users[u], int(i), int(c)) for u, i, c in zip(coo.row, coo.col, coo.data)))


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write total as an ordered sum of ``parts`` non-negative integers."""
    return [
        tuple(b - a - 1 for a, b in zip((-1, *cut), (*cut, total + parts - 1)))
        for cut in itertools.combinations(range(total + parts - 1), parts - 1)
    ]


def sampling_outputs(log: SearchLog, x: np.ndarray) -> list[tuple]:
    """Every labelled output the multinomial sampling of ``log`` can give for counts x."""
    csc = log.counts.tocsc()
    per_pair = []
    for i in np.flatnonzero(x):
        holders = [log.users[u] for u in csc.indices[csc.indptr[i] : csc.indptr[i + 1]]]
        per_pair.append(
            [[(u, int(i), c) for u, c in zip(holders, split) if c] for split in _compositions(int(x[i]), len(holders))]
        )
    return [tuple(sorted(itertools.chain.from_iterable(parts))) for parts in itertools.product(*per_pair)]


def sampling_log() -> SearchLog:
    """The constructed log of the sampling audit (:data:`SAMPLING_USERS`)."""
    return toy_log(SAMPLING_USERS, SAMPLING_PAIRS)


def without_user(data: SearchLog, user: str) -> SearchLog:
    """The neighbour D' = D minus one user's whole log (same pairs)."""
    return data.select_users(np.array([j for j, u in enumerate(data.users) if u != user]))


def audit_sampling(
    data: SearchLog,
    x: np.ndarray,
    removed: str,
    *,
    draws: int,
    seed: int | None = None,
    epsilon: float = SAMPLING_EPSILON,
    delta: float = SAMPLING_DELTA,
    confidence: float = DEFAULT_CONFIDENCE,
    every_output: bool = True,
) -> Audit:
    """Multinomial sampling of D and of D' = D minus ``removed`` with the same x (over all pairs),
    tested against (eps, delta)-probabilistic DP: E = outputs holding a record of ``removed``.
    Buckets: the two halves E / not E, and (``every_output``, small logs) every labelled output."""
    logs = (data, without_user(data, removed))
    rng = make_rng(seed)
    outputs = [
        [_records(log.users, multinomial_sample(csc, x, rng)) for _ in range(draws)]
        for log, csc in ((log, log.counts.tocsc()) for log in logs)
    ]

    def holds_user(o: tuple) -> bool:
        return any(u == removed for u, _, _ in o)

    partitions = [Partition("holds_user", (False, True), holds_user)]
    if every_output:
        partitions.append(Partition("output", sampling_outputs(data, x), lambda o: o))
    result = stochastic_test(*outputs, partitions, epsilon, delta, delta_event=holds_user, confidence=confidence)
    load = user_load(data, x, removed)
    facts = {
        "users": data.n_users,
        "output_size": int(np.sum(x)),
        "removed_user": removed,
        "b": privacy_bound(epsilon, delta),
        "user_load": load,
        "exact_disclosure_probability": 1 - math.exp(-load),
    }
    return Audit("sampling", {"probabilistic_dp": result}, facts)


def optimum_counts(log: SearchLog, b: float) -> np.ndarray:
    """The greedy max-output optimum x over all pairs of ``log`` (0 off the variables)."""
    cond, var_pairs = build_conditions(log, b)
    x = np.zeros(log.n_pairs, dtype=np.int64)
    x[var_pairs] = solve(cond, "max-output", integer="greedy").x
    return x


# ----------------------------------------------------------------------------- noise
def distributed_noise(scale: Fraction, parties: int, rng: random.Random) -> int:
    """One noise value as the private mode makes it: the sum of ``parties`` Polya shares."""
    return sum(laplace_share(scale, parties, rng) for _ in range(parties))


def laplace_fit(noise: Sequence[int], scale: Fraction) -> float:
    """Chi-square p-value of noise draws against the exact discrete Laplace of ``scale``: one bin
    per integer within 4 scales of 0, two tail bins (:func:`cels.audit.exact.discrete_laplace_bins`)."""
    width = max(1, math.ceil(4 * scale))
    bins = [float(p.evalf(30)) for p in discrete_laplace_bins(scale, -width, width)]
    return goodness_of_fit(noise, bins, -width)


def audit_noise(
    x: int = 10,
    d: int = 1,
    noise_epsilon: float = 1.0,
    *,
    draws: int,
    seed: int | None = None,
    parties: int = NOISE_PARTIES,
    scale: Fraction | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Audit:
    """x + noise against x + d + noise (one pair, L1 sensitivity d), tested against pure
    eps'-DP.  The noise is the sum of ``parties`` Polya shares of scale d / eps' (``scale``
    overrides it: the control).  Facts: the exact worst loss d / scale and the chi-square
    p-value of the noise against the exact discrete Laplace."""
    scale = noise_scale(noise_epsilon, d) if scale is None else Fraction(scale)
    rng = CipherRandom(seed)
    noise = [[distributed_noise(scale, parties, rng) for _ in range(draws)] for _ in range(2)]
    width = math.ceil(6 * scale)
    lo, hi = x - width, x + d + width
    partition = Partition("count", range(lo - 1, hi + 2), lambda o: min(max(o, lo - 1), hi + 1))
    result = stochastic_test([x + z for z in noise[0]], [x + d + z for z in noise[1]], [partition], noise_epsilon, 0.0, confidence=confidence)
    facts = {
        "x": x,
        "d": d,
        "parties": parties,
        "scale": str(scale),
        "exact_max_loss": str(max_laplace_loss(d, scale)),
        "shares_sum_to_geometric": share_sum_is_geometric(Fraction(1, parties), parties),
        "chi_square_p": float(f"{laplace_fit(noise[0] + noise[1], scale):.4g}"),
    }
    return Audit("noise", {"pure_dp": result}, facts)


# ----------------------------------------------------------------------------- repair
REPAIR_EPSILON, REPAIR_DELTA = 2.0, 0.6
"""b = 0.916 >= ln 2: a pair held once by each of two users can take one record."""
REPAIR_PAIRS = ("A", "B", "C")
REPAIR_BASE = {"k": {"A": 1}, "l": {"B": 1}, "m": {"B": 1}, "n": {"B": 1}, "o": {"C": 1}, "p": {"C": 1}}
"""D': pair A is unique to k (suppressed), B has 3 holders (x_B <= 2: 3 ln 1.5 > b), C has 2 (x_C <= 1)."""
REPAIR_CASES = {
    "unique": {"j": {"A": 1}},
    "capacity": {"j": {"B": 1}},
}
"""D = D' plus user j.  unique: j shares A with k, so A is a variable of D only (x_A <= 1) and
never released from D'.  capacity: j is B's fourth holder, ln t = ln(4/3), so x_B <= 3 in D
against 2 in D'.  Either way the noise-free optimum moves by 1 in L1."""


@dataclass
class CountRelease:
    """One log's noisy count release: its conditions, the noise-free optimum x (over all pairs)
    and ``draw(noise_epsilon, d, rng)``, one draw of the released counts (over all pairs)."""

    cond: Conditions
    var_pairs: np.ndarray
    optimum: np.ndarray
    draw: Callable[[float, float, random.Random], np.ndarray]


def count_release(log: SearchLog, b: float, path: str, parties: int = NOISE_PARTIES) -> CountRelease:
    """The released counts of ``path``: ``sanitize`` = add_noise_and_repair on the greedy
    max-output optimum (cels sanitize --integer greedy); ``private`` = the private mode's first
    pass and noise pass (cels.mechanism.greedy, ``parties`` Polya shares per pair)."""
    cond, var_pairs = build_conditions(log, b)

    def spread(x_var: np.ndarray) -> np.ndarray:
        out = np.zeros(log.n_pairs, dtype=np.int64)
        out[var_pairs] = x_var
        return out

    if path == "sanitize":
        x = solve(cond, "max-output", integer="greedy").x

        def repaired(noise_epsilon: float, d: float, rng: random.Random) -> np.ndarray:
            return spread(add_noise_and_repair(cond, x, noise_epsilon, d, rng)[0])

        return CountRelease(cond, var_pairs, spread(x), repaired)
    if path == "private":
        rule = ProposalRule("max-output", cond.c)
        first, _ = central_run(rule, [cond.G], b)

        def noise_pass(noise_epsilon: float, d: float, rng: random.Random) -> np.ndarray:
            scale = noise_scale(noise_epsilon, d)
            z = np.array([distributed_noise(scale, parties, rng) for _ in range(cond.n)], dtype=np.int64)
            return spread(central_run(rule, [cond.G], b, rule.noise_pass(first, z))[0])

        return CountRelease(cond, var_pairs, spread(first), noise_pass)
    raise ValueError(f"path must be 'sanitize' or 'private', got {path!r}")


def audit_repair(
    data: SearchLog,
    removed: str,
    *,
    path: str,
    draws: int,
    seed: int | None = None,
    epsilon: float = REPAIR_EPSILON,
    delta: float = REPAIR_DELTA,
    noise_epsilon: float = 1.0,
    sensitivity: int | None = None,
    watch: Sequence[int] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Audit:
    """The whole release (noisy repaired counts, then the multinomial sampling) of D and of
    D' = D minus ``removed`` (same pairs), tested against the end-to-end claim -- (eps + eps',
    delta)-probabilistic DP, E = outputs holding a record of ``removed`` -- and the counts alone
    against the count step's eps'-DP claim.  The noise sensitivity d is the measured L1 move of the
    noise-free optimum (at least 1), so the noise alone would be eps'-DP, unless ``sensitivity``
    sets it.  Buckets: the counts of the ``watch`` pairs (default every pair) and each watched
    pair's count, each split by E."""
    b = privacy_bound(epsilon, delta)
    rng = CipherRandom(seed)
    sample_rng = make_rng(seed)
    without = without_user(data, removed)
    releases = [count_release(log, b, path) for log in (data, without)]
    move = int(np.abs(releases[0].optimum - releases[1].optimum).sum())
    d = max(1, move) if sensitivity is None else sensitivity
    watch = np.arange(data.n_pairs) if watch is None else np.asarray(watch)
    caps = np.zeros(data.n_pairs, dtype=np.int64)
    for rel in releases:
        caps[rel.var_pairs] = np.maximum(caps[rel.var_pairs], np.floor(rel.cond.upper_bounds()).astype(np.int64))
    ranges = [range(int(caps[i]) + 1) for i in watch]

    def release(log: SearchLog, counts: sp.csc_matrix, rel: CountRelease) -> tuple[tuple[int, ...], bool]:
        x = rel.draw(noise_epsilon, d, rng)
        holds = any(u == removed for u, _, _ in _records(log.users, multinomial_sample(counts, x, sample_rng)))
        return tuple(int(v) for v in x[watch]), holds

    outputs = [
        [release(log, counts, rel) for _ in range(draws)]
        for log, counts, rel in ((log, log.counts.tocsc(), rel) for log, rel in zip((data, without), releases))
    ]
    sides = (False, True)
    split = [Partition("counts", list(itertools.product(sides, itertools.product(*ranges))), lambda o: (o[1], o[0]))]
    split += [
        Partition(f"count[{data.pairs[i][0]}]", list(itertools.product(sides, ranges[w])), lambda o, w=w: (o[1], o[0][w]))
        for w, i in enumerate(watch)
    ]
    counts_only = [
        Partition("counts", list(itertools.product(*ranges)), lambda o: o[0]),
        *(Partition(f"count[{data.pairs[i][0]}]", ranges[w], lambda o, w=w: o[0][w]) for w, i in enumerate(watch)),
    ]
    results = {
        "end_to_end": stochastic_test(
            *outputs, split, epsilon + noise_epsilon, delta, delta_event=lambda o: o[1], confidence=confidence
        ),
        "count_step": stochastic_test(*outputs, counts_only, noise_epsilon, 0.0, confidence=confidence),
    }
    facts = {
        "path": path,
        "removed_user": removed,
        "b": b,
        "optimum_move_l1": move,
        "d": d,
        "watched_pairs": [data.pairs[i][0] for i in watch],
        "released_variables": [int(r.cond.n) for r in releases],
    }
    return Audit(f"repair/{path}", results, facts)


def repair_case(name: str) -> SearchLog:
    """D of :data:`REPAIR_CASES`: the base log plus user j (D' = :func:`without_user` (D, "j"))."""
    return toy_log({**REPAIR_CASES[name], **REPAIR_BASE}, REPAIR_PAIRS)


def unique_in_neighbour(data: SearchLog, b: float, candidates: int = 10) -> tuple[str, int]:
    """(user j, pair i) on a real log: i is released by the greedy max-output optimum of D and
    held by exactly two users, j one of them, so i is unique (never released) in D minus j.
    Among the first ``candidates`` such pairs, the one whose removal moves the optimum least."""
    x = optimum_counts(data, b)
    csc = data.counts.tocsc()
    holders = np.diff(csc.indptr)
    found = [int(i) for i in np.flatnonzero((x > 0) & (holders == 2))][:candidates]
    if not found:
        raise ValueError("no released pair has exactly two holders")
    moves = []
    for i in found:
        user = data.users[int(csc.indices[csc.indptr[i]])]
        moves.append((int(np.abs(x - optimum_counts(without_user(data, user), b)).sum()), user, i))
    _, user, i = min(moves)
    return user, i
