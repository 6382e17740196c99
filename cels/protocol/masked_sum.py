"""The private mode's secure sums by pairwise masks (docs/protocol.md, "Counts").

The same sums as Algorithm 1 (:mod:`cels.protocol.secure_sum`: the counts, the unique-pair
indicators, the sampling stage totals), and the same result -- every party learns the total,
nothing else -- but without Paillier.  Each party P_k sends P_1 (``ring[0]``, the party that
holds Algorithm 1's key in the paper's mode) its vector plus its pairwise masks mod 2^64
(``MaskedSumShare``; :class:`cels.crypto.secure_aggregation.PairwiseMasks`, stream SUMS, one
round number per sum of the session); P_1 adds the r vectors, the masks cancel, and it sends
the total to every other party as a ``SumResult``.

What each party sees (semi-honest, non-colluding): P_1 sees every other party's masked
vector, which is uniform without the seed that party shares with a third (r >= 3; with
r = 2 the total reveals the other vector anyway, as in Algorithm 1); P_2..P_r see only the
total.  Every entry must lie in [0, ``bound``] (all these sums add non-negative counts), so
P_1 refuses a total outside [0, r * bound]: a share that was not a masked vector of the
session.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cels.crypto.secure_aggregation import SUMS, PairwiseMasks, signed
from cels.crypto.paillier import PackingOverflowError
from cels.protocol.roles import Envelope, Outgoing, ProtocolError
from cels.protocol.secure_sum import RingMember
from cels.protocol.wire import cels_pb2


class MaskedSum(RingMember):
    """One party's state in one masked sum ``sum_id`` (the ``round_number``-th of the
    session); ``result`` is the int64 total.  :meth:`start` needs every mask key in."""

    def __init__(
        self,
        *,
        name: str,
        session_id: str,
        sum_id: str,
        ring: Sequence[str],
        values: np.ndarray,
        bound: int,
        masks: PairwiseMasks,
        round_number: int,
    ) -> None:
        super().__init__(name, session_id, ring)
        self.sum_id, self.bound, self.masks, self.round_number = sum_id, bound, masks, round_number
        self.values = np.asarray(values, dtype=np.int64).ravel()
        self.result: np.ndarray | None = None
        self.started = False
        self._received: set[str] = set()  # P_1: the parties whose share is in the running total
        self._running = np.zeros(0, dtype=np.uint64)  # P_1: the shares so far, added mod 2^64
        outside = (self.values < 0) | (self.values > bound)
        if np.any(outside):
            index = int(np.flatnonzero(outside)[0])
            raise PackingOverflowError(f"sum {sum_id!r}: value {self.values[index]} at {index} outside [0, {bound}]")

    @property
    def aggregator(self) -> str:
        return self.ring[0]

    def start(self) -> list[Outgoing]:
        """Mask this party's vector; P_1 keeps its own, the others send theirs to P_1."""
        if self.started:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"sum {self.sum_id!r} started twice")
        self.started = True
        share = self.masks.masked_values(self.values, SUMS, self.round_number)
        if self.name == self.aggregator:
            return self._add(self.name, share)
        msg = cels_pb2.MaskedSumShare(session_id=self.session_id, sum_id=self.sum_id, words=share.astype("<u8").tobytes())
        return [(self.aggregator, self.envelope(masked_sum_share=msg))]

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take a MaskedSumShare (at P_1) or the SumResult (elsewhere)."""
        step = self.check(envelope, sender)
        if step == "masked_sum_share":
            return self._on_share(sender, envelope.masked_sum_share)
        if step == "sum_result":
            return self._on_result(sender, envelope.sum_result)
        raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"masked sum cannot take {step}")

    def _on_share(self, sender: str, msg: cels_pb2.MaskedSumShare) -> list[Outgoing]:
        if self.name != self.aggregator or sender == self.name or sender not in self.ring or sender in self._received:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected MaskedSumShare of {self.sum_id!r} from {sender!r}")
        if len(msg.words) != 8 * len(self.values):
            raise ProtocolError(
                ProtocolError.INVALID_ARGUMENT,
                f"MaskedSumShare of {self.sum_id!r} from {sender!r}: {len(msg.words)} bytes, expected {8 * len(self.values)}",
            )
        return self._add(sender, np.frombuffer(msg.words, dtype="<u8"))

    def _add(self, party: str, share: np.ndarray) -> list[Outgoing]:
        """P_1 adds ``party``'s share to the running total as it arrives (it keeps no share);
        once every share is in, the masks cancel and the total goes to every other party."""
        if self._received:
            self._running += share  # wraps mod 2^64
        else:
            self._running = share.astype(np.uint64)  # a copy: a received share is a message's buffer
        self._received.add(party)
        if len(self._received) < self.r:
            return []
        total, self._running = self._running, self._running[:0]
        self._finish(signed(total), f"masked sum {self.sum_id!r} outside [0, r * bound]: a share was not masked for this sum")
        result = cels_pb2.SumResult(session_id=self.session_id, sum_id=self.sum_id, values=self.result.tolist(), rows=len(total), cols=1)
        return [(p, self.envelope(sum_result=result)) for p in self.others()]

    def _on_result(self, sender: str, msg: cels_pb2.SumResult) -> list[Outgoing]:
        if sender != self.aggregator or self.name == self.aggregator:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected SumResult from {sender!r}")
        if (msg.rows, msg.cols, msg.scale_bits) != (len(self.values), 1, 0) or len(msg.values) != len(self.values):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"SumResult of {self.sum_id!r}: {len(msg.values)} values for {len(self.values)}")
        self._finish(np.array(msg.values, dtype=np.int64), f"SumResult of {self.sum_id!r} outside [0, r * bound]")
        return []

    def _finish(self, total: np.ndarray, refusal: str) -> None:
        """Keep the total, refused (INVALID_ARGUMENT, ``refusal``) outside [0, r * bound]."""
        if np.any((total < 0) | (total > self.r * self.bound)):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, refusal)
        self.result = total
        self.done = True
