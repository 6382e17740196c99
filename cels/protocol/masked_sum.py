"""The private mode's secure sums by pairwise masks (docs/protocol.md, "Counts").

The same sums as Algorithm 1 (:mod:`cels.protocol.secure_sum`: the counts, the unique-pair
indicators, the sampling stage totals), and the same result -- every party learns the total,
nothing else -- but without Paillier.  Each party P_k sends P_1 (``ring[0]``, the party that
holds Algorithm 1's key in the paper's mode) its vector plus its pairwise masks mod 2^w
(``MaskedSumShare``; :class:`cels.crypto.secure_aggregation.PairwiseMasks`, stream SUMS, one
round number per sum of the session); P_1 adds the r vectors, the masks cancel, and it sends
the total to every other party as a ``SumResult``.  The ring's width w (:func:`ring_bits`: 8,
16, 32 or 64 bits) is the smallest that holds r * bound, public: the masks cancel mod 2^64,
so they cancel mod 2^w, and a share is as uniform mod 2^w -- the unique pairs' indicators go
as a byte an entry, the counts as 8.  Every vector goes in chunks of
:data:`SUM_CHUNK` entries, each masked from its own position in the mask streams, so the
totals are those of whole vectors and no message or mask is ever built for a whole vector.

The DP release (docs/releases.md) sums signed vectors (counts plus noise shares) at the solver,
a node outside the ring with no mask of its own: ``aggregator`` names it, every party sends it
its share, nobody is sent the total, and ``bound`` None means any signed 64-bit entry (w = 64:
no range can be checked, since the noise is unbounded).

What each party sees (semi-honest, non-colluding): P_1 sees every other party's masked
vector, which is uniform without the seed that party shares with a third (r >= 3; with
r = 2 the total reveals the other vector anyway, as in Algorithm 1); P_2..P_r see only the
total.  Every entry must lie in [0, ``bound``] (all these sums add non-negative counts), so
P_1 refuses a total outside [0, r * bound]: a share that was not a masked vector of the
session.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cels.crypto.secure_aggregation import SUMS, PairwiseMasks, signed
from cels.crypto.packing import PackingOverflowError
from cels.engine.routines import chunks
from cels.protocol.chunked import ChunkCursor
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Stream
from cels.protocol.secure_sum import RingMember, Summand
from cels.engine.routines import smallest
from cels.protocol.wire import cels_pb2


SUM_CHUNK = 65_536
"""Entries per MaskedSumShare and per SumResult of a masked sum: every vector goes as
consecutive chunks of at most this many (512 KiB of words, within one transport frame), so no
party builds a whole masked vector or total message at once, and P_1 sends each chunk of the
total as soon as all r shares of it are in.  A multiple of the PRG's block
(cels.crypto.secure_aggregation.PRG_BLOCK_WORDS): a chunk's masks start at its first entry."""


def ring_bits(r: int, bound: int) -> int:
    """The width w of a masked sum's ring Z_{2^w}: the smallest of 8, 16, 32 and 64 bits in
    which a total of r entries in [0, bound] is exact (module doc)."""
    return next(bits for bits in (8, 16, 32, 64) if r * bound < 2**bits or bits == 64)


