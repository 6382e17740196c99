"""Phase 3, the paper's transformed solve (CELS Algorithm 2; docs/protocol.md, "Transformed solve").

Local ln t rows (the counts' result), eqs. 7-8 (cels.protocol.transform); the one-encryption
ring under P_0's key; per-party column permutation with re-randomisation; the solution
un-permuted in reverse order; every party checks its exact rows on x.
"""

from __future__ import annotations


import numpy as np

from cels.crypto import paillier
from cels.crypto.packing import EncryptedMatrix, Packing, encrypt
from cels.crypto.obfuscators import ObfuscatorSource
from cels.crypto.streams import DrawKeys
from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, fail, malformed
from cels.protocol.rolebase import Overreach
from cels.protocol.stages.results import CountsResult
from cels.protocol.stages.seat import Seat
from cels.protocol.stages.solve import Solve
from cels.protocol.stages.sums import PaillierSetup, PaillierSums, SumTotal
from cels.protocol.transform import agreed_ell, share_packings, transform_constraints
from cels.protocol.wire import cels_pb2, codec
from cels.engine.interface import PartyWork

MAX_SOLUTION_COUNT = 2**53
"""The largest count x_i a solution may give: exact in int64 and in the float64 check of the
conditions (far above any b c_i of a log within docs/formats.md's limits)."""


