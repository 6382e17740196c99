"""The private solve as sans-I/O sub-protocols (docs/protocol.md, "Private solve").

Instead of Algorithm 2 (the solver decrypts A(T|F|B) and can rebuild every row), the parties
run the monotone greedy of :mod:`cels.mechanism.greedy` over secure OR-aggregation:

1. every party sends its X25519 mask key to every other party (``MaskKey``);
2. each round every party computes the same public proposals, its own verdicts from its own
   rows and loads, and sends the masked verdicts to the aggregator (``MaskedVerdicts``);
3. the aggregator (the solver node) sums them mod 2^64 and sends every party the accepted bits
   (``RoundVerdict``); every party applies the same update to the public x and A;
4. a round without proposals ends it: every party sends ``MaskedVerdicts(last)``.

What each node sees: the aggregator sees the rounds, the number of proposals and the accepted
bits (a function of the published x); a party additionally sees its own rows.  No row, load,
slack or coefficient leaves its party.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from cels.crypto.secure_aggregation import MaskError, PairwiseMasks, aggregate
from cels.mechanism.greedy import ProposalRule, verdicts
from cels.protocol.roles import Envelope, Outgoing, fail, malformed
from cels.protocol.wire import cels_pb2


def _envelope(session_id: str, sender: str, **step) -> Envelope:
    return cels_pb2.Envelope(session_id=session_id, sender=sender, **step)


class PrivateSolveParty:
    """P_k's side for one session: its masks, its rows' loads, the public x and A."""

    def __init__(self, name: str, parties: list[str], aggregator: str, session_id: str) -> None:
        self.name, self.parties, self.aggregator, self.session_id = name, parties, aggregator, session_id
        self.masks = PairwiseMasks(name, parties, session_id)
        self.rule: ProposalRule | None = None
        self.round = 0
        self.proposals = np.zeros(0, dtype=np.int64)
        self.done = False

    def mask_keys(self) -> list[Outgoing]:
        """Step 1: this party's mask key to every other party."""
        msg = cels_pb2.MaskKey(session_id=self.session_id, public_key=self.masks.public_key)
        return [(p, _envelope(self.session_id, self.name, mask_key=msg)) for p in self.parties if p != self.name]

    def on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        try:
            self.masks.add_peer(sender, msg.public_key)
        except MaskError as exc:
            raise malformed(f"{self.name}: mask_key: {exc}") from None
        return self._next_round()

    def start(self, rule: ProposalRule, rows: sp.spmatrix, b: float) -> list[Outgoing]:
        """This party's rows are ready: begin the rounds once every mask key is in."""
        self.rule, self.b = rule, b
        self.x, self.active = rule.start()
        self.rows = sp.csc_matrix(rows, dtype=np.float64)
        self.loads = np.zeros(self.rows.shape[0])
        return self._next_round()

    def _next_round(self) -> list[Outgoing]:
        if self.rule is None or not self.masks.complete or self.done or len(self.proposals):
            return []
        self.proposals = self.rule.propose(self.x, self.active)
        if not len(self.proposals):
            self.done = True
            msg = cels_pb2.MaskedVerdicts(session_id=self.session_id, round=self.round, last=True)
        else:
            v = verdicts(self.rows, self.loads, self.proposals, self.b)
            shares = self.masks.masked_or_shares(self.round, v)
            msg = cels_pb2.MaskedVerdicts(session_id=self.session_id, round=self.round, values=shares.tolist())
        return [(self.aggregator, _envelope(self.session_id, self.name, masked_verdicts=msg))]

    def on_round_verdict(self, sender: str, msg: cels_pb2.RoundVerdict) -> list[Outgoing]:
        """Step 3: apply the public update, then the next round."""
        if sender != self.aggregator:
            raise fail(f"{self.name}: round_verdict from {sender!r}, expected from {self.aggregator!r}")
        if self.rule is None or not len(self.proposals) or msg.round != self.round:
            raise fail(f"{self.name}: round_verdict for round {msg.round} out of order (round {self.round})")
        if msg.proposals != len(self.proposals) or len(msg.accepted) != (len(self.proposals) + 7) // 8:
            raise malformed(f"{self.name}: round_verdict for {msg.proposals} proposals, this round has {len(self.proposals)}")
        accepted = np.unpackbits(np.frombuffer(msg.accepted, dtype=np.uint8), bitorder="little")[: len(self.proposals)].astype(bool)
        chosen = self.proposals[accepted]
        self.loads += np.asarray(self.rows[:, chosen].sum(axis=1)).ravel()
        self.rule.update(self.x, self.active, self.proposals, accepted)
        self.round += 1
        self.proposals = np.zeros(0, dtype=np.int64)
        return self._next_round()


class PrivateSolveAggregator:
    """The aggregator's side (on the solver node): sum each round's masked verdicts."""

    def __init__(self, name: str, parties: list[str], session_id: str) -> None:
        self.name, self.parties, self.session_id = name, parties, session_id
        self.round = 0
        self.shares: dict[str, np.ndarray] = {}
        self.last: set[str] = set()
        self.proposals_total = 0
        self.done = False

    def on_masked_verdicts(self, sender: str, msg: cels_pb2.MaskedVerdicts) -> list[Outgoing]:
        if sender not in self.parties:
            raise fail(f"{self.name}: masked_verdicts from {sender!r}, not a party")
        if msg.round != self.round or sender in self.shares or sender in self.last:
            raise fail(f"{self.name}: masked_verdicts of {sender} for round {msg.round} out of order (round {self.round})")
        if msg.last:
            if msg.values or self.shares:
                raise malformed(f"{self.name}: {sender} ends the rounds while others go on")
            self.last.add(sender)
            self.done = len(self.last) == len(self.parties)
            return []
        if self.last:
            raise malformed(f"{self.name}: {sender} goes on while others ended the rounds")
        self.shares[sender] = np.asarray(msg.values, dtype=np.uint64)
        if len(self.shares) < len(self.parties):
            return []
        try:
            total = aggregate(self.shares)
        except MaskError as exc:
            raise malformed(f"{self.name}: round {self.round}: {exc}") from None
        verdict = cels_pb2.RoundVerdict(
            session_id=self.session_id,
            round=self.round,
            proposals=len(total),
            accepted=np.packbits(total == 0, bitorder="little").tobytes(),
        )
        self.proposals_total += len(total)
        self.round += 1
        self.shares = {}
        return [(p, _envelope(self.session_id, self.name, round_verdict=verdict)) for p in self.parties]
