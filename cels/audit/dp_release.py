"""Empirical privacy audit of the distributed DP histogram (``--release dp``; docs/releases.md,
docs/security.md "The DP histogram: the argument"), on the outputs cels.audit.dp_simulation draws.

Two observers (:func:`views`): a RECIPIENT sees the release; a PARTY OBSERVER, a party other
than the one holding the differing user pooling t parties (itself included), also sees its
pooled noise shares of every watched pair (conservative: it can link a column to a pair only
for pairs it holds), the padded set size of the differing user's party and the index size
(less its own dummies).  Neighbouring inputs differ by one user at one party (the unit of
privacy, docs/releases.md).  The claims (:meth:`DpSetup.claims`): the recipient's (eps, delta),
the party observer's ``release_accounting(...)["party"]`` (the counts and selection, that party's
padded size and the index's, basic composition).

``step_report``: the solver's StepReport, which the initiator (a party) receives, carries the
solver's COUNTS-phase bytes, the size of its DpSelection messages (:attr:`SimulatedRelease.selections`).
Each party is sent every kept column, so that size is r times the number of kept columns, a
function of the release; it was once each party's own kept columns, which a user who brings a
released pair to a party that did not hold it moved by one (the "newcomer" case), and the audit
certified that leak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln

from cels.audit.audits import Audit
from cels.audit.tester import DEFAULT_CONFIDENCE, Partition, Result, stochastic_test
from cels.mechanism.dp_histogram import delta_prime, noise_tail

from cels.audit.dp_simulation import DpSetup, Holdings, Pair, SimulatedRelease, as_pair, pairs_of, simulate


class View(NamedTuple):
    """One draw as an observer sees it, on the watched pairs: ``release`` n + Z or None (not
    released) per watched pair; a party observer also ``own`` (its pooled noise shares per
    watched pair), ``padded`` (the padded set size of the differing user's party) and ``index``
    (the index size less its own dummies); ``selected``, if asked for, the solver's DpSelection
    entries (:attr:`SimulatedRelease.selections`), which the initiator reads off the solver's
    StepReport bytes."""

    release: tuple[int | None, ...]
    own: tuple[int, ...] | None = None
    padded: int | None = None
    index: int | None = None
    selected: int | None = None


def views(
    sim: SimulatedRelease, watch: Sequence[Pair], observers: Sequence[str] = (), party: str | None = None, *, step_report: bool = False
) -> list[View]:
    """Every draw's view: the recipient's (no ``observers``), or the party observer's pooling
    ``observers`` (``party``: whose padded set size it watches; ``step_report``: also the
    solver's selection size)."""
    cols = [sim.pairs.index(as_pair(p)) for p in watch]
    noisy = sim.noisy[:, cols].tolist()
    kept = sim.kept[:, cols].tolist()
    release = [tuple(v if k else None for v, k in zip(vs, ks)) for vs, ks in zip(noisy, kept)]
    if not observers:
        return [View(r) for r in release]
    index = [sim.setup.parties.index(o) for o in observers]
    own = sim.shares[index][:, :, cols].sum(axis=0).tolist()
    padded = sim.padded[sim.setup.parties.index(party)].tolist()
    size = (sim.index_size - sim.padding[index].sum(axis=0)).tolist()
    selected = sim.selections.tolist() if step_report else [None] * sim.draws
    return [View(r, tuple(o), p, s, c) for r, o, p, s, c in zip(release, own, padded, size, selected)]


def clamp(value: int, lo: int, hi: int) -> int:
    return lo if value < lo else hi if value > hi else value


def bins(lo: int, hi: int, width: int, edge: int = 2) -> tuple[list[int], Callable[[int], int]]:
    """Buckets over the integers, fixed before the draws: ``edge`` singletons at each end of
    [lo, hi] (where the padding's outputs only one neighbour gives lie), bins of ``width`` in
    between, and everything below / above in the end buckets.  Returns (labels, key)."""
    starts = sorted({*range(lo, lo + edge), *range(lo + edge, hi - edge + 1, width), *range(hi - edge + 1, hi + 1)})

    def key(value: int) -> int:
        v = clamp(value, lo, hi)
        return starts[int(np.searchsorted(starts, v, side="right")) - 1]

    return starts, key


def partitions(
    setup: DpSetup,
    watch: Sequence[Pair],
    centre: Sequence[int],
    *,
    party_view: bool = False,
    padded: tuple[int, int] = (0, 0),
    index: tuple[int, int] = (0, 0),
    selected: int | None = None,
) -> list[Partition]:
    """The buckets of an audit, fixed before the draws from the setup and the watched pairs'
    counts ``centre`` in the neighbour without the user (it adds at most 1 to each):

    - per watched pair, whether it was released (the selection: a lone pair's release is the
      delta event), and its released n + Z (recipient), or (party observer) ("kept", n + Z less
      its own shares) / ("dropped", its own shares), within a window of about 4 noise scales;
    - with several watched pairs, how many were released above their centre and the sum of their
      offsets (released n + Z less the centre, less its own shares for a party observer);
    - party observer: the differing user's party's padded size and the index size (less its own
      dummies), in bins between ``padded`` / ``index`` = (lowest, highest) of both neighbours;
      with ``selected`` (the most DpSelection entries a pair can make: r x pairs), the solver's
      selection size, each value 0..selected + 9 its own bucket."""
    tau = setup.tau
    w = math.ceil(4 * float(setup.scale) * math.sqrt(float(setup.beta))) + 1
    out: list[Partition] = []
    for i, (p, c) in enumerate(zip(watch, centre)):
        out.append(Partition(f"kept[{as_pair(p)[0]}]", (False, True), lambda o, i=i: o.release[i] is not None))
        name = f"count[{as_pair(p)[0]}]"
        if not party_view:
            lo, hi = max(tau, c - w), max(tau, c + 1 + w)
            out.append(
                Partition(name, [None, *range(lo, hi + 1)], lambda o, i=i, lo=lo, hi=hi: None if o.release[i] is None else clamp(o.release[i], lo, hi))
            )
        else:
            lo, hi = c - w, max(c + 1 + w, tau + w)
            labels = [*(("kept", x) for x in range(lo, hi + 1)), *(("dropped", s) for s in range(-w, w + 1))]

            def key(o: View, i: int = i, lo: int = lo, hi: int = hi, w: int = w) -> tuple[str, int]:
                if o.release[i] is None:
                    return ("dropped", clamp(o.own[i], -w, w))
                return ("kept", clamp(o.release[i] - o.own[i], lo, hi))

            out.append(Partition(name, labels, key))
    if len(watch) > 1:
        m, spread = len(watch), 2 * w

        def offsets(o: View) -> list[int] | None:
            if any(v is None for v in o.release):
                return None
            own = o.own if party_view else (0,) * m
            return [v - s - c for v, s, c in zip(o.release, own, centre)]

        def above(o: View) -> int:
            off = offsets(o)
            return -1 if off is None else sum(x >= 1 for x in off)

        def total(o: View) -> int | str:
            off = offsets(o)
            return "dropped" if off is None else clamp(sum(off), -spread, m + spread)

        out.append(Partition("above", list(range(-1, m + 1)), above))
        out.append(Partition("sum", ["dropped", *range(-spread, m + spread + 1)], total))
    if party_view:
        width = max(1, math.ceil(2 * setup.padding_mu / 12))
        labels, key = bins(*padded, width)
        out.append(Partition("padded", labels, lambda o, key=key: key(o.padded)))
        labels, key = bins(*index, 2 * width)
        out.append(Partition("index", labels, lambda o, key=key: key(o.index)))
    if selected is not None:
        top = selected + 9
        out.append(Partition("selected", list(range(top + 1)), lambda o, top=top: min(o.selected, top)))
    return out


# ----------------------------------------------------------------------------- exact facts
def _nb_pmf(beta: float, alpha: float, terms: int) -> np.ndarray:
    k = np.arange(terms)
    return np.exp(gammaln(k + beta) - gammaln(beta) - gammaln(k + 1) + beta * np.log1p(-alpha) + k * np.log(alpha))


def noise_loss(epsilon: float, max_items: int, beta: Fraction | float) -> float:
    """The worst privacy loss max_k ln P(k - 1)/P(k) of X - Y, X, Y iid NB(beta, alpha), alpha =
    exp(-eps/Delta_0), for a count moved by 1 (float64, series cut at relative 1e-30): exactly
    eps/Delta_0 at beta = 1 (the discrete Laplace), above it for beta < 1 (fewer shares than a
    full discrete Laplace), at most it for beta > 1."""
    alpha = math.exp(-epsilon / max_items)
    terms = int(math.ceil(70 / -math.log(alpha))) + 50
    p = _nb_pmf(float(beta), alpha, terms)
    z = np.convolve(p, p[::-1])[terms - 1 :]  # P(Z = k), k >= 0 (symmetric)
    span = max(2, terms // 3)
    return float(np.max(np.log(z[: span - 1] / z[1:span])))


# ----------------------------------------------------------------------------- the cases
DP_AUDIT_PARTIES = ("P1", "P2", "P3")
DP_AUDIT_EPSILON, DP_AUDIT_DELTA, DP_AUDIT_MAX_ITEMS = 1.0, 0.01, 1
"""delta = 0.01 keeps the selection testable with 10^4 draws: tau = 6 at beta = 1.5, a lone pair's
release chance Pr[Z >= 5] = 0.00966 <= delta' = 0.01, and at tau - 1 it is 0.0241."""
DP_AUDIT_COLLUSION = 1
DP_AUDIT_PADDING_EPSILON = 0.05
"""The party observer's claim is then eps + 2 * 0.05 = 1.1 (release_accounting's composition), below
control (b)'s true count loss 1.39 (NB(2/3) - NB(2/3), two of three shares sized for h = 3)."""
DIFFERING_PARTY, DIFFERING_USER = "P1", "j"
CROWD = tuple(f"S{i}" for i in range(1, 6))
"""Pairs held by tau + 10 users spread over every party (released with overwhelming chance)."""
NEWCOMER, EDGE, LONE = "F", "E", "U"
"""F: tau + 10 holders at P2 and P3 only (the differing user is P1's first); E: tau - 1 holders
(the user brings it to tau); U: no holder but the differing user."""
DP_AUDIT_CASES: dict[str, tuple[str, ...]] = {
    "unique": (LONE,),
    "shared": (CROWD[0],),
    "edge": (EDGE,),
    "newcomer": (NEWCOMER,),
    "many": CROWD,
}
"""The differing user's pairs per case: unique tests the selection (delta); shared, the count
(eps); edge, the count at the threshold; newcomer, the count and the party's padded size; many,
the contribution bound (5 pairs, Delta_0 = 1)."""


def dp_audit_setup(**changes) -> DpSetup:
    """The audits' configuration: r = 3, t = 1, eps = 1, delta = 0.01, Delta_0 = 1, padding eps 0.05."""
    base = DpSetup(DP_AUDIT_EPSILON, DP_AUDIT_DELTA, DP_AUDIT_MAX_ITEMS, DP_AUDIT_PARTIES, DP_AUDIT_COLLUSION, DP_AUDIT_PADDING_EPSILON)
    return base.replace(**changes)


def dp_audit_holdings(tau: int, parties: Sequence[str] = DP_AUDIT_PARTIES) -> dict[str, dict[str, set[Pair]]]:
    """The base input D' (one pair per user, so no bound binds): every crowd pair held by tau +
    10 users round-robin over the parties, the newcomer by tau + 10 users of every party but the
    first, the edge pair by tau - 1 users round-robin."""
    out: dict[str, dict[str, set[Pair]]] = {p: {} for p in parties}

    def spread(pair: str, holders: int, over: Sequence[str]) -> None:
        for i in range(holders):
            party = over[i % len(over)]
            out[party][f"{pair}-{party}-{i}"] = {as_pair(pair)}

    for pair in CROWD:
        spread(pair, tau + 10, parties)
    spread(NEWCOMER, tau + 10, parties[1:])
    spread(EDGE, max(0, tau - 1), parties)
    return out


@dataclass(frozen=True)
class DpCase:
    """Neighbouring inputs: ``with_user`` = ``without_user`` plus ``user`` at ``party``, who holds ``watch``."""

    name: str
    with_user: dict
    without_user: dict
    party: str
    user: str
    watch: tuple[Pair, ...]


def dp_case(name: str, setup: DpSetup, pairs: Sequence[str] | None = None) -> DpCase:
    """A case of :data:`DP_AUDIT_CASES` (or the user's ``pairs``) on :func:`dp_audit_holdings` at
    the claimed threshold (``setup.threshold_shift`` ignored)."""
    held = tuple(pairs) if pairs is not None else DP_AUDIT_CASES[name]
    tau = setup.replace(threshold_shift=0).tau
    without = dp_audit_holdings(tau, setup.parties)
    party = setup.parties[0]
    with_user = {p: dict(users) for p, users in without.items()}
    with_user[party][DIFFERING_USER] = {as_pair(p) for p in held}
    return DpCase(name, with_user, without, party, DIFFERING_USER, tuple(as_pair(p) for p in held))


def holders(holdings: Holdings, pair: Pair) -> int:
    """Users holding ``pair`` over every party (before any bound)."""
    return sum(1 for users in holdings.values() for held in users.values() if pair in {as_pair(p) for p in held})


# ----------------------------------------------------------------------------- the audit
def audit_dp_release(
    case: DpCase,
    setup: DpSetup,
    *,
    draws: int,
    seed: int,
    observers: Sequence[str] | None = None,
    step_report: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Audit:
    """The distributed release of ``case.with_user`` (A) and ``case.without_user`` (B), ``draws``
    each, tested per observer against its claim (:meth:`DpSetup.claims`; approximate DP, both
    orders): ``recipient`` always, ``party`` when t >= 1 (``observers``: the t pooled parties,
    default the first t parties other than the differing user's).  ``step_report``: also
    ``party_with_step_report``, the party observer that is the initiator and reads the solver's
    selection size off its StepReport (the party claim again)."""
    pairs = pairs_of(case.with_user, case.without_user)
    sims = [simulate(h, setup, draws=draws, seed=seed, label=side, pairs=pairs) for h, side in ((case.with_user, "A/"), (case.without_user, "B/"))]
    centre = [holders(case.without_user, p) for p in case.watch]
    claims = setup.claims()
    results: dict[str, Result] = {}
    outputs = [views(s, case.watch) for s in sims]
    results["recipient"] = stochastic_test(*outputs, partitions(setup, case.watch, centre), *claims["recipient"], confidence=confidence)
    pooled: list[str] = []
    if "party" in claims:
        pooled = list(observers) if observers is not None else [p for p in setup.parties if p != case.party][: setup.collusion]
        if case.party in pooled or len(pooled) != setup.collusion:
            raise ValueError(f"observers {pooled} must be t = {setup.collusion} parties other than {case.party}")
        outputs = [views(s, case.watch, pooled, case.party) for s in sims]
        k = setup.parties.index(case.party)
        # the bins' ends: |S_k| and |U| as simulated (before any padding: set by the inputs here) plus [0, 2 mu]
        # per padding the observer does not know
        mu2 = 2 * setup.padding_mu
        sizes = [(int(s.set_sizes[k].min()), int(s.set_sizes[k].max())) for s in sims]
        unions = [(int((s.counts.sum(axis=0) > 0).sum(axis=1).min()), int((s.counts.sum(axis=0) > 0).sum(axis=1).max())) for s in sims]
        padded = (min(a for a, _ in sizes), max(b for _, b in sizes) + mu2)
        unknown = setup.r + 1 - len(pooled)  # the paddings the observer does not know: the other parties' and the solver's
        index = (min(a for a, _ in unions), max(b for _, b in unions) + unknown * mu2)
        parts = partitions(setup, case.watch, centre, party_view=True, padded=padded, index=index)
        results["party"] = stochastic_test(*outputs, parts, *claims["party"], confidence=confidence)
        if step_report:
            outputs = [views(s, case.watch, pooled, case.party, step_report=True) for s in sims]
            parts = partitions(setup, case.watch, centre, party_view=True, padded=padded, index=index, selected=setup.r * len(pairs))
            results["party_with_step_report"] = stochastic_test(*outputs, parts, *claims["party"], confidence=confidence)
    a = math.exp(-setup.epsilon / setup.max_items)
    facts = {
        "case": case.name,
        "user_pairs": [p[0] for p in case.watch],
        "parties": setup.r,
        "collusion": setup.collusion,
        "shares_h": setup.h,
        "beta": str(setup.beta),
        "bound": setup.bound,
        "max_items": setup.max_items,
        "threshold": setup.tau,
        "threshold_claimed": setup.replace(threshold_shift=0, shares=None).tau,
        "centre_counts": centre,
        "claims": {k: [float(e), float(d)] for k, (e, d) in claims.items()},
        "delta_prime": delta_prime(setup.delta, setup.max_items),
        "lone_release_probability": float(noise_tail(setup.tau - 1, a, setup.beta)),
        "recipient_noise_loss": noise_loss(setup.epsilon, setup.max_items, setup.beta),
        "padding_shift": setup.padding_mu,
    }
    if pooled:
        facts["observers"] = pooled
        facts["party_noise_loss"] = noise_loss(setup.epsilon, setup.max_items, Fraction(setup.r - len(pooled), setup.h))
    facts["estimated_epsilon"] = {k: round(max(r.estimated_epsilon.values(), default=0.0), 4) for k, r in results.items()}
    facts["certified_epsilon"] = {k: round(r.certified_epsilon, 4) for k, r in results.items()}
    return Audit(f"dp_release/{case.name}", results, facts)


# ----------------------------------------------------------------------------- faithfulness
