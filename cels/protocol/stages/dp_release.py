"""The DP histogram's counts and selection (``--release dp``; docs/releases.md).

After the universe (assembled by the solver, each id set padded with dummy ids), every party
P_k adds to its distinct-user counts n^k over the index one noise share per column, X - Y with
X, Y ~ NB(1/h, alpha), h = r - t (Goryczka and Xiong's Polya shares: the h shares an observer
pooling t parties does not know add up to an exact discrete Laplace), and sends the vector,
under pairwise masks, to the solver (cels.protocol.masked_sum with an outside aggregator).  The
solver opens only n + Z, keeps the columns at or above the threshold tau (the exact tail of
the total noise, worst case n = 1: cels.mechanism.dp_histogram.threshold), and asks each party
for the items of the kept columns it holds (:class:`DpSelection`); the same noisy value that
passed the threshold is released, to the initiator alone (:class:`DpRelease`).  No node ever
holds a noise-free count or another party's share.
"""

from __future__ import annotations

import json

import numpy as np

from cels.crypto.streams import CipherRandom, DrawKeys
from cels.mechanism.dp_release import NOISE_SHARES, DpHistogram
from cels.mechanism.dp_histogram import count_scale, noise_shares, release_accounting, share_beta, threshold
from cels.mechanism.item_kinds import Item, checked_item
from cels.protocol.masked_sum import MaskedSum
from cels.protocol.secure_sum import Summand
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, addressed, fail, malformed
from cels.engine.routines import chunks
from cels.engine.variable_index import IndexPart, increasing
from cels.protocol.stages.results import UniverseResult
from cels.protocol.stages.seat import Seat, Stage
from cels.protocol.stages.sums import COUNTS_SUM, SumRing
from cels.protocol.stages.universe import STREAM_IDS
from cels.protocol.wire import cels_pb2
from cels.engine.interface import PartyWork
from cels.engine.routines import INDEX_PADDING, ItemBound
from cels.protocol.releases import DP_HISTOGRAM


def release_threshold(options: SessionOptions) -> int:
    """tau of a session: the exact tail of the total noise NB(r/h) - NB(r/h), n = 1."""
    beta = share_beta(len(options.parties), options.collusion)
    return threshold(options.epsilon, options.delta, options.item_kinds.total, beta)


def session_accounting(options: SessionOptions) -> dict:
    """A DP session's accounting per observer (cels.mechanism.dp_histogram.release_accounting)."""
    return release_accounting(options.epsilon, options.delta, options.item_kinds, options.padding_epsilon, len(options.parties), options.collusion)


def session_spends(options: SessionOptions) -> tuple[float, float, float]:
    """(eps, delta, eps') a DP session spends in a party's ledger (cels.protocol.releases): what its
    most-informed observer gets, a party's view (release and padded set sizes), with no eps'."""
    eps, delta = session_accounting(options)["party"]
    return float(eps), float(delta), 0.0


