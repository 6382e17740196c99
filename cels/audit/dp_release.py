"""Empirical privacy audit of the distributed DP histogram (``--release dp``; docs/releases.md,
docs/security.md "Empirical privacy audit" and the DP histogram row of its learns table).

A full protocol run per draw is far too slow for the thousands of draws the stochastic tester
needs, so :func:`simulate` draws the release's outputs the way the protocol makes them, on a
toy input held by r parties (party -> user -> set of pairs), vectorised over the draws:

1. each party bounds its users (:func:`cels.mechanism.dp_release.bounded_counts`: at most
   Delta_0 distinct pairs per user, entries 1), with a fresh uniform choice per draw;
2. n^k per pair = the party's distinct users of the pair; n = sum_k n^k;
3. each party adds one noise share per pair, :func:`cels.mechanism.dp_histogram.noise_shares`
   sized for h = r - t (X - Y, X, Y ~ NB(1/h, alpha)), so n + Z = sum_k (n^k + share_k), what
   the solver opens (:func:`combine`);
4. a pair is kept iff some user kept it (it has a column) and n + Z >= tau, tau =
   :func:`cels.mechanism.dp_histogram.threshold` at beta = r/h; the release is {pair: n + Z};
5. each party pads its id set with D_k dummies and the solver the index with D_s
   (:func:`cels.mechanism.dp_histogram.padding_count`, drawn here by :func:`padding_draws`): a
   party's padded set size |S_k| + D_k and the index size |U| + sum_k D_k + D_s.

Two observers (:func:`views`): a RECIPIENT sees the release; a PARTY OBSERVER, a party other
than the one holding the differing user pooling t parties (itself included), also sees its
pooled noise shares of every watched pair (conservative: it can link a column to a pair only
for pairs it holds), the padded set size of the differing user's party and the index size
(less its own dummies).  Neighbouring inputs differ by one user at one party (the unit of
privacy, docs/releases.md).  The claims (:meth:`DpSetup.claims`): the recipient's (eps, delta),
the party observer's ``release_accounting(...)["party"]`` (the counts and selection, that party's
padded size and the index's, basic composition).

The simulation is checked against a seeded protocol session (:func:`replay_session`,
tests/test_dp_audit.py): the solver's n + Z is :func:`combine` of the parties' bounded counts
and replayed noise shares, exactly, and the release is its kept columns.

``step_report``: the solver's StepReport, which the initiator (a party) receives, carries the
solver's COUNTS-phase bytes, the size of its DpSelection messages (:attr:`SimulatedRelease.selections`).
Each party is sent every kept column, so that size is r times the number of kept columns, a
function of the release; it was once each party's own kept columns, which a user who brings a
released pair to a party that did not hold it moved by one (the "newcomer" case), and the audit
certified that leak.

Seeds are for tests only: a seeded draw is reproducible and therefore not private.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from cels.audit.audits import Audit
from cels.audit.tester import DEFAULT_CONFIDENCE, Partition, Result, stochastic_test
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.logs.model import SearchLog
from cels.mechanism.dp_histogram import (
    count_scale,
    delta_prime,
    noise_shares,
    noise_tail,
    padding_shift,
    release_accounting,
    threshold,
)
from cels.mechanism.dp_release import ITEM_CHOICE, NOISE_SHARES, bounded_counts

Pair = tuple[str, str]
Holdings = Mapping[str, Mapping[str, Iterable["Pair | str"]]]
"""A toy input: party -> user -> the pairs it holds (a string s stands for the pair (s, s))."""

PADDING_STREAM = "padding"
"""A party's stream for its dummy count (as cels.protocol.work's)."""
INDEX_PADDING_STREAM = "index padding"
"""The solver's stream for its dummy count (as cels.protocol.stages.dp_release's)."""
SOLVER = "solver"


def as_pair(item: Pair | str) -> Pair:
    """A pair (query, url); a string s is the pair (s, s), as :func:`cels.audit.audits.toy_log`."""
    if isinstance(item, str):
        return (item, item)
    query, url = item
    return (str(query), str(url))


# ----------------------------------------------------------------------------- the setup
@dataclass(frozen=True)
class DpSetup:
    """One configuration of the distributed release.  ``collusion`` is the t claimed;
    ``shares`` the h the noise shares are actually sized for (default r - t; r with t >= 1 is
    control (b)); ``threshold_shift`` moves tau (-1: control (a)); ``bound`` False skips the
    contribution bound (control (c))."""

    epsilon: float
    delta: float
    max_items: int
    parties: tuple[str, ...]
    collusion: int
    padding_epsilon: float
    shares: int | None = None
    threshold_shift: int = 0
    bound: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "parties", tuple(self.parties))
        if len(self.parties) < 2 or len(set(self.parties)) != len(self.parties):
            raise ValueError(f"need at least two distinct parties, got {self.parties}")
        if not 0 <= self.collusion < len(self.parties):
            raise ValueError(f"collusion t = {self.collusion} must be in [0, r) for r = {len(self.parties)}")
        if self.shares is not None and not 1 <= self.shares <= len(self.parties):
            raise ValueError(f"shares h = {self.shares} must be in [1, r]")

    @property
    def r(self) -> int:
        return len(self.parties)

    @property
    def h(self) -> int:
        """The h the shares are sized for: any h of them add up to one discrete Laplace."""
        return self.r - self.collusion if self.shares is None else self.shares

    @property
    def beta(self) -> Fraction:
        """r/h: the total noise is NB(beta) - NB(beta)."""
        return Fraction(self.r, self.h)

    @property
    def scale(self) -> Fraction:
        return count_scale(self.epsilon, self.max_items)

    @property
    def tau(self) -> int:
        """The threshold the simulated solver applies (the protocol's release_threshold for the
        shares' beta, plus ``threshold_shift``)."""
        return threshold(self.epsilon, self.delta, self.max_items, self.beta) + self.threshold_shift

    @property
    def padding_mu(self) -> int:
        return padding_shift(self.max_items, self.padding_epsilon, self.delta)

    def accounting(self) -> dict:
        """cels.mechanism.dp_histogram.release_accounting of the claimed (r, t)."""
        return release_accounting(self.epsilon, self.delta, self.max_items, self.padding_epsilon, self.r, self.collusion)

    def claims(self) -> dict[str, tuple[float, float]]:
        """(eps, delta) per observer: the recipient's, and the party observer's (if t >= 1)."""
        acc = self.accounting()
        out = {"recipient": tuple(acc["recipient"])}
        if self.collusion >= 1:
            out["party"] = tuple(acc["party"])
        return out

    def replace(self, **changes) -> DpSetup:
        return DpSetup(**{**self.__dict__, **changes})


# ----------------------------------------------------------------------------- the simulation
def pairs_of(*holdings: Holdings) -> tuple[Pair, ...]:
    """Every pair any of ``holdings`` holds, sorted."""
    return tuple(sorted({as_pair(p) for h in holdings for users in h.values() for held in users.values() for p in held}))


def party_log(users: Mapping[str, Iterable[Pair | str]], pairs: Sequence[Pair]) -> SearchLog:
    """One party's toy log over ``pairs`` (every entry 1: a pair counts distinct users)."""
    column = {p: i for i, p in enumerate(pairs)}
    rows, cols = [], []
    names = list(users)
    for j, name in enumerate(names):
        for i in sorted({column[as_pair(p)] for p in users[name]}):
            rows.append(j)
            cols.append(i)
    counts = sp.csr_matrix((np.ones(len(rows), dtype=np.int64), (rows, cols)), shape=(len(names), len(pairs)))
    return SearchLog(names, list(pairs), counts)


def bounded_draws(log: SearchLog, max_items: int, draws: int, gen: np.random.Generator, *, bound: bool = True, bounding: str = "uniform") -> np.ndarray:
    """n^k per pair for ``draws`` independent contribution bounds of one party: (draws, pairs).
    A user with at most Delta_0 pairs keeps them all; one with more keeps a uniformly random
    Delta_0 of them, fresh per draw: ``bounding="keyed"`` through
    :func:`cels.mechanism.dp_release.bounded_counts` with a uniform 32-byte key per draw (its
    BLAKE2b priorities, as a party draws them), ``"uniform"`` (fast) through uniform random
    priorities from ``gen``, the same choice.  ``bound`` False keeps every pair (control (c))."""
    if bounding not in ("uniform", "keyed"):
        raise ValueError(f"bounding must be 'uniform' or 'keyed', got {bounding!r}")
    counts = sp.csr_matrix(log.counts, dtype=np.int64)
    counts.eliminate_zeros()
    sizes = np.diff(counts.indptr)
    over = np.flatnonzero(sizes > max_items) if bound else np.zeros(0, dtype=np.int64)
    fixed = np.ones(counts.shape[0], dtype=bool)
    fixed[over] = False
    base = np.asarray((counts[np.flatnonzero(fixed)] > 0).sum(axis=0)).ravel().astype(np.int64)
    out = np.repeat(base[None, :], draws, axis=0)
    if not len(over):
        return out
    if bounding == "keyed":
        from cels.protocol.work import encode_item

        sub = counts[over]
        users = [log.users[j] for j in over]

        def encoded(cols: list[int]) -> list[bytes]:
            return [encode_item(*log.pairs[c]) for c in cols]

        for d in range(draws):
            kept = bounded_counts(sub, users, encoded, gen.bytes(32), max_items)
            out[d] += np.asarray(kept.sum(axis=0)).ravel().astype(np.int64)
        return out
    rows = np.arange(draws)[:, None]
    for j in over.tolist():
        held = counts.indices[counts.indptr[j] : counts.indptr[j + 1]]
        chosen = held[np.argsort(gen.random((draws, len(held))), axis=1)[:, :max_items]]
        np.add.at(out, (np.broadcast_to(rows, chosen.shape), chosen), 1)
    return out


def combine(counts: np.ndarray, shares: np.ndarray, tau: int) -> tuple[np.ndarray, np.ndarray]:
    """The solver's step over (parties, draws, columns) counts and shares: n + Z = the sum over
    parties of counts plus shares, and kept = a column some party holds (n > 0: a pair, not a
    dummy) with n + Z >= tau.  Returns (n + Z, kept), each (draws, columns)."""
    counts, shares = np.asarray(counts, dtype=np.int64), np.asarray(shares, dtype=np.int64)
    if counts.shape != shares.shape:
        raise ValueError(f"counts {counts.shape} and shares {shares.shape} differ in shape")
    noisy = counts.sum(axis=0) + shares.sum(axis=0)
    return noisy, (counts.sum(axis=0) > 0) & (noisy >= tau)


def padding_draws(count: int, max_items: int, epsilon: float, delta: float, rng: random.Random) -> np.ndarray:
    """``count`` draws of :func:`cels.mechanism.dp_histogram.padding_count` (vectorised): D = mu
    + L, L the discrete Laplace of scale Delta_0/eps (here the difference of two geometrics of
    :func:`noise_shares` with one share) drawn again until |L| <= mu."""
    mu = padding_shift(max_items, epsilon, delta)
    scale = count_scale(epsilon, max_items)
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        shift = noise_shares(todo.size, scale, 1, rng)
        ok = np.abs(shift) <= mu
        out[todo[ok]] = mu + shift[ok]
        todo = todo[~ok]
    return out


@dataclass
class SimulatedRelease:
    """``draws`` outputs of the distributed release on one toy input (arrays over the draws).
    Axes: parties in ``setup.parties`` order, draws, ``pairs``."""

    setup: DpSetup
    pairs: tuple[Pair, ...]
    counts: np.ndarray
    """(parties, draws, pairs): n^k after the bound."""
    shares: np.ndarray
    """(parties, draws, pairs): each party's noise share."""
    noisy: np.ndarray
    """(draws, pairs): n + Z."""
    kept: np.ndarray
    """(draws, pairs): released."""
    padding: np.ndarray
    """(parties + 1, draws): each party's dummy count D_k, then the solver's D_s."""
    tau: int
    dummies_kept: np.ndarray
    """(parties, draws): each party's dummy columns at or above tau (their n + Z is Z alone)."""

    @property
    def draws(self) -> int:
        return self.noisy.shape[0]

    @property
    def set_sizes(self) -> np.ndarray:
        """(parties, draws): |S_k|, the pairs some user of party k kept."""
        return (self.counts > 0).sum(axis=2)

    @property
    def padded(self) -> np.ndarray:
        """(parties, draws): the padded set size |S_k| + D_k every party sees in the universe phase."""
        return self.set_sizes + self.padding[:-1]

    @property
    def index_size(self) -> np.ndarray:
        """(draws,): |U| + sum_k D_k + D_s, the index size every party is told."""
        return (self.counts.sum(axis=0) > 0).sum(axis=1) + self.padding.sum(axis=0)

    @property
    def selections(self) -> np.ndarray:
        """(draws,): the entries of the solver's DpSelection messages, every kept column (pairs and
        dummies) to each of the r parties: what the size of those messages tells, and the solver's
        StepReport carries that size to the initiator (its COUNTS-phase bytes)."""
        return len(self.counts) * (self.kept.sum(axis=1) + self.dummies_kept.sum(axis=0))

    def release(self, draw: int) -> dict[Pair, int]:
        """One draw's release: {pair: n + Z} over the kept pairs."""
        return {self.pairs[i]: int(self.noisy[draw, i]) for i in np.flatnonzero(self.kept[draw])}


def simulate(
    holdings: Holdings,
    setup: DpSetup,
    *,
    draws: int,
    seed: int,
    label: str = "",
    pairs: Sequence[Pair] | None = None,
    bounding: str = "uniform",
) -> SimulatedRelease:
    """``draws`` independent runs of the distributed release on ``holdings`` (module docstring).
    Each party's draws come from its own replayed keys (``DrawKeys.replay(seed, label + party)``,
    streams as a party's: its item choice, ``noise shares``, ``padding``; the solver's
    ``index padding``); give the two neighbours different ``label`` s.  ``pairs``: the columns
    (default: every pair in ``holdings``; pass the union of both neighbours' so they align)."""
    unknown = set(holdings) - set(setup.parties)
    if unknown:
        raise ValueError(f"holdings of parties {sorted(unknown)} outside the setup's {setup.parties}")
    pairs = tuple(pairs) if pairs is not None else pairs_of(holdings)
    keys = {p: DrawKeys.replay(seed, label + p) for p in setup.parties}
    counts = np.stack([
        bounded_draws(party_log(holdings.get(p, {}), pairs), setup.max_items, draws, keys[p].stream(ITEM_CHOICE), bound=setup.bound, bounding=bounding)
        for p in setup.parties
    ])  # fmt: skip
    scale = setup.scale
    shares = np.stack([
        noise_shares(draws * len(pairs), scale, setup.h, CipherRandom(generator=keys[p].stream(NOISE_SHARES))).reshape(draws, len(pairs))
        for p in setup.parties
    ])  # fmt: skip
    tau = setup.tau
    noisy, kept = combine(counts, shares, tau)
    padding = np.stack([
        padding_draws(draws, setup.max_items, setup.padding_epsilon, setup.delta, CipherRandom(generator=rng))
        for rng in [*(keys[p].stream(PADDING_STREAM) for p in setup.parties), DrawKeys.replay(seed, label + SOLVER).stream(INDEX_PADDING_STREAM)]
    ])  # fmt: skip
    # a dummy column's n + Z is Z (NB(beta) - NB(beta)): each is kept independently with Pr[Z >= tau]
    dummy_rate = float(noise_tail(tau, math.exp(-1 / float(scale)), setup.beta))
    dummy_gen = DrawKeys.replay(seed, label + SOLVER).stream("dummy columns")
    dummies_kept = dummy_gen.binomial(padding[:-1], dummy_rate)
    return SimulatedRelease(setup, pairs, counts, shares, noisy, kept, padding, tau, dummies_kept)


# ----------------------------------------------------------------------------- the observers
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
@dataclass
class ReplayedRelease:
    """A seeded session recomputed from its parties' replayed draws (:func:`replay_session`)."""

    counts: np.ndarray
    """(parties, columns): each party's distinct-user counts placed on its columns."""
    shares: np.ndarray
    """(parties, columns): each party's replayed noise shares over the index."""
    noisy: np.ndarray
    """(columns,): n + Z, what the solver should open."""
    kept: np.ndarray
    """(columns,): the released columns (a pair's, at or above tau)."""
    tau: int
    release: dict[Pair, int]


def replay_session(logs: Sequence[SearchLog], options, seed: int, index_size: int, pair_of: Mapping[str, Mapping[int, int]]) -> ReplayedRelease:
    """What this module's simulation computes for a session run with ``seed``
    (cels.inprocess.session_hosts) from the same draws: party k's bounded distinct-user counts
    (:func:`cels.mechanism.dp_release.distinct_users` with ``DrawKeys.replay(seed, party)``)
    on its columns, its replayed ``noise shares`` stream's shares over the ``index_size``
    columns (sized for h = r - t), :func:`combine` at tau = threshold(eps, delta, Delta_0, r/h).
    ``pair_of[party]``: column -> pair index into ``logs[k].pairs`` (the session's column order,
    which only the session knows: the solver's sorted hashed ids)."""
    from cels.mechanism.dp_release import distinct_users

    parties = list(options.parties)
    setup = DpSetup(options.epsilon, options.delta, options.max_items_per_user, tuple(parties), options.collusion, options.padding_epsilon)
    counts = np.zeros((len(parties), 1, index_size), dtype=np.int64)
    shares = np.zeros_like(counts)
    pair_at: dict[int, Pair] = {}
    for k, (party, log) in enumerate(zip(parties, logs)):
        keys = DrawKeys.replay(seed, party)
        n = distinct_users(log, options.max_items_per_user, keys)
        for column, i in pair_of[party].items():
            counts[k, 0, column] = n[i]
            pair_at.setdefault(int(column), as_pair(log.pairs[i]))
        shares[k, 0] = noise_shares(index_size, setup.scale, setup.h, CipherRandom(generator=keys.stream(NOISE_SHARES)))
    tau = setup.tau
    noisy, kept = combine(counts, shares, tau)
    release = {pair_at[c]: int(noisy[0, c]) for c in np.flatnonzero(kept[0]).tolist()}
    return ReplayedRelease(counts[:, 0], shares[:, 0], noisy[0], kept[0], tau, release)
