"""What P_0 reconstructs from its recorded view (docs/protocol.md, "What each role sees").

P_0 decrypts AF = [A_1F_1 | ... | A_rF_r], AB and the column-permuted [AT; c] (Algorithm 2
line 12).  AF has full column rank, so

    (AF)^+ [AT | AB] = F^-1 [T | B]

row j of which is user row ln t_j scaled by 1/f_j with right-hand side b/f_j: with the public
b, P_0 has every ln t_ij = G_j b / h_j exactly, in the permuted column order, and the permuted
totals c_i (the count row).  Since ln t_ij = -ln(1 - c_ij / c_i), every c_ij = c_i (1 - e^-ln t)
follows.  The block structure of AF (m_k columns per party, public in NlpKey) even says which
party each user row belongs to.  Once the output O is published, a column whose solution value
x_j is unique among the x matches the one pair of O with that total, which undoes the
permutation there and links the reconstructed rows to real (query, url) pairs.

Everything here reads P_0's recorded view (:mod:`cels.views`) and the published output
only; :func:`ground_truth` and :func:`score` use the parties' state to grade the result.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cels.logs import LoadOptions, load_log, write_log
from cels.logs.model import SearchLog
from cels.logs.records import Pair
from cels.mechanism.conditions import dominant_rows, log_t_rows
from cels.protocol.options import SessionOptions
from cels.protocol.transform import Recovered
from cels.views import load_node_view, record_session


@dataclass
class SolverView:
    """What P_0 decrypted in one session, read back from its recorded view."""

    parties: list[str]
    b: float
    shape_rows: list[int]  # m_k per party (NlpKey)
    af: np.ndarray  # l x m, party blocks in ring order
    ab: np.ndarray  # l
    at: np.ndarray  # l x n, columns permuted
    counts: np.ndarray  # n, the permuted count row
    x: np.ndarray | None  # the permuted solution P_0 returned


def reconstruct_rows(recovered: Recovered, b: float) -> np.ndarray:
    """P_0's reconstruction of the users' ln t rows in Algorithm 2: AF has full column rank, so
    (AF)^+ [AT | AB] = F^-1 [T | B]; row j is a user row ln t_j over 1/f_j with right-hand side
    b / f_j, so G_j * b / h_j is the exact row (permuted columns).  Theorem 4's claim that the
    transformation hides the constraints does not hold (docs/protocol.md)."""
    return recovered.G * (b / recovered.h)[:, None]


def load_solver_view(root: str | Path) -> SolverView:
    """P_0's decrypted matrices from ``root`` (DIR/<session>/<solver>), nothing else."""
    view = load_node_view(root)
    options = SessionOptions.from_config(view.config())
    parties = list(options.parties)

    def first(direction: str, step: str, decoded: str | None = None):
        found = [e for e in view.find(direction, step) if decoded is None or decoded in e["decoded"]]
        if not found:
            raise ValueError(f"{root}: the view has no {step} {direction}" + (f" with {decoded} decoded" if decoded else ""))
        return found[0]

    shape_rows = list(first("sent", "nlp_key").envelope().nlp_key.shape_rows)
    blocks = {e.envelope().nlp_slack_block.party: e.array("af") for e in view.find("received", "nlp_slack_block")}
    missing = [p for p, m in zip(parties, shape_rows) if m and p not in blocks]
    if missing:
        raise ValueError(f"{root}: no decoded slack block of {', '.join(missing)}")
    at = first("received", "nlp_permute_hop", "at").array("at")
    solution = view.find("sent", "nlp_solution")
    return SolverView(
        parties=parties,
        b=options.b,
        shape_rows=shape_rows,
        af=np.hstack([blocks[p] for p, m in zip(parties, shape_rows) if m]),
        ab=first("received", "nlp_sum_hop", "ab").array("ab")[:, 0],
        at=at[:-1],
        counts=np.rint(at[-1]).astype(np.int64),
        x=solution[0].array("x") if solution else None,
    )


@dataclass
class Reconstruction:
    """P_0's reconstruction: every user row's ln t and c_ij (permuted columns) and its party."""

    ln_t: np.ndarray  # m x n
    cells: np.ndarray  # m x n, c_ij
    row_party: list[str]
    counts: np.ndarray
    residual: float


