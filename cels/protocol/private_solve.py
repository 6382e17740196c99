"""The private solve as sans-I/O sub-protocols (docs/protocol.md, "Private solve").

Instead of Algorithm 2 (the solver decrypts A(T|F|B) and can rebuild every row), the parties
run the monotone greedy of :mod:`cels.mechanism.greedy` over secure OR-aggregation:

1. every party sends its X25519 mask key to every other party (``MaskKey``);
2. each round every party computes the same public proposals, its own verdicts from its own
   rows and loads, and sends the masked verdicts to the aggregator (``MaskedVerdicts``);
3. the aggregator (the solver node) sums them mod 2^64 and sends every party the accepted bits
   (``RoundVerdict``); every party applies the same update to the public x and A;
4. a round without proposals ends it: every party sends ``MaskedVerdicts(last)``;
5. with noise on the counts (``noise_scale`` = d/eps', CELS App. C), the end of the first pass is
   instead marked by every party's ``MaskedNoiseShare`` (one masked Polya share per pair,
   :func:`cels.mechanism.noise.laplace_share`); the aggregator's sum z (one discrete Laplace
   per pair) goes to every party as ``NoiseTotal``, and the rounds go on (round numbers
   continue) in the noise pass towards max(x + z, 0) (:meth:`ProposalRule.noise_pass`),
   which then ends with ``MaskedVerdicts(last)``;
6. transcript agreement: once its rounds are over, every party sends every other party the
   SHA-256 of every RoundVerdict (and NoiseTotal) it applied (``TranscriptDigest``) and goes
   on only if all r digests agree, so an aggregator that tells parties different verdicts is
   caught before any x is used.  A party that sees its own rejection come back accepted does
   not say so: it goes on with the rounds and sends random bytes as its digest, so the
   session aborts with "verdict transcripts differ", which names no party (docs/security.md).

What each node sees: the aggregator sees the rounds, the number of proposals and the accepted
bits (a function of the published x; with noise, of x, z and the release); a party additionally
sees its own rows.  No row, load, slack, coefficient or single noise share leaves its party.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from cels.crypto.secure_aggregation import MaskError, PairwiseMasks, aggregate, signed
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.mechanism.greedy import GreedyState, ProposalRule, verdicts
from cels.mechanism.noise import laplace_share
from cels.protocol.roles import Envelope, Outgoing, fail, malformed
from cels.protocol.wire import cels_pb2


def _envelope(session_id: str, sender: str, **step) -> Envelope:
    return cels_pb2.Envelope(session_id=session_id, sender=sender, **step)


NOISE_LIMIT = 2**62
"""Largest |z_i| a party takes from a NoiseTotal (x + z must not overflow int64)."""
DIGEST_BYTES = 32
"""A TranscriptDigest: SHA-256."""


MASK_KEY = "pairwise mask key"
"""The draw-key label of a party's X25519 mask key (cels.crypto.streams.DrawKeys.secret)."""
OR_SHARES = "or shares"
"""The draw-key label of the stream of its OR shares' rho."""


def session_masks(index: int, parties: int, session_id: str, draws: DrawKeys) -> PairwiseMasks:
    """P_k's pairwise masks of one session (HKDF info: label || session id), keyed from its
    draw keys: replayed keys mask every vector the same way again (docs/crypto.md, Randomness)."""
    return PairwiseMasks.keyed(index, parties, session_id.encode(), draws.secret(MASK_KEY), draws.stream(OR_SHARES))


def mask_key_messages(masks: PairwiseMasks, session_id: str, name: str, parties: Sequence[str]) -> list[Outgoing]:
    """Step 1: this party's mask key to every other party."""
    msg = cels_pb2.MaskKey(session_id=session_id, public_key=masks.public_key)
    return [(p, _envelope(session_id, name, mask_key=msg)) for p in parties if p != name]


def add_mask_key(masks: PairwiseMasks, name: str, parties: Sequence[str], sender: str, msg: cels_pb2.MaskKey) -> None:
    """Another party's mask key (its seed with this party)."""
    if sender not in parties:
        raise malformed(f"{name}: mask_key from {sender!r}, which is not a party")
    try:
        masks.add_peer(list(parties).index(sender), msg.public_key)
    except MaskError as exc:
        raise malformed(f"{name}: mask_key from {sender!r}: {exc}") from None


