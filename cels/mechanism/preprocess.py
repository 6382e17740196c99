"""CELS Appendix C: bound the sensitivity of the optimal counts by d before adding noise.

For every user log U_j: solve on D and on D - U_j; if the counts move by more than d in L1
(sum_i |x_i - x'_i| > d), drop U_j and restart on D - U_j.  L1, not the paper's per-pair bound:
Lap(d/eps') on every pair is eps'-DP only for an L1 sensitivity d (a per-pair bound d lets k
pairs move at once and costs k eps').  One solve per user (quadratic in the worst case).  Two exact
savings: a user holding no released variable (only unique or cleaned pairs) leaves the
conditions, the objective weights and |𝕆| unchanged, so it is skipped; and every per-user
problem is built with its dominated rows pruned.  The count function must be deterministic
(sanitize uses the greedy integer step, never the time-limited MIP, when preprocessing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from tqdm import tqdm

from cels.logs.model import SearchLog

log = logging.getLogger(__name__)


def preprocess(
    data: SearchLog,
    counts_of: Callable[[SearchLog], tuple[np.ndarray, np.ndarray]],
    d: float,
    *,
    progress: bool = True,
) -> tuple[SearchLog, dict]:
    """Drop the user logs whose removal moves the optimal counts by more than d in L1.

    ``counts_of(log)`` returns (x over all pairs of ``log``, indices of the pairs that are
    variables).  Returns the kept sub-log and {dropped_users, solves, restarts}.
    """
    if not d > 0:
        raise ValueError(f"sensitivity d must be positive, got {d}")
    kept = np.arange(data.n_users)
    dropped: list[str] = []
    solves = restarts = 0
    while True:
        current = data.select_users(kept)
        x, var_pairs = counts_of(current)
        solves += 1
        holders = np.flatnonzero(np.diff(current.counts[:, var_pairs].tocsr().indptr) > 0)
        bar = tqdm(holders, desc=f"preprocess (pass {restarts + 1})", unit="user", disable=None if progress else True, leave=False)
        culprit = None
        for j in bar:
            without, _ = counts_of(current.select_users(np.delete(np.arange(current.n_users), j)))
            solves += 1
            if np.abs(without - x).sum() > d:
                culprit = int(j)
                break
        bar.close()
        if culprit is None:
            break
        dropped.append(current.users[culprit])
        log.info("preprocess: dropping user %s (moves the counts by more than d = %g in L1)", current.users[culprit], d)
        kept = np.delete(kept, culprit)
        restarts += 1
    return data.select_users(kept), {"dropped_users": len(dropped), "solves": solves, "restarts": restarts}