class TransformedSolve(Solve):
    """P_k's part of Algorithm 2: its encrypted share, the sum and permutation hops, and the
    solution's way back (``pi``: pi_k, this party's column permutation, line 11)."""

    phase = Phase.NLP

    def __init__(self, seat: Seat, work: PartyWork, sums: PaillierSums, counts: CountsResult, rng: np.random.Generator) -> None:
        super().__init__(seat, work, sums, counts, rng)
        self.paillier = sums
        self.nlp_key: paillier.PublicKey | None = None
        self.ell = 0
        self.shape_rows: list[int] = []
        self.share: dict[str, np.ndarray] = {}
        self.packings: dict[str, Packing] = {}
        self.obfuscators: ObfuscatorSource | None = None
        self.summed = False  # this party's share is in the NLP sum
        self.pi: np.ndarray | None = None

    @staticmethod
    def sum_ring(seat: Seat, on_total: SumTotal, setup: PaillierSetup, draws: DrawKeys) -> PaillierSums:
        return PaillierSums(seat, on_total, setup)

    def start(self) -> list[Outgoing]:
        seat = self.seat
        shape = cels_pb2.ConstraintShape(session_id=seat.session_id, party=seat.name, rows=self.counts.rows.shape[0])
        return seat.send(seat.solver, constraint_shape=shape)

    def on_nlp_key(self, sender: str, msg: cels_pb2.NlpKey) -> list[Outgoing]:
        seat, counts = self.seat, self.counts
        seat.expect_sender(sender, seat.solver, "nlp_key")
        if self.nlp_key is not None:
            raise fail(f"{seat.name}: second nlp_key")
        try:
            key = codec.public_key_of(msg.key, allow_insecure_key_bits=seat.allow_insecure_key_bits)
        except ValueError as exc:
            raise malformed(f"{seat.name}: nlp_key: {exc}") from None
        rows, k, r, kept = list(msg.shape_rows), seat.k, seat.r, counts.active_totals
        if len(rows) != r or rows[k] != counts.rows.shape[0] or msg.ell != agreed_ell(sum(rows), seat.options.ell_ratio):
            raise Overreach(f"{seat.name}: nlp_key shapes {rows} / l = {msg.ell} do not fit this party")
        if sum(rows) > kept.sum():  # every row is a user holding one of these records at least
            raise Overreach(
                f"{seat.name}: nlp_key claims {sum(rows)} constraint rows, more than the {int(kept.sum())} "
                "records of the pairs they constrain"
            )
        self.nlp_key, self.ell, self.shape_rows = key, msg.ell, rows
        share = transform_constraints(counts.rows, seat.b, self.ell, self.rng)
        count_row = kept if k == 0 else np.zeros(len(counts.active))
        self.share = {"at": np.vstack([share.at, count_row[None, :]]), "ab": share.ab}
        self.packings = share_packings(key, int(counts.totals.max(initial=1)), seat.b, rows, r)
        self.obfuscators = self.paillier.obfuscators_for(key)
        out = []
        if rows[k]:
            af = encrypt(key, share.af, self.packings["af"], self.obfuscators)
            block = cels_pb2.NlpSlackBlock(session_id=seat.session_id, party=seat.name, af=codec.matrix_message(af))
            out = seat.send(seat.solver, nlp_slack_block=block)
        if k != 0:
            return out
        enc = {w: encrypt(key, self.share[w], self.packings[w], self.obfuscators) for w in ("at", "ab")}
        return out + self._forward_sum(enc, hops=1)

    def _parse_matrices(self, msg, step: str, terms: int, which=("at", "ab")) -> dict[str, EncryptedMatrix]:
        """The encrypted matrices of a hop, checked against the session's shapes and packings."""
        shapes = {"at": (self.ell + 1, len(self.counts.active)), "ab": (self.ell, 1)}
        out = {}
        for w in which:
            shape = shapes[w]
            try:
                enc = codec.matrix_of(getattr(msg, w), self.nlp_key, self.packings[w])
            except ValueError as exc:
                raise malformed(f"{self.seat.name}: {step}.{w}: {exc}") from None
            if (enc.rows, enc.cols) != shape or enc.terms != terms:
                raise malformed(
                    f"{self.seat.name}: {step}.{w} is {enc.rows}x{enc.cols} with {enc.terms} shares, "
                    f"expected {shape[0]}x{shape[1]} with {terms}"
                )
            out[w] = enc
        return out

    def _forward_sum(self, enc: dict, hops: int) -> list[Outgoing]:
        """Next sum hop; after the last share AB goes to P_0 and AT into the permutation ring."""
        seat = self.seat
        protos = {w: codec.matrix_message(e) for w, e in enc.items()}
        if hops < seat.r:
            hop = cels_pb2.NlpSumHop(session_id=seat.session_id, hops=hops, **protos)
            return seat.send(seat.successor, nlp_sum_hop=hop)
        slacks = cels_pb2.NlpSumHop(session_id=seat.session_id, hops=hops, ab=protos["ab"])
        ring = cels_pb2.NlpPermuteHop(session_id=seat.session_id, hops=0, at=protos["at"])
        return seat.send(seat.solver, nlp_sum_hop=slacks) + seat.send(seat.parties[0], nlp_permute_hop=ring)

    def on_nlp_sum_hop(self, sender: str, msg: cels_pb2.NlpSumHop) -> list[Outgoing]:
        """Algorithm 2 line 8: add this party's plaintext share, re-randomise, forward."""
        seat = self.seat
        seat.expect_sender(sender, seat.predecessor, "nlp_sum_hop")
        if self.nlp_key is None or seat.k == 0 or msg.hops != seat.k or self.summed:
            raise fail(f"{seat.name}: nlp_sum_hop after {msg.hops} hops out of order")
        enc = self._parse_matrices(msg, "nlp_sum_hop", terms=seat.k)
        self.summed = True
        enc = {w: e.add_plain(self.share[w]).rerandomize(self.obfuscators) for w, e in enc.items()}
        return self._forward_sum(enc, hops=seat.k + 1)

    def on_nlp_permute_hop(self, sender: str, msg: cels_pb2.NlpPermuteHop) -> list[Outgoing]:
        """Algorithm 2 lines 10-11: permute the variables of AT with pi_k, re-randomise."""
        seat = self.seat
        seat.expect_sender(sender, seat.parties[-1] if seat.k == 0 else seat.predecessor, "nlp_permute_hop")
        if self.nlp_key is None or msg.hops != seat.k or self.pi is not None:
            raise fail(f"{seat.name}: nlp_permute_hop after {msg.hops} permutations out of order")
        at = self._parse_matrices(msg, "nlp_permute_hop", terms=seat.r, which=("at",))["at"]
        self.pi = self.rng.permutation(len(self.counts.active)).astype(np.int64)
        at = at.permute_columns(self.pi).rerandomize(self.obfuscators)
        hop = cels_pb2.NlpPermuteHop(session_id=seat.session_id, hops=seat.k + 1, at=codec.matrix_message(at))
        return seat.send(seat.successor if seat.k < seat.r - 1 else seat.solver, nlp_permute_hop=hop)

    def on_nlp_solution(self, sender: str, msg: cels_pb2.NlpSolution) -> list[Outgoing]:
        """Undo pi_r .. pi_1 in reverse order (Algorithm 2, last line); P_1 shares the result."""
        seat, variables = self.seat, len(self.counts.active)
        final = msg.unpermuted == seat.r
        if final:
            seat.expect_sender(sender, seat.parties[0], "nlp_solution")
            if seat.k == 0:
                raise fail(f"{seat.name}: final nlp_solution sent back to P_1")
        else:
            expected = seat.solver if seat.k == seat.r - 1 else seat.successor
            seat.expect_sender(sender, expected, "nlp_solution")
            if msg.unpermuted != seat.r - 1 - seat.k or self.pi is None:
                raise fail(f"{seat.name}: nlp_solution un-permuted {msg.unpermuted} times out of order")
        x = np.asarray(msg.x, dtype=np.uint64)
        if x.shape != (variables,):
            raise malformed(f"{seat.name}: nlp_solution has {x.shape[0]} counts for {variables} variables")
        if x.size and x.max() > MAX_SOLUTION_COUNT:
            raise Overreach(f"{seat.name}: nlp_solution holds a count {int(x.max())} above {MAX_SOLUTION_COUNT} (2^53)")
        x = x.astype(np.int64)
        out = []
        if not final:
            unpermuted = np.empty_like(x)
            unpermuted[self.pi] = x  # permuted column j was column perm[j]
            x = unpermuted
            step = cels_pb2.NlpSolution(
                session_id=seat.session_id, unpermuted=msg.unpermuted + 1, x=x.tolist(), solver_report=msg.solver_report
            )
            if seat.k > 0:
                return seat.send(seat.predecessor, nlp_solution=step)
            out = seat.send(seat.parties[1:], nlp_solution=step)
        report = {"solve": "transformed", **codec.table_of(msg.solver_report)}
        self._solved(x, report, constraint_rows=tuple(self.shape_rows), ell=int(self.ell))
        return out