class MaskedSum(RingMember):
    """One party's state in one masked sum ``sum_id`` (the ``round_number``-th of the
    session); ``result`` is the total, in the smallest unsigned type that holds it (a byte or
    two an entry for the counts of an index of millions of pairs, not the ring's 8).
    :meth:`start` needs every mask key in."""

    def __init__(self, summand: Summand, *, masks: PairwiseMasks | None, round_number: int, aggregator: str | None = None) -> None:
        name, ring, sum_id, bound = summand.name, summand.ring, summand.sum_id, summand.bound
        super().__init__(name, summand.session_id, ring, outsider=aggregator is not None and name == aggregator and aggregator not in ring)
        self.sum_id, self.bound, self.masks, self.round_number = sum_id, bound, masks, round_number
        self._aggregator = aggregator or self.ring[0]  # outside the ring (the solver): sums r shares, sends no total
        self.values = np.asarray(summand.values).ravel()  # its own integer type (an indicator: one byte each), int64 a chunk at a time
        self.result: np.ndarray | None = None
        self.started = False
        n = len(self.values)
        self._word = np.dtype(f"<u{ring_bits(self.r, bound) // 8 if bound is not None else 8}")  # an entry of the ring, on the wire and in the total
        self._running: dict[int, np.ndarray] = {}  # P_1: chunk -> the shares of it so far, added mod 2^w (until all r are in)
        self._shares = np.zeros(len(range(0, max(n, 1), SUM_CHUNK)), dtype=np.int64)  # P_1: shares in, per chunk
        self._total: list[np.ndarray | None] = [None] * len(self._shares)  # the total's chunks so far, each in its smallest type
        self._chunks_in = 0  # chunks of the total complete
        self._cursors: dict[str, ChunkCursor] = {}  # P_1: each party's share so far; elsewhere: P_1's total
        outside = (self.values < 0) | (self.values > bound) if bound is not None else np.zeros(0, dtype=bool)
        if np.any(outside):
            index = int(np.flatnonzero(outside)[0])
            raise PackingOverflowError(f"sum {sum_id!r}: value {self.values[index]} at {index} outside [0, {bound}]")

    @property
    def aggregator(self) -> str:
        return self._aggregator

    @property
    def outside(self) -> bool:
        """The aggregator is outside the ring: it adds r shares of its peers, none of its own."""
        return self._aggregator not in self.ring

    def start(self) -> list[Outgoing | Stream]:
        """Mask this party's vector chunk by chunk: the others send theirs to P_1, each chunk
        masked as the link drains the ones before (cels.protocol.roles.Stream); P_1 adds its
        own to each chunk's running total when a peer's share of it comes in."""
        if self.started:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"sum {self.sum_id!r} started twice")
        self.started = True
        if self.name != self.aggregator:
            if self.outside:  # its share is its whole part: nobody sends it the total
                self.done = True
            return [Stream(self._share_messages())]
        if self.outside:
            return []
        if self.r == 1:  # no peer: each chunk is P_1's own share alone
            for first, stop, _more in chunks(len(self.values), SUM_CHUNK):
                self._add(first, stop)
        return [Stream(self._result_messages())]  # P_1's own share of a chunk is added with the first peer's (:meth:`_add`)

    def _share_messages(self) -> Iterator[list[Outgoing]]:
        """This party's masked vector to P_1, a MaskedSumShare per chunk."""
        for first, stop, more in chunks(len(self.values), SUM_CHUNK):
            share = self.masks.masked_values(self.values[first:stop], SUMS, self.round_number, offset=first)
            msg = cels_pb2.MaskedSumShare(session_id=self.session_id, sum_id=self.sum_id, words=share.astype(self._word).tobytes(), first=first, more=more)
            yield [(self.aggregator, self.envelope(masked_sum_share=msg))]

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take a chunk of a MaskedSumShare (at P_1) or of the SumResult (elsewhere)."""
        step = self.check(envelope, sender)
        if step == "masked_sum_share":
            return self._on_share(sender, envelope.masked_sum_share)
        if step == "sum_result":
            return self._on_result(sender, envelope.sum_result)
        raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"masked sum cannot take {step}")

    def _take(self, what: str, cursor: ChunkCursor, first: int, count: int, more: bool) -> None:
        """A chunk of ``count`` entries from ``first`` on: as many as that chunk of this sum's
        vector has, and ``more`` unless it ends the vector (INVALID_ARGUMENT otherwise), taken
        in place by ``cursor`` (FAILED_PRECONDITION out of place)."""
        n = len(self.values)
        expected = min(SUM_CHUNK, n - first) if first < n else 0
        if count != expected or more != (first + expected < n):
            raise ProtocolError(
                ProtocolError.INVALID_ARGUMENT, f"{what}: {count} entries from {first} on (more = {more}), expected {expected} of the {n}"
            )
        cursor.take(first, count, more)

    def _on_share(self, sender: str, msg: cels_pb2.MaskedSumShare) -> list[Outgoing]:
        if self.name != self.aggregator or sender == self.name or sender not in self.ring or not self.started:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected MaskedSumShare of {self.sum_id!r} from {sender!r}")
        what = f"MaskedSumShare of {self.sum_id!r} from {sender!r}"
        cursor = self._cursors.setdefault(sender, ChunkCursor(what, SUM_CHUNK))
        width = self._word.itemsize
        self._take(what, cursor, msg.first, len(msg.words) // width if len(msg.words) % width == 0 else -1, msg.more)
        self._add(msg.first, cursor.position, np.frombuffer(msg.words, dtype=self._word))
        return []  # the total's chunks go out through P_1's Stream (:meth:`_result_messages`)

    def _add(self, first: int, stop: int, share: np.ndarray | None = None) -> None:
        """P_1 adds a chunk (first..stop) of one party's ``share`` to that chunk's running total as it arrives (it
        keeps no share, and a running total only for the chunks some peer's share of which is
        in and some not: its own share starts it); once all r are, its masks cancel (checked here: a bad share is refused to its
        sender), the chunk of the total is kept compact and :meth:`_result_messages` can send
        it (the last one ends the sum)."""
        chunk = first // SUM_CHUNK
        running = self._running.get(chunk)
        if running is None and self.outside:  # the solver holds no share: a peer's starts the running total
            running = self._running[chunk] = np.zeros(stop - first, dtype=self._word)
        elif running is None:  # a peer's first share of this chunk: P_1's own is the running total's start
            own = self.masks.masked_values(self.values[first:stop], SUMS, self.round_number, offset=first)
            running = self._running[chunk] = own.astype(self._word)  # the low w bits of the 64-bit masked words
            self._shares[chunk] += 1
        if share is not None:
            running += share  # wraps mod 2^w
            self._shares[chunk] += 1
        if self._shares[chunk] < self.r:
            return
        del self._running[chunk]
        total = signed(running) if self._word.itemsize == 8 else running.astype(np.int64)
        if self.bound is None:  # signed entries: the total as it is
            self._total[chunk] = total
            self._chunks_in += 1
            if self._chunks_in == len(self._total):
                self.result, self._total, self.done = np.concatenate([np.zeros(0, dtype=np.int64), *self._total]), [], True
            return
        self._check(total, f"masked sum {self.sum_id!r} outside [0, r * bound]: a share was not masked for this sum")
        self._complete(chunk, total)

    def _result_messages(self) -> Iterator[list[Outgoing] | None]:
        """P_1's SumResults, a chunk of the total to every other party as soon as all r shares
        of it are in (None while they are not: cels.protocol.roles.Stream), each made as the
        link drains the ones before."""
        for c, (first, stop, more) in enumerate(chunks(len(self.values), SUM_CHUNK)):
            while not self.done and self._total[c] is None:
                yield None
            part = self.result[first:stop] if self.done else self._total[c]
            result = cels_pb2.SumResult(
                session_id=self.session_id, sum_id=self.sum_id, words=part.astype(f"<u{part.itemsize}", copy=False).tobytes(), word_bytes=part.itemsize,
                rows=len(self.values), cols=1, first=first, more=more,
            )  # fmt: skip
            yield [(p, self.envelope(sum_result=result)) for p in self.others()]

    def _on_result(self, sender: str, msg: cels_pb2.SumResult) -> list[Outgoing]:
        if sender != self.aggregator or self.name == self.aggregator:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected SumResult from {sender!r}")
        what = f"SumResult of {self.sum_id!r}"
        if (msg.rows, msg.cols, msg.scale_bits) != (len(self.values), 1, 0):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{what}: a {msg.rows}x{msg.cols} total, not {len(self.values)}x1")
        if msg.values or msg.word_bytes not in (1, 2, 4, 8) or len(msg.words) % msg.word_bytes:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{what}: not a chunk of 1, 2, 4 or 8-byte words ({len(msg.words)} bytes of {msg.word_bytes})")
        cursor = self._cursors.setdefault(sender, ChunkCursor(what, SUM_CHUNK))
        total = np.frombuffer(msg.words, dtype=f"<u{msg.word_bytes}")
        if int(total.max(initial=0)) > self.r * self.bound:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{what} outside [0, r * bound]")
        self._take(what, cursor, msg.first, len(total), msg.more)
        self._complete(msg.first // SUM_CHUNK, total)
        return []

    def _check(self, total: np.ndarray, refusal: str) -> None:
        """Refuse (INVALID_ARGUMENT, ``refusal``) a total outside [0, r * bound]."""
        if np.any((total < 0) | (total > self.r * self.bound)):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, refusal)

    def _complete(self, chunk: int, total: np.ndarray) -> None:
        """Chunk ``chunk`` of the total is in, kept in its smallest type; with the last one, the
        chunks together are the result, in the smallest type that holds each."""
        self._total[chunk] = smallest(total)
        self._chunks_in += 1
        if self._chunks_in == len(self._total):
            self.result = np.concatenate([np.zeros(0, dtype=np.uint8), *self._total])
            self._total = []
            self.done = True
