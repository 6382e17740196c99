"""Phases 0-1 of a party: the log's load, and the universe (docs/protocol.md, "Universe").

Commutative hashing of the pair ids around the ring (X25519 by default, Pohlig-Hellman as an
option): every party's ids pass every party once; P_1 gets every party's fully hashed ids,
assembles their sorted union (the index of variables) and tells every party its size and the
columns of that party's own ids (CELS section 4.2, Algorithm 3's cipher).
"""

from __future__ import annotations

import numpy as np

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.groups import group_for_bits
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, fail, malformed
from cels.protocol.rolebase import RoleFailure
from cels.protocol.stages.results import LoadResult, UniverseResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.wire import cels_pb2
from cels.protocol.work import CommutativeHash, LocalWork


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
        self.own_pairs = np.zeros(0, dtype=np.int64)  # own pairs in the order their ids left
        self.full_ids: list[bytes] | None = None  # own ids, every layer applied
        self.sets: dict[str, list[bytes]] = {}  # P_1: every party's complete ids
        self.ids_seen = len(loaded.own)  # every party's set passes this party: the union has at most this many

    def start(self) -> list[Outgoing]:
        own, seat = self.loaded.own, self.seat
        first = self.work.hash_ids(self.cipher, own)
        order = sorted(range(len(own)), key=first.__getitem__)  # ids leave sorted, not in log order
        self.own_pairs = own[order]
        hop = cels_pb2.UniverseHop(session_id=seat.session_id, owner=seat.name, applied=[seat.name], ids=[first[t] for t in order])
        return seat.send(seat.successor, universe_hop=hop)

    def on_hop(self, sender: str, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        seat, applied = self.seat, list(msg.applied)
        parties, r = seat.parties, seat.r
        if msg.owner not in parties or not applied or applied[0] != msg.owner or len(set(applied)) != len(applied):
            raise malformed(f"{seat.name}: universe_hop owner/applied inconsistent")
        if len(applied) < r:  # forward with this party's layer
            seat.expect_sender(sender, seat.predecessor, "universe_hop")
            if seat.name in applied or applied != [parties[(parties.index(msg.owner) + t) % r] for t in range(len(applied))]:
                raise fail(f"{seat.name}: universe_hop of {msg.owner} arrived out of ring order")
            self.ids_seen += len(msg.ids)
            try:
                ids = self.work.apply_layer(self.cipher, list(msg.ids))
            except CommutativeCipherError as exc:
                raise malformed(f"{seat.name}: universe_hop: {exc}") from None
            hop = cels_pb2.UniverseHop(session_id=seat.session_id, owner=msg.owner, applied=[*applied, seat.name], ids=ids)
            return seat.send(seat.successor, universe_hop=hop)
        if msg.owner == seat.name:  # my own ids, every layer applied, in the order I sent them
            seat.expect_sender(sender, seat.predecessor, "universe_hop")
            if self.full_ids is not None or len(msg.ids) != len(self.own_pairs):
                raise fail(f"{seat.name}: unexpected return of its own universe ids")
            self.full_ids = list(msg.ids)
            if seat.name != seat.key_holder:
                hop = cels_pb2.UniverseHop(session_id=seat.session_id, owner=seat.name, applied=applied, ids=sorted(self.full_ids))
                return seat.send(seat.key_holder, universe_hop=hop)
            return self._collect(seat.name, self.full_ids)
        if seat.name != seat.key_holder or sender != msg.owner:
            raise fail(f"{seat.name}: complete universe ids of {msg.owner} from {sender}")
        ids = list(msg.ids)
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise malformed(f"{seat.name}: complete universe ids of {msg.owner} are not sorted and distinct")
        return self._collect(msg.owner, ids)

    def _collect(self, owner: str, ids: list[bytes]) -> list[Outgoing]:
        """P_1 assembles the sorted union of the fully hashed ids (the index of variables) and
        tells every party its size and the columns of that party's own ids (docs/protocol.md)."""
        seat = self.seat
        if owner in self.sets:
            raise fail(f"{seat.name}: second complete universe set of {owner}")
        self.sets[owner] = ids
        if len(self.sets) < seat.r:
            return []
        index = sorted(set().union(*self.sets.values()))
        position = {pid: i for i, pid in enumerate(index)}
        out = []
        for party in seat.parties:
            if party != seat.name:
                columns = [position[f] for f in self.sets[party]]
                out += seat.send(party, universe_index=cels_pb2.UniverseIndex(session_id=seat.session_id, size=len(index), columns=columns))
        self.sets = {}
        self._index(len(index), np.array([position[f] for f in self.full_ids], dtype=np.int64))
        return out

    def on_index(self, sender: str, msg: cels_pb2.UniverseIndex) -> list[Outgoing]:
        """The index size and the columns of this party's ids, in the sorted order it sent them."""
        seat = self.seat
        seat.expect_sender(sender, seat.key_holder, "universe_index")
        if self.full_ids is None:
            raise fail(f"{seat.name}: universe_index before its own ids came back")
        by_id = np.asarray(msg.columns, dtype=np.int64)
        if msg.size > self.ids_seen:
            raise malformed(f"{seat.name}: universe_index of {msg.size} pairs, more than the {self.ids_seen} ids of all parties")
        if len(by_id) != len(self.full_ids) or np.any(np.diff(by_id) <= 0) or (len(by_id) and by_id[-1] >= msg.size):
            raise malformed(
                f"{seat.name}: universe_index: {len(by_id)} columns for {len(self.full_ids)} ids, "
                f"not strictly increasing below the index size {msg.size}"
            )
        cols = np.empty_like(by_id)
        cols[sorted(range(len(self.full_ids)), key=self.full_ids.__getitem__)] = by_id
        self._index(int(msg.size), cols)
        return []

    def _index(self, n: int, cols: np.ndarray) -> None:
        """Own pair t is index column ``cols[t]`` of ``n``: the universe is known."""
        self.result = UniverseResult(n, self.work.index(n, self.own_pairs, cols))
