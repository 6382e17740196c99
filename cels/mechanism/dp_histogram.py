"""A DP histogram of items with its noise shared among parties: threshold, shares, padding, accounting.

Each user keeps at most ``max_items`` = Delta_0 items; an item's count n (distinct users) gets
Z = X - Y, X, Y iid NB(beta, alpha), alpha = exp(-epsilon / Delta_0), and is released iff
n + Z >= tau.  At beta = 1 Z is the discrete Laplace, the sum of h Polya shares NB(1/h) - NB(1/h)
(Goryczka and Xiong); r such shares make beta = r / h.  The rule is partition selection
(Korolova et al., WWW 2009; Desfontaines et al., "Differentially private partition selection",
PoPETs 2022) with the exact tail of the discrete noise in place of the continuous Laplace's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from fractions import Fraction

import mpmath
import numpy as np

from cels.mechanism.item_kinds import ItemKinds
from cels.mechanism.noise import discrete_laplace, laplace_share, noise_scale

_MP = mpmath.MPContext()
_MP.dps = 60
TAIL_TOLERANCE = _MP.mpf("1e-40")  # relative error of noise_tail: every truncation bounded, not estimated
MAX_TERMS = 2_000_000  # series terms beyond which the exact tail is refused (scale Delta_0/eps ~ 20,000)


def _check(epsilon: float = 1.0, delta: float = 0.5, max_items: int = 1, beta: Fraction = Fraction(1)) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and positive, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 1:
        raise ValueError(f"max_items must be an integer >= 1, got {max_items!r}")
    if not beta > 0:
        raise ValueError(f"beta = r/h must be positive, got {beta}")


def _mpf(x: object) -> mpmath.mpf:
    return _MP.mpf(x.numerator) / x.denominator if isinstance(x, Fraction) else _MP.mpf(x)


def delta_prime(delta: float, max_items: int) -> float:
    """delta' = 1 - (1 - delta)^(1/Delta_0): a release chance per item that keeps all Delta_0
    items of one user within delta (Desfontaines et al. 2022, Section 3)."""
    _check(delta=delta, max_items=max_items)
    return -math.expm1(math.log1p(-delta) / max_items)


def count_scale(epsilon: float, max_items: int) -> Fraction:
    """The discrete Laplace scale Delta_0 / epsilon (L1 sensitivity Delta_0), exactly; alpha = exp(-1/scale)."""
    _check(epsilon=epsilon, max_items=max_items)
    return noise_scale(epsilon, max_items)


def share_beta(parties: int, collusion: int) -> Fraction:
    """beta = r / h, h = r - t: the shape of the total noise in units of the exact discrete Laplace."""
    if not 0 <= collusion < parties:
        raise ValueError(f"collusion t = {collusion} must be in [0, r) for r = {parties} parties")
    return Fraction(parties, parties - collusion)


class _Tail:
    """Pr[Z >= k], Z = X - Y, X, Y iid NB(beta, alpha), for |k| <= k_max: sum_y p(y) S(k + y)
    with S the upper tail of p, both series cut where a bounded remainder is below the tolerance."""

    def __init__(self, alpha: object, beta: Fraction, k_max: int) -> None:
        a, b = _mpf(alpha), _mpf(beta)
        if not 0 < a < 1 or not b > 0:
            raise ValueError(f"need 0 < alpha < 1 and beta > 0, got {alpha}, {beta}")
        if k_max + math.log(4 / float(TAIL_TOLERANCE)) / -math.log(float(a)) > MAX_TERMS:
            raise ValueError(f"the exact tail at alpha = {float(a):.6g} needs more than {MAX_TERMS} terms")
        p = [(1 - a) ** b]
        tol = TAIL_TOLERANCE / 4

        def remainder(m: int) -> mpmath.mpf:  # >= sum_{x > m} p(x): the pmf ratio is <= rho beyond m
            while len(p) <= m + 1:
                x = len(p) - 1
                p.append(p[x] * a * (x + b) / (x + 1))
            rho = a * max(1, (m + 1 + b) / (m + 2))
            return p[m + 1] / (1 - rho) if rho < 1 else _MP.inf

        y = 0
        while remainder(y) > tol * p[0]:
            y += 1
        n = k_max + y
        remainder(k_max)
        while remainder(n) > tol * p[0] * p[k_max]:
            n += 1
        self.p, self.y, self.k_max = p[: y + 1], y, k_max
        self.s = [_MP.zero] * (n + 2)  # s[m] = sum_{x=m}^{n} p(x)
        for m in range(n, -1, -1):
            self.s[m] = self.s[m + 1] + p[m]

    def __call__(self, k: int) -> mpmath.mpf:
        if not -self.k_max < k <= self.k_max:
            raise ValueError(f"k = {k} outside the table (|k| <= {self.k_max})")
        if k <= 0:  # Z is symmetric: Pr[Z >= k] = 1 - Pr[Z >= 1 - k]
            return 1 - self(1 - k)
        return _MP.fdot(self.p, self.s[k : k + self.y + 1])


def noise_tail(k: int, alpha: object, beta: Fraction) -> mpmath.mpf:
    """Pr[X - Y >= k], X, Y iid NB(beta, alpha), P(m) = Gamma(m + beta)/(Gamma(beta) m!)
    (1 - alpha)^beta alpha^m, to relative error 1e-40 (mpmath).  At beta = 1, alpha^k/(1 + alpha), k >= 1."""
    return _Tail(alpha, Fraction(beta), max(k, 1 - k))(k)


def threshold(epsilon: float, delta: float, max_items: int, beta: Fraction = Fraction(1)) -> int:
    """tau = min{m : Pr[Z >= m - 1] <= delta'}: an item only one user holds (n = 1) is released
    with chance at most delta'.  At beta = 1 it is 1 + ceil((Delta_0/eps) ln(1/(delta' (1 + alpha)))),
    the discrete twin of Google's 1 - (Delta_0/eps) ln(2 delta')."""
    beta = Fraction(beta)
    _check(epsilon, delta, max_items, beta)
    lam = 1 / _mpf(count_scale(epsilon, max_items))
    a = _MP.exp(-lam)
    dp = -_MP.expm1(_MP.log1p(-_MP.mpf(delta)) / max_items)
    # Chernoff: Pr[Z >= k] <= E[e^{sZ}] e^{-sk}, s = theta lam, bounds tau - 1 from above
    log_mgf = lambda th: _mpf(beta) * _MP.log((1 - a) ** 2 / ((1 - a ** (1 - th)) * (1 - a ** (1 + th))))  # noqa: E731
    hi = 1 + min(int(_MP.ceil((log_mgf(th) - _MP.log(dp)) / (th * lam))) for th in (1 - _MP.mpf(2) ** -j for j in range(1, 40)))
    tail = _Tail(a, beta, max(hi, 2))
    if tail(0) <= dp:  # delta' >= Pr[Z >= 0] >= 1/2: walk down from m = 1
        m = 1
        while True:
            if 2 - m >= tail.k_max:
                tail = _Tail(a, beta, 2 * (2 - m))
            if tail(m - 2) > dp:
                return m
            m -= 1
    lo = 1
    while hi - lo > 1:  # invariant: Pr[Z >= lo - 1] > delta' >= Pr[Z >= hi - 1]
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tail(mid - 1) <= dp else (mid, hi)
    return hi


# -- noise shares ---------------------------------------------------------------------------


def check_session(options: object) -> None:
    """A DP-release session's parameters, refused in one line before any work: t < r and a
    computable threshold (cels.protocol.releases)."""
    r, t = len(options.parties), options.collusion
    if t >= r:
        raise ValueError(f"collusion t = {t} must be below the {r} parties (no noise share would stay unknown)")
    threshold(options.epsilon, options.delta, options.item_kinds.total, share_beta(r, t))


def _bernoulli_exp(num: np.ndarray, den: int, gen: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-num/den)) elementwise, 0 <= num <= den (Canonne, Kamath and Steinke 2020,
    Algorithm 1): K is the first k with a failed Bernoulli(num/(den k)) coin; true iff K is odd.
    Every draw still alive at pass k has had k - 1 successes, so one bound serves a pass."""
    odd = np.zeros(len(num), dtype=bool)
    live, k = np.arange(len(num)), 1
    while live.size:
        hit = gen.integers(0, den * k, size=live.size) < num[live]
        odd[live[~hit]] = k % 2 == 1
        live, k = live[hit], k + 1
    return odd


