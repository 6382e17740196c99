"""Phases 0-1 of a party: the log's load, and the universe (docs/protocol.md, "Universe").

Commutative hashing of the pair ids around the ring (X25519 by default, Pohlig-Hellman as an
option): every party's ids pass every party once; P_1 gets every party's fully hashed ids,
assembles their sorted union (the index of variables) and tells every party its size and the
columns of that party's own ids (CELS section 4.2, Algorithm 3's cipher).

Every list travels in chunks of at most :data:`STREAM_IDS` (docs/protocol.md, "Universe"): a
forwarding party applies its layer to each chunk as it arrives and sends it on, so it never
holds a peer's whole list; the ids a party keeps are fixed-width numpy arrays, not Python bytes.
"""

from __future__ import annotations

import numpy as np

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.groups import group_for_bits
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.protocol.chunked import ChunkCursor, chunks
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, fail, malformed
from cels.protocol.rolebase import RoleFailure
from cels.protocol.stages.results import LoadResult, UniverseResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.wire import cels_pb2
from cels.protocol.work import CommutativeHash, LocalWork, id_width


STREAM_IDS = 16384
"""Ids per UniverseHop, columns per UniverseIndex: every list goes as consecutive chunks of at
most this many (issue 25), a hop's ids packed in one bytes field.  16,384 X25519 ids are
512 KiB, within one 1 MiB transport frame (cels.node.framing); Pohlig-Hellman ids (the
group's size each) span a few frames."""


UNION_KEY_BYTES = 16
"""Bytes of a fully hashed id that its owner keeps and sends P_1, and P_1 keeps for the union
(its first ones): two distinct ids of a session share them with probability about
n^2 / 2^129, the bet the Ray engine's pair digests make too
(cels.engine.log_shards.PAIR_DIGEST_BYTES); a complete set then takes half the memory and
bytes of X25519's 32-byte ids, and a sixteenth of a 2048-bit Pohlig-Hellman group's."""


def union_keys(ids: np.ndarray) -> np.ndarray:
    """The first :data:`UNION_KEY_BYTES` of each of the :func:`id_array` ``ids`` (all of a
    shorter id), as a fixed-width array that sorts as the ids do."""
    width = ids.dtype.itemsize
    if width <= UNION_KEY_BYTES:
        return ids
    return np.ascontiguousarray(ids.view(np.uint8).reshape(-1, width)[:, :UNION_KEY_BYTES]).view(f"V{UNION_KEY_BYTES}").ravel()


def increasing(ids: np.ndarray, before: np.ndarray) -> bool:
    """Whether ``ids`` (after the ids ``before``, at most one) are strictly increasing as bytes
    (the same-width ``S`` view compares as bytes do)."""
    keys = np.concatenate([before, ids]).view(f"S{ids.dtype.itemsize}")
    return bool(np.all(keys[1:] > keys[:-1]))


