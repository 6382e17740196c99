"""Secure sum (CELS Algorithm 1) as a sans-I/O sub-protocol.

Ring P_1 -> P_2 -> ... -> P_r -> P_1, P_1 (``ring[0]``) holds the Paillier key:

1. P_1 generates (pk, sk) -- or reuses a key pair it was given -- and sends ``SumKey`` to
   P_2..P_r (Algorithm 1 lines 1-2).
2. P_1 encrypts its packed values and sends ``SumHop(hops=1)`` to P_2 (line 4 for k = 1).
3. P_k (k >= 2) adds its plaintext homomorphically -- a multiplication by (1 + vN), not an
   encryption -- re-randomises every ciphertext and forwards ``SumHop(hops=k)`` (lines 3-5).
4. P_1 decrypts the sum and sends ``SumResult`` to P_2..P_r (line 6).

What each party sees: P_2..P_r see pk and one re-randomised encryption of a partial sum
(semantically secure under the DCR assumption); P_1 sees only the total.  Everyone learns
the total (with r = 2 that reveals the other party's vector, inherent to a sum).  All
parties must agree on ``bound`` and ``scale_bits`` (public session parameters); a value
outside the bound is a :class:`PackingOverflowError` at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.crypto.paillier import DEFAULT_KEY_BITS, CiphertextError, KeySizeError, PrivateKey, PublicKey, generate_keypair
from cels.crypto.packing import EncryptedMatrix, Packing, PackingOverflowError, decrypt_fixed, encrypt
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, step_name
from cels.protocol.wire import cels_pb2, codec

ObfuscatorFactory = Callable[[PublicKey], ObfuscatorSource]


def _inline(public_key: PublicKey) -> ObfuscatorSource:
    return InlineObfuscators(public_key.n)


@dataclass(frozen=True)
class Summand:
    """One party's part in one secure sum, either kind: who it is (``name``), in which session
    and sum, over which ``ring`` of parties, its ``values`` and their ``bound`` (None: signed,
    unbounded, for an outside aggregator)."""

    name: str
    session_id: str
    sum_id: str
    ring: Sequence[str]
    values: np.ndarray
    bound: float | None


class RingMember:
    """Ring bookkeeping shared by the secure sum and the secure union."""

    def __init__(self, name: str, session_id: str, ring: Sequence[str], outsider: bool = False) -> None:
        """``outsider``: ``name`` is a node outside the ring (an aggregator that holds no share)."""
        self.ring = list(ring)
        if (self.ring.count(name) != (0 if outsider else 1)) or len(set(self.ring)) != len(self.ring):
            raise ValueError(f"{name!r} must appear {'nowhere' if outsider else 'exactly once'} in the ring {self.ring}")
        self.name = name
        self.session_id = session_id
        self.index = -1 if outsider else self.ring.index(name)  # an outsider has no place in the ring
        self.done = False

    @property
    def r(self) -> int:
        return len(self.ring)

    def at(self, index: int) -> str:
        """The ring member at ``index`` (mod r)."""
        return self.ring[index % self.r]

    def others(self) -> list[str]:
        return [p for p in self.ring if p != self.name]

    def envelope(self, **step) -> Envelope:
        return cels_pb2.Envelope(session_id=self.session_id, sender=self.name, **step)

    def check(self, envelope: Envelope, sender: str, expected_sender: str | None = None) -> str:
        """Common checks: session id, not finished, expected sender; returns the step name."""
        step = step_name(envelope)
        if envelope.session_id != self.session_id:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"{step} for unknown session {envelope.session_id!r}")
        if self.done:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"{step} after the sub-protocol finished")
        if expected_sender is not None and sender != expected_sender:
            raise ProtocolError(
                ProtocolError.FAILED_PRECONDITION, f"{step} from {sender!r}, expected it from {expected_sender!r}"
            )
        return step


class SecureSum(RingMember):
    """One party's state in one secure sum, identified by ``sum_id``.

    ``values`` is an int vector (counts) or a float matrix; ``result`` has its shape (int64
    when ``scale_bits`` is 0, else float64).  ``keypair`` lets the key holder reuse a key
    across sums; ``obfuscators`` maps the sum's public key to an obfuscator source (e.g. a
    shared :class:`~cels.node.obfuscator_stock.ObfuscatorPool`; default: computed inline);
    ``decryption_pool`` (a process pool) lets the key holder spread its CRT decryptions over
    worker processes (default: in this process).
    """

    def __init__(
        self,
        summand: Summand,
        *,
        scale_bits: int = 0,
        key_bits: int = DEFAULT_KEY_BITS,
        allow_insecure_key_bits: bool = False,
        keypair: tuple[PublicKey, PrivateKey] | None = None,
        obfuscators: ObfuscatorFactory | None = None,
        decryption_pool: Executor | None = None,
        nonnegative: bool = False,
    ) -> None:
        """``nonnegative``: every party's values are >= 0 (counts), so a total below this
        party's own values is refused as forged."""
        super().__init__(summand.name, summand.session_id, summand.ring)
        self.sum_id, bound = summand.sum_id, summand.bound
        if bound is None:
            raise ValueError(f"sum {self.sum_id!r}: a Paillier sum needs a bound on its values")
        self.values = np.asarray(summand.values)
        self.shape = self.values.shape
        self.bound, self.scale_bits = bound, scale_bits
        self.key_bits, self.allow_insecure_key_bits = key_bits, allow_insecure_key_bits
        self._keypair = keypair
        self._obfuscators = obfuscators or _inline
        self._decryption_pool = decryption_pool
        self.nonnegative = nonnegative
        self.public_key: PublicKey | None = None
        self.result: np.ndarray | None = None
        self._pending_hop: tuple[str, Envelope] | None = None
        self._started = False
        low = 0 if nonnegative else -bound
        outside = ~((self.values >= low) & (self.values <= bound))
        if np.any(outside):
            index = tuple(np.argwhere(outside)[0])
            raise PackingOverflowError(f"sum {self.sum_id!r}: value {self.values[index]} at {index} is outside [{low}, {bound}]")

    @property
    def key_holder(self) -> str:
        return self.ring[0]

    def _matrix(self) -> np.ndarray:
        return self.values.reshape(-1, 1) if self.values.ndim == 1 else self.values.reshape(self.values.shape[0], -1)

    def _packing(self, public_key: PublicKey) -> Packing:
        return Packing.for_values(public_key, self.bound, self.r, self.scale_bits)

    def _check_total(self, fixed: np.ndarray, what: str) -> None:
        """The others' part of a total (fixed point) must be a sum of r - 1 values within the bound
        (and >= 0 for a non-negative sum); else the total is forged (e.g. an encryption of 0)."""
        own = np.rint(self._matrix().astype(np.float64) * 2.0**self.scale_bits).astype(np.int64)
        limit = (self.r - 1) * max(1, int(np.ceil(self.bound * 2**self.scale_bits)))
        others = fixed.astype(object) - own.astype(object)  # exact: a forged total may be near 2^63
        low = 0 if self.nonnegative else -limit
        bad = np.argwhere((others < low) | (others > limit))
        if bad.size:
            index = int(np.ravel_multi_index(tuple(bad[0]), fixed.shape))
            raise ProtocolError(
                ProtocolError.INVALID_ARGUMENT,
                f"secure sum {self.sum_id!r}: {what}[{index}] = {int(fixed.flat[index])} is not this party's value plus "
                f"{self.r - 1} others in [{low}, {limit}]",
            )

    def _finish(self, fixed: np.ndarray) -> None:
        values = fixed if self.scale_bits == 0 else fixed.astype(np.float64) / float(2**self.scale_bits)
        self.result = values.reshape(self.shape)
        self.done = True

    def start(self) -> list[Outgoing]:
        """Key holder: send the key and the first (encrypted) hop.  Others need not call it
        (they act on the messages they receive) and get an empty list."""
        if self.name != self.key_holder:
            return []
        if self._started:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"sum {self.sum_id!r} started twice")
        self._started = True
        if self._keypair is None:
            self._keypair = generate_keypair(self.key_bits, allow_insecure_key_bits=self.allow_insecure_key_bits)
        self.public_key = self._keypair[0]
        if self.r == 1:
            self._finish(self._packing(self.public_key).quantize(self._matrix()))
            return []
        key = cels_pb2.SumKey(session_id=self.session_id, sum_id=self.sum_id, key=codec.public_key_message(self.public_key))
        out: list[Outgoing] = [(p, self.envelope(sum_key=key)) for p in self.others()]
        first = encrypt(self.public_key, self._matrix(), self._packing(self.public_key), self._obfuscators(self.public_key))
        return out + [(self.at(1), self._hop(1, first))]

    def _hop(self, hops: int, partial: EncryptedMatrix) -> Envelope:
        hop = cels_pb2.SumHop(session_id=self.session_id, sum_id=self.sum_id, hops=hops, partial=codec.matrix_message(partial))
        return self.envelope(sum_hop=hop)

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take a SumKey, SumHop or SumResult of this sum."""
        step = self.check(envelope, sender)
        message = getattr(envelope, step, None)
        if step not in ("sum_key", "sum_hop", "sum_result"):
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"secure sum cannot take {step}")
        if message.sum_id != self.sum_id or message.session_id != self.session_id:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"{step} for sum {message.sum_id!r}, this is {self.sum_id!r}")
        if step == "sum_key":
            return self._on_key(sender, message)
        if step == "sum_hop":
            return self._on_hop(sender, envelope)
        return self._on_result(sender, message)

    def _on_key(self, sender: str, message: cels_pb2.SumKey) -> list[Outgoing]:
        if sender != self.key_holder or self.name == self.key_holder or self.public_key is not None:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected SumKey from {sender!r}")
        try:
            self.public_key = codec.public_key_of(message.key, allow_insecure_key_bits=self.allow_insecure_key_bits)
        except (KeySizeError, CiphertextError) as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumKey: {exc}") from None
        return self._replay_pending()

    def _replay_pending(self) -> list[Outgoing]:
        """A hop that arrived before the key is processed now."""
        if self._pending_hop is None:
            return []
        sender, envelope = self._pending_hop
        self._pending_hop = None
        return self._on_hop(sender, envelope)

    def _on_hop(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        hop = envelope.sum_hop
        expected_hops = self.r if self.index == 0 else self.index
        if sender != self.at(self.index - 1) or hop.hops != expected_hops:
            raise ProtocolError(
                ProtocolError.FAILED_PRECONDITION,
                f"SumHop(hops={hop.hops}) from {sender!r}: expected hops={expected_hops} from {self.at(self.index - 1)!r}",
            )
        if self.public_key is None:
            if self._pending_hop is not None or self.name == self.key_holder:
                raise ProtocolError(ProtocolError.FAILED_PRECONDITION, "SumHop before the sum started")
            self._pending_hop = (sender, envelope)  # the SumKey is still on its way
            return []
        try:
            partial = codec.matrix_of(hop.partial, self.public_key)
        except CiphertextError as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumHop from {sender!r}: {exc}") from None
        if partial.packing != self._packing(self.public_key) or (partial.rows, partial.cols) != self._matrix().shape:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumHop from {sender!r}: packing or shape differs from the session's")
        if partial.terms != hop.hops:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumHop from {sender!r}: {partial.terms} terms after {hop.hops} hops")
        if self.name == self.key_holder:
            return self._decrypt_and_distribute(partial)
        forward = partial.add_plain(self._matrix()).rerandomize(self._obfuscators(self.public_key))
        return [(self.at(self.index + 1), self._hop(hop.hops + 1, forward))]

    def _decrypt_and_distribute(self, total: EncryptedMatrix) -> list[Outgoing]:
        try:
            fixed = decrypt_fixed(self._keypair[1], total, self._decryption_pool)
        except (CiphertextError, PackingOverflowError) as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"secure sum {self.sum_id!r}: {exc}") from None
        self._check_total(fixed, "sum_hop.partial")
        rows, cols = fixed.shape
        result = cels_pb2.SumResult(
            session_id=self.session_id, sum_id=self.sum_id, values=fixed.ravel().tolist(),
            rows=rows, cols=cols, scale_bits=self.scale_bits,
        )
        self._finish(fixed)
        return [(p, self.envelope(sum_result=result)) for p in self.others()]

    def _on_result(self, sender: str, message: cels_pb2.SumResult) -> list[Outgoing]:
        rows, cols = self._matrix().shape
        if sender != self.key_holder or self.name == self.key_holder:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected SumResult from {sender!r}")
        chunked = message.first or message.more  # a masked sum's total (cels.protocol.masked_sum)
        if (message.rows, message.cols, message.scale_bits) != (rows, cols, self.scale_bits) or len(message.values) != rows * cols or chunked:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumResult shape {message.rows}x{message.cols} differs from {rows}x{cols}")
        fixed = np.array(message.values, dtype=np.int64).reshape(rows, cols)
        self._check_total(fixed, "sum_result.values")
        self._finish(fixed)
        return []