def reconstruct(view: SolverView) -> Reconstruction:
    """(AF)^+ [AT | AB] = F^-1 [T | B]; ln t = G_j b / h_j; c_ij = c_i (1 - exp(-ln t_ij))."""
    rhs = np.column_stack([view.at, view.ab])
    solution, *_ = np.linalg.lstsq(view.af, rhs, rcond=None)
    residual = float(np.linalg.norm(view.af @ solution - rhs) / max(np.linalg.norm(rhs), 1e-300))
    recovered = Recovered(G=solution[:, :-1], h=solution[:, -1], residual=residual)
    ln_t = np.clip(reconstruct_rows(recovered, view.b), 0.0, None)
    cells = np.rint(-view.counts[None, :] * np.expm1(-ln_t)).astype(np.int64)
    row_party = [p for p, m in zip(view.parties, view.shape_rows) for _ in range(m)]
    return Reconstruction(ln_t=ln_t, cells=cells, row_party=row_party, counts=view.counts, residual=residual)


def recover_permutation(x: np.ndarray, output: SearchLog, supports: Sequence[set[int]] = ()) -> dict[int, Pair]:
    """Permuted column -> (query, url) of the published output, by matching counts.

    In exact sampling every column with x_j > 0 is exactly one output pair with total x_j, so
    the candidates of an output pair are the columns with its total.  ``supports`` (the column
    sets of the reconstructed rows) prune further: a pseudonym of the output is one real user,
    whose pairs lie inside one reconstructed row (a pruned row is dominated by a kept one).
    Candidates are narrowed to a fixed point (plus: a column claimed by one pair is not
    another's; a column only one pair can take is that pair's); only certain matches return.
    """
    totals = output.pair_totals()
    by_x: dict[int, set[int]] = defaultdict(set)
    for j, v in enumerate(np.asarray(x)):
        if v > 0:
            by_x[int(v)].add(j)
    cand = {i: set(by_x.get(int(t), ())) for i, t in enumerate(totals)}
    held = [set(output.counts.indices[output.counts.indptr[u] : output.counts.indptr[u + 1]]) for u in range(output.n_users)]
    changed = True
    while changed:
        before = {i: len(c) for i, c in cand.items()}
        for pairs in held if supports else ():
            for i in pairs:
                cand[i] = {j for j in cand[i] if any(j in row and all(cand[k] & row for k in pairs - {i}) for row in supports)}
        fixed = {next(iter(c)): i for i, c in cand.items() if len(c) == 1}
        for i, c in cand.items():
            if len(c) > 1:
                cand[i] = {j for j in c if fixed.get(j, i) == i}
        claims: dict[int, list[int]] = defaultdict(list)
        for i, c in cand.items():
            for j in c:
                claims[j].append(i)
        for j, owners in claims.items():
            if len(owners) == 1 and len(cand[owners[0]]) > 1:  # j must be some pair's: this one
                cand[owners[0]] = {j}
        changed = before != {i: len(c) for i, c in cand.items()}
    return {next(iter(c)): output.pairs[i] for i, c in cand.items() if len(c) == 1}


@dataclass
class Truth:
    """The parties' real rows in P_0's order, to grade the reconstruction."""

    cells: np.ndarray  # m x n, c_ij of the rows P_0 received (permuted columns)
    counts: np.ndarray  # n, permuted c_i
    pairs: list[Pair]  # the pair of every permuted column
    users_with_rows: int  # users holding at least one released-candidate pair


def ground_truth(party_roles: Sequence) -> Truth:
    """Real c_ij of the (pruned) rows each party sent, permuted by pi_r(..pi_1(.)..)."""
    first = party_roles[0].counted
    perm = np.arange(len(first.active))
    for role in party_roles:
        perm = perm[role.solve.pi]  # permuted column j was original column perm[j]
    blocks, users, names = [], 0, {}
    for role in party_roles:
        work, counted = role.work, role.counted
        local = work.log.counts_over(counted.active)
        kept = dominant_rows(log_t_rows(local, counted.active_totals))  # the party's own pruning
        blocks.append(local[kept].toarray()[:, perm])
        users += int(np.count_nonzero(np.diff(local.indptr)))
        names.update(work.log.pair_names(counted.active))
    return Truth(
        cells=np.vstack(blocks),
        counts=first.active_totals[perm],
        pairs=[names[int(first.active[p])] for p in perm],
        users_with_rows=users,
    )


