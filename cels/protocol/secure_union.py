"""Secure union (CELS Algorithm 3) with shuffling at every hop, as a sans-I/O sub-protocol.

Pohlig-Hellman commutative encryption (:mod:`cels.crypto.commutative_cipher`), fresh keys
per session, ring P_1 .. P_r, coordinator P_1 = ``ring[0]``.

Encryption (one ring per owner, all running at once).  P_k encodes its records, encrypts
them with e_k, shuffles, and sends ``UnionEncryptHop(owner=P_k, hops=1)`` to P_k+1; every
party on the way adds its layer and shuffles, so the set travels P_k -> P_k+1 -> ... ->
P_k-1.  The last party (hops = r) sends the fully encrypted set to P_1.

Decryption (one pass over the pooled set).  When P_1 holds all r sets it pools them,
shuffles, removes its layer, shuffles, and sends ``UnionDecryptHop(hops=1)`` to P_2; P_i
removes its layer, shuffles and forwards, until P_r removes the last layer, decodes the
records, drops duplicates (set union), shuffles, and sends ``UnionResult`` to everyone.

What each party sees (semi-honest, non-colluding; DDH in the QR subgroup).  Every party
learns |O_k| of every owner (set sizes travel with the owner's name) and the total pool
size; P_r also learns how many duplicates the pool had.  The origin of an output record:

* P_1 links each fully encrypted record to its owner, but its decryption output (layers
  2..r) is re-shuffled by P_2, .., P_r, whose keys it lacks, before the plaintext appears.
* P_i (i >= 2) receives the pool under layers {i..r}.  In the encryption phase it only saw
  sets under ring arcs ending at its predecessor P_i-1, which always contain layer i-1
  (or are its own set), so no set it saw with an owner tag matches the pool it decrypts,
  even after adding or removing its own layer.
* P_r sees plaintexts only after r - 1 shuffles by the others.

Algorithm 3 as printed lets P_1 send each O'_k for decryption separately and get its
plaintext back, i.e. P_1 learns which party contributed which record; the pooled,
shuffled decryption above removes that leak (docs/protocol.md).  Records are whole: the
chunks of a record (``EncryptedRecord.chunks``) are shuffled together, so the number of
chunks of a record (its length class, 255 bytes per chunk at 2048 bits) is visible and
could single out the origin of an unusually long record; ``record_chunks=k`` pads every
record to exactly k chunks (a public session parameter) to hide it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from cels.crypto.commutative_cipher import (
    CommutativeCipherError,
    PohligHellman,
    decode_record,
    element_from_bytes,
    element_to_bytes,
    encode_record,
)
from cels.crypto.groups import SafePrimeGroup
from cels.crypto.streams import CipherRandom, cipher_generator
from cels.protocol.roles import Envelope, Outgoing, ProtocolError
from cels.protocol.secure_sum import RingMember
from cels.protocol.wire import cels_pb2

Record = list  # the chunks of one record, as group elements (gmpy2 mpz)


class SecureUnion(RingMember):
    """One party's state in the secure union; ``result`` is the union (list of bytes).

    ``record_chunks``: pad every record to this many group elements (hides record lengths;
    a longer own record is a CommutativeCipherError, a received one ``invalid_argument``).
    ``rng``: the numpy Generator this party's key e and its shuffles draw from (default: a
    fresh ChaCha20 stream, :mod:`cels.crypto.streams`; a party's replayed keys replay them).
    ``keeping`` wraps the key e (a node that keeps its layers for a re-run).
    """

    def __init__(
        self,
        *,
        name: str,
        session_id: str,
        ring: Sequence[str],
        records: Iterable[bytes],
        group: SafePrimeGroup | None = None,
        record_chunks: int | None = None,
        rng: np.random.Generator | None = None,
        keeping: Callable[[PohligHellman], PohligHellman] | None = None,
    ) -> None:
        super().__init__(name, session_id, ring)
        self.rng = rng or cipher_generator()
        self.record_chunks = record_chunks
        self.cipher = PohligHellman(group, CipherRandom(generator=self.rng))
        if keeping is not None:  # its layers kept for a re-run (a node's cache: cels.node.hash_cache)
            self.cipher = keeping(self.cipher)
        self.group = self.cipher.group
        self.records = [bytes(r) for r in records]
        self.result: list[bytes] | None = None
        self._encrypted_for: set[str] = set()  # owners whose sets this party has encrypted
        self._pooled: dict[str, list[Record]] = {}  # coordinator only: fully encrypted sets by owner
        self._started = False

    def _shuffle(self, items: list) -> None:
        """A uniform permutation of ``items`` in place, from this party's stream."""
        self.rng.shuffle(items)

    @property
    def coordinator(self) -> str:
        return self.ring[0]

    def start(self) -> list[Outgoing]:
        """Encrypt this party's records (Algorithm 3 line 1), shuffle, send them on their ring."""
        if self._started:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, "secure union started twice")
        self._started = True
        own = [encode_record(self.group, record, self.record_chunks) for record in self.records]
        return self._encrypt_hop(self.name, 0, own)

    def _encrypt_hop(self, owner: str, hops: int, records: list[Record]) -> list[Outgoing]:
        """Add this party's layer, shuffle, and pass the set on (or to the coordinator)."""
        self._encrypted_for.add(owner)
        layered = [self.cipher.encrypt_record(chunks) for chunks in records]
        self._shuffle(layered)
        hops += 1
        if hops < self.r:
            return [(self.at(self.index + 1), self._message("union_encrypt_hop", hops, layered, owner))]
        if self.name == self.coordinator:
            return self._pool(owner, layered)
        return [(self.coordinator, self._message("union_encrypt_hop", hops, layered, owner))]

    def _message(self, step: str, hops: int, records: list[Record], owner: str | None = None) -> Envelope:
        wire = [cels_pb2.EncryptedRecord(chunks=[element_to_bytes(self.group, c) for c in chunks]) for chunks in records]
        if step == "union_encrypt_hop":
            body = cels_pb2.UnionEncryptHop(session_id=self.session_id, hops=hops, records=wire, owner=owner)
        else:
            body = cels_pb2.UnionDecryptHop(session_id=self.session_id, hops=hops, records=wire)
        return self.envelope(**{step: body})

    def _parse(self, sender: str, records) -> list[Record]:
        if self.record_chunks is not None and any(len(r.chunks) != self.record_chunks for r in records):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"union records from {sender!r}: not {self.record_chunks} chunks each")
        try:
            return [[element_from_bytes(self.group, c) for c in record.chunks] for record in records]
        except CommutativeCipherError as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"union records from {sender!r}: {exc}") from None

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take a UnionEncryptHop, UnionDecryptHop or UnionResult."""
        step = self.check(envelope, sender)
        if step == "union_encrypt_hop":
            return self._on_encrypt_hop(sender, envelope.union_encrypt_hop)
        if step == "union_decrypt_hop":
            return self._on_decrypt_hop(sender, envelope.union_decrypt_hop)
        if step == "union_result":
            return self._on_result(sender, envelope.union_result)
        raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"secure union cannot take {step}")

    def _on_encrypt_hop(self, sender: str, hop: cels_pb2.UnionEncryptHop) -> list[Outgoing]:
        if hop.owner not in self.ring:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"UnionEncryptHop for unknown owner {hop.owner!r}")
        owner_index = self.ring.index(hop.owner)
        if hop.hops == self.r:  # a fully encrypted set for the coordinator
            last = self.at(owner_index - 1)
            if self.name != self.coordinator or sender != last or hop.owner in self._pooled:
                raise ProtocolError(
                    ProtocolError.FAILED_PRECONDITION,
                    f"fully encrypted set of {hop.owner!r} from {sender!r}: expected once, from {last!r} to {self.coordinator!r}",
                )
            return self._pool(hop.owner, self._parse(sender, hop.records))
        expected_hops = (self.index - owner_index) % self.r
        if sender != self.at(self.index - 1) or hop.hops != expected_hops or expected_hops == 0 or hop.owner in self._encrypted_for:
            raise ProtocolError(
                ProtocolError.FAILED_PRECONDITION,
                f"UnionEncryptHop(owner={hop.owner!r}, hops={hop.hops}) from {sender!r} is out of ring order",
            )
        return self._encrypt_hop(hop.owner, hop.hops, self._parse(sender, hop.records))

    def _pool(self, owner: str, records: list[Record]) -> list[Outgoing]:
        """Coordinator: keep a fully encrypted set; once all r are in, start the decryption."""
        self._pooled[owner] = records
        if len(self._pooled) < self.r:
            return []
        pool = [record for owner in self.ring for record in self._pooled[owner]]
        self._shuffle(pool)
        return self._decrypt_hop(0, pool)

    def _decrypt_hop(self, hops: int, records: list[Record]) -> list[Outgoing]:
        """Remove this party's layer, shuffle, and forward (or finish, at P_r)."""
        plain = [self.cipher.decrypt_record(chunks) for chunks in records]
        self._shuffle(plain)
        hops += 1
        if hops < self.r:
            return [(self.at(self.index + 1), self._message("union_decrypt_hop", hops, plain))]
        try:
            union = list({decode_record(self.group, chunks): None for chunks in plain})
        except CommutativeCipherError as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"secure union: {exc}") from None
        self._shuffle(union)
        self.result, self.done = union, True
        result = cels_pb2.UnionResult(session_id=self.session_id, records=union)
        return [(p, self.envelope(union_result=result)) for p in self.others()]

    def _on_decrypt_hop(self, sender: str, hop: cels_pb2.UnionDecryptHop) -> list[Outgoing]:
        if self.index == 0 or sender != self.at(self.index - 1) or hop.hops != self.index:
            raise ProtocolError(
                ProtocolError.FAILED_PRECONDITION, f"UnionDecryptHop(hops={hop.hops}) from {sender!r} is out of ring order"
            )
        if len(self._encrypted_for) != self.r:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, "UnionDecryptHop before every set was encrypted")
        return self._decrypt_hop(hop.hops, self._parse(sender, hop.records))

    def _on_result(self, sender: str, message: cels_pb2.UnionResult) -> list[Outgoing]:
        if sender != self.ring[-1] or self.name == self.ring[-1]:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"unexpected UnionResult from {sender!r}")
        self.result, self.done = list(message.records), True
        return []
