"""A party's heavy local work, behind one small interface (docs/protocol.md, "How a session lives").

The phase machines of :mod:`cels.protocol.stages` never hold a party's users: they ask a
:class:`PartyWork` for everything that runs over its rows -- hashing its pair ids, another
layer of the commutative hash on a peer's ids, the per-pair vectors of the secure sums, the
constraint rows, the private solve's verdicts, the sampling draws and the output records --
and keep only what the protocol needs (vectors over pairs, bitmaps, id lists).  So a party
whose rows do not fit one array in one process plugs in another implementation (a cluster)
without touching the protocol.  :class:`InProcessWork` is the default: the whole log in this
process, exactly as CELS section 4.2 describes one party's computation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from cels.crypto.commutative_cipher import PohligHellmanHash
from cels.crypto.ec_hash import ELEMENT_BYTES, X25519Hash
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.logs.model import SearchLog
from cels.logs.records import LogError
from cels.logs.readers import LogFile, iter_records
from cels.mechanism.conditions import apply_cap, dominant_rows, log_t_rows
from cels.mechanism.dp_histogram import padding_count
from cels.mechanism.dp_release import ITEM_CHOICE, bounded_by_kind
from cels.mechanism.item_kinds import ItemKinds
from cels.mechanism.greedy import verdicts
from cels.protocol.chunked import chunks
from cels.protocol.sampling import StagedSampler, paper_trials
from cels.protocol.variable_index import IndexPart
from cels.protocol.stages.results import LoadResult
from cels.protocol.user_draws import BucketDraws, buckets_of, draw_order, split_over_buckets, user_digests

CommutativeHash = X25519Hash | PohligHellmanHash
PAIR_DIGEST_BYTES = 16
"""Bytes of a pair's keyed digest (:func:`pair_digests`): distinct pairs collide with
probability about n^2 / 2^129."""
PAIR_ORDER = "pair order"
"""The label of a party's session key for its pairs' digests (cels.crypto.streams.DrawKeys.secret)."""
_JSON_STRING = json.encoder.encode_basestring  # a JSON string, UTF-8 kept (json's C encoder with ensure_ascii off)


def id_width(cipher: CommutativeHash) -> int:
    """The fixed byte width of this cipher's hashed ids (a curve point's u, a group element)."""
    return ELEMENT_BYTES if isinstance(cipher, X25519Hash) else cipher.group.element_bytes


def id_array(ids: Sequence[bytes], width: int) -> np.ndarray | None:
    """The ids as one writable array of ``np.void`` items of ``width`` bytes (compact; unlike
    ``S``, keeps trailing NUL bytes), or None if one has another width."""
    if any(len(i) != width for i in ids):
        return None
    return np.frombuffer(bytearray().join(ids), dtype=f"V{width}")


def id_list(ids: np.ndarray) -> list[bytes]:
    """The ids of an :func:`id_array` as bytes (for the wire and the ciphers)."""
    raw, width = ids.tobytes(), ids.dtype.itemsize
    return [raw[i : i + width] for i in range(0, len(raw), width)]


def pair_digests(key: bytes, encoded: Sequence[bytes]) -> np.ndarray:
    """Keyed BLAKE2b of each pair's encoded id (:func:`encode_item`), :data:`PAIR_DIGEST_BYTES`
    bytes, under the party's :data:`PAIR_ORDER` key: a fixed-width ``S`` array (compared on all
    its bytes).  A party's own ids leave in the order of these digests (docs/protocol.md,
    "Universe"): a keyed pseudorandom order, not the log's, that every engine finds the same
    way (a cluster numbers its pairs by them; docs/crypto.md)."""
    return np.array([hashlib.blake2b(item, key=key, digest_size=PAIR_DIGEST_BYTES).digest() for item in encoded], dtype=f"S{PAIR_DIGEST_BYTES}")


def smallest(values: np.ndarray) -> np.ndarray:
    """Non-negative integer ``values`` in the smallest unsigned type that holds them: vectors
    over an index of millions of pairs whose entries are mostly small counts."""
    return values.astype(np.min_scalar_type(int(values.max(initial=0))), copy=False)


def column_type(n: int) -> np.dtype:
    """The type of a column of an index of ``n`` pairs: int32 below 2^31 (4 bytes a pair), else int64."""
    return np.dtype(np.int32 if n < 2**31 else np.int64)


def encode_item(*fields: str | int) -> bytes:
    """Injective byte encoding of a pair id (query, url) or an output record (user, query, url,
    count): the compact JSON array of the fields, UTF-8, byte for byte what
    ``json.dumps(fields, ensure_ascii=False, separators=(",", ":"))`` writes, built without the
    encoder's per-call set-up (docs/protocol.md, Decisions: Universe)."""
    return ("[" + ",".join([_JSON_STRING(f) if isinstance(f, str) else str(int(f)) for f in fields]) + "]").encode()


