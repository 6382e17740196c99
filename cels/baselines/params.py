"""Parameter calculations of the baseline sanitizers (docs/baselines.md).

ZEALOUS: Götz et al., Theorem 2 (indistinguishability), Theorem 3 (probabilistic DP), Prop. 4
(choice of tau), Theorem 4 (retention).  Korolova et al.: the privacy guarantee and the optimal
K, b of the slides.  Safelog: Zhang et al., Theorem 1 / eq. (2).  Natural logarithms throughout.

The functions return plain floats or dicts of floats so that ``cels params`` can print them.
"""

from __future__ import annotations

import math


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _probability(**values: float) -> None:
    for name, value in values.items():
        if not 0 < value < 1:
            raise ValueError(f"{name} must lie in (0, 1), got {value!r}")


# --------------------------------------------------------------------------- ZEALOUS


def zealous_tau_prime(lam: float, tau: float, delta: float, users: int, m: int) -> float:
    """Smallest tau' of Theorem 3, eq. (5): tau + max(-lam ln(2 - 2e^{-1/lam}), -lam ln(2 delta / (U m / tau)))."""
    _positive(lam=lam, tau=tau, users=users, m=m)
    _probability(delta=delta)
    first = -lam * math.log(2.0 - 2.0 * math.exp(-1.0 / lam))
    second = -lam * math.log(2.0 * delta / (users * m / tau))
    return tau + max(first, second)


def zealous_best_tau(lam: float, delta: float, users: int, m: int) -> int:
    """Prop. 4: tau' is minimal at tau = lam; the better of floor(lam), ceil(lam) (at least 1)."""
    candidates = sorted({max(1, math.floor(lam)), max(1, math.ceil(lam))})
    return min(candidates, key=lambda tau: zealous_tau_prime(lam, tau, delta, users, m))


def zealous_probabilistic(
    epsilon: float, delta: float, m: int, users: int, tau: int | None = None, lam: float | None = None
) -> dict:
    """(epsilon, delta)-probabilistic DP setting of Theorem 3: lam = 2m/epsilon, tau per Prop. 4."""
    _positive(epsilon=epsilon, m=m, users=users)
    _probability(delta=delta)
    lam = 2.0 * m / epsilon if lam is None else lam
    if lam < 2.0 * m / epsilon - 1e-12:
        raise ValueError(f"lambda = {lam} is below 2m/epsilon = {2.0 * m / epsilon} (Theorem 3, eq. (4))")
    tau = zealous_best_tau(lam, delta, users, m) if tau is None else tau
    tau_prime = zealous_tau_prime(lam, tau, delta, users, m)
    return {
        "mode": "probabilistic",
        "epsilon": epsilon,
        "delta": delta,
        "m": m,
        "users": users,
        "lambda": lam,
        "tau": tau,
        "tau_prime": tau_prime,
        "delta_prime": zealous_indistinguishability_delta(m, lam, tau_prime),
    }


def zealous_probabilistic_delta(lam: float, tau: float, tau_prime: float, users: int, m: int) -> float:
    """delta reached by given lam, tau, tau' (eq. (5), second term solved for delta; Table 1)."""
    _positive(lam=lam, tau=tau, users=users, m=m)
    return users * m / tau / 2.0 * math.exp(-(tau_prime - tau) / lam)


def zealous_indistinguishability(epsilon_prime: float, delta_prime: float, m: int) -> dict:
    """(epsilon', delta')-indistinguishability (Theorem 2): tau = 1, lam = 2m/eps', tau' = m - lam ln(2 delta'/m).

    This form reproduces the paper's Table 1; its printed eq. (3) drops a factor 2.
    """
    _positive(epsilon_prime=epsilon_prime, m=m)
    _probability(delta_prime=delta_prime)
    lam = 2.0 * m / epsilon_prime
    tau_prime = m - lam * math.log(2.0 * delta_prime / m)
    return {
        "mode": "indistinguishability",
        "epsilon_prime": epsilon_prime,
        "delta_prime": delta_prime,
        "m": m,
        "lambda": lam,
        "tau": 1,
        "tau_prime": tau_prime,
    }


def zealous_indistinguishability_delta(m: int, lam: float, tau_prime: float) -> float:
    """delta' = (m/2) e^{-(tau' - m)/lam} (Table 1, delta' column)."""
    _positive(m=m, lam=lam)
    return m / 2.0 * math.exp(-(tau_prime - m) / lam)