def _geometric_array(count: int, scale: Fraction, gen: np.random.Generator) -> np.ndarray:
    """``count`` draws of P(k) = (1 - q) q^k, q = exp(-1/scale) (CKS Algorithm 2's one-sided part,
    as :func:`cels.mechanism.noise.geometric`): floor((U + t V)/s) for scale = t/s."""
    t, s = scale.numerator, scale.denominator
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        u = gen.integers(0, t, size=todo.size)
        ok = _bernoulli_exp(u, t, gen)
        v = np.zeros(int(ok.sum()), dtype=np.int64)
        live = np.arange(v.size)
        while live.size:  # V: successes of Bernoulli(exp(-1)) before the first failure
            live = live[_bernoulli_exp(np.ones(live.size, dtype=np.int64), 1, gen)]
            v[live] += 1
        out[todo[ok]] = (u[ok] + t * v) // s
        todo = todo[~ok]
    return out


def polya_array(count: int, shape: Fraction, scale: Fraction, gen: np.random.Generator) -> np.ndarray:
    """``count`` exact draws of NB(shape, q), 0 < shape = c/d <= 1, q = exp(-1/scale), with only
    uniform integers from ``gen``: a geometric G = NB(1, q) split by a Polya urn of weights
    (c/d, 1 - c/d), whose first colour's count is NB(c/d, q) (NB(c/d) + NB(1 - c/d) = NB(1),
    and given their sum two NBs are beta-binomial; Johnson, Kemp and Kotz, "Univariate Discrete
    Distributions"): step j + 1 draws colour one with chance (c + d x)/(d (j + 1)) after x of j."""
    shape, scale = Fraction(shape), Fraction(scale)
    if not 0 < shape <= 1 or not 0 < scale.numerator < 2**40:
        raise ValueError(f"need 0 < shape <= 1 and a scale t/s with 0 < t < 2^40, got {shape}, {scale}")
    g = _geometric_array(count, scale, gen)
    if shape == 1:
        return g
    c, d = shape.numerator, shape.denominator
    x = np.zeros(count, dtype=np.int64)
    live, j = np.flatnonzero(g > 0), 0
    while live.size:
        x[live] += gen.integers(0, d * (j + 1), size=live.size) < c + d * x[live]
        j += 1
        live = live[g[live] > j]
    return x