def decode_item(data: bytes) -> Item:
    """Inverse of cels.engine.routines.encode_item for an item of any kind (cels.mechanism.item_kinds)."""
    try:
        return checked_item(json.loads(data.decode()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise malformed(f"dp item does not decode: {exc}") from None


class NoisyCounts(Stage):
    """P_k: its counts plus its noise shares, masked, to the solver; then the items of its kept
    columns (``result``: how many it named)."""

    phase = Phase.COUNTS

    def __init__(self, seat: Seat, work: PartyWork, sums: SumRing, universe: UniverseResult, draws: DrawKeys) -> None:
        super().__init__(seat)
        self.work, self.sums, self.n = work, sums, universe.n
        self.local_counts: np.ndarray | None = universe.local_counts
        self.padding, self.own = universe.padding_columns, universe.own_columns  # sorted
        self.rng = CipherRandom(generator=draws.stream(NOISE_SHARES))

    def start(self) -> list[Outgoing]:
        options = self.seat.options
        scale = count_scale(options.epsilon, options.item_kinds.total)
        noise = noise_shares(self.n, scale, self.seat.r - options.collusion, self.rng)
        local, self.local_counts = self.local_counts, None
        return self.sums.start(COUNTS_SUM, local.astype(np.int64) + noise, aggregator=self.seat.solver)

    def on_dp_selection(self, sender: str, msg: cels_pb2.DpSelection) -> list[Outgoing]:
        seat = self.seat
        seat.expect_sender(sender, seat.solver, "dp_selection")
        kept = np.asarray(msg.columns, dtype=np.int64)
        if np.any(np.diff(kept) <= 0) or (len(kept) and (kept[0] < 0 or kept[-1] >= self.n)):
            raise malformed(f"{seat.name}: dp_selection: columns not strictly increasing below the index size {self.n}")
        columns = np.union1d(np.intersect1d(kept, self.own), np.intersect1d(kept, self.padding))  # its own kept columns, in order
        dummy = np.isin(columns, self.padding)
        try:
            real = iter(self.work.items(columns[~dummy]))
        except KeyError as exc:
            raise malformed(f"{seat.name}: dp_selection names column {exc}, which is not its own") from None
        items = [b"" if d else next(real) for d in dummy.tolist()]  # a dummy's kept column: dropped by the solver
        self.result = len(items)
        return seat.send(seat.solver, dp_items=cels_pb2.DpItems(session_id=seat.session_id, items=items))


class DpAggregator:
    """The solver's part of the DP release: the index of every party's complete id set (with
    its own dummy columns), the sum of the masked noisy counts, the threshold, the selection
    and the release to the initiator."""

    def __init__(self, name: str, options: SessionOptions, key_width: int, draws: DrawKeys) -> None:
        self.name, self.options = name, options
        self.parties = list(options.parties)
        self.union = IndexPart(key_width)
        self.key_width = key_width
        self.rng = CipherRandom(generator=draws.stream(INDEX_PADDING))
        self.sets: dict[str, int] = {}  # each party's complete set size, once whole
        self.pending: dict[str, list[np.ndarray]] = {}  # a party's complete ids so far, in the order it sent them
        self.order: dict[str, np.ndarray] = {}  # each party's ids in sorted order: positions in the order it sent them
        self.held: dict[str, np.ndarray] = {}  # each party's columns in the index
        self.n: int | None = None
        self.sum: MaskedSum | None = None
        self.kept: np.ndarray | None = None
        self.totals: np.ndarray | None = None
        self.items: dict[int, bytes] = {}
        self.answered: set[str] = set()
        self.tau = release_threshold(options)

    # -- the universe ------------------------------------------------------------------------
    def on_complete_ids(self, sender: str, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        """A chunk of a party's complete set, from the party before it in the ring (which applied
        the last layer), in the order the owner sent its ids; whole, it is sorted and merged."""
        applied, owner, r = list(msg.applied), msg.owner, len(self.parties)
        k = self.parties.index(owner) if owner in self.parties else -1
        ring = [self.parties[(k + t) % r] for t in range(r)]
        if k < 0 or sender != ring[-1] or applied != ring:
            raise fail(f"{self.name}: complete universe ids of {owner!r} from {sender!r} with layers {applied}")
        if owner in self.sets:
            raise fail(f"{self.name}: complete universe ids of {owner!r} after its set was whole")
        if len(msg.ids) % self.key_width:
            raise malformed(f"{self.name}: {len(msg.ids)} bytes of ids of {owner!r}, not {self.key_width}-byte keys")
        chunks = self.pending.setdefault(owner, [])
        position = sum(len(c) for c in chunks)
        if msg.first != position:
            raise fail(f"{self.name}: complete universe ids of {owner!r} from {msg.first}, expected {position}")
        chunks.append(np.frombuffer(msg.ids, dtype=f"V{self.key_width}"))
        if msg.more:
            return []
        keys = np.concatenate([np.zeros(0, dtype=f"V{self.key_width}"), *self.pending.pop(owner)])
        order = np.argsort(keys)
        ordered = keys[order]
        if not increasing(ordered, ordered[:0]):
            raise malformed(f"{self.name}: two complete universe ids of {owner!r} are equal")
        self.union.add(owner, ordered)
        self.union.complete(owner)
        self.sets[owner], self.order[owner] = len(keys), order
        return self._index() if len(self.sets) == r else []

    def _index(self) -> list[Outgoing]:
        """Every set is in: the solver's own dummy columns go in (so that the index size minus
        the set sizes, the pairs two parties share, is DP), then every party is told the size
        and its columns."""
        dummies = ItemBound.of(self.options).padding(self.rng)
        keys = np.unique(np.frombuffer(self.rng.randbytes(dummies * self.key_width), dtype=f"V{self.key_width}"))
        if len(keys):
            self.union.add(self.name, keys)
        self.union.complete(self.name)
        n = self.n = self.union.size()
        out: list[Outgoing] = []
        for party in self.parties:
            columns = np.zeros(self.sets[party], dtype=np.int64)
            columns[self.order.pop(party)] = self.union.columns(party, 0, self.sets[party])  # in the order the party sent its ids
            self.held[party] = np.sort(columns)
            for first, stop, more in chunks(len(columns), STREAM_IDS):
                index = cels_pb2.UniverseIndex(session_id=self.options.session_id, size=n, columns=columns[first:stop].tolist(), first=first, more=more)
                out += self._send(party, universe_index=index)
        self.union.close()
        summand = Summand(self.name, self.options.session_id, COUNTS_SUM, self.parties, np.zeros(n, dtype=np.int64), None)
        self.sum = MaskedSum(summand, masks=None, round_number=0, aggregator=self.name)
        self.sum.start()
        return out

    # -- the noisy counts ----------------------------------------------------------------------
    def on_share(self, sender: str, envelope: cels_pb2.Envelope) -> list[Outgoing]:
        """A chunk of a party's masked noisy counts; with every one in, n + Z is opened, the
        threshold applied and each party asked for its kept columns' items."""
        if self.sum is None:
            raise fail(f"{self.name}: masked_sum_share before the index was sent")
        if envelope.masked_sum_share.sum_id != COUNTS_SUM:
            raise fail(f"{self.name}: masked_sum_share of sum {envelope.masked_sum_share.sum_id!r}")
        self.sum.receive(sender, envelope)
        if not self.sum.done:
            return []
        total = np.asarray(self.sum.result, dtype=np.int64)
        self.kept = np.flatnonzero(total >= self.tau)
        self.totals = total[self.kept]
        selection = cels_pb2.DpSelection(session_id=self.options.session_id, columns=self.kept.tolist())  # the same to every party
        return [out for party in self.parties for out in self._send(party, dp_selection=selection)]

    def on_items(self, sender: str, msg: cels_pb2.DpItems) -> list[Outgoing] | None:
        """A party's items for its kept columns (an empty one: its dummy); once every party
        answered, the release to the initiator (None until then)."""
        if self.kept is None or sender not in self.parties or sender in self.answered:
            raise fail(f"{self.name}: unexpected dp_items from {sender!r}")
        mine = np.intersect1d(self.kept, self.held[sender], assume_unique=True)
        if len(msg.items) != len(mine):
            raise malformed(f"{self.name}: dp_items from {sender!r}: {len(msg.items)} items for {len(mine)} columns")
        for column, item in zip(mine.tolist(), msg.items):
            if not item:
                continue
            decode_item(item)
            if self.items.setdefault(column, item) != item:
                raise malformed(f"{self.name}: dp_items from {sender!r}: another item than a co-holder's for one column")
        self.answered.add(sender)
        if len(self.answered) < len(self.parties):
            return None
        released = [(self.items[c], int(v)) for c, v in zip(self.kept.tolist(), self.totals.tolist()) if c in self.items]
        released.sort()
        release = cels_pb2.DpRelease(
            session_id=self.options.session_id, items=[i for i, _ in released], counts=[v for _, v in released]
        )  # fmt: skip
        return self._send(self.options.initiator, dp_release=release)

    def _send(self, recipient: str, **step) -> list[Outgoing]:
        return addressed(self.options.session_id, self.name, recipient, **step)

    def report(self) -> dict:
        """What the solver reports of the release (its public size and threshold)."""
        return {"release": DP_HISTOGRAM.name, "index_size": self.n, "threshold": self.tau, "released": len(self.items)}


def histogram_of(msg: cels_pb2.DpRelease, tau: int) -> DpHistogram:
    """The initiator's release from the solver's DpRelease (every count at or above tau)."""
    if len(msg.items) != len(msg.counts):
        raise malformed(f"dp_release: {len(msg.items)} items and {len(msg.counts)} counts")
    pairs = []
    for data, count in zip(msg.items, msg.counts):
        if count < tau:
            raise malformed(f"dp_release: a count {count} below the threshold {tau}")
        pairs.append(decode_item(data))
    return DpHistogram.of(pairs, msg.counts, tau)
