"""Phase 3 of a party, one interface for two solves (docs/protocol.md, "Private solve", "Transformed solve").

:class:`Solve` is built from the counts' result; it finds the public x (the private greedy
over masked verdicts, :mod:`.private`, or the paper's Algorithm 2, :mod:`.transformed`),
checks this party's exact conditions on it and reports a :class:`SolveResult`.  Which one a
session runs is its ``solve`` option, read once (:data:`SOLVES`); the same class says which
ring runs the session's secure sums (:meth:`Solve.sum_ring`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from cels.crypto.streams import DrawKeys
from cels.protocol.rolebase import RoleFailure
from cels.protocol.stages.results import CountsResult, SolveResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.sums import PaillierSetup, SumRing, SumTotal
from cels.engine.interface import PartyWork


class Solve(Stage, ABC):
    """Phase 3 on one party: ``result`` is the checked x (:class:`SolveResult`)."""

    def __init__(self, seat: Seat, work: PartyWork, sums: SumRing, counts: CountsResult, rng: np.random.Generator) -> None:
        super().__init__(seat)
        self.work, self.sums, self.counts, self.rng = work, sums, counts, rng

    @staticmethod
    @abstractmethod
    def sum_ring(seat: Seat, on_total: SumTotal, setup: PaillierSetup, draws: DrawKeys) -> SumRing:
        """The ring that runs the session's secure sums in this solve's sessions (its masks keyed from ``draws``)."""

    def _solved(self, x: np.ndarray, solver_report: dict, **public) -> None:
        """Check this party's exact conditions on x; then the phase is over."""
        load = self.counts.rows @ x.astype(np.float64)
        b = self.seat.b
        if np.any(load > b):
            raise RoleFailure("the solution breaks one of its conditions", f"the solution breaks one of this party's conditions ({float(load.max()):.6g} > b = {b:.6g})")
        self.result = SolveResult(x, solver_report, **public)
