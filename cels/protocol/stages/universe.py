"""Phases 0-1 of a party: the log's load, and the universe (docs/protocol.md, "Universe").

Commutative hashing of the pair ids around the ring (X25519 by default, Pohlig-Hellman as an
option): every party's ids pass every party once; P_1 gets every party's fully hashed ids,
assembles their sorted union (the index of variables) and tells every party its size and the
columns of that party's own ids (CELS section 4.2, Algorithm 3's cipher).

Every list travels in chunks of at most :data:`STREAM_IDS` (docs/protocol.md, "Universe"): a
forwarding party applies its layer to each chunk as it arrives and sends it on before any
chunk of its own, so it never holds a peer's whole list, and an owner has at most
:data:`RING_WINDOW` chunks in the ring (docs/protocol.md, "Flow around the ring").  A
party's own ids are hashed as its first hop drains (``PartyWork.hashed_ids``), their
returned union keys are kept where its work runs (``PartyWork.keep_returned``) and leave
sorted a chunk at a time, and the index's columns go back there: this machine holds no list
of the party's ids.  Ids are fixed-width numpy arrays, not Python bytes.

In the DP release (``--release dp``, docs/releases.md) the solver assembles the index and no
party ever holds a complete set, its own included: the party that applies the last layer to an
owner's ids sends them (their union keys, in the owner's order) to the solver, not back to the
owner, and the solver tells each owner the column of each id in the order it sent them (its
dummy ids, sent last, stay with this machine).  Otherwise the last forwarder could meet the
owner's complete ids with its own and learn which of its pairs the owner holds.
"""

from __future__ import annotations

from collections import deque
import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.ec_hash import ELEMENT_BYTES, X25519Hash
from cels.crypto.groups import group_for_bits
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.mechanism.dp_histogram import padding_shift
from cels.protocol.chunked import ChunkCursor
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.rolebase import Overreach, RoleFailure
from cels.protocol.roles import Outgoing, Stream, fail, malformed
from cels.engine.variable_index import increasing
from cels.protocol.stages.results import UniverseResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.wire import cels_pb2
from cels.engine.interface import LoadResult, PartyWork
from cels.engine.routines import STREAM_IDS, CommutativeHash, chunks, id_array, id_width


RING_WINDOW = 8
"""Chunks of a party's own ids in the ring at once: its first hop sends the next chunk only
while fewer than this many have not come back with every layer (docs/protocol.md, "Flow
around the ring").  So at most r x RING_WINDOW hops are anywhere in the ring, however fast one
party layers and the next one does not; a forwarded hop is never held back (only new ids
wait), so the ring cannot deadlock."""


UNION_KEY_BYTES = 16
"""Bytes of a fully hashed id that its owner keeps and sends P_1, and P_1 keeps for the union
(its first ones): two distinct ids of a session share them with probability about
n^2 / 2^129, the bet the Ray engine's pair digests make too
(cels.engine.routines.PAIR_DIGEST_BYTES); a complete set then takes half the memory and
bytes of X25519's 32-byte ids, and a sixteenth of a 2048-bit Pohlig-Hellman group's."""


def index_padding_bound(options: SessionOptions) -> int:
    """The most dummy columns the index holder adds to the index (the DP release's solver:
    cels.mechanism.dp_histogram.padding_count, at most twice its shift); none otherwise."""
    if not options.release_kind.private_universe:
        return 0
    return 2 * padding_shift(options.item_kinds.total, options.padding_epsilon, options.delta)


def rechunked(parts: Iterable[np.ndarray], size: int) -> Iterator[np.ndarray]:
    """``parts`` (arrays of one dtype, at least one) again as chunks of ``size``, the last maybe
    fewer (one empty chunk if they hold nothing, as :func:`cels.protocol.chunked.chunks` counts
    them), each made as it is asked for."""
    buffered: list[np.ndarray] = []
    held, sent = 0, 0
    for part in parts:
        buffered.append(part)
        held += len(part)
        while held >= size:
            joined = np.concatenate(buffered)
            yield joined[:size]
            buffered, held, sent = [joined[size:]], held - size, sent + 1
    if held or not sent:
        yield np.concatenate(buffered)


