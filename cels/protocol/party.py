"""The party role P_k (CELS section 4.2; docs/protocol.md, "How a session lives").

One state machine per session over this party's private log D_k, composed of one phase
machine per phase (cels.protocol.stages): the load and the universe (commutative hashing, P_1's
index), the counts (secure sums, suppression, the constraint rows), phase 3 (the private solve
or the paper's Algorithm 2, chosen once from the options), the sampling and the secure union;
the initiator keeps the output and every node's StepReports (:class:`SessionResult`).  Each
machine is built from the frozen result of the one before it; the role routes each step
message to the running machine through its ``ACCEPTS`` table and moves the phase in one place
(:meth:`PartyRole._moved`).  The row-wise work over the log is the executor's
(cels.protocol.work).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from cels.crypto import paillier
from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, Outgoing, accepts, fail
from cels.protocol.rolebase import SessionRole
from cels.protocol.stages.counts import Counts
from cels.protocol.stages.dp_release import NoisyCounts, histogram_of, release_threshold
from cels.protocol.stages.private import PrivateSolve
from cels.protocol.stages.results import (
    CountsResult, LoadResult, SamplingResult, SessionResult, SolveResult, UnionResult,
)  # fmt: skip
from cels.protocol.stages.sampling import Sampling
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.solve import Solve
from cels.protocol.stages.sums import MaskedSums, PaillierSetup
from cels.protocol.stages.transformed import TransformedSolve
from cels.protocol.stages.union import Union, output_log
from cels.protocol.stages.universe import Load, Universe, commutative_hash
from cels.protocol.wire import cels_pb2
from cels.protocol.work import InProcessWork, ItemBound, PartyWork

SOLVES: dict[str, type[Solve]] = {"private": PrivateSolve, "transformed": TransformedSolve}
"""Phase 3 by the session's ``solve`` option."""
SessionReporter = Callable[[SessionResult], dict]
"""Builds the initiator's session report from its result (a driver's: cels.session_report)."""


def step(handler: Callable[..., list[Outgoing]]) -> Callable[..., list[Outgoing]]:
    """A table row's handler: the running phase machine's ``handler``, then the phase moves
    if the machine has its result."""

    def run(role: PartyRole, sender: str, message) -> list[Outgoing]:
        return role._moved(handler(role.stage, sender, message))

    run.__name__ = handler.__name__
    return run


