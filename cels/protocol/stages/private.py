"""Phase 3, the private solve (docs/protocol.md, "Private solve"): the monotone greedy over
masked verdicts (cels.protocol.private_solve), with the session's pairwise masks."""

from __future__ import annotations

import numpy as np

from cels.crypto.streams import CipherRandom, DrawKeys
from cels.mechanism.greedy import ProposalRule
from cels.mechanism.noise import noise_scale
from cels.protocol.aborts import PROTOCOL_ERROR
from cels.protocol.phases import Phase
from cels.protocol.private_solve import PrivateSolveParty
from cels.protocol.roles import Outgoing
from cels.protocol.rolebase import RoleFailure
from cels.protocol.stages.results import CountsResult
from cels.protocol.stages.seat import Seat
from cels.protocol.stages.solve import Solve
from cels.protocol.stages.sums import MaskedSums, PaillierSetup, SumTotal
from cels.protocol.wire import cels_pb2
from cels.engine.interface import PartyWork


class PrivateSolve(Solve):
    """P_k's rounds (``private``: its :class:`PrivateSolveParty`, noise shares from ``rng``)."""

    phase = Phase.SOLVE

    def __init__(self, seat: Seat, work: PartyWork, sums: MaskedSums, counts: CountsResult, rng: np.random.Generator) -> None:
        super().__init__(seat, work, sums, counts, rng)
        options = seat.options
        scale = noise_scale(options.noise_epsilon, options.sensitivity) if options.noise_epsilon is not None else None
        self.private = PrivateSolveParty(
            seat.name, seat.parties, seat.solver, seat.session_id, noise_scale=scale, rng=CipherRandom(generator=rng),
            masks=sums.masks, verdicts=work.verdicts,
        )  # fmt: skip

    @staticmethod
    def sum_ring(seat: Seat, on_total: SumTotal, setup: PaillierSetup, draws: DrawKeys) -> MaskedSums:
        return MaskedSums(seat, on_total, draws)

    def start(self) -> list[Outgoing]:
        options, c = self.seat.options, self.counts.totals
        size = round(options.output_size) if options.output_size is not None else None
        kept = self.counts.active_totals
        frequent = kept / c.sum() >= options.support if options.objective == "frequent" else None
        rule = ProposalRule(options.objective, kept, options.round_batch, size, frequent)
        return self._progress(self.private.start(rule, self.counts.rows, self.seat.b))

    def on_round_verdict(self, sender: str, msg: cels_pb2.RoundVerdict) -> list[Outgoing]:
        return self._progress(self.private.on_round_verdict(sender, msg))

    def on_noise_total(self, sender: str, msg: cels_pb2.NoiseTotal) -> list[Outgoing]:
        return self._progress(self.private.on_noise_total(sender, msg))

    def on_transcript_digest(self, sender: str, msg: cels_pb2.TranscriptDigest) -> list[Outgoing]:
        self.private.on_transcript_digest(sender, msg)
        return self._progress([])

    def _progress(self, out: list[Outgoing]) -> list[Outgoing]:
        """Once the rounds ended (no proposal left) and every party's verdict transcript agrees
        (private_solve step 6), x is public: check it.  Transcripts that differ abort the
        session blaming the aggregator, with a reason that names no party."""
        private, options = self.private, self.seat.options
        if not private.done or self.result is not None:
            return out
        out = out + private.send_digest()
        agreed = private.agreement()
        if agreed is None:
            return out
        if not agreed:
            raise RoleFailure("verdict transcripts differ", private.disagreement(), PROTOCOL_ERROR, origin=self.seat.solver)
        report = {
            "solve": "private",
            "objective": options.objective,
            "round_batch": options.round_batch,
            "rounds": private.round,
            "integer_total": int(private.x.sum()),
            **({"output_size": options.output_size} if options.output_size is not None else {}),  # the requested |O|, when asked for
        }
        if private.noise_total is not None:  # CELS App. C, from shares no node chose or saw
            z, first = private.noise_total, private.first_x
            report["noise"] = {
                "noise_epsilon": options.noise_epsilon,
                "sensitivity": options.sensitivity,
                "scale": float(private.noise_scale),
                "how": "sum of every party's Polya share through the masked aggregation (distributed discrete Laplace)",
                "noise_l1": int(np.abs(z).sum()),
                "total_before": int(first.sum()),
                "total_noisy": int(np.maximum(first + z, 0).sum()),
                "total_after_repair": int(private.x.sum()),
            }
        self._solved(private.x.copy(), report)
        return out
