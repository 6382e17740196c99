"""Who contributed which output record: Algorithm 3 as printed vs. the shuffled union.

CELS Algorithm 3 (section 4.2.2): every P_k sends O'_k = Enc_{e_k}(O_k) to the coordinator
P_1, which has each set encrypted by every other party in turn (lines 3-7) and then decrypted
by every party in turn, one set O'_k at a time (lines 8-13), each party sending the result
back to P_1.  The last decryption hands P_1 the plaintext of O_k: P_1 knows the origin of
every record.  :class:`LiteralUnion` runs it exactly so (sans-I/O, the union's wire messages,
no shuffles), only for this demonstration.  :class:`cels.protocol.secure_union.SecureUnion`
(what sessions use) shuffles at every hop and decrypts the pooled sets, so P_1 never sees a
plaintext it can tie to an owner.

:func:`attribute` is the attack: it reads the coordinator's recorded view
(:mod:`cels.views`) and attributes each decrypted set to the owner whose turn it was
(Algorithm 3 decrypts O'_1, .., O'_r in order).  Records it cannot attribute it guesses
uniformly among the other parties (its own records it knows; they are not scored), so chance
is 1 / (r - 1).
"""

from __future__ import annotations

import math
import random
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cels.crypto.commutative_cipher import CommutativeCipherError, decode_record, element_from_bytes, encode_record
from cels.crypto.groups import SafePrimeGroup, group_for_bits
from cels.logs import synthetic_log
from cels.logs.model import SearchLog
from cels.mechanism.sampling import pseudonyms
from cels.inprocess import InMemoryNetwork
from cels.engine.routines import encode_item
from cels.protocol.roles import Envelope, Outgoing, ProtocolError
from cels.protocol.secure_union import SecureUnion
from cels.views import NodeView, ViewRecorder, load_node_view
from cels.protocol.wire import cels_pb2


class LiteralUnion(SecureUnion):
    """Algorithm 3 as printed: the coordinator (``ring[0]``) routes every layer, one set at a
    time, without shuffles (SecureUnion's keys, encoding and wire format, not its flow)."""

    def __init__(self, *, name: str, session_id: str, ring: Sequence[str], records: Iterable[bytes], group: SafePrimeGroup) -> None:
        super().__init__(name=name, session_id=session_id, ring=ring, records=records, group=group)
        self.origin: dict[bytes, str] = {}  # coordinator: record -> owner (what Algorithm 3 shows it)
        self._sets: dict[str, list[list]] = {}
        self._plan: list[tuple[str, str, str]] = []  # (action, owner, party), run in order

    def start(self) -> list[Outgoing]:
        """Line 1: encrypt O_k with e_k and send it to the coordinator."""
        own = [self.cipher.encrypt_record(encode_record(self.group, r)) for r in self.records]
        if self.index != 0:
            return [(self.ring[0], self._message("union_encrypt_hop", 1, own, self.name))]
        return self._collect(self.name, own)

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        step = self.check(envelope, sender)
        msg = getattr(envelope, step)
        if step == "union_result":
            self.result, self.done = list(msg.records), True
            return []
        records = self._parse(sender, msg.records)
        if self.index != 0:  # lines 6 and 11 at P_i: one layer on or off, back to the coordinator
            if step == "union_encrypt_hop":
                layered = [self.cipher.encrypt_record(r) for r in records]
                return [(sender, self._message(step, msg.hops + 1, layered, msg.owner))]
            return [(sender, self._message(step, msg.hops + 1, [self.cipher.decrypt_record(r) for r in records]))]
        if step == "union_encrypt_hop" and msg.owner == sender and msg.hops == 1:
            return self._collect(sender, records)
        if not self._plan:
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"literal union: unexpected {step} from {sender}")
        action, owner, party = self._plan[0]
        if sender != party or (step == "union_encrypt_hop") != (action == "enc"):
            raise ProtocolError(ProtocolError.FAILED_PRECONDITION, f"literal union: {step} from {sender}, waiting for {action} by {party}")
        self._sets[owner] = records
        self._plan.pop(0)
        return self._advance()

    def _collect(self, owner: str, records: list[list]) -> list[Outgoing]:
        """Coordinator: keep O'_k; with all r, plan lines 3-13 and run them."""
        self._sets[owner] = records
        if len(self._sets) < self.r:
            return []
        self._plan = [("enc", k, i) for k in self.ring for i in self.ring if i != k]
        self._plan += [("dec", k, i) for k in self.ring for i in self.ring]
        return self._advance()

    def _advance(self) -> list[Outgoing]:
        """Run the plan: own layers locally, other layers by a round trip to their party; at
        the end every set is plaintext and P_1 knows whose it was (line 13)."""
        while self._plan:
            action, owner, party = self._plan[0]
            if party != self.name:
                step = "union_encrypt_hop" if action == "enc" else "union_decrypt_hop"
                return [(party, self._message(step, 1, self._sets[owner], owner))]
            apply = self.cipher.encrypt_record if action == "enc" else self.cipher.decrypt_record
            self._sets[owner] = [apply(r) for r in self._sets[owner]]
            self._plan.pop(0)
        try:
            self.origin = {decode_record(self.group, r): owner for owner in self.ring for r in self._sets[owner]}
        except CommutativeCipherError as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"literal union: {exc}") from None
        self.result, self.done = list(self.origin), True
        result = cels_pb2.UnionResult(session_id=self.session_id, records=self.result)
        return [(p, self.envelope(union_result=result)) for p in self.others()]