class PartyRole(SessionRole):
    """P_k for one session.  ``log`` is the private log or a callable that loads it (a load
    failure aborts the session with the loader's message); ``work`` runs the row-wise work over
    it (default: in this process).  ``obfuscators``, ``keypair`` and ``decryption_pool`` are
    the node's Paillier means (cels.protocol.stages.sums.PaillierSetup); ``session_report``
    builds the initiator's ``report`` from its ``session_result``."""

    def __init__(
        self,
        name: str,
        options: SessionOptions,
        log: SearchLog | Callable[[], SearchLog],
        *,
        allow_insecure_key_bits: bool = False,
        obfuscators: Callable[[int], ObfuscatorSource] = InlineObfuscators,
        keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None,
        decryption_pool: Executor | None = None,
        draws: DrawKeys | None = None,
        work: PartyWork | None = None,
        session_report: SessionReporter | None = None,
    ) -> None:
        super().__init__(name, options)
        if name not in self.parties:
            raise ValueError(f"{name!r} is not a party of session {self.session_id!r}")
        self.k = self.parties.index(name)
        self.seat = Seat(name, options, allow_insecure_key_bits)
        self.draws = draws if draws is not None else DrawKeys.fresh()
        bound = ItemBound.of(options)
        self.work: PartyWork = work if work is not None else InProcessWork(log, options.cap, self.draws, bound)
        self.dummies = bound.dummies(self.draws) if bound is not None else []  # the DP release's padding of its id set
        self._hash = commutative_hash(options, self.draws, allow_paper_bits=allow_insecure_key_bits)
        # this party's ChaCha20 stream (docs/crypto.md, Randomness): A_k, F_k, pi_k, the union's
        # shuffles and (as CipherRandom) the noise shares; the draws over its users come from
        # the streams its work indexes by user bucket (cels.protocol.work)
        self._rng = self.draws.stream("party")
        self._solve_class = SOLVES[options.solve]
        setup = PaillierSetup(obfuscators, keypair, decryption_pool)
        # the DP release sums under pairwise masks whatever the solve (it runs none)
        self.sums = MaskedSums(self.seat, self._on_sum_total) if options.release == "dp" else self._solve_class.sum_ring(self.seat, self._on_sum_total, setup)
        self.stage: Stage = Stage(self.seat)  # the running phase machine (none before begin)
        self.loaded: LoadResult | None = None
        self.counted: CountsResult | None = None
        self.solve: Solve | None = None
        self.solved: SolveResult | None = None
        self.sampled: SamplingResult | None = None
        self.united: UnionResult | None = None
        self.reports: list[cels_pb2.StepReport] = []
        self.session_result: SessionResult | None = None
        self._session_report = session_report

    def view_keys(self) -> list:
        return self.sums.view_keys()

    def _begin(self) -> list[Outgoing]:
        return self.sums.begin() + self._moved([], Load(self.seat, self.work))

    def _moved(self, out: list[Outgoing], begin: Stage | None = None) -> list[Outgoing]:
        """The one place the phase moves: the machine ``begin``, or while the running machine
        has its result the next one built from it, is entered and started; the union's result
        ends this party's part."""
        stage = begin
        while stage is not None or (self.stage.result is not None and not self.done):
            stage = stage or self._next(self.stage.result)
            if stage is None:
                self._finish()
                break
            self.stage, stage = stage, None
            self._enter(self.stage.phase)
            out = out + self.stage.start()
        return out

    def _next(self, result) -> Stage | None:
        """The phase machine after the running one (:data:`NEXT`), built from its ``result``,
        which the role keeps (as NEXT says); none after the union (the initiator keeps the output)."""
        keep, then, build = (DP_NEXT if self.options.release == "dp" else NEXT)[self.phase]
        if keep is not None:
            setattr(self, keep, result)
        if build is None:
            if self.name == self.initiator and self.options.release != "dp":  # the DP release comes from the solver
                self.output = output_log(result, self.loaded)
            return None
        stage = build(self, result)
        assert stage.phase is then or (then is None and stage.phase in SOLVE_PHASES), (self.phase, stage.phase)
        return stage

    def _on_sum_total(self, sum_id: str, total: np.ndarray) -> list[Outgoing]:
        return self.stage.on_sum_total(sum_id, total)

    def _on_sum_message(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        return self._moved(self.sums.receive(sender, envelope))

    def _on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        return self._moved(self.sums.on_mask_key(sender, msg))

    # -- the initiator: every node's StepReports, the session's result ------------------------
    def _report(self) -> list[Outgoing]:
        if self.name != self.initiator:
            return super()._report()
        self.reports.extend(self.step_reports())
        self._complete()
        return []

    def _on_step_report(self, sender: str, msg: cels_pb2.StepReport) -> list[Outgoing]:
        if self.name != self.initiator or msg.node != sender:
            raise fail(f"{self.name}: step_report of {msg.node!r} from {sender!r}")
        self.reports.append(msg)
        self._complete()
        return []

    def _on_dp_release(self, sender: str, msg: cels_pb2.DpRelease) -> list[Outgoing]:
        """The initiator: the DP histogram from the solver (cels.protocol.stages.dp_release)."""
        if self.name != self.initiator or sender != self.seat.solver or self.output is not None:
            raise fail(f"{self.name}: dp_release from {sender!r}")
        self.output = histogram_of(msg, release_threshold(self.options))
        self._complete()
        return []

    def _complete(self) -> None:
        """Once the output is in and every node has reported: the session's result (and report)."""
        reported = {r.node for r in self.reports if r.last}  # every StepReport of every node is in
        if self.output is None or reported != set(self.nodes):
            return
        self.session_result = SessionResult(
            self.options, self.output, self.counted, self.solved, self.sampled, tuple(self.reports), self.draws.seeded
        )
        if self._session_report is not None:
            self.report = self._session_report(self.session_result)

    @property
    def finished(self) -> bool:
        """The initiator is finished once it holds the output and every node's report."""
        return self.session_result is not None if self.name == self.initiator else self.done

    ACCEPTS = {
        "universe_hop": accepts(Phase.UNIVERSE, step(Universe.on_hop)),
        "universe_index": accepts(Phase.UNIVERSE, step(Universe.on_index)),
        "sum_key": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "sum_hop": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "sum_result": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "masked_sum_share": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "nlp_key": accepts(Phase.NLP, step(TransformedSolve.on_nlp_key)),
        "nlp_sum_hop": accepts(Phase.NLP, step(TransformedSolve.on_nlp_sum_hop)),
        "nlp_permute_hop": accepts(Phase.NLP, step(TransformedSolve.on_nlp_permute_hop)),
        "nlp_solution": accepts(Phase.NLP, step(TransformedSolve.on_nlp_solution)),
        "mask_key": accepts((Phase.UNIVERSE, Phase.COUNTS, Phase.SOLVE), _on_mask_key),
        "round_verdict": accepts(Phase.SOLVE, step(PrivateSolve.on_round_verdict)),
        "noise_total": accepts(Phase.SOLVE, step(PrivateSolve.on_noise_total)),
        "transcript_digest": accepts(Phase.SOLVE, step(PrivateSolve.on_transcript_digest)),
        "union_encrypt_hop": accepts(Phase.UNION, step(Union.on_message), whole=True),
        "union_decrypt_hop": accepts(Phase.UNION, step(Union.on_message), whole=True),
        "union_result": accepts(Phase.UNION, step(Union.on_message), whole=True),
        "dp_selection": accepts(Phase.COUNTS, step(NoisyCounts.on_dp_selection)),
        "dp_release": accepts(Phase.OVER, _on_dp_release),
        "step_report": accepts((Phase.UNIVERSE, Phase.COUNTS, Phase.NLP, Phase.SOLVE, Phase.SAMPLING, Phase.UNION, Phase.OVER), _on_step_report),
    }
    """Which step message P_k takes in which phase (the initiator also takes StepReports)."""


def _sampling(role: PartyRole, solved: SolveResult) -> Sampling:
    return Sampling(role.seat, role.work, role.sums, role.counted, solved)


def _solve(role: PartyRole, counted: CountsResult) -> Solve:
    role.solve = role._solve_class(role.seat, role.work, role.sums, counted, role._rng)
    return role.solve


SOLVE_PHASES = (Phase.SOLVE, Phase.NLP)
NEXT: dict[Phase, tuple[str | None, Phase | None, Callable[[PartyRole, object], Stage] | None]] = {
    Phase.LOAD: ("loaded", Phase.UNIVERSE, lambda role, r: Universe(role.seat, role.work, role._hash, r, role.dummies)),
    Phase.UNIVERSE: (None, Phase.COUNTS, lambda role, r: Counts(role.seat, role.work, role.sums, r)),  # c^k: to the counts' sum only
    Phase.COUNTS: ("counted", None, _solve),  # the solve mode's phase 3: SOLVE or NLP (SOLVES)
    Phase.SOLVE: ("solved", Phase.SAMPLING, _sampling),  # either solve's result starts the same sampling
    Phase.NLP: ("solved", Phase.SAMPLING, _sampling),
    Phase.SAMPLING: ("sampled", Phase.UNION, lambda role, r: Union(role.seat, role.work, role.counted, r, role._rng)),
    Phase.UNION: ("united", None, None),  # this party's part is over: OVER
}
"""The party's phases in order: when the running phase machine has its result, the role keeps
it (the attribute named; none: only the next phase needs it), and builds the next phase's machine from it.  With ``ACCEPTS`` (which
step message each phase takes) this is the whole machine."""
DP_NEXT: dict[Phase, tuple[str | None, Phase | None, Callable[[PartyRole, object], Stage] | None]] = {
    Phase.LOAD: NEXT[Phase.LOAD],
    Phase.UNIVERSE: (None, Phase.COUNTS, lambda role, r: NoisyCounts(role.seat, role.work, role.sums, r, role.draws)),
    Phase.COUNTS: (None, None, None),  # the items of its kept columns went to the solver: OVER
}
"""The DP release's phases (``--release dp``, cels.protocol.stages.dp_release): the universe,
assembled by the solver, then the noisy counts and the selection; the initiator's release
comes from the solver (``dp_release``)."""