def index_key_width(options: SessionOptions, allow_paper_bits: bool = False) -> int:
    """The width of a complete set's keys (:func:`union_keys`) under the session's cipher."""
    width = ELEMENT_BYTES if options.universe_cipher == "x25519" else group_for_bits(options.group_bits, allow_paper_bits=allow_paper_bits).element_bytes
    return min(width, UNION_KEY_BYTES)


def union_keys(ids: np.ndarray) -> np.ndarray:
    """The first :data:`UNION_KEY_BYTES` of each of the :func:`id_array` ``ids`` (all of a
    shorter id), as a fixed-width array that sorts as the ids do."""
    width = ids.dtype.itemsize
    if width <= UNION_KEY_BYTES:
        return ids
    return np.ascontiguousarray(ids.view(np.uint8).reshape(-1, width)[:, :UNION_KEY_BYTES]).view(f"V{UNION_KEY_BYTES}").ravel()


def commutative_hash(options: SessionOptions, draws: DrawKeys, allow_paper_bits: bool = False) -> X25519Hash | PohligHellmanHash:
    """This party's key for the universe phase, from its session's ``draws`` (docs/protocol.md:
    EC by default, PH as an option)."""
    if options.universe_cipher == "x25519":
        return X25519Hash(draws.secret("universe scalar"))
    group = group_for_bits(options.group_bits, allow_paper_bits=allow_paper_bits)
    return PohligHellmanHash(group, CipherRandom(generator=draws.stream("universe exponent")))


class Load(Stage):
    """Load and cap this party's log (its executor's work; a failure aborts the session)."""

    phase = Phase.LOAD

    def __init__(self, seat: Seat, work: PartyWork) -> None:
        super().__init__(seat)
        self.work = work

    def start(self) -> list[Outgoing]:
        try:
            self.result = self.work.load()
        except Exception as exc:  # noqa: BLE001 - any load failure aborts the session (its message stays here)
            raise RoleFailure("cannot load its log", f"cannot load the log: {exc}") from None
        return []