def merged(union: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted union of ``union`` and ``ids`` (each sorted and distinct, same width), where
    each of ``ids`` sits in it, and where the ids new to it were inserted (positions in
    ``union``, ascending): an old position p moves to p + (insertions at or before p)."""
    width = union.dtype.itemsize
    keys, asked = union.view(f"S{width}"), ids.view(f"S{width}")
    at = np.searchsorted(keys, asked)
    found = keys[np.minimum(at, max(len(union) - 1, 0))] == asked if len(union) else np.zeros(len(ids), dtype=bool)
    inserted = at[~found]
    positions = np.empty(len(ids), dtype=np.int64)
    positions[found] = moved(at[found], inserted)
    positions[~found] = inserted + np.arange(len(inserted))  # np.insert keeps equal points in order
    return np.insert(union, inserted, ids[~found]), positions, inserted


def moved(positions: np.ndarray, inserted: np.ndarray) -> np.ndarray:
    """Positions in a union after :func:`merged` inserted ids at ``inserted``."""
    return positions + np.searchsorted(inserted, positions, side="right")


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

    def __init__(self, seat: Seat, work: LocalWork) -> None:
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

    def __init__(self, seat: Seat, work: LocalWork, cipher: CommutativeHash, loaded: LoadResult) -> None:
        super().__init__(seat)
        self.work, self.cipher, self.loaded = work, cipher, loaded
        self.width = id_width(cipher)
        self.own_pairs = np.zeros(0, dtype=np.int64)  # own pairs in the order their ids left
        self.key_width = min(self.width, UNION_KEY_BYTES)  # a complete set's ids: union_keys
        self.full_ids = np.zeros(len(loaded.own), dtype=f"V{self.key_width}")  # own ids, every layer applied (union_keys)
        self.returned = ChunkCursor(f"{seat.name}: return of its own universe ids", STREAM_IDS)
        self.forwarded: dict[str, ChunkCursor] = {}  # each owner's ids this party layered and sent on
        self.complete: dict[str, tuple[ChunkCursor, list[np.ndarray]]] = {}  # P_1: each party's complete ids so far (union_keys)
        self.union = np.zeros(0, dtype=f"V{self.key_width}")  # P_1: the sorted union of the complete id sets so far (union_keys)
        self.positions: dict[str, np.ndarray] = {}  # P_1: where each set's ids sit in it
        self.indexed = ChunkCursor(f"{seat.name}: universe_index", STREAM_IDS)
        self.size: int | None = None  # the index size the first UniverseIndex chunk gave
        self.columns = np.zeros(len(loaded.own), dtype=np.int64)  # own columns, in the sorted order of full_ids
        self.ids_seen = len(loaded.own)  # every party's set passes this party: the union has at most this many

    def start(self) -> list[Outgoing]:
        own, seat = self.loaded.own, self.seat
        first = self.work.hash_ids(self.cipher, own)
        order = np.argsort(first, kind="stable")  # ids leave sorted, not in log order
        self.own_pairs, first = own[order], first[order]
        return self._stream(seat.successor, seat.name, [seat.name], first)

    def _stream(self, recipient: str, owner: str, applied: list[str], ids: np.ndarray) -> list[Outgoing]:
        """``owner``'s ``ids`` (layers ``applied``) to ``recipient`` in chunks of STREAM_IDS."""
        seat = self.seat
        return [
            out
            for first, stop, more in chunks(len(ids), STREAM_IDS)
            for out in seat.send(
                recipient,
                universe_hop=cels_pb2.UniverseHop(
                    session_id=seat.session_id, owner=owner, applied=applied, ids=ids[first:stop].tobytes(), first=first, more=more
                ),
            )
        ]

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
            hop = cels_pb2.UniverseHop(
                session_id=seat.session_id, owner=msg.owner, applied=[*applied, seat.name], ids=ids.tobytes(), first=msg.first, more=msg.more
            )
            return seat.send(seat.successor, universe_hop=hop)
        if msg.owner == seat.name:  # a chunk of my own ids, every layer applied, in the order I sent them
            seat.expect_sender(sender, seat.predecessor, "universe_hop")
            return self._returned(msg)
        if seat.name != seat.key_holder or sender != msg.owner:
            raise fail(f"{seat.name}: complete universe ids of {msg.owner} from {sender}")
        return self._complete(msg)

    def _returned(self, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        """A chunk of this party's own ids is back (it keeps their :func:`union_keys`); once all
        are, P_k sends the keys sorted to P_1."""
        seat, n = self.seat, len(self.full_ids)
        ids = union_keys(self._chunk_ids(msg, self.returned, self.width))
        if self.returned.position > n or (self.returned.done and self.returned.position != n):
            raise malformed(f"{self.returned.what}: {self.returned.position} ids so far, it sent {n}")
        self.full_ids[msg.first : self.returned.position] = ids
        if msg.more:
            return []
        if seat.name != seat.key_holder:
            return self._stream(seat.key_holder, seat.name, list(msg.applied), np.sort(self.full_ids))
        return self._collect(seat.name, self.full_ids)

    def _complete(self, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        """P_1: a chunk of another party's complete ids, sorted and distinct across chunks; at
        most as many as passed P_1 on that party's ring (checked against its forwarded count)."""
        seat, owner = self.seat, msg.owner
        passed = self.forwarded.get(owner)
        if passed is None or not passed.done:
            raise fail(f"{seat.name}: complete universe ids of {owner} before its ids passed {seat.name}")
        cursor, parts = self.complete.setdefault(owner, (ChunkCursor(f"{seat.name}: complete universe ids of {owner}", STREAM_IDS), []))
        keys = self._chunk_ids(msg, cursor, self.key_width)
        if cursor.position > passed.position or (cursor.done and cursor.position != passed.position):
            raise malformed(f"{cursor.what}: {cursor.position} ids so far, {passed.position} passed {seat.name}")
        if not increasing(keys, parts[-1][-1:] if parts else keys[:0]):
            raise malformed(f"{cursor.what} are not sorted and distinct")
        parts.append(keys)
        if msg.more:
            return []
        return self._collect(owner, np.concatenate(parts))

    def _chunk_ids(self, msg: cels_pb2.UniverseHop, cursor: ChunkCursor, width: int) -> np.ndarray:
        """A chunk's ids, each of ``width`` bytes (the cipher's; a complete set's union keys),
        packed in ``msg.ids``, taken in place by ``cursor``."""
        if len(msg.ids) % width:
            raise malformed(f"{cursor.what}: {len(msg.ids)} bytes of ids, not a whole number of {width}-byte ids")
        ids = np.frombuffer(msg.ids, dtype=f"V{width}")
        cursor.take(msg.first, len(ids), msg.more)
        return ids

    def _collect(self, owner: str, keys: np.ndarray) -> list[Outgoing]:
        """P_1 merges each party's fully hashed ids (their :func:`union_keys`, as every owner
        keeps and sends them) into the sorted union (the index of variables) as they complete,
        keeping only where each set's ids sit; with every set in, it tells every party the index
        size and the columns of that party's own ids (docs/protocol.md).  Each set arrives once
        (its chunks' cursor refuses a second); P_1's own come in the order they left, the
        others' sorted."""
        seat = self.seat
        if owner == seat.name:
            order = np.argsort(keys, kind="stable")
            if not increasing(keys[order], keys[:0]):
                raise malformed(f"{self.returned.what}: two of its ids came back equal")
            self.union, sorted_at, inserted = merged(self.union, keys[order])
            at = np.empty_like(sorted_at)
            at[order] = sorted_at
        else:
            self.union, at, inserted = merged(self.union, keys)
        for party, before in self.positions.items():
            self.positions[party] = moved(before, inserted)
        self.positions[owner] = at
        if len(self.positions) < seat.r:
            return []
        n, out = len(self.union), []
        self.union = self.union[:0]
        for party in seat.parties:
            columns = self.positions.pop(party)
            if party == seat.name:
                own = columns
                continue
            for first, stop, more in chunks(len(columns), STREAM_IDS):
                index = cels_pb2.UniverseIndex(session_id=seat.session_id, size=n, columns=columns[first:stop].tolist(), first=first, more=more)
                out += seat.send(party, universe_index=index)
        self._index(n, own)
        return out

    def on_index(self, sender: str, msg: cels_pb2.UniverseIndex) -> list[Outgoing]:
        """A chunk of the index size and the columns of this party's ids, in the sorted order it
        sent them (strictly increasing across chunks)."""
        seat, n = self.seat, len(self.full_ids)
        seat.expect_sender(sender, seat.key_holder, "universe_index")
        if not self.returned.done:
            raise fail(f"{seat.name}: universe_index before its own ids came back")
        self.indexed.take(msg.first, len(msg.columns), msg.more)
        if msg.size > self.ids_seen:
            raise malformed(f"{seat.name}: universe_index of {msg.size} pairs, more than the {self.ids_seen} ids of all parties")
        if self.size is not None and msg.size != self.size:
            raise malformed(f"{seat.name}: universe_index: index size {msg.size}, an earlier chunk said {self.size}")
        self.size, stop = msg.size, self.indexed.position
        if stop > n or (self.indexed.done and stop != n):
            raise malformed(f"{seat.name}: universe_index: {stop} columns for {n} ids")
        by_id = np.asarray(msg.columns, dtype=np.int64)
        before = self.columns[msg.first - 1 : msg.first] if msg.first else np.full(1, -1)
        if np.any(np.diff(np.concatenate([before, by_id])) <= 0) or (len(by_id) and by_id[-1] >= msg.size):
            raise malformed(
                f"{seat.name}: universe_index: columns {msg.first}..{stop} of {n} ids "
                f"not strictly increasing below the index size {msg.size}"
            )
        self.columns[msg.first : stop] = by_id
        if msg.more:
            return []
        cols = np.empty_like(self.columns)
        cols[np.argsort(self.full_ids, kind="stable")] = self.columns
        self._index(int(msg.size), cols)
        return []

    def _index(self, n: int, cols: np.ndarray) -> None:
        """Own pair t is index column ``cols[t]`` of ``n``: the universe is known."""
        self.result = UniverseResult(n, self.work.index(n, self.own_pairs, cols))