def attribute(view: NodeView, ring: Sequence[str], group: SafePrimeGroup) -> dict[bytes, str]:
    """The coordinator's attack on its own recorded view: every decryption reply from the
    last party that decodes as plaintext is the set whose turn it was (O'_1, .., O'_r)."""
    replies = [e for e in view.find("received", "union_decrypt_hop") if e["peer"] == ring[-1]]
    out: dict[bytes, str] = {}
    for owner, entry in zip(ring, replies):
        for record in entry.envelope().union_decrypt_hop.records:
            try:
                out[decode_record(group, [element_from_bytes(group, c) for c in record.chunks])] = owner
            except CommutativeCipherError:
                continue  # still under someone's layer: nothing learnt
    return out


def attribution_accuracy(attributed: dict[bytes, str], truth: dict[bytes, str], ring: Sequence[str], rng: random.Random) -> float:
    """Share of the other parties' records attributed to their owner (unattributed ones guessed
    uniformly among the r - 1 other parties)."""
    others = list(ring[1:])
    scored = [r for r, owner in truth.items() if owner != ring[0]]
    hits = sum((attributed.get(r) or rng.choice(others)) == truth[r] for r in scored)
    return hits / len(scored)


def party_records(log: SearchLog, parties: int, per_party: int, rng: np.random.Generator) -> dict[str, list[bytes]]:
    """``per_party`` records (pseudonym, query, url, count) of each party's users (round-robin split)."""
    out = {}
    for k, share in enumerate(log.split_by_user(parties)):
        sub = share.counts.tocoo()
        if sub.nnz < per_party:
            raise ValueError(f"party-{k + 1} has {sub.nnz} records, fewer than {per_party}")
        names = pseudonyms(log.n_users, rng)
        out[f"party-{k + 1}"] = [
            encode_item(names[j], *log.pairs[i], int(c)) for j, i, c in zip(sub.row[:per_party], sub.col[:per_party], sub.data[:per_party])
        ]
    return out


def _run(protocol, records: dict[str, list[bytes]], group: SafePrimeGroup, root: Path) -> tuple[NodeView, list[bytes]]:
    """One union over the in-memory network, every node recorded; the coordinator's view."""
    ring = list(records)
    session = f"{protocol.__name__.lower()}-{secrets.token_hex(4)}"
    roles = {p: ViewRecorder(protocol(name=p, session_id=session, ring=ring, records=records[p], group=group), root) for p in ring}
    network = InMemoryNetwork(roles)
    for p in ring:
        network.run(roles[p].start(), sender=p)
    if not all(role.done for role in roles.values()):
        raise RuntimeError(f"{protocol.__name__} did not finish")
    return load_node_view(root / session / ring[0]), roles[ring[0]].result


def demonstrate(
    parties: int = 3,
    per_party: int = 60,
    *,
    seed: int | None = None,
    group_bits: int = 2048,
    allow_paper_bits: bool = False,
    view_dir: str | Path | None = None,
) -> dict:
    """Both unions over the same records; the coordinator's attribution accuracy in each."""
    rng = np.random.default_rng(seed)
    log_seed = int(rng.integers(1 << 31))
    records = party_records(synthetic_log(seed=log_seed, users=max(60, 2 * parties * per_party // 3)), parties, per_party, rng)
    truth = {r: p for p, rs in records.items() for r in rs}
    group = group_for_bits(group_bits, allow_paper_bits=allow_paper_bits)
    guess = random.Random(int(rng.integers(1 << 31)))
    with tempfile.TemporaryDirectory(prefix="cels-union-") as tmp:
        root = Path(view_dir or tmp)
        literal_view, literal = _run(LiteralUnion, records, group, root)
        shuffled_view, shuffled = _run(SecureUnion, records, group, root)
        ring = list(records)
        literal_attr, shuffled_attr = attribute(literal_view, ring, group), attribute(shuffled_view, ring, group)
        result = {
            "paper_algorithm_attribution_accuracy": attribution_accuracy(literal_attr, truth, ring, guess),
            "shuffled_union_attribution_accuracy": attribution_accuracy(shuffled_attr, truth, ring, guess),
        }
    scored = (parties - 1) * per_party
    chance = 1.0 / (parties - 1)
    result.update(
        chance=chance,
        tolerance=4.0 * math.sqrt(chance * (1.0 - chance) / scored),
        parties=parties,
        records_per_party=per_party,
        scored_records=scored,
        paper_algorithm_records_attributed=len(literal_attr),
        shuffled_union_records_attributed=len(shuffled_attr),
        same_union=set(literal) == set(shuffled) == set(truth),
        group_bits=group_bits,
        view_dir=str(view_dir) if view_dir else None,
    )
    return result