def retention_probability(count: float, tau_prime: float, lam: float) -> float:
    """Pr[count + Lap(lam) > tau'] for continuous Laplace (Götz et al. Theorem 4's proof)."""
    _positive(lam=lam)
    if count >= tau_prime:
        return 1.0 - 0.5 * math.exp(-(count - tau_prime) / lam)
    return 0.5 * math.exp(-(tau_prime - count) / lam)


def discrete_retention_probability(count: int, threshold: float, scale: float) -> float:
    """Pr[count + eta > threshold] for the discrete Laplace eta, Pr[eta = k] ∝ e^{-|k|/scale}.

    With p = e^{-1/scale}: Pr[eta >= j] = p^j / (1 + p) for j >= 1, and 1 - p^{1-j} / (1 + p) for j <= 0.
    This is the exact probability of the released sanitizers, which draw discrete noise.
    """
    _positive(scale=scale)
    p = math.exp(-1.0 / scale)
    j = math.floor(threshold - count) + 1  # smallest integer eta that passes
    if j >= 1:
        return p**j / (1.0 + p)
    return 1.0 - p ** (1 - j) / (1.0 + p)


# --------------------------------------------------------------------------- Korolova et al.


def korolova_alpha(K: float, b: float) -> float:
    """alpha = max(e^{1/b}, 1 + 1 / (2 e^{(K-1)/b} - 1))."""
    _positive(b=b)
    return max(math.exp(1.0 / b), 1.0 + 1.0 / (2.0 * math.exp((K - 1.0) / b) - 1.0))


def korolova_privacy(d: int, dc: int, K: float, b: float, bq: float | None, bc: float | None) -> dict:
    """epsilon = d ln alpha + d/bq + dc/bc, delta = (d/2) e^{(d-K)/b}; missing bq/bc drop their term."""
    _positive(d=d, b=b)
    alpha = korolova_alpha(K, b)
    epsilon_select = d * math.log(alpha)
    epsilon = epsilon_select + (d / bq if bq else 0.0) + (dc / bc if bc else 0.0)
    return {
        "alpha": alpha,
        "epsilon_select": epsilon_select,
        "epsilon": epsilon,
        "delta": d / 2.0 * math.exp((d - K) / b),
    }


def korolova_optimum(epsilon: float, delta: float, d: int) -> tuple[float, float]:
    """Optimal K = d (1 - ln(2 delta / d) / epsilon) and b = d / epsilon for Select-Queries."""
    _positive(epsilon=epsilon, d=d)
    _probability(delta=delta)
    return d * (1.0 - math.log(2.0 * delta / d) / epsilon), d / epsilon


# --------------------------------------------------------------------------- Safelog


def safelog_alpha(K: float, b: float, pg: float = 1.0) -> float:
    """Zhang et al. eq. (2): alpha = max(e^{1/b} / p_g, 1 + 1 / (2 e^{(K-1)/b} - 1))."""
    _positive(b=b)
    if not 0 < pg <= 1:
        raise ValueError(f"p_g must lie in (0, 1], got {pg!r}")
    return max(math.exp(1.0 / b) / pg, 1.0 + 1.0 / (2.0 * math.exp((K - 1.0) / b) - 1.0))


def safelog_epsilon(
    qf: int, cf: int, K: float, b: float, bq: float, bc: float, pg: float = 1.0, bt: float | None = None
) -> dict:
    """Theorem 1: epsilon = q_f ln alpha + q_f/b_q + c_f/b_c, plus (q_f - 1)/b_t with transitions."""
    _positive(qf=qf, bq=bq, bc=bc)
    alpha = safelog_alpha(K, b, pg)
    epsilon = qf * math.log(alpha) + qf / bq + cf / bc
    out = {"alpha": alpha, "epsilon": epsilon, "epsilon_without_transitions": epsilon}
    if bt is not None:
        _positive(bt=bt)
        out["epsilon"] = epsilon + (qf - 1) / bt
        out["epsilon_with_transitions"] = out["epsilon"]
    return out


def safelog_turning_point(b: float, pg: float = 1.0) -> float:
    """Smallest K at which alpha = e^{1/b}/p_g (the paper's recommended 'turning point')."""
    _positive(b=b)
    x = math.exp(1.0 / b) / pg - 1.0  # need 1 / (2 e^{(K-1)/b} - 1) <= x
    return 1.0 + b * math.log((1.0 / x + 1.0) / 2.0)


def pool_release_probability(K: float, b: float) -> float:
    """A pool query (count 0) passes 0 + Lap(b) > K with probability 1/2 e^{-K/b} (eq. (6))."""
    _positive(b=b)
    return 0.5 * math.exp(-K / b)
