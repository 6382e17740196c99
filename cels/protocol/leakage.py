"""What the solver P_0 learns from the secure NLP (spec/protocol.md, "What the solver can learn").

AF has full column rank, so P_0 computes (AF)^+ [AT | AB] = F^-1 [T | B].  Row j is party
P_k's user row ln t_j scaled by 1/f_j, and its right-hand side is b / f_j: with the public b,
P_0 recovers every user's exact ln t row, G_j * b / h_j, in the permuted column order.  The
count row gives every c_i in that order.  Theorem 4's claim that the transformation hides the
constraints does not hold.

The attack itself, from P_0's recorded view, is :mod:`cels.attacks.solver_reconstruction`
(``cels attack solver-reconstruction``); ``python -m cels.protocol.leakage`` runs it on a small
session with test-size keys and prints its JSON.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from cels.protocol.transform import Recovered


def reconstruct_rows(recovered: Recovered, b: float) -> np.ndarray:
    """P_0's reconstruction of the users' ln t rows: G_j * b / h_j (permuted columns)."""
    return recovered.G * (b / recovered.h)[:, None]


def demonstrate(users: int = 40, parties: int = 3) -> dict:
    """The solver-reconstruction attack on a recorded session of the synthetic log (256-bit
    Paillier, 1024-bit group: test-size keys, never for a release)."""
    from cels.attacks.solver_reconstruction import demonstrate as attack
    from cels.logs import synthetic_log

    return attack(
        synthetic_log(seed=5, users=users), parties, epsilon=8.0, delta=0.9, objective="max-output",
        key_bits=256, group_bits=1024, allow_insecure_key_bits=True,
    )  # fmt: skip


def main() -> int:
    json.dump(demonstrate(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
