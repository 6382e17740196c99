"""The party role P_k (CELS section 4.2; docs/protocol.md, "How a session lives").

One state machine per session over this party's private log D_k, composed of one phase
machine per phase (cels.protocol.stages): the load and the universe (commutative hashing, P_1's
index), the counts (secure sums, suppression, the constraint rows), phase 3 (the private solve
or the paper's Algorithm 2, chosen once from the options), the sampling and the secure union,
or the DP release's noisy counts; the initiator keeps the output and every node's StepReports
(:class:`SessionResult`).  Each machine is built from the frozen result of the one before it;
the role routes each step message to the running machine through its table
(cels.protocol.machines) and moves the phase in one place (:meth:`PartyRole._moved`).  The row-wise work over the log is the executor's
(cels.engine.interface).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from concurrent.futures import Executor

import numpy as np

from cels.crypto import paillier
from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, Outgoing, fail
from cels.protocol.machines import party_machine, session_charges
from cels.protocol.rolebase import SessionRole
from cels.protocol.stages.dp_release import histogram_of, release_threshold
from cels.engine.interface import LoadResult
from cels.protocol.stages.results import CountsResult, SamplingResult, SessionResult, SolveResult, UnionResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.solve import Solve
from cels.protocol.stages.sums import PaillierSetup
from cels.protocol.stages.union import output_log
from cels.protocol.stages.universe import commutative_hash
from cels.protocol.wire import cels_pb2
from cels.engine.inprocess import in_process_work
from cels.engine.interface import PartyWork
from cels.engine.routines import ItemBound

SessionReporter = Callable[[SessionResult], dict]
"""Builds the initiator's session report from its result (a driver's: cels.session_report)."""


class PartyRole(SessionRole):
    """P_k for one session.  ``log`` is the private log or a callable that loads it (a load
    failure aborts the session with the loader's message); ``work`` runs the row-wise work over
    it (default: in this process).  ``obfuscators``, ``keypair`` and ``decryption_pool`` are
    the node's Paillier means (cels.protocol.stages.sums.PaillierSetup); ``session_report``
    builds the initiator's ``report`` from its ``session_result``; ``keeping`` wraps its universe
    and union keys (the node's cache of their results, for a re-run)."""

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
        keeping: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(name, options, party_machine(options), session_charges(options))
        if name not in self.parties:
            raise ValueError(f"{name!r} is not a party of session {self.session_id!r}")
        self.k = self.parties.index(name)
        self.seat = Seat(name, options, allow_insecure_key_bits)
        self.draws = draws if draws is not None else DrawKeys.fresh()
        bound = ItemBound.of(options)
        self.work: PartyWork = work if work is not None else in_process_work(log, options.cap, self.draws, bound)
        self.dummies = bound.dummies(self.draws) if bound is not None else []  # the DP release's padding of its id set
        self._hash = commutative_hash(options, self.draws, allow_paper_bits=allow_insecure_key_bits)
        self.keeping = keeping  # the node keeps its keys' results for a re-run (cels.node.hash_cache)
        if keeping is not None:
            self._hash = keeping(self._hash)
        # this party's ChaCha20 stream (docs/crypto.md, Randomness): A_k, F_k, pi_k, the union's
        # shuffles and (as CipherRandom) the noise shares; the draws over its users come from
        # the streams its work indexes by user bucket (cels.engine.interface)
        self._rng = self.draws.stream("party")
        self.sums = self.machine.ring(self.seat, self._on_sum_total, PaillierSetup(obfuscators, keypair, decryption_pool), self.draws)
        self.stage: Stage = Stage(self.seat)  # the running phase machine (none before begin)
        self.solve: Solve | None = None  # phase 3's machine, kept after its phase (its views: cels.attacks)
        self.loaded: LoadResult | None = None
        self.counted: CountsResult | None = None
        self.solved: SolveResult | None = None
        self.sampled: SamplingResult | None = None
        self.united: UnionResult | None = None
        self.reports: list[cels_pb2.StepReport] = []
        self.session_result: SessionResult | None = None
        self._session_report = session_report

    def view_keys(self) -> list:
        return self.sums.view_keys()

    def _begin(self) -> list[Outgoing]:
        return self.sums.begin() + self._moved([], self.machine.phases[0])

    def _moved(self, out: list[Outgoing], begin: Phase | None = None) -> list[Outgoing]:
        """The one place the phase moves, by the machine's table: the phase ``begin``, or
        while the running phase machine has its result the row's next phase, is entered, its
        machine built from that result and started; a row with no next phase ends this
        party's part (the sampled release's initiator then holds the output)."""
        then, result = begin, None
        while then is not None or (self.stage.result is not None and not self.done):
            if then is None:
                row, result = self.machine.rows[self.phase], self.stage.result
                if row.keep is not None:
                    setattr(self, row.keep, result)
                if row.then is None:
                    if self.name == self.initiator and self.united is not None:
                        self.output = output_log(self.united, self.loaded)
                    self._finish()
                    break
                then = row.then
            self.stage = self.machine.rows[then].build(self, result)
            assert self.stage.phase is then, (then, self.stage.phase)
            self._enter(then)
            then = None
            out = out + self.stage.start()
        return out

    def kept_solve(self, solve: Solve) -> Solve:
        """Phase 3's machine, which the party keeps after its phase (what it saw: cels.attacks)."""
        self.solve = solve
        return solve

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
