"""What the solver P_0 learns from the secure NLP -- a runnable demonstration.

spec/protocol.md ("What the solver can learn"): AF has full column rank, so P_0 computes
(AF)^+ [AT | AB] = F^-1 [T | B].  Row j is party P_k's user row ln t_j scaled by 1/f_j, and
its right-hand side is b / f_j: with the public b, P_0 recovers every user's exact ln t row,
G_j * b / h_j, in the permuted column order.  The count row gives every c_i in that order.
Once the output is public, matching the released x_i to the permuted solution undoes the
permutation wherever the x_i differ.  Theorem 4's claim that the transformation hides the
constraints does not hold.

``python -m cels.protocol.leakage`` runs a small session in memory (test-size keys) and
prints, as JSON, how exactly P_0's view reproduces every party's private rows and counts.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import scipy.sparse as sp

from cels.protocol.transform import Recovered


def reconstruct_rows(recovered: Recovered, b: float) -> np.ndarray:
    """P_0's reconstruction of the users' ln t rows: G_j * b / h_j (permuted columns)."""
    return recovered.G * (b / recovered.h)[:, None]


def row_match_error(reconstructed: np.ndarray, true_rows: np.ndarray) -> float:
    """Largest error when matching every true row to its nearest reconstructed row."""
    if true_rows.shape[0] == 0:
        return 0.0
    dist = np.abs(true_rows[:, None, :] - reconstructed[None, :, :]).max(axis=2)
    return float(dist.min(axis=1).max())


def demonstrate(users: int = 40, parties: int = 3) -> dict:
    """Run a session and compare P_0's reconstruction with the parties' private rows."""
    from cels.logs import synthetic_log
    from cels.protocol.session import in_memory_network, make_config, session_hosts, start_session

    log = synthetic_log(seed=5, users=users)
    logs = [log.select_users(np.arange(k, log.n_users, parties)) for k in range(parties)]
    config = make_config(parties, epsilon=8.0, delta=0.9, objective="max-output", key_bits=256, group_bits=1024)
    roles = start_session(in_memory_network(session_hosts(logs, config, allow_insecure_key_bits=True)), config)
    solver = roles[config.solver.name]
    recovered, counts = solver.view
    party_roles = [roles[p.name] for p in config.parties]
    # the composed permutation pi_r(..pi_1(.)..): permuted column j is original column perm[j]
    perm = np.arange(len(party_roles[0].active))
    for role in party_roles:
        perm = perm[role.pi]
    b = party_roles[0].b
    reconstructed = reconstruct_rows(recovered, b)
    true_rows = np.vstack([sp.csr_matrix(role.rows)[:, perm].toarray() for role in party_roles])
    return {
        "constraint_rows": int(true_rows.shape[0]),
        "variables": int(len(perm)),
        "max_abs_error_ln_t": row_match_error(reconstructed, true_rows),
        "counts_recovered_exactly": bool(np.array_equal(counts, party_roles[0].totals[party_roles[0].active][perm])),
    }


def main() -> int:
    json.dump(demonstrate(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