def _framed(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (an injective encoding of the transcript's fields)."""
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


class PrivateSolveParty:
    """P_k's side for one session: its masks, its rows' loads, the public x and A; with
    ``noise_scale`` (d/eps') its noise shares, drawn from ``rng`` (default: a fresh ChaCha20
    stream, :mod:`cels.crypto.streams`).  ``masks``: the session's pairwise masks if the party
    holds them already (its masked sums use them too); ``verdicts``: who judges its rows'
    loads on a round's proposals (a party's executor, cels.engine.interface)."""

    def __init__(
        self,
        name: str,
        parties: list[str],
        aggregator: str,
        session_id: str,
        noise_scale: Fraction | None = None,
        rng: CipherRandom | None = None,
        masks: PairwiseMasks | None = None,
        verdicts: Callable[[sp.csc_matrix, np.ndarray, np.ndarray, float], np.ndarray] = verdicts,
    ) -> None:
        self.name, self.parties, self.aggregator, self.session_id = name, parties, aggregator, session_id
        self.masks = masks or PairwiseMasks(parties.index(name), len(parties), session_id.encode())  # HKDF info: label || session id
        self.verdicts = verdicts
        self.rule: ProposalRule | None = None
        self.b = 0.0  # the privacy bound, once the rows are in (start)
        self.state: GreedyState | None = None  # the public x and A
        self.rows = sp.csc_matrix((0, 0))  # this party's ln t rows (start)
        self.loads = np.zeros(0)  # its users' loads sum_i x_i ln t_ij
        self.round = 0
        self.proposals = np.zeros(0, dtype=np.int64)
        self.done = False
        self.noise_scale, self.rng = noise_scale, rng or CipherRandom()
        self.first_x: np.ndarray | None = None  # the first pass's x, once the noise shares are sent
        self.noise_total: np.ndarray | None = None  # z, once received
        self.own_verdicts = np.zeros(0, dtype=np.uint64)
        self.transcript = hashlib.sha256(_framed(b"cels verdict transcript", session_id.encode()))
        self.rejected_accepted = ""  # this party's own note (its log only): a verdict it cannot apply honestly
        self.digests: dict[str, bytes] = {}  # every party's TranscriptDigest, this party's once sent
        self._digest_sent = False

    @property
    def x(self) -> np.ndarray:
        """The public counts (the release once ``done``)."""
        return self.state.x

    def mask_keys(self) -> list[Outgoing]:
        """Step 1: this party's mask key to every other party."""
        return mask_key_messages(self.masks, self.session_id, self.name, self.parties)

    def on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        add_mask_key(self.masks, self.name, self.parties, sender, msg)
        return self._next_round()

    def start(self, rule: ProposalRule, rows: sp.spmatrix, b: float) -> list[Outgoing]:
        """This party's rows are ready: begin the rounds once every mask key is in."""
        self.rule, self.b = rule, b
        self.state = rule.start()
        self.rows = sp.csc_matrix(rows, dtype=np.float64)
        self.loads = np.zeros(self.rows.shape[0])
        return self._next_round()

    def _next_round(self) -> list[Outgoing]:
        if self.rule is None or not self.masks.complete or self.done or len(self.proposals) or self._awaiting_noise:
            return []
        self.proposals = self.rule.propose(self.state)
        if not len(self.proposals) and self.noise_scale is not None and self.first_x is None:
            return self._noise_share()
        if not len(self.proposals):
            self.done = True
            msg = cels_pb2.MaskedVerdicts(session_id=self.session_id, round=self.round, last=True)
        else:
            self.own_verdicts = self.verdicts(self.rows, self.loads, self.proposals, self.b)
            shares = self.masks.masked_or_shares(self.round, self.own_verdicts)
            msg = cels_pb2.MaskedVerdicts(session_id=self.session_id, round=self.round, values=shares.tolist())
        return [(self.aggregator, _envelope(self.session_id, self.name, masked_verdicts=msg))]

    @property
    def _awaiting_noise(self) -> bool:
        return self.first_x is not None and self.noise_total is None

    def _noise_share(self) -> list[Outgoing]:
        """The first pass ended: one masked share of Lap(d/eps') per pair to the aggregator."""
        self.first_x = self.state.x.copy()
        r = len(self.parties)
        shares = [laplace_share(self.noise_scale, r, self.rng) for _ in range(len(self.rule.c))]
        msg = cels_pb2.MaskedNoiseShare(session_id=self.session_id, values=self.masks.masked_values(shares).tolist())
        return [(self.aggregator, _envelope(self.session_id, self.name, masked_noise_share=msg))]

    def on_noise_total(self, sender: str, msg: cels_pb2.NoiseTotal) -> list[Outgoing]:
        """Step 5: z is in; the noise pass starts from min(x, max(x + z, 0))."""
        if sender != self.aggregator:
            raise fail(f"{self.name}: noise_total from {sender!r}, expected from {self.aggregator!r}")
        if not self._awaiting_noise:
            raise fail(f"{self.name}: noise_total before this party's noise share (or a second one)")
        if len(msg.noise) != len(self.rule.c):
            raise malformed(f"{self.name}: noise_total has {len(msg.noise)} values for {len(self.rule.c)} pairs")
        if len(msg.noise) and max(abs(v) for v in msg.noise) > NOISE_LIMIT:
            raise malformed(f"{self.name}: noise_total has a value beyond +-2^62")
        self.noise_total = np.array(msg.noise, dtype=np.int64)
        self.transcript.update(_framed(b"noise_total", msg.session_id.encode(), self.noise_total.astype(">i8").tobytes()))
        self.state = self.rule.noise_pass(self.first_x, self.noise_total)
        self.loads = self.rows @ self.state.x.astype(np.float64)
        return self._next_round()

    def on_round_verdict(self, sender: str, msg: cels_pb2.RoundVerdict) -> list[Outgoing]:
        """Step 3: apply the public update, then the next round."""
        if sender != self.aggregator:
            raise fail(f"{self.name}: round_verdict from {sender!r}, expected from {self.aggregator!r}")
        if self.rule is None or not len(self.proposals) or msg.round != self.round:
            raise fail(f"{self.name}: round_verdict for round {msg.round} out of order (round {self.round})")
        if msg.proposals != len(self.proposals):
            raise malformed(f"{self.name}: round_verdict for {msg.proposals} proposals, this round has {len(self.proposals)}")
        if len(msg.accepted) != (len(self.proposals) + 7) // 8:
            raise malformed(
                f"{self.name}: round_verdict has {len(msg.accepted)} bytes of accepted bits for {len(self.proposals)} proposals, "
                f"expected {(len(self.proposals) + 7) // 8}"
            )
        accepted = np.unpackbits(np.frombuffer(msg.accepted, dtype=np.uint8), bitorder="little")[: len(self.proposals)].astype(bool)
        self.transcript.update(
            _framed(b"round_verdict", msg.session_id.encode(), msg.round.to_bytes(8, "big"), msg.proposals.to_bytes(8, "big"), msg.accepted)
        )
        vetoed = int(np.count_nonzero(accepted & (self.own_verdicts != 0)))
        if vetoed and not self.rejected_accepted:  # applied all the same: transcript agreement ends the session
            self.rejected_accepted = f"round_verdict {self.round} accepts {vetoed} proposal(s) this party rejected"
        chosen = self.proposals[accepted]
        self.loads += np.asarray(self.rows[:, chosen].sum(axis=1)).ravel()
        self.rule.update(self.state, self.proposals, accepted)
        self.round += 1
        self.proposals = np.zeros(0, dtype=np.int64)
        return self._next_round()

    # -- step 6: transcript agreement ---------------------------------------------------------
    def send_digest(self) -> list[Outgoing]:
        """The rounds are over: this party's transcript digest to every other party (once).
        Random bytes if a round accepted a proposal this party rejected: the digests then
        disagree, as after an equivocation, and nobody is told that this party vetoed."""
        if self._digest_sent:
            return []
        self._digest_sent = True
        digest = self.rng.randbytes(DIGEST_BYTES) if self.rejected_accepted else self.transcript.digest()
        self.digests[self.name] = digest
        msg = cels_pb2.TranscriptDigest(session_id=self.session_id, sha256=digest)
        return [(p, _envelope(self.session_id, self.name, transcript_digest=msg)) for p in self.parties if p != self.name]

    def on_transcript_digest(self, sender: str, msg: cels_pb2.TranscriptDigest) -> None:
        """Another party's digest (it may arrive before this party's rounds are over)."""
        if sender not in self.parties or sender == self.name:
            raise fail(f"{self.name}: transcript_digest from {sender!r}, not another party")
        if sender in self.digests:
            raise fail(f"{self.name}: second transcript_digest from {sender!r}")
        if len(msg.sha256) != DIGEST_BYTES:
            raise malformed(f"{self.name}: transcript_digest of {len(msg.sha256)} bytes, expected {DIGEST_BYTES}")
        self.digests[sender] = bytes(msg.sha256)

    def agreement(self) -> bool | None:
        """None until every party's digest is in (this party's sent), then whether all agree."""
        if not self._digest_sent or len(self.digests) < len(self.parties):
            return None
        return len(set(self.digests.values())) == 1

    def disagreement(self) -> str:
        """This party's own account of a failed agreement (its log only)."""
        differ = sorted(p for p, d in self.digests.items() if d != self.digests[self.name] and p != self.name)
        mine = f"; {self.rejected_accepted}" if self.rejected_accepted else ""
        return f"verdict transcript digests of {', '.join(differ) or 'no other party'} differ from this party's{mine}"


class PrivateSolveAggregator:
    """The aggregator's side (on the solver node): sum each round's masked verdicts."""

    def __init__(self, name: str, parties: list[str], session_id: str) -> None:
        self.name, self.parties, self.session_id = name, parties, session_id
        self.round = 0
        self.shares: dict[str, np.ndarray] = {}
        self.last: set[str] = set()
        self.proposals_total = 0
        self.done = False
        self.noise_shares: dict[str, np.ndarray] = {}
        self.noise_total: np.ndarray | None = None  # z, once every share is in

    def on_masked_verdicts(self, sender: str, msg: cels_pb2.MaskedVerdicts) -> list[Outgoing]:
        if sender not in self.parties:
            raise fail(f"{self.name}: masked_verdicts from {sender!r}, not a party")
        if msg.round != self.round or sender in self.shares or sender in self.last:
            raise fail(f"{self.name}: masked_verdicts of {sender} for round {msg.round} out of order (round {self.round})")
        if self.noise_shares:
            raise fail(f"{self.name}: masked_verdicts of {sender} while the noise shares are being summed")
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

    def on_masked_noise_share(self, sender: str, msg: cels_pb2.MaskedNoiseShare) -> list[Outgoing]:
        """Step 5: sum every party's masked share into z and send it to every party."""
        if sender not in self.parties:
            raise fail(f"{self.name}: masked_noise_share from {sender!r}, not a party")
        if sender in self.noise_shares or self.noise_total is not None or self.last:
            raise fail(f"{self.name}: masked_noise_share of {sender} out of order")
        if self.shares:
            raise fail(f"{self.name}: {sender} ends the first pass while others go on with round {self.round}")
        values = np.asarray(msg.values, dtype=np.uint64)
        if self.noise_shares and len(values) != len(next(iter(self.noise_shares.values()))):
            raise malformed(f"{self.name}: masked_noise_share of {sender} has {len(values)} values, the others' differ")
        self.noise_shares[sender] = values
        if len(self.noise_shares) < len(self.parties):
            return []
        self.noise_total = signed(aggregate(self.noise_shares)).copy()
        self.noise_shares = {}
        msg_out = cels_pb2.NoiseTotal(session_id=self.session_id, noise=self.noise_total.tolist())
        return [(p, _envelope(self.session_id, self.name, noise_total=msg_out)) for p in self.parties]