class Universe(Stage):
    """P_k's part of the hash ring, and P_1's index; ``result``: :class:`UniverseResult`."""

    phase = Phase.UNIVERSE

    def __init__(self, seat: Seat, work: PartyWork, cipher: CommutativeHash, loaded: LoadResult, dummies: Sequence[bytes] = ()) -> None:
        """``dummies``: the DP release's dummy ids (encoded), sent after the own pairs' so that
        the set's size is DP; their columns are this machine's, not the work's."""
        super().__init__(seat)
        self.work, self.cipher = work, cipher
        self.width = id_width(cipher)
        self.n_real = loaded.own_pairs  # the work's own pairs
        self.dummies = list(dummies)
        self.n_own = self.n_real + len(self.dummies)  # the ids this party sends
        self.to_solver = seat.options.release_kind.private_universe  # the last layer goes to the solver, not back to the owner (below)
        self.own_columns: list[np.ndarray] = []  # the DP release: the index's columns of its ids, in the order it sent them
        self.key_width = min(self.width, UNION_KEY_BYTES)  # a complete set's ids: union_keys
        self.returned = ChunkCursor(f"{seat.name}: return of its own universe ids", STREAM_IDS)
        self.forwarded: dict[str, ChunkCursor] = {}  # each owner's ids this party layered and sent on
        self.relay: deque[list[Outgoing]] = deque()  # peers' chunks layered, for the ring Stream to send first
        self.complete: dict[str, tuple[ChunkCursor, np.ndarray]] = {}  # P_1: each party's complete ids so far, and the last one
        self.union = work.union(self.key_width) if seat.name == seat.index_holder else None  # P_1: the index, where the work runs
        self.sets_in = 0  # P_1: complete sets merged into it
        self.indexed = ChunkCursor(f"{seat.name}: universe_index", STREAM_IDS)
        self.complete_sent = False  # its sorted complete ids began to leave for P_1 (an index can only follow them)
        self.size: int | None = None  # the index size the first UniverseIndex chunk gave
        self.last_column = -1  # the last column a UniverseIndex chunk gave
        self.ids_seen = self.n_own  # every party's set passes this party: the union has at most this many

    def start(self) -> list[Stream]:
        """This party's hops to its successor, as one Stream (:meth:`_ring`)."""
        return [Stream(self._ring())]

    def _ring(self) -> Iterator[list[Outgoing] | None]:
        """What this party sends its successor in the ring, as the link drains: first the
        peers' chunks it has layered (:meth:`on_hop`: never held back), else the next chunk of
        its own ids if fewer than :data:`RING_WINDOW` of its chunks are out in the ring, else
        nothing yet (the next hop taken asks again); over once its own ids are all sent and
        every peer's have passed it.  Its own ids leave in the order of their keyed digests
        (cels.engine.routines.pair_digests: not the log's order), hashed as the link drains them
        (no list of them all is ever held)."""
        seat = self.seat
        own = self._hops(seat.successor, seat.name, [seat.name], self._own_ids(), self.n_own)
        own_left, sent = True, 0  # own ids in the ring so far
        while True:
            if self.relay:
                yield self.relay.popleft()
            elif own_left and (self.to_solver or sent - self.returned.position < RING_WINDOW * STREAM_IDS):
                hop = next(own, None)
                own_left = hop is not None
                if own_left:
                    sent = min(sent + STREAM_IDS, self.n_own)
                    yield hop
            elif not own_left and all(p in self.forwarded and self.forwarded[p].done for p in seat.parties if p != seat.name):
                return
            else:
                yield None

    def _own_ids(self) -> Iterator[np.ndarray]:
        """The work's hashed own ids, then the dummies' (hashed here), in chunks of STREAM_IDS."""
        real = self.work.hashed_ids(self.cipher, STREAM_IDS)
        if not self.dummies:
            return real
        return rechunked(itertools.chain(real, [id_array(self.cipher.hash(self.dummies), self.width)]), STREAM_IDS)

    def _hops(self, recipient: str, owner: str, applied: list[str], ids: Iterable[np.ndarray], count: int) -> Iterator[list[Outgoing]]:
        """``owner``'s ``count`` ids (layers ``applied``) to ``recipient``: ``ids`` gives them in
        chunks of STREAM_IDS, each taken when its message is asked for (never all built at once)."""
        seat = self.seat
        for (first, stop, more), chunk in zip(chunks(count, STREAM_IDS), ids):
            if len(chunk) != stop - first:
                raise RoleFailure("lost its own universe ids", f"its work gave {len(chunk)} ids for {first}..{stop}")
            hop = cels_pb2.UniverseHop(session_id=seat.session_id, owner=owner, applied=applied, first=first, more=more, ids=chunk.tobytes())
            yield seat.send(recipient, universe_hop=hop)

    def on_hop(self, sender: str, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        seat, applied = self.seat, list(msg.applied)
        parties, r = seat.parties, seat.r
        if msg.owner not in parties or not applied or applied[0] != msg.owner or len(set(applied)) != len(applied):
            raise malformed(f"{seat.name}: universe_hop owner/applied inconsistent")
        if len(applied) < r:  # forward this chunk with this party's layer
            seat.expect_sender(sender, seat.predecessor, "universe_hop")
            if seat.name in applied or applied != [parties[(parties.index(msg.owner) + t) % r] for t in range(len(applied))]:
                raise fail(f"{seat.name}: universe_hop of {msg.owner} arrived out of ring order")
            cursor = self.forwarded.setdefault(msg.owner, ChunkCursor(f"{seat.name}: universe_hop of {msg.owner}", STREAM_IDS))
            ids = self._chunk_ids(msg, cursor, self.width)
            self.ids_seen += len(ids)
            try:
                ids = self.work.apply_layer(self.cipher, ids)
            except CommutativeCipherError as exc:
                raise malformed(f"{seat.name}: universe_hop: {exc}") from None
            last = self.to_solver and len(applied) == r - 1  # the DP release: complete ids go to the solver, never back to their owner
            hop = cels_pb2.UniverseHop(
                session_id=seat.session_id, owner=msg.owner, applied=[*applied, seat.name], ids=(union_keys(ids) if last else ids).tobytes(),
                first=msg.first, more=msg.more,
            )  # fmt: skip
            self.relay.append(seat.send(seat.index_holder if last else seat.successor, universe_hop=hop))  # sent by the ring Stream, before any own chunk
            return []
        if self.to_solver:
            raise fail(f"{seat.name}: complete universe ids of {msg.owner} from {sender} (the solver takes them in the DP release)")
        if msg.owner == seat.name:  # a chunk of my own ids, every layer applied, in the order I sent them
            seat.expect_sender(sender, seat.predecessor, "universe_hop")
            return self._returned(msg)
        if seat.name != seat.index_holder or sender != msg.owner:
            raise fail(f"{seat.name}: complete universe ids of {msg.owner} from {sender}")
        return self._complete(msg)

    def _returned(self, msg: cels_pb2.UniverseHop) -> list[Outgoing | Stream]:
        """A chunk of this party's own ids is back: the work keeps their :func:`union_keys`;
        once all are, P_k sends them sorted to P_1, a chunk at a time as the link drains."""
        seat, n = self.seat, self.n_own
        ids = union_keys(self._chunk_ids(msg, self.returned, self.width))
        if self.returned.position > n or (self.returned.done and self.returned.position != n):
            raise malformed(f"{self.returned.what}: {self.returned.position} ids so far, it sent {n}")
        self.work.keep_returned(msg.first, ids)
        if msg.more:
            return []
        keys = self.work.sorted_returned(STREAM_IDS)
        if seat.name != seat.index_holder:
            return [Stream(self._hops(seat.index_holder, seat.name, list(msg.applied), self._leaving(keys), n))]
        last = np.zeros(0, dtype=f"V{self.key_width}")
        for chunk in keys:
            if not increasing(chunk, last):  # P_1's own come back in the order they left, not sorted
                raise malformed(f"{self.returned.what}: two of its ids came back equal")
            self.union.add(seat.name, chunk)
            last = chunk[-1:]
        return self._collect(seat.name)

    def _leaving(self, keys: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """The sorted complete ids as they leave for P_1, marking that they began to."""
        for chunk in keys:
            self.complete_sent = True
            yield chunk

    def _complete(self, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        """P_1: a chunk of another party's complete ids, sorted and distinct across chunks; at
        most as many as passed P_1 on that party's ring (checked against its forwarded count)."""
        seat, owner = self.seat, msg.owner
        passed = self.forwarded.get(owner)
        if passed is None or not passed.done:
            raise fail(f"{seat.name}: complete universe ids of {owner} before its ids passed {seat.name}")
        cursor, last = self.complete.get(owner) or (ChunkCursor(f"{seat.name}: complete universe ids of {owner}", STREAM_IDS), None)
        keys = self._chunk_ids(msg, cursor, self.key_width)
        if cursor.position > passed.position or (cursor.done and cursor.position != passed.position):
            raise malformed(f"{cursor.what}: {cursor.position} ids so far, {passed.position} passed {seat.name}")
        if not increasing(keys, last if last is not None else keys[:0]):
            raise malformed(f"{cursor.what} are not sorted and distinct")
        self.complete[owner] = cursor, (keys[-1:].copy() if len(keys) else last)  # not a view of the whole message
        self.union.add(owner, keys)
        if msg.more:
            return []
        return self._collect(owner)

    def _chunk_ids(self, msg: cels_pb2.UniverseHop, cursor: ChunkCursor, width: int) -> np.ndarray:
        """A chunk's ids, each of ``width`` bytes (the cipher's; a complete set's union keys),
        packed in ``msg.ids``, taken in place by ``cursor``."""
        if len(msg.ids) % width:
            raise malformed(f"{cursor.what}: {len(msg.ids)} bytes of ids, not a whole number of {width}-byte ids")
        ids = np.frombuffer(msg.ids, dtype=f"V{width}")
        cursor.take(msg.first, len(ids), msg.more)
        return ids

    def _collect(self, owner: str) -> list[Outgoing | Stream]:
        """P_1: ``owner``'s set of fully hashed ids (their :func:`union_keys`, sorted, as every
        owner keeps and sends them; P_1's own sorted here) is whole, and merged into the sorted
        union (the index of variables) where the work runs (cels.engine.variable_index); with
        every set in, P_1 tells every party the index size and the columns of that party's own
        ids, in the sorted order it sent them (docs/protocol.md).  Each set arrives once (its
        chunks' cursor refuses a second)."""
        seat = self.seat
        self.union.complete(owner)
        self.sets_in += 1
        if self.sets_in < seat.r:
            return []
        n = self.union.size()
        for first, stop, _more in chunks(self.n_own, STREAM_IDS):
            self.work.place_columns(n, first, self.union.columns(seat.name, first, stop))
        self.result = UniverseResult(n, self.work.index(n))
        return [Stream(self._index_messages(n))]

    def _index_messages(self, n: int) -> Iterator[list[Outgoing]]:
        """P_1's UniverseIndex chunks to every other party, each party's columns asked of the
        union as the link drains the chunks before; the union is closed after the last."""
        seat = self.seat
        for party in seat.parties:
            if party == seat.name:
                continue
            for first, stop, more in chunks(self.complete[party][0].position, STREAM_IDS):
                columns = self.union.columns(party, first, stop)
                index = cels_pb2.UniverseIndex(session_id=seat.session_id, size=n, columns=columns.tolist(), first=first, more=more)
                yield seat.send(party, universe_index=index)
        self.union.close()

    def on_index(self, sender: str, msg: cels_pb2.UniverseIndex) -> list[Outgoing]:
        """A chunk of the index size and the columns of this party's ids, in the sorted order it
        sent them (strictly increasing across chunks)."""
        seat, n = self.seat, self.n_own
        seat.expect_sender(sender, seat.index_holder, "universe_index")
        if not self.returned.done and not self.to_solver:
            raise fail(f"{seat.name}: universe_index before its own ids came back")
        if not self.complete_sent and not self.to_solver:  # P_1 cannot have indexed a set it has not seen: no session goes on from it
            raise Overreach(f"{seat.name}: universe_index before its complete ids left for {seat.index_holder}")
        self.indexed.take(msg.first, len(msg.columns), msg.more)
        most = self.ids_seen + index_padding_bound(seat.options)
        if msg.size > most:
            raise malformed(f"{seat.name}: universe_index of {msg.size} pairs, more than the {most} ids of all parties and the padding")
        if self.size is not None and msg.size != self.size:
            raise malformed(f"{seat.name}: universe_index: index size {msg.size}, an earlier chunk said {self.size}")
        self.size, stop = msg.size, self.indexed.position
        if stop > n or (self.indexed.done and stop != n):
            raise malformed(f"{seat.name}: universe_index: {stop} columns for {n} ids")
        by_id = np.asarray(msg.columns, dtype=np.int64)
        if self.to_solver:
            return self._dp_index(int(msg.size), msg.first, by_id, msg.more)
        if np.any(np.diff(np.concatenate([[self.last_column], by_id])) <= 0) or (len(by_id) and by_id[-1] >= msg.size):
            raise malformed(
                f"{seat.name}: universe_index: columns {msg.first}..{stop} of {n} ids "
                f"not strictly increasing below the index size {msg.size}"
            )
        self.work.place_columns(int(msg.size), msg.first, by_id)
        self.last_column = int(by_id[-1]) if len(by_id) else self.last_column
        if msg.more:
            return []
        self.result = UniverseResult(int(msg.size), self.work.index(int(msg.size)))
        return []

    def _dp_index(self, n: int, first: int, columns: np.ndarray, more: bool) -> list[Outgoing]:
        """The DP release: the columns of this party's ids in the order it sent them (it never
        saw them with every layer); its own pairs' go to the work, its dummies' (the last it
        sent) stay here.  Distinct and below the index size, or the index is malformed."""
        seat = self.seat
        if len(columns) and (columns.min() < 0 or columns.max() >= n):
            raise malformed(f"{seat.name}: universe_index: a column outside the index of {n}")
        real = max(0, min(len(columns), self.n_real - first))
        if real:
            self.work.place_sent_columns(n, first, columns[:real])
        self.own_columns.append(columns)
        if more:
            return []
        every = np.concatenate(self.own_columns)
        if len(np.unique(every)) != len(every):
            raise malformed(f"{seat.name}: universe_index gives two of its ids one column")
        self.result = UniverseResult(n, self.work.index(n), padding_columns=np.sort(every[self.n_real :]), own_columns=np.sort(every[: self.n_real]))
        return []
