"""Phase 4 of a party: sampling the output given x (docs/protocol.md, "Sampling").

The exact staged Poisson protocol (each stage's totals through a secure sum, cels.protocol.
sampling) or, with ``sampling = "paper"``, the paper's local sampling (CELS 4.2.2).  The draws
over this party's users are its executor's work.
"""

from __future__ import annotations

import numpy as np

from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, malformed
from cels.engine.sampling import StagedSampler
from cels.protocol.stages.results import CountsResult, SamplingResult, SolveResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.sums import SumRing, sampling_sum
from cels.engine.interface import PartyWork


class Sampling(Stage):
    """This party's draws; ``result``: :class:`SamplingResult`."""

    phase = Phase.SAMPLING

    def __init__(
        self, seat: Seat, work: PartyWork, sums: SumRing, counts: CountsResult, solved: SolveResult
    ) -> None:
        super().__init__(seat)
        self.work, self.sums, self.counts, self.solved = work, sums, counts, solved
        self.sampler: StagedSampler | None = None

    def start(self) -> list[Outgoing]:
        active, x = self.counts.active, self.solved.x
        totals = self.counts.active_totals
        if self.seat.options.sampling == "paper":
            self.result = SamplingResult(self.work.local_sample(active, totals, x), 0)
            return []
        self.sampler = self.work.sampler(active, totals, x, self.seat.options.sampling_theta)
        return self._next_stage()

    def _next_stage(self) -> list[Outgoing]:
        if self.sampler.done:
            self.result = SamplingResult(self.sampler.result(), self.sampler.stage)
            return []
        _pairs, local = self.sampler.propose()
        return self.sums.start(sampling_sum(self.sampler.stage), local)

    def on_sum_total(self, sum_id: str, total: np.ndarray) -> list[Outgoing]:
        try:
            self.sampler.settle(total)
        except ValueError as exc:
            raise malformed(f"{self.seat.name}: sampling stage totals: {exc}") from None
        return self._next_stage()