def noise_shares(count: int, scale: Fraction, shares: int, rng: random.Random) -> np.ndarray:
    """``count`` draws of one party's share X - Y, X, Y ~ NB(1/shares, alpha) (int64): any
    ``shares`` of them add up to an exact discrete Laplace of ``scale``.  With a
    :class:`cels.crypto.streams.CipherRandom` the vectorised :func:`polya_array` on its stream,
    else :func:`cels.mechanism.noise.laplace_share` one by one (the same distribution)."""
    scale = Fraction(scale)
    if shares < 1 or scale <= 0:
        raise ValueError(f"need shares >= 1 and a positive scale, got {shares}, {scale}")
    gen = getattr(rng, "generator", None)
    if isinstance(gen, np.random.Generator) and scale.numerator < 2**40:
        shape = Fraction(1, shares)
        return polya_array(count, shape, scale, gen) - polya_array(count, shape, scale, gen)
    return np.array([laplace_share(scale, shares, rng) for _ in range(count)], dtype=np.int64)


# -- padding of an id set ---------------------------------------------------------------------


def padding_shift(max_items: int, epsilon: float, delta: float) -> int:
    """mu = Delta_0 - 1 + max(1, ceil((Delta_0/eps) ln(1/(delta (1 + alpha))))): the least
    mu >= Delta_0 with Pr[L <= Delta_0 - 1 - mu] = alpha^(mu - Delta_0 + 1)/(1 + alpha) <= delta."""
    _check(epsilon, delta, max_items)
    a = _MP.exp(-1 / _mpf(count_scale(epsilon, max_items)))
    m = max(1, int(_MP.ceil(_mpf(count_scale(epsilon, max_items)) * _MP.log(1 / (_MP.mpf(delta) * (1 + a))))))
    while m > 1 and a ** (m - 1) / (1 + a) <= delta:  # guard the rounding of the logarithm
        m -= 1
    while a**m / (1 + a) > delta:
        m += 1
    return max_items - 1 + m