def score(rec: Reconstruction, mapping: dict[int, Pair], x: np.ndarray | None, truth: Truth) -> dict:
    """The issue's three fractions, and what the math says they must be."""
    m, n = truth.cells.shape
    if rec.cells.shape != (m, n):
        raise ValueError(f"reconstruction is {rec.cells.shape}, the parties sent {m} x {n}")
    support = (rec.cells != 0) | (truth.cells != 0)
    exact = (rec.cells == truth.cells) & support
    true_ln_t = -np.log1p(-truth.cells / truth.counts[None, :])
    correct = sum(truth.pairs[j] == pair for j, pair in mapping.items())
    identifiable, released = 0, n
    if x is not None:
        values, freq = np.unique(x, return_counts=True)
        identifiable = int(sum(f for v, f in zip(values, freq) if f == 1 and v > 0))
        released = int(np.count_nonzero(x))
    linked = int(np.count_nonzero(rec.cells[:, sorted(mapping)])) if mapping else 0
    return {
        "rows_recovered_fraction": float(np.mean(np.all(rec.cells == truth.cells, axis=1))) if m else 1.0,
        "cells_recovered_exactly_fraction": float(exact.sum() / max(support.sum(), 1)),
        "permutation_recovered_fraction": correct / released if released else 1.0,
        "constraint_rows": int(m),
        "variables": int(n),
        "cells": int(support.sum()),
        "max_abs_error_ln_t": float(np.abs(rec.ln_t - true_ln_t).max(initial=0.0)),
        "counts_recovered_exactly": bool(np.array_equal(rec.counts, truth.counts)),
        "relative_residual": rec.residual,
        "released_columns": released,
        "columns_identifiable_by_x_fraction": identifiable / released if released else 1.0,
        "misidentified_columns": len(mapping) - correct,
        "linked_cells": linked,
        "users_with_rows_at_solver_fraction": m / max(truth.users_with_rows, 1),
    }


def attack(solver_root: str | Path, output: SearchLog | None) -> tuple[Reconstruction, dict[int, Pair], np.ndarray | None]:
    """The attack proper: P_0's recorded view (and the published output, if any)."""
    view = load_solver_view(solver_root)
    rec = reconstruct(view)
    supports = [set(np.flatnonzero(row).tolist()) for row in rec.cells]
    mapping = recover_permutation(view.x, output, supports) if output is not None and view.x is not None else {}
    return rec, mapping, view.x


def demonstrate(
    log: SearchLog,
    parties: int = 3,
    *,
    epsilon: float = 8.0,
    delta: float = 0.9,
    objective: str = "kl",
    key_bits: int = 2048,
    group_bits: int = 2048,
    allow_insecure_key_bits: bool = False,
    view_dir: str | Path | None = None,
    solve: str = "transformed",
) -> dict:
    """Run a recorded in-memory session (users dealt round-robin to the parties), publish its
    output, run :func:`attack` on P_0's files and grade it with the parties' real rows.  With
    ``solve="private"`` P_0 is the aggregator of the private solve: :func:`private_view_report`
    says what its view holds (no row, so 0 cells)."""
    logs = log.split_by_user(parties)
    config = SessionOptions.create(
        parties, epsilon=epsilon, delta=delta, objective=objective, key_bits=key_bits, group_bits=group_bits, solve=solve
    )
    with tempfile.TemporaryDirectory(prefix="cels-views-") as tmp:
        root = Path(view_dir or tmp)
        roles = record_session(logs, config, root, allow_insecure_key_bits=allow_insecure_key_bits)
        published = root / config.session_id / "output.tsv"  # the release, as anyone reads it
        write_log(roles[config.initiator].output, published, {"format": "histogram"})
        output = load_log(published, LoadOptions("histogram"))
        if solve == "private":
            result = private_view_report(root / config.session_id / config.solver)
        else:
            rec, mapping, x = attack(root / config.session_id / config.solver, output)
            result = score(rec, mapping, x, ground_truth([roles[p] for p in config.parties]))
            result.update(solve="transformed", cells_recovered=round(result["cells_recovered_exactly_fraction"] * result["cells"]))
    result.update(parties=parties, key_bits=key_bits, session=config.session_id, view_dir=str(view_dir) if view_dir else None)
    return result


def private_view_report(solver_root: str | Path) -> dict:
    """What the aggregator of the private solve can reconstruct from its recorded view: it
    received no encrypted matrix and no row, only masked verdict vectors (each uniform mod 2^64)
    and it sent the accepted bits (a function of the published x, docs/security.md)."""
    view = load_node_view(solver_root)
    received: dict[str, int] = defaultdict(int)
    for entry in view.entries:
        if entry.get("direction") == "received":
            received[entry["step"]] += 1
    rows_steps = {"nlp_key", "nlp_sum_hop", "nlp_permute_hop", "nlp_slack_block", "constraint_shape"}
    if rows_steps & set(received) or not received.get("masked_verdicts"):
        raise ValueError(f"{solver_root}: not the view of a private-solve aggregator: {dict(received)}")
    return {
        "solve": "private",
        "rows_recovered_fraction": 0.0,
        "cells_recovered_exactly_fraction": 0.0,
        "permutation_recovered_fraction": 0.0,
        "cells_recovered": 0,
        "solver_received": dict(sorted(received.items())),
        "why": "the private solve sends the solver no constraint row, load, slack or coefficient: only "
        "masked verdict vectors, each uniform without the parties' pairwise seeds, whose sums are the "
        "accepted bits, which the published x determines",
    }
