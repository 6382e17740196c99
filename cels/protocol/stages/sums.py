"""The session's secure sums (Algorithm 1, or pairwise masks in the private mode; docs/protocol.md, "Counts").

A party runs one secure sum per vector the protocol sums -- the counts, the unique-pair
indicators, each sampling stage's totals -- under a sum id (:func:`sampling_sum`); the ring that
runs them (:class:`PaillierSums` or :class:`MaskedSums`) is chosen once, with the solve
(cels.protocol.stages.solve), and tells the party each finished sum's total (``on_total``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from abc import ABC, abstractmethod

import numpy as np

from cels.crypto import paillier
from cels.crypto.packing import PackingOverflowError
from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.crypto.streams import DrawKeys
from cels.logs.records import MAX_COUNT
from cels.protocol.masked_sum import MaskedSum
from cels.protocol.phases import Phase
from cels.protocol.private_solve import add_mask_key, mask_key_messages, session_masks
from cels.protocol.roles import Envelope, Outgoing, fail
from cels.protocol.rolebase import RoleFailure
from cels.protocol.secure_sum import SecureSum, Summand
from cels.protocol.stages.seat import Seat
from cels.protocol.wire import cels_pb2

COUNT_BOUND = MAX_COUNT
"""Public packing bound of every party's count and stage-total vectors (secure sums): the
largest pair total a log may hold (docs/formats.md, "Limits")."""
COUNTS_SUM = Phase.COUNTS.value
"""The sum id of the counts c (the wire's ``sum_id``); in the DP release, of the noisy counts n + Z."""
UNIQUE_SUM = "unique"
"""The sum id of the indicators "one of my users holds all of pair i" (bound 1)."""

SumTotal = Callable[[str, np.ndarray], list[Outgoing]]
"""Called with a finished sum's id and total; returns the messages it causes."""


def sampling_sum(stage: int) -> str:
    """The sum id of a sampling stage's totals (cels.protocol.rolebase.phase_of reads it)."""
    return f"{Phase.SAMPLING.value}-{stage}"


@dataclass(frozen=True)
class PaillierSetup:
    """A party node's Paillier means: ``obfuscators`` maps a public key N to its obfuscator
    source (cels.node.keys); ``keypair`` is the node key P_1 sums under (default: fresh for the
    session); ``decryption_pool`` spreads P_1's CRT decryptions over cores."""

    obfuscators: Callable[[int], ObfuscatorSource] = InlineObfuscators
    keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None
    decryption_pool: Executor | None = None


class SumRing(ABC):
    """The secure sums of one session on one party: ``running`` by sum id."""

    def __init__(self, seat: Seat, on_total: SumTotal) -> None:
        self.seat, self.on_total = seat, on_total
        self.running: dict[str, SecureSum | MaskedSum] = {}

    def begin(self) -> list[Outgoing]:
        """Messages at the session's start (none by default)."""
        return []

    def start(self, sum_id: str, vector: np.ndarray, aggregator: str | None = None) -> list[Outgoing]:
        """Join secure sum ``sum_id`` with this party's ``vector``; ``aggregator``: a node
        outside the ring that alone gets the total of signed vectors (the DP release's noisy
        counts: :class:`MaskedSums` only; no total comes back)."""
        bound = None if aggregator is not None else 1 if sum_id == UNIQUE_SUM else COUNT_BOUND
        summand = Summand(self.seat.name, self.seat.session_id, sum_id, self.seat.parties, vector, bound)
        try:
            joined = self._join(summand, aggregator)
        except PackingOverflowError as exc:
            raise RoleFailure("a value exceeds its packing bound", str(exc)) from None
        self.running[sum_id] = joined
        return self._started(sum_id, joined)

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """A secure sum message goes to the running sum of its id."""
        sum_id = getattr(envelope, envelope.WhichOneof("step")).sum_id
        running = self.running.get(sum_id)
        if running is None:
            raise fail(f"{self.seat.name}: message for secure sum {sum_id!r}, which is not running")
        return self._after(sum_id, running, running.receive(sender, envelope))

    def on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        raise fail(f"{self.seat.name}: mask_key in a session that solves with {self.seat.options.solve!r}")

    def view_keys(self) -> list:
        """The Paillier private keys this party holds (cels.views)."""
        return []

    @abstractmethod
    def _join(self, summand: Summand, aggregator: str | None) -> SecureSum | MaskedSum:
        """Join the secure sum of ``summand``: Paillier (Algorithm 1) or masked."""

    @abstractmethod
    def _started(self, sum_id: str, joined: SecureSum | MaskedSum) -> list[Outgoing]:
        """The messages that start a joined sum (a masked sum waits for every mask key)."""

    def _after(self, sum_id: str, running: SecureSum | MaskedSum, out: list[Outgoing]) -> list[Outgoing]:
        """A finished sum's total moves the session on."""
        if running.done and self.running.get(sum_id) is running:
            del self.running[sum_id]
            if running.result is not None:  # None: the total went to an aggregator outside the ring
                out = out + self.on_total(sum_id, np.asarray(running.result).ravel())
        return out


class PaillierSums(SumRing):
    """Algorithm 1: P_1's key (one key pair for the whole session), the ring of hops."""

    def __init__(self, seat: Seat, on_total: SumTotal, setup: PaillierSetup) -> None:
        super().__init__(seat, on_total)
        self.setup = setup
        self.keypair = paillier.checked_keypair(setup.keypair, seat.options.key_bits)
        self._obfuscator_sources: dict[int, ObfuscatorSource] = {}

    def obfuscators_for(self, key: paillier.PublicKey) -> ObfuscatorSource:
        """One obfuscator source per public key for the whole session (a pool is made once)."""
        n = int(key.n)
        if n not in self._obfuscator_sources:
            self._obfuscator_sources[n] = self.setup.obfuscators(n)
        return self._obfuscator_sources[n]

    def view_keys(self) -> list:
        return [] if self.keypair is None else [self.keypair[1]]

    def _join(self, summand: Summand, aggregator: str | None) -> SecureSum:
        if aggregator is not None:
            raise RoleFailure("a signed sum needs pairwise masks", "Algorithm 1's sums have no outside aggregator")
        options, insecure = self.seat.options, self.seat.allow_insecure_key_bits
        if self.seat.k == 0 and self.keypair is None:
            self.keypair = paillier.generate_keypair(options.key_bits, allow_insecure_key_bits=insecure)
        return SecureSum(
            summand, key_bits=options.key_bits, allow_insecure_key_bits=insecure, keypair=self.keypair,
            obfuscators=self.obfuscators_for, nonnegative=True, decryption_pool=self.setup.decryption_pool,
        )  # fmt: skip

    def _started(self, sum_id: str, joined: SecureSum) -> list[Outgoing]:
        return joined.start()


class MaskedSums(SumRing):
    """The private mode's sums by pairwise masks (cels.protocol.masked_sum): the masks are
    the session's (the private solve's verdicts use them too), their keys go out at its start,
    and each sum starts once every mask key is in, with its round number."""

    def __init__(self, seat: Seat, on_total: SumTotal, draws: DrawKeys) -> None:
        super().__init__(seat, on_total)
        self.masks = session_masks(seat.k, seat.r, seat.session_id, draws)
        self.begun = 0  # masked sums so far: each one's mask round number

    def begin(self) -> list[Outgoing]:
        return mask_key_messages(self.masks, self.seat.session_id, self.seat.name, self.seat.parties)

    def on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        add_mask_key(self.masks, self.seat.name, self.seat.parties, sender, msg)
        return self._start_waiting()

    def _join(self, summand: Summand, aggregator: str | None) -> MaskedSum:
        return MaskedSum(summand, masks=self.masks, round_number=self.begun, aggregator=aggregator)

    def _started(self, sum_id: str, joined: MaskedSum) -> list[Outgoing]:
        self.begun += 1
        return self._start_waiting()

    def _start_waiting(self) -> list[Outgoing]:
        """Start every masked sum not yet started, once this party has every mask key."""
        out: list[Outgoing] = []
        if not self.masks.complete:
            return out
        for sum_id, masked in list(self.running.items()):
            if not masked.started and not masked.done:
                out += self._after(sum_id, masked, masked.start())
        return out
