"""The solver role P_0 (CELS Algorithm 2 lines 2, 12-13; docs/protocol.md phase 3).

P_0 holds no data.  It collects every party's constraint-row count m_k, agrees l, generates
the NLP's Paillier key and sends it (NlpKey) to the parties; it receives the summed, column-
permuted transformed problem from the last party, decrypts it, eliminates the slacks
(:func:`cels.protocol.transform.eliminate_slacks`), solves with the mechanism's solvers, adds
the optional discrete Laplace noise (then repairs feasibility against the transformed
constraints) and returns pi_r(..pi_1(x)..) to the last party.
"""

from __future__ import annotations

from dataclasses import replace
from concurrent.futures import Executor

import numpy as np
import scipy.sparse as sp

from cels.crypto import paillier
from cels.crypto.packing import Packing, decrypt_fixed
from cels.crypto.streams import DrawKeys
from cels.mechanism.conditions import Conditions
from cels.mechanism.noisy_counts import add_noise_and_repair
from cels.mechanism.sanitize import solve_with_params
from cels.protocol.options import SessionOptions
from cels.protocol.private_solve import PrivateSolveAggregator
from cels.protocol.roles import Outgoing, fail, malformed
from cels.protocol.machines import session_charges, solver_machine
from cels.protocol.rolebase import RoleFailure, SessionRole
from cels.protocol.stages.dp_release import DpAggregator
from cels.protocol.stages.universe import index_key_width
from cels.protocol.transform import MAX_ELL, agreed_ell, check_count_row, eliminate_slacks, implied_at_packing, share_packings
from cels.protocol.wire import cels_pb2, codec


