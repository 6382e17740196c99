"""The single-holder sanitization recipe (CELS sections 2-3, App. B-C; EDBT sections 4-5).

cap -> [preprocess] -> conditions (unique pairs suppressed, cleaning, dominated rows pruned)
-> optimal counts (solvers) -> [discrete Laplace noise + repair] -> multinomial sampling
-> pseudonymised output log in the input's schema, plus a report with the privacy accounting.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from cels import metrics
from cels.claims import privacy_accounting
from cels.crypto.streams import CipherRandom
from cels.logs.model import SearchLog, output_sizes
from cels.mechanism.conditions import Conditions, apply_cap, build_conditions, privacy_bound
from cels.mechanism.noisy_counts import add_noise_and_repair
from cels.mechanism.preprocess import preprocess
from cels.mechanism.sampling import multinomial_sample, released_log
from cels.mechanism.defaults import DEFAULT_BREAKPOINTS, DEFAULT_SUPPORT, DEFAULT_TIME_LIMIT
from cels.mechanism.solvers import Solution, solve


@dataclass(frozen=True)
class SanitizeParams:
    """Everything ``cels sanitize`` decides (CLI flags of the same names; the session options
    marked ``mechanism`` in cels.protocol.options are these fields)."""

    epsilon: float
    delta: float
    bound: str = "cels"
    objective: str = "kl"
    output_size: float | None = None
    min_count: int = 0
    cap: int | None = None
    noise_epsilon: float | None = None
    sensitivity: float | None = None
    preprocess: bool = False
    keep_user_ids: bool = False
    seed: int | None = None
    breakpoints: int = DEFAULT_BREAKPOINTS
    support: float = DEFAULT_SUPPORT
    time_limit: float = DEFAULT_TIME_LIMIT
    integer: str = "mip"

    def validate(self) -> float:
        """Check the parameters; returns b."""
        b = privacy_bound(self.epsilon, self.delta, self.bound)
        if (self.noise_epsilon is None) != (self.sensitivity is None):
            raise ValueError("--noise-epsilon and --sensitivity go together (noise Lap(d/eps'))")
        if self.preprocess and self.sensitivity is None:
            raise ValueError("--preprocess bounds the sensitivity d: give --noise-epsilon and --sensitivity")
        if self.min_count < 0:
            raise ValueError(f"min-count must be >= 0, got {self.min_count}")
        return b


class _Timer:
    """Seconds per step, shown on a tqdm bar over the steps."""

    def __init__(self, bar: tqdm) -> None:
        self.seconds: dict[str, float] = {}
        self.bar = bar

    def step(self, name: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = round(now - started, 4)
        self.bar.set_postfix_str(f"{name} done")
        self.bar.update(1)
        return now


def solve_with_params(cond: Conditions, params: SanitizeParams, integer: str | None = None) -> Solution:
    """The optimal counts for ``cond`` with the objective and solver options of ``params``
    (also called by the distributed solver role on the transformed problem)."""
    return solve(
        cond,
        params.objective,
        output_size=params.output_size,
        breakpoints=params.breakpoints,
        support=params.support,
        time_limit=params.time_limit,
        integer=params.integer if integer is None else integer,
    )


def _solve_log(log: SearchLog, params: SanitizeParams, b: float, integer: str) -> tuple[Solution | None, object, np.ndarray]:
    cond, var_pairs = build_conditions(log, b, params.min_count, params.cap)
    if cond.n == 0:
        return None, cond, var_pairs
    return solve_with_params(cond, params, integer), cond, var_pairs


def sanitize(log: SearchLog, params: SanitizeParams, *, progress: bool = True) -> tuple[SearchLog, dict]:
    """Sanitize one log; returns (released log, report).  Raises ValueError on bad input."""
    b = params.validate()
    if log.n_users == 0 or log.size == 0:
        raise ValueError("the log is empty: no user holds a query-url pair")
    steps = 3 + bool(params.preprocess) + (params.noise_epsilon is not None)
    bar = tqdm(total=steps, desc="sanitize", unit="step", disable=None if progress else True)
    timer = _Timer(bar)
    t = time.perf_counter()
    input_log = log
    # the time-limited MIP is not a deterministic function of D, so its sensitivity is undefined
    integer = "greedy" if params.preprocess and params.integer == "mip" else params.integer
    pre_info = None
    if params.preprocess:

        def counts_of(sub: SearchLog) -> tuple[np.ndarray, np.ndarray]:
            x = np.zeros(sub.n_pairs)
            sol, _, var_pairs = _solve_log(sub, params, b, integer)
            if sol is not None:
                x[var_pairs] = sol.x
            return x, var_pairs

        log, pre_info = preprocess(log, counts_of, float(params.sensitivity), progress=progress)
        t = timer.step("preprocess", t)
    sol, cond, var_pairs = _solve_log(log, params, b, integer)
    if sol is None:
        raise ValueError(
            "no query-url pair is held by two or more users (after cleaning): every pair is unique "
            "and must be suppressed, so nothing can be released"
        )
    t = timer.step("conditions_and_solve", t)
    x_var = sol.x
    noise_info = None
    stream = CipherRandom(params.seed)  # one ChaCha20 stream: noise, sampling, pseudonyms
    if params.noise_epsilon is not None:
        x_var, noise_info = add_noise_and_repair(cond, sol.x, params.noise_epsilon, params.sensitivity, stream)
        t = timer.step("noise", t)
    x = np.zeros(log.n_pairs, dtype=np.int64)
    x[var_pairs] = x_var
    sampled = multinomial_sample(apply_cap(log.counts, params.cap), x, stream.generator)
    if not np.array_equal(np.asarray(sampled.sum(axis=0)).ravel(), x):
        raise RuntimeError("sampled user counts do not add up to the output counts")
    out = released_log(log, sampled, keep_user_ids=params.keep_user_ids, rng=stream.generator)
    t = timer.step("sample", t)

    # utility against the UNCAPPED input, over the pairs that pass the cleaning filter
    capped_totals = np.asarray(apply_cap(input_log.counts, params.cap).sum(axis=0)).ravel()
    universe = capped_totals >= max(params.min_count, 1)
    utility = metrics.utility_report(input_log.pair_totals()[universe], x[universe], support=params.support)
    timer.step("metrics", t)
    bar.close()
    report = {
        "method": "optimal",
        "privacy": privacy_accounting(
            epsilon=params.epsilon, delta=params.delta, b=b, bound=params.bound, noise_epsilon=params.noise_epsilon,
            sensitivity=params.sensitivity, cap=params.cap, setting="single", seeded=params.seed is not None,
            preprocess=params.preprocess,
        ),
        "solver": {
            **sol.summary(),
            "integer_requested": params.integer,
            "integer_method": sol.integer_method,
            # max_i u_i = b / min_i max_j ln t_ij: below 1, no pair can take a single record
            "max_pair_bound": float(np.max(cond.upper_bounds(), initial=0.0)),
        },
        "sizes": {
            "users": input_log.n_users,
            "users_after_preprocess": log.n_users,
            "pairs": input_log.n_pairs,
            "input_size": input_log.size,
            "nonunique_pairs": int(len(var_pairs)),
            "constraint_rows_after_pruning": int(cond.G.shape[0]),
            **output_sizes(out),
        },
        "utility": utility,
        "noise": noise_info,
        "preprocess": pre_info,
        "timings": timer.seconds,
        "input": {
            "format": input_log.source.get("format"),
            "skipped_lines": input_log.source.get("skipped_lines", 0),
        },
        "params": asdict(params),
    }
    return out, report
