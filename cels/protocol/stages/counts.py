"""Phase 2 of a party: the counts (docs/protocol.md, "Counts").

Secure sums (Algorithm 1, or pairwise masks in the private mode) of the capped count
vectors, then of the indicator "one of my users holds all of pair i" (unique pairs); every
party then applies the same suppression and cleaning (min_count) to the public totals c and
builds its ln t rows over the pairs kept, dominated rows pruned (eqs. 7-8).
"""

from __future__ import annotations

import numpy as np

from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing
from cels.protocol.stages.results import CountsResult, UniverseResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.sums import COUNTS_SUM, UNIQUE_SUM, SumRing
from cels.engine.interface import PartyWork
from cels.engine.routines import smallest


class Counts(Stage):
    """The counts and unique-pair sums; ``result``: :class:`CountsResult`."""

    phase = Phase.COUNTS

    def __init__(self, seat: Seat, work: PartyWork, sums: SumRing, universe: UniverseResult) -> None:
        super().__init__(seat)
        self.work, self.sums, self.n = work, sums, universe.n
        self.local_counts: np.ndarray | None = universe.local_counts  # c^k, until its sum takes it
        self.totals: np.ndarray | None = None  # c, once the counts sum is over

    def start(self) -> list[Outgoing]:
        """The counts' secure sum, which holds c^k until its total is in (nothing else does)."""
        local_counts, self.local_counts = self.local_counts, None
        return self.sums.start(COUNTS_SUM, local_counts)

    def on_sum_total(self, sum_id: str, total: np.ndarray) -> list[Outgoing]:
        if sum_id == COUNTS_SUM:
            self.totals = smallest(total)  # c in a byte or two a pair, kept to the end
            return self.sums.start(UNIQUE_SUM, self.work.held_whole(total))
        unique, c = total > 0, self.totals
        active = np.flatnonzero((c > 0) & ~unique & (c >= self.seat.options.min_count))
        rows = self.work.constraint_rows(active, c[active].astype(np.int64))
        self.result = CountsResult(self.n, c, active, int(np.count_nonzero(unique)), rows)
        return []