class SolverRole(SessionRole):
    """P_0 for one session."""

    def __init__(
        self,
        name: str,
        options: SessionOptions,
        *,
        allow_insecure_key_bits: bool = False,
        keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None,
        decryption_pool: Executor | None = None,
        max_time_limit: float | None = None,
        draws: DrawKeys | None = None,
    ) -> None:
        """``keypair``: the node key (cels.node.keys), else a fresh pair for this session;
        ``decryption_pool``: a process pool for the CRT decryptions (else in this process);
        ``max_time_limit``: the most seconds this node gives the integer step (a node policy:
        a session asking more gets this many); ``draws``: its keys for the session (the DP
        release's padding of the index), fresh by default."""
        super().__init__(name, options, solver_machine(options), session_charges(options))
        if name != self.solver:
            raise ValueError(f"{name!r} is not the solver of session {self.session_id!r}")
        paillier.check_key_bits(options.key_bits, allow_insecure_key_bits=allow_insecure_key_bits)
        self._keypair = paillier.checked_keypair(keypair, options.key_bits)
        time_limit = options.time_limit if max_time_limit is None else min(options.time_limit, max_time_limit)
        self.params = replace(options.params, time_limit=time_limit)
        self._allow_insecure = allow_insecure_key_bits
        self._decryption_pool = decryption_pool
        self.shapes: dict[str, int] = {}
        self.ell = 0
        self.public_key: paillier.PublicKey | None = None
        self._private_key: paillier.PrivateKey | None = None
        self._af: dict[str, np.ndarray] = {}
        self._ab: np.ndarray | None = None
        self._at: np.ndarray | None = None
        self.solve_report: dict = {}
        self._draws = draws
        self._aggregator: PrivateSolveAggregator | None = None
        self.dp: DpAggregator | None = None
        if self.machine.start is not None:
            getattr(self, self.machine.start)()

    def view_keys(self) -> list:
        return [] if self._private_key is None else [self._private_key]

    def _begin(self) -> list[Outgoing]:
        self._enter(self.machine.phases[0])
        return []

    def _start_private(self) -> None:
        """The private solve's aggregator of masked verdicts (cels.protocol.private_solve)."""
        self._aggregator = PrivateSolveAggregator(self.name, self.parties, self.session_id)

    def _start_dp(self) -> None:
        """The DP release's aggregator; ``draws``: the padding of the index (fresh by default)."""
        draws = self._draws if self._draws is not None else DrawKeys.fresh()
        self.dp = DpAggregator(self.name, self.options, index_key_width(self.options, self._allow_insecure), draws)

    # -- the DP release (cels.protocol.stages.dp_release) ----------------------------------------
    def _on_complete_ids(self, sender: str, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        out = self.dp.on_complete_ids(sender, msg)
        if self.dp.n is not None:
            self._advance()
        return out

    def _on_noisy_share(self, sender: str, envelope: cels_pb2.Envelope) -> list[Outgoing]:
        return self.dp.on_share(sender, envelope)

    def _on_dp_items(self, sender: str, msg: cels_pb2.DpItems) -> list[Outgoing]:
        out = self.dp.on_items(sender, msg)
        if out is None:
            return []
        self.solve_report = self.dp.report()
        self._advance()
        return out

    def _on_masked_noise_share(self, sender: str, msg: cels_pb2.MaskedNoiseShare) -> list[Outgoing]:
        """The private solve with noise: sum the parties' masked shares into z, send it to all."""
        return self._aggregator.on_masked_noise_share(sender, msg)

    def _on_masked_verdicts(self, sender: str, msg: cels_pb2.MaskedVerdicts) -> list[Outgoing]:
        """The private solve: sum a round's masked verdicts, send the accepted bits."""
        out = self._aggregator.on_masked_verdicts(sender, msg)
        if self._aggregator.done:
            self.solve_report = {"solve": "private", "rounds": self._aggregator.round, "proposals": self._aggregator.proposals_total}
            self._advance()
        return out

    def _on_constraint_shape(self, sender: str, msg: cels_pb2.ConstraintShape) -> list[Outgoing]:
        """Collect m_k; with all r: key pair, l, NlpKey to P_r .. P_1 (P_1 last, so that every
        party holds the key before P_1's first hop can reach it)."""
        if sender not in self.parties or msg.party != sender:
            raise fail(f"{self.name}: constraint_shape for {msg.party!r} from {sender!r}")
        if sender in self.shapes or self.public_key is not None:
            raise fail(f"{self.name}: second constraint_shape from {sender!r}")
        self.shapes[sender] = msg.rows
        if len(self.shapes) < len(self.parties):
            return []
        rows = [self.shapes[p] for p in self.parties]
        if sum(rows) == 0:
            raise RoleFailure("no party has a constraint row", "no party has a constraint row: no pair is held by two users")
        ell = agreed_ell(sum(rows), self.options.ell_ratio)
        if ell > MAX_ELL:
            raise self.refuse_and_abort(
                f"{self.name}: constraint_shape rows {dict(zip(self.parties, rows))} need l = {ell} rows of A, "
                f"more than the {MAX_ELL} NlpKey.ell holds"
            )
        self.ell = ell
        self.public_key, self._private_key = self._keypair or paillier.generate_keypair(
            self.options.key_bits, allow_insecure_key_bits=self._allow_insecure
        )
        key = cels_pb2.NlpKey(session_id=self.session_id, key=codec.public_key_message(self.public_key), ell=self.ell, shape_rows=rows)
        return self._send(list(reversed(self.parties)), nlp_key=key)

    def _decrypt(
        self, what: str, msg: cels_pb2.EncryptedMatrix, shape: tuple[int, int], terms: int, packing: Packing | None
    ) -> tuple[np.ndarray, Packing]:
        """Parse (in the session's ``packing`` where P_0 knows it), check and decrypt a share sum.

        A sum of ``terms`` honest shares never reaches the packing's limit +-terms * offset (each
        share would have to sit on its bound, docs/crypto.md): an entry there is a forged
        plaintext (e.g. an encryption of 0, whose slots all decode to -terms * offset)."""
        try:
            enc = codec.matrix_of(msg, self.public_key, packing)
        except ValueError as exc:
            raise malformed(f"{self.name}: {what}: {exc}") from None
        if (enc.rows, enc.cols) != shape:
            raise malformed(f"{self.name}: {what} is {enc.rows}x{enc.cols}, expected {shape[0]}x{shape[1]}")
        if enc.terms != terms:
            raise malformed(f"{self.name}: {what} sums {enc.terms} shares, expected {terms}")
        try:
            fixed = decrypt_fixed(self._private_key, enc, self._decryption_pool)
        except ValueError as exc:
            raise malformed(f"{self.name}: {what}: {exc}") from None
        if np.any(np.abs(fixed) >= terms * enc.packing.offset):
            raise malformed(f"{self.name}: {what}: an entry at the packing's limit (+-{terms} x offset): a forged plaintext, not a sum of shares")
        return fixed.astype(np.float64) / float(2**enc.packing.scale_bits), enc.packing

    def _packing(self, which: str) -> Packing:
        """The session's packing of AF or AB (they do not depend on the counts, which P_0 does not know)."""
        rows = [self.shapes[p] for p in self.parties]
        return share_packings(self.public_key, 1, self.b, rows, len(self.parties))[which]

    def _expect_nlp(self, step: str) -> None:
        if self.public_key is None or self._private_key is None:
            raise fail(f"{self.name}: {step} before the NLP key was sent")

    def _on_nlp_slack_block(self, sender: str, msg: cels_pb2.NlpSlackBlock) -> list[Outgoing]:
        """P_k's A_k F_k (its slack columns of AF)."""
        self._expect_nlp("nlp_slack_block")
        if msg.party != sender or sender not in self.parties or sender in self._af or not self.shapes[sender]:
            raise fail(f"{self.name}: unexpected slack block of {msg.party!r} from {sender!r}")
        self._af[sender] = self._decrypt("nlp_slack_block.af", msg.af, (self.ell, self.shapes[sender]), 1, self._packing("af"))[0]
        return self._solve_when_complete()

    def _on_nlp_sum_hop(self, sender: str, msg: cels_pb2.NlpSumHop) -> list[Outgoing]:
        """The summed right-hand side AB from P_r (not permuted)."""
        self._expect_nlp("nlp_sum_hop")
        self._expect_sender(sender, self.parties[-1], "nlp_sum_hop")
        if self._ab is not None or msg.hops != len(self.parties):
            raise fail(f"{self.name}: nlp_sum_hop (hops={msg.hops}) out of order")
        self._ab = self._decrypt("nlp_sum_hop.ab", msg.ab, (self.ell, 1), len(self.parties), self._packing("ab"))[0][:, 0]
        return self._solve_when_complete()

    def _on_nlp_permute_hop(self, sender: str, msg: cels_pb2.NlpPermuteHop) -> list[Outgoing]:
        """AT (and the count row) after every party's column permutation."""
        self._expect_nlp("nlp_permute_hop")
        self._expect_sender(sender, self.parties[-1], "nlp_permute_hop")
        if self._at is not None or msg.hops != len(self.parties):
            raise fail(f"{self.name}: nlp_permute_hop after {msg.hops} of {len(self.parties)} permutations")
        what = "nlp_permute_hop.at"
        try:
            implied = implied_at_packing(codec.packing_of(msg.at.packing), self.public_key, len(self.parties))
        except ValueError as exc:
            raise malformed(f"{self.name}: {what}: {exc}") from None
        at, packing = self._decrypt(what, msg.at, (self.ell + 1, msg.at.cols), len(self.parties), implied)
        try:
            check_count_row(packing, at[-1])
        except ValueError as exc:
            raise malformed(f"{self.name}: {what}: {exc}") from None
        self._at = at
        return self._solve_when_complete()

    def _solve_when_complete(self) -> list[Outgoing]:
        """Algorithm 2 lines 12-13 once AT, AB and every slack block are in: eliminate the
        slacks, solve, add the optional noise, return x (still permuted) to P_r."""
        blocks = [p for p in self.parties if self.shapes[p]]
        if self._at is None or self._ab is None or len(self._af) < len(blocks):
            return []
        at, ab = self._at, self._ab
        af = np.hstack([self._af[p] for p in blocks])
        counts = np.rint(at[-1]).astype(np.int64)
        try:
            recovered = eliminate_slacks(at[:-1], af, ab)
            cond = Conditions(sp.csr_matrix(recovered.G), recovered.h, counts.astype(np.float64))
        except ValueError as exc:
            raise RoleFailure("the transformed problem is unusable", f"transformed problem unusable: {exc}") from None
        self._private_key = None  # this session decrypts nothing else
        params = self.params
        try:
            solution = solve_with_params(cond, params)
        except ValueError as exc:
            raise RoleFailure("the solver failed", f"solver: {exc}") from None
        x = solution.x
        self.solve_report = {**solution.summary(), "residual": recovered.residual, "rows": int(cond.G.shape[0]), "ell": self.ell}
        if params.noise_epsilon is not None:
            x, self.solve_report["noise"] = add_noise_and_repair(cond, x, params.noise_epsilon, params.sensitivity)
        solution_msg = cels_pb2.NlpSolution(
            session_id=self.session_id,
            unpermuted=0,
            x=[int(v) for v in x],
            solver_report=codec.table_message(self.solve_report),
        )
        self._advance()
        return self._send(self.parties[-1], nlp_solution=solution_msg)
