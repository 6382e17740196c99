"""The frozen result of every phase of a party's session (docs/protocol.md, "How a session lives").

Each phase machine of :mod:`cels.protocol.stages` is built from the result of the phase before
it and reports its own; the initiator's :class:`SessionResult` is what the drivers build the
session report from (cels.session_report).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from cels.logs.model import SearchLog
from cels.protocol.options import SessionOptions
from cels.protocol.wire import cels_pb2


@dataclass(frozen=True)
class UniverseResult:
    """The index: ``n`` pairs in the universe; this party's counts c^k over them; the DP
    release: the columns of this party's dummy ids and of its own pairs (sorted)."""

    n: int
    local_counts: np.ndarray
    padding_columns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    own_columns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class CountsResult:
    """The public totals c (after the cap; in the smallest unsigned type that holds them, as
    the index is millions of pairs), the pairs kept (not unique, cleaned: ``active``), how many
    pairs were unique, and this party's constraint rows over the active pairs."""

    n: int
    totals: np.ndarray
    active: np.ndarray
    unique_pairs: int
    rows: sp.csr_matrix

    @property
    def active_totals(self) -> np.ndarray:
        """c over the active pairs, int64 (what the solve and the sampling compute with)."""
        return self.totals[self.active].astype(np.int64)


@dataclass(frozen=True)
class SolveResult:
    """The public x over the active pairs, checked against this party's rows, and the
    solver's report; the transformed solve also makes every party's number of constraint rows
    and l public (``constraint_rows``, ``ell``)."""

    x: np.ndarray
    solver_report: dict
    constraint_rows: tuple[int, ...] | None = None
    ell: int | None = None


@dataclass(frozen=True)
class SamplingResult:
    """x_ij drawn for this party's users over the active pairs, and the sampling's stages."""

    sampled: sp.csr_matrix
    stages: int


@dataclass(frozen=True)
class UnionResult:
    """The secure union's records (every party's encoded (user, query, url, count))."""

    records: tuple[bytes, ...]


@dataclass(frozen=True)
class SessionResult:
    """What the initiator holds at the end of a session: the output log, the public results
    of every phase and every node's StepReports; ``seeded``: the initiator's draws were
    replayed from a seed (then the release is not private)."""

    options: SessionOptions
    output: SearchLog
    counts: CountsResult
    solved: SolveResult
    sampled: SamplingResult
    step_reports: tuple[cels_pb2.StepReport, ...]
    seeded: bool
