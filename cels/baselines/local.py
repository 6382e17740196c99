"""Local Sanitization (LS, CELS section 6.4): every party sanitizes its own share alone.

Party k runs the single-holder mechanism (:func:`cels.mechanism.sanitize`) on its log D_k with
the same b as CELS and a share of the output size proportional to its share of the input,
|O_k| = |O| * |D_k| / |D| (clipped at its own maximum |𝕆_k|); the released logs are united.
Each party sees only its own counts: a pair that only one of ITS users holds is unique to it
and suppressed, and its conditions use its local totals c_i^k.  That is the utility CELS gains
by solving on the union (Fig. 5).  The parties' users are disjoint, so the union of the
(ε, δ)-DP releases is (ε, δ)-DP by parallel composition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import scipy.sparse as sp

from cels import metrics
from cels.logs.model import SearchLog, output_sizes
from cels.logs.records import Pair
from cels.mechanism.conditions import apply_cap, build_conditions
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.mechanism.solvers import max_output_lp


def union_logs(logs: Sequence[SearchLog]) -> SearchLog:
    """The union of logs in one schema: pairs merged by (query, url), rows of users with the
    same id summed (parties' pseudonyms are fresh random ids, so they stay apart)."""
    if not logs:
        raise ValueError("no logs to unite")
    user_index: dict[str, int] = {}
    pair_index: dict[Pair, int] = {}
    rows, cols, vals = [], [], []
    for log in logs:
        user_map = np.array([user_index.setdefault(u, len(user_index)) for u in log.users], dtype=np.int64)
        pair_map = np.array([pair_index.setdefault(p, len(pair_index)) for p in log.pairs], dtype=np.int64)
        coo = log.counts.tocoo()
        rows.append(user_map[coo.row] if len(coo.row) else coo.row)
        cols.append(pair_map[coo.col] if len(coo.col) else coo.col)
        vals.append(coo.data)
    counts = sp.csr_matrix(
        (np.concatenate(vals).astype(np.int64), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(user_index), len(pair_index)),
        dtype=np.int64,
    )
    counts.sum_duplicates()
    return SearchLog(list(user_index), list(pair_index), counts, dict(logs[0].source))


def pair_counts(log: SearchLog, pairs: Sequence[Pair]) -> np.ndarray:
    """Total count of each pair of ``pairs`` in ``log`` (0 where the log lacks the pair)."""
    totals = dict(zip(log.pairs, log.pair_totals().tolist()))
    return np.array([totals.get(p, 0) for p in pairs], dtype=np.int64)


def output_shares(input_sizes: Sequence[int], total_output: float) -> np.ndarray:
    """|O_k| = |O| * |D_k| / |D| (CELS 6.4: a share of |O| proportional to the share of |D|)."""
    sizes = np.asarray(input_sizes, dtype=np.float64)
    if np.any(sizes < 0) or sizes.sum() <= 0:
        raise ValueError("party input sizes must be non-negative with a positive sum")
    if total_output < 0:
        raise ValueError(f"total output size must be non-negative, got {total_output}")
    return total_output * sizes / sizes.sum()


def local_sanitize(
    parties: Sequence[SearchLog],
    params: SanitizeParams,
    *,
    total_output: float | None = None,
    progress: bool = False,
) -> tuple[SearchLog, dict]:
    """LS over the party logs; returns (united release, report).

    ``total_output`` = |O| (absolute count) is shared in proportion to |D_k|; without it every
    party applies ``params.output_size`` to itself (a fraction of its own |𝕆_k| or a count).
    A party with no releasable pair (or a zero share) releases nothing.  With ``params.seed``
    party k uses seed + k (reproducible, NOT private).
    """
    if not parties:
        raise ValueError("local sanitization needs at least one party log")
    b = params.validate()
    shares = output_shares([p.size for p in parties], total_output) if total_output is not None else None
    outputs: list[SearchLog] = []
    party_reports: list[dict] = []
    for k, party in enumerate(parties):
        entry: dict = {"party": k + 1, "users": party.n_users, "input_size": party.size}
        cond, _ = build_conditions(party, b, params.min_count, params.cap)
        max_output = max_output_lp(cond)[0] if cond.n else 0.0
        entry["max_output_lp"] = max_output
        output_size = params.output_size
        if shares is not None:
            entry["output_share"] = float(shares[k])
            entry["share_clipped"] = bool(shares[k] > max_output)
            output_size = min(shares[k] / max_output, 1.0) if max_output > 0 else 0.0
        if max_output <= 0 or (output_size is not None and output_size <= 0):
            entry.update(released=False, reason="no releasable pair or a zero output share", output_records=0)
            party_reports.append(entry)
            continue
        seed = None if params.seed is None else params.seed + k
        out, report = sanitize(party, replace(params, output_size=output_size, seed=seed), progress=progress)
        entry.update(released=True, **output_sizes(out), utility=report["utility"])
        entry["privacy"] = report["privacy"]
        outputs.append(out)
        party_reports.append(entry)
    united_input = union_logs(parties)
    output = union_logs(outputs) if outputs else SearchLog([], [], sp.csr_matrix((0, 0), dtype=np.int64), dict(parties[0].source))
    x = pair_counts(output, united_input.pairs)
    universe = apply_cap(united_input.counts, params.cap).sum(axis=0).A1 >= max(params.min_count, 1)
    report = {
        "method": "local",
        "parties": len(parties),
        "b": b,
        "privacy": {
            "epsilon": params.epsilon,
            "delta": params.delta,
            "b": b,
            "bound": params.bound,
            "guarantee": "every party's release is (epsilon, delta)-DP for its users; the users are "
            "disjoint, so the union is (epsilon, delta)-DP (parallel composition)",
            "party_privacy": party_reports[0].get("privacy") if party_reports else None,
        },
        "total_output_requested": total_output,
        "sizes": {
            "users": united_input.n_users,
            "input_size": united_input.size,
            **output_sizes(output),
        },
        "utility": metrics.utility_report(united_input.pair_totals()[universe], x[universe], support=params.support),
        "party_reports": party_reports,
    }
    return output, report