def padding_count(max_items: int, epsilon: float, delta: float, rng: random.Random) -> int:
    """D = mu + L, L ~ discrete Laplace of scale Delta_0/eps drawn again until |L| <= mu:
    D in [0, 2 mu], E[D] = mu (mu = :func:`padding_shift`).

    |S| + D is (eps, delta)-DP if one user moves |S| by k <= Delta_0: the window [|S|, |S| + 2 mu]
    moves by k with the same normaliser, so on common outputs the ratio is alpha^-k <= e^eps;
    the k outputs only one side has weigh P = Pr[-mu <= L <= k - 1 - mu | |L| <= mu] <= A =
    Pr[L <= Delta_0 - 1 - mu] <= delta (P <= A iff A <= 1/2, true for mu >= Delta_0).  Clamping
    max(0, mu + L) would do too, but with a second clamp at 2 mu delta grows by alpha^(Delta_0 - 1)."""
    mu = padding_shift(max_items, epsilon, delta)
    scale = count_scale(epsilon, max_items)
    while True:
        shift = discrete_laplace(scale, rng)
        if abs(shift) <= mu:
            return mu + shift


# -- accounting -----------------------------------------------------------------------------


def compose(events: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Basic composition of (eps_i, delta_i)-DP mechanisms: (sum eps_i, sum delta_i) (Dwork and
    Roth 2014, Theorem 3.16); pure DP parts are (eps_i, 0)."""
    return float(sum(e for e, _ in events)), float(sum(d for _, d in events))


def pld_epsilon(mechanisms: Sequence[tuple[float, int]], delta: float = 0.0) -> float:
    """epsilon at ``delta`` of composed discrete Laplace mechanisms, each (eps, sensitivity):
    noise P(k) ~ exp(-eps |k| / sensitivity), from dp-accounting's privacy loss distributions
    (pessimistic, composed without tail truncation, which would make delta = 0 infinite).  Needs
    dp-accounting (the ``test`` extra): the tests cross-check :func:`release_accounting` with it."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    total = None
    for eps, sensitivity in mechanisms:
        one = pld.from_discrete_laplace_mechanism(parameter=eps / sensitivity, sensitivity=int(sensitivity))
        total = one if total is None else total.compose(one, tail_mass_truncation=0.0)
    return 0.0 if total is None else float(total.get_epsilon_for_delta(delta))


def kinds_accounting(epsilon: float, delta: float, kinds: ItemKinds) -> dict:
    """Each item kind's part of the release (cels.mechanism.item_kinds): its bound Delta_k,
    eps_k = eps Delta_k / Delta, and delta_k = 1 - (1 - delta')^Delta_k, the chance that one of
    a user's Delta_k items of that kind passes the threshold alone; the eps_k add up to eps and
    1 - prod_k (1 - delta_k) = delta."""
    d_prime, shares = delta_prime(delta, kinds.total), kinds.epsilon_shares(epsilon)
    return {
        kind.name: {"max_items": bound, "epsilon": shares[kind.name], "delta": float(-mpmath.expm1(bound * mpmath.log1p(-d_prime)))}
        for kind, bound in kinds.bounds
    }


def release_accounting(
    epsilon: float, delta: float, bound: int | ItemKinds, padding_epsilon: float, parties: int, collusion: int
) -> dict:
    """(epsilon, delta) per observer of the DP histogram (JSON-serialisable).  ``recipient``: the
    counts (eps) and the selection (delta).  ``party``: also every party's padded set size and
    the union size (the solver's padding), each (padding_epsilon, delta): basic composition.
    ``bound``: Delta_0 of query-url pairs, or item kinds whose bounds add up to Delta_0."""
    kinds = ItemKinds.of(bound)
    max_items = kinds.total
    beta = share_beta(parties, collusion)
    padding = (padding_epsilon, delta)
    return {
        "recipient": (epsilon, delta),
        "party": compose([(epsilon, delta), padding, padding]),
        "threshold": threshold(epsilon, delta, max_items, beta),
        "beta": float(beta),
        "delta_prime": delta_prime(delta, max_items),
        "scale": float(count_scale(epsilon, max_items)),
        "max_items": int(max_items),
        "items": kinds_accounting(epsilon, delta, kinds),
        "parties": int(parties),
        "collusion": int(collusion),
        "padding_epsilon": padding_epsilon,
        "padding_delta": delta,
        "padding_shift": padding_shift(max_items, padding_epsilon, delta),
        "accountant": (
            "basic composition (Dwork and Roth 2014, Theorem 3.16); the pure parts agree with dp-accounting's "
            "privacy loss distributions (pld_epsilon, checked in the tests)"
        ),
    }


# -- one holder -----------------------------------------------------------------------------


def _sorted(items: set[Hashable]) -> list[Hashable]:  # a replayable order for rng.sample
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def single_holder_histogram(
    user_items: Sequence[set[Hashable]] | object,
    epsilon: float,
    delta: float,
    max_items: int,
    beta: Fraction = Fraction(1),
    rng: random.Random | None = None,
) -> dict[Hashable, int]:
    """The reference release of one holder: each user keeps at most Delta_0 of its items
    (uniformly, ``rng``), n = distinct users per item, Z = the sum of r shares of
    :func:`noise_shares` with h shares to a discrete Laplace (beta = r/h), items with n + Z >= tau
    (:func:`threshold`).  ``user_items``: sets of items, or a scipy CSR users x items 0/1 matrix
    (items are then column indices)."""
    from cels.crypto.streams import CipherRandom

    rng = rng or CipherRandom()
    beta = Fraction(beta)
    tau = threshold(epsilon, delta, max_items, beta)
    if hasattr(user_items, "indptr"):
        from scipy import sparse

        matrix = sparse.csr_matrix(user_items, copy=True)
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        rows = (matrix.indices[i:j].tolist() for i, j in zip(matrix.indptr[:-1], matrix.indptr[1:]))
    else:
        rows = (_sorted(set(items)) for items in user_items)
    counts: dict[Hashable, int] = {}
    for row in rows:
        for item in rng.sample(row, max_items) if len(row) > max_items else row:
            counts[item] = counts.get(item, 0) + 1
    keys = list(counts)
    noisy = np.array([counts[k] for k in keys], dtype=np.int64)
    scale = count_scale(epsilon, max_items)
    for _ in range(beta.numerator):
        noisy += noise_shares(len(keys), scale, beta.denominator, rng)
    return {k: int(v) for k, v in zip(keys, noisy.tolist()) if v >= tau}
