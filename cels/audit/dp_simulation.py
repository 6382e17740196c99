"""The distributed DP histogram's outputs, simulated for the audit (``--release dp``;
docs/releases.md, docs/security.md "The DP histogram: the argument").

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

The simulation is checked against a seeded protocol session (:func:`replay_session`,
tests/test_dp_audit.py): the solver's n + Z is :func:`combine` of the parties' bounded counts
and replayed noise shares, exactly, and the release is its kept columns.

Seeds are for tests only: a seeded draw is reproducible and therefore not private.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import CipherRandom, DrawKeys
from cels.logs.model import SearchLog
from cels.mechanism.dp_histogram import count_scale, noise_shares, noise_tail, padding_shift, release_accounting, threshold
from cels.mechanism.dp_release import ITEM_CHOICE, NOISE_SHARES, bounded_counts
from cels.engine.routines import INDEX_PADDING, PADDING, encode_item

Pair = tuple[str, str]
Holdings = Mapping[str, Mapping[str, Iterable["Pair | str"]]]
"""A toy input: party -> user -> the pairs it holds (a string s stands for the pair (s, s))."""

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
        for rng in [*(keys[p].stream(PADDING) for p in setup.parties), DrawKeys.replay(seed, label + SOLVER).stream(INDEX_PADDING)]
    ])  # fmt: skip
    # a dummy column's n + Z is Z (NB(beta) - NB(beta)): each is kept independently with Pr[Z >= tau]
    dummy_rate = float(noise_tail(tau, math.exp(-1 / float(scale)), setup.beta))
    dummy_gen = DrawKeys.replay(seed, label + SOLVER).stream("dummy columns")
    dummies_kept = dummy_gen.binomial(padding[:-1], dummy_rate)
    return SimulatedRelease(setup, pairs, counts, shares, noisy, kept, padding, tau, dummies_kept)


# ----------------------------------------------------------------------------- the observers


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


def replay_session(logs: Sequence[SearchLog], options, seed: int, index_size: int, pair_at: Mapping[str, Mapping[int, Pair]]) -> ReplayedRelease:
    """What this module's simulation computes for a session run with ``seed``
    (cels.inprocess.session_hosts) from the same draws: party k's bounded distinct-user counts
    (:func:`cels.mechanism.dp_release.distinct_users` with ``DrawKeys.replay(seed, party)``)
    on its columns, its replayed ``noise shares`` stream's shares over the ``index_size``
    columns (sized for h = r - t), :func:`combine` at tau = threshold(eps, delta, Delta_0, r/h).
    ``pair_at[party]``: column -> the pair (query, url) of ``logs[k]`` there (the session's column
    order, which only the session knows: the solver's sorted hashed ids)."""
    from cels.mechanism.dp_release import distinct_users

    parties = list(options.parties)
    setup = DpSetup(options.epsilon, options.delta, options.max_items_per_user, tuple(parties), options.collusion, options.padding_epsilon)
    counts = np.zeros((len(parties), 1, index_size), dtype=np.int64)
    shares = np.zeros_like(counts)
    named: dict[int, Pair] = {}
    for k, (party, log) in enumerate(zip(parties, logs)):
        keys = DrawKeys.replay(seed, party)
        n = distinct_users(log, options.max_items_per_user, keys)
        index = {as_pair(pair): i for i, pair in enumerate(log.pairs)}
        for column, pair in pair_at[party].items():
            counts[k, 0, column] = n[index[as_pair(pair)]]
            named.setdefault(int(column), as_pair(pair))
        shares[k, 0] = noise_shares(index_size, setup.scale, setup.h, CipherRandom(generator=keys.stream(NOISE_SHARES)))
    tau = setup.tau
    noisy, kept = combine(counts, shares, tau)
    release = {named[c]: int(noisy[0, c]) for c in np.flatnonzero(kept[0]).tolist()}
    return ReplayedRelease(counts[:, 0], shares[:, 0], noisy[0], kept[0], tau, release)