def pruned_constraint_rows(local: sp.spmatrix, totals: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """A party's ln t rows over the active pairs (``local``: its users x those pairs, totals c
    over them) with dominated rows pruned (cels.mechanism.conditions.prune_dominated), and the
    user of each row kept."""
    rows = log_t_rows(local, totals)
    users = dominant_rows(rows)
    return rows[users].tocsr(), users


def encode_records(sampled: sp.spmatrix, names: Callable[[np.ndarray], list[str]], pair: Callable[[int], tuple[str, str]]) -> list[bytes]:
    """The encoded (user, query, url, count) of every x_ij > 0 in ``sampled`` (users x active
    pairs): ``names(rows)`` names the users drawn from, ``pair(col)`` is column col's pair."""
    sampled = sp.csr_matrix(sampled)
    sampled.eliminate_zeros()
    users = np.flatnonzero(np.diff(sampled.indptr))
    out = []
    for j, user in zip(users, names(users)):
        lo, hi = sampled.indptr[j], sampled.indptr[j + 1]
        for col, count in zip(sampled.indices[lo:hi], sampled.data[lo:hi]):
            out.append(encode_item(user, *pair(int(col)), int(count)))
    return out


PADDING = "padding"
"""The label of a party's stream for the DP release's dummy ids."""
INDEX_PADDING = "index padding"
"""The label of the solver's stream for the DP release's dummy columns of the index."""


@dataclass(frozen=True)
class ItemBound:
    """The DP release's contribution bound at a party, applied at the load before anything
    leaves it (cels.mechanism.dp_release.bounded_by_kind: at most Delta_k items of each kind
    a user), and the dummy ids that pad its set of items (``options``: the session's, for the
    padding's size)."""

    kinds: ItemKinds
    options: Any

    @classmethod
    def of(cls, options: Any) -> ItemBound | None:
        """The bound of a session's options (None unless its release kind bounds users: cels.protocol.releases)."""
        return cls(options.item_kinds, options) if options.release_kind.private_universe else None

    def padding(self, rng: CipherRandom) -> int:
        """How many dummy ids pad one id set: D in [0, 2 mu] (cels.mechanism.dp_histogram.padding_count
        at Delta_0 = the sum of the kinds' bounds)."""
        return padding_count(self.kinds.total, self.options.padding_epsilon, self.options.delta, rng)

    def dummies(self, draws: DrawKeys) -> list[bytes]:
        """This party's dummy ids, as encoded items that no item's encoding equals (an item's
        starts with a number or has at most two strings; these three fields): D of them, D drawn
        so that the padded set's size is DP (:meth:`padding`)."""
        rng = CipherRandom(generator=draws.stream(PADDING))
        return [encode_item("padding", rng.randbytes(16).hex(), 0) for _ in range(self.padding(rng))]


def party_log(source: SearchLog | Callable[[], SearchLog] | LogFile, bound: ItemBound | None) -> SearchLog:
    """The log a party's work runs over: its histogram c_ij of query-url pairs, or, for a DP
    release of other item kinds, its histogram of those items, read from the log's events
    in file order (cels.mechanism.item_kinds; the source must then be a log file)."""
    if bound is None or bound.kinds.only_pairs:
        return source() if callable(source) else source
    if not isinstance(source, LogFile):
        raise ValueError(f"--items {bound.kinds.text()} counts the log's events in order: the party's log must be read from its file")
    read: dict = {}
    log = bound.kinds.histogram(iter_records(source.path, source.options, read), read)
    if log.n_pairs == 0:
        raise LogError(str(source.path), None, None, f"no item of the kinds {bound.kinds.text()} in {source.path}")
    return log


class UnionIndex(Protocol):
    """P_1's sorted union of the complete id sets (cels.protocol.variable_index): a
    :class:`IndexPart` in this process, or a ``RangedIndex`` over a cluster's shards."""

    def add(self, owner: str, keys: np.ndarray) -> None: ...
    def complete(self, owner: str) -> None: ...
    def size(self) -> int: ...
    def columns(self, owner: str, first: int, stop: int) -> np.ndarray: ...
    def close(self) -> None: ...


class PartyWork(Protocol):
    """What a phase machine asks of the party's rows (users x pairs, c_ij capped)."""

    def load(self) -> LoadResult:
        """Load and cap the log: how many distinct pairs this party holds, and its source."""
        ...

    def hashed_ids(self, cipher: CommutativeHash, size: int) -> Iterator[np.ndarray]:
        """This party's layer on its own pair ids (universe phase, first hop), in the order of
        their :func:`pair_digests`: :func:`id_array` chunks of ``size`` ids (the last maybe
        fewer), each made as it is asked for."""
        ...

    def apply_layer(self, cipher: CommutativeHash, ids: np.ndarray) -> np.ndarray:
        """This party's layer on a peer's ids (universe phase, later hops), an :func:`id_array` of
        the cipher's width in and out."""
        ...

    def union(self, width: int) -> UnionIndex:
        """P_1: an empty sorted union of complete sets of ``width``-byte union keys (the index),
        held where the work runs."""
        ...

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        """Own ids ``first``.. (in the order :meth:`hashed_ids` gave them) came back with every
        layer: their union keys, kept where the work runs."""
        ...

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        """Every kept union key, sorted (the complete set P_k sends P_1): chunks of ``size``
        (at least one, the last maybe shorter), each made as it is asked for."""
        ...

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The sorted union keys ``first``.. (:meth:`sorted_returned`'s order) are columns
        ``columns`` of the index of ``n`` pairs."""
        ...

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The DP release: own ids ``first``.. in the order :meth:`hashed_ids` gave them are
        columns ``columns`` of the index of ``n`` pairs (the party never saw them with every layer)."""
        ...

    def index(self, n: int) -> np.ndarray:
        """Every own pair's column is placed: the local counts c^k over the index of ``n``
        pairs, in the smallest unsigned integer type that holds them."""
        ...

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        """The indicator "one of my users holds all of pair i" (the unique pairs' secure sum),
        one byte per pair."""
        ...

    def constraint_rows(self, active: np.ndarray, totals: np.ndarray) -> sp.csr_matrix:
        """This party's ln t rows over the ``active`` pairs (totals c over them), dominated rows pruned."""
        ...

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        """The private solve's verdicts of its rows on one round's proposals (cels.mechanism.greedy)."""
        ...

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> StagedSampler:
        """The staged exact sampling over this party's users (cels.protocol.sampling), each
        stage's draws from the users' buckets (cels.protocol.user_draws)."""
        ...

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        """The paper's local sampling: floor(x_i c_i^k / c_i) multinomial trials over its users
        (split over the users' buckets, then within each: cels.protocol.user_draws)."""
        ...

    def records(self, sampled: sp.csr_matrix, active: np.ndarray, keep_user_ids: bool) -> list[bytes]:
        """(user pseudonym, query, url, count) for every x_ij > 0 drawn, encoded for the union
        (pseudonyms from the users' buckets)."""
        ...

    def items(self, columns: np.ndarray) -> list[bytes]:
        """The DP release: the encoded pair (query, url) of each of its own ``columns`` (b"" for
        a dummy id's); KeyError names a column that is not its own."""
        ...


class InProcessWork:
    """The whole log in this process (the default).  ``log`` is the log or its loader;
    ``draws`` the party's keys for this session.  The rows are kept in draw order
    (cels.protocol.user_draws)."""

    def __init__(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> None:
        self._source, self._cap, self.draws, self.bound = log, cap, draws, bound
        self.log: SearchLog | None = None
        self.user_draws: BucketDraws | None = None
        self.counts: sp.csr_matrix | None = None  # users x own pairs, capped
        self.own = np.zeros(0, dtype=np.int64)  # the pairs this party holds (log numbering, ascending)
        self.sent = np.zeros(0, dtype=np.int64)  # the own pairs in the order their ids left (hashed_ids)
        self.returned = np.zeros(0, dtype="V16")  # their union keys, every layer applied, in that order
        self.sorted_from = np.zeros(0, dtype=np.int64)  # the position in that order of each returned key, sorted
        self.columns = np.zeros(0, dtype=np.int64)  # the index column of each own pair, in that order
        self.local: sp.csr_matrix | None = None  # users x universe
        self.pair_of: dict[int, int] = {}  # universe column -> own pair index
        self.row_users = np.zeros(0, dtype=np.int64)  # the user (log row) of each constraint row

    def load(self) -> LoadResult:
        log = party_log(self._source, self.bound)
        digests = user_digests(self.draws, log.users)
        order = draw_order(digests)
        self.log = log if np.array_equal(order, np.arange(len(order))) else log.select_users(order)
        self.user_draws = BucketDraws(self.draws, buckets_of(digests[order]))
        self.counts = apply_cap(self.log.counts, self._cap).tocsr()
        if self.bound is not None:
            pairs, key = self.log.pairs, self.draws.secret(ITEM_CHOICE)
            self.counts = bounded_by_kind(self.counts, self.log.users, lambda cols: [encode_item(*pairs[c]) for c in cols], key, self.bound.kinds)
        self.own = np.flatnonzero(np.asarray(self.counts.sum(axis=0)).ravel() > 0)
        return LoadResult(len(self.own), log.source)

    def hashed_ids(self, cipher: CommutativeHash, size: int) -> Iterator[np.ndarray]:
        pairs = self.log.pairs
        encoded = [encode_item(*pairs[i]) for i in self.own]
        order = np.argsort(pair_digests(self.draws.secret(PAIR_ORDER), encoded), kind="stable")
        self.sent = self.own[order]
        for lo, hi, _more in chunks(len(order), size):
            yield id_array(cipher.hash([encoded[t] for t in order[lo:hi].tolist()]), id_width(cipher))

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        if len(self.returned) != len(self.sent) or self.returned.dtype != keys.dtype:
            self.returned = np.zeros(len(self.sent), dtype=keys.dtype)
        self.returned[first : first + len(keys)] = keys

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        self.sorted_from = np.argsort(self.returned)  # distinct keys (a repeat is malformed): no stable sort needed
        for lo, hi, _more in chunks(len(self.returned), size):
            yield self.returned[self.sorted_from[lo:hi]]

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        if len(self.columns) != len(self.sent):
            self.columns = np.zeros(len(self.sent), dtype=column_type(n))
        self.columns[self.sorted_from[first : first + len(columns)]] = columns

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        if len(self.columns) != len(self.sent):
            self.columns = np.zeros(len(self.sent), dtype=column_type(n))
        self.columns[first : first + len(columns)] = columns

    def apply_layer(self, cipher: CommutativeHash, ids: np.ndarray) -> np.ndarray:
        return id_array(cipher.apply(id_list(ids)), id_width(cipher))

    def union(self, width: int) -> IndexPart:
        return IndexPart(width)

    def index(self, n: int) -> np.ndarray:
        own, columns = self.sent, self.columns
        self.returned, self.sorted_from, self.columns = self.returned[:0].copy(), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        select = sp.csr_matrix((np.ones(len(columns), dtype=np.int64), (np.arange(len(columns)), columns)), shape=(len(columns), n))
        self.local = (self.counts[:, own] @ select).tocsr()
        self.pair_of = dict(zip(columns.tolist(), own.tolist()))
        return smallest(np.asarray(self.local.sum(axis=0)).ravel())

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        col_max = np.asarray(self.local.max(axis=0).todense()).ravel() if self.local.shape[0] else np.zeros(len(totals))
        return ((col_max >= totals) & (totals > 0)).astype(np.uint8)

    def constraint_rows(self, active: np.ndarray, totals: np.ndarray) -> sp.csr_matrix:
        rows, self.row_users = pruned_constraint_rows(self.local[:, active], totals)
        return rows

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        return verdicts(rows, loads, proposals, b)

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> StagedSampler:
        return StagedSampler(self.local[:, active], totals, x, self.user_draws.poisson, theta)

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        local = self.local[:, active]
        trials = paper_trials(np.asarray(local.sum(axis=0)).ravel(), totals, x)
        split = split_over_buckets(trials, self.user_draws.bucket_totals(local), self.draws.stream("paper split"))
        return self.user_draws.multinomial(local, split)

    def records(self, sampled: sp.csr_matrix, active: np.ndarray, keep_user_ids: bool) -> list[bytes]:
        names = (lambda rows: [self.log.users[j] for j in rows]) if keep_user_ids else self.user_draws.pseudonyms
        return encode_records(sampled, names, lambda col: self.log.pairs[self.pair_of[int(active[col])]])

    def items(self, columns: np.ndarray) -> list[bytes]:
        return [encode_item(*self.log.pairs[self.pair_of[c]]) for c in columns.tolist()]
