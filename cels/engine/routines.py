"""The party's work routines that every engine shares, Ray-free (docs/protocol.md, "How a session lives").

What the in-process engine (cels.engine.inprocess) and the Ray engine (cels.engine.ray) both
compute over a party's rows, written once: the fixed-width id arrays, the pairs' keyed digests
(the order a party's ids leave in), the item encoding, the pruned constraint rows, the output
records, the DP release's contribution bound and padding, and the chunks of a streamed list.
The draw buckets (cels.engine.user_draws), P_1's index (cels.engine.variable_index) and the
staged sampling (cels.engine.sampling) are modules of their own beside this one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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

STREAM_IDS = 16384
"""Ids per UniverseHop, columns per UniverseIndex (cels.protocol.stages.universe): every list
goes as consecutive chunks of at most this many, a hop's ids packed in one bytes field, and a
party's work hashes them a chunk at a time.  16,384 X25519 ids are 512 KiB, within one 1 MiB
transport frame (cels.node.framing); Pohlig-Hellman ids (the group's size each) span a few frames."""


def chunks(n: int, size: int) -> Iterator[tuple[int, int, bool]]:
    """(first, stop, more) of the consecutive chunks of at most ``size`` of a list of ``n``."""
    for first in range(0, max(n, 1), size):
        stop = min(first + size, n)
        yield first, stop, stop < n


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


def bounded_rows(counts: sp.spmatrix, cap: int, users: Sequence[str], items: Callable[[Sequence[int]], list[bytes]], draws: DrawKeys,
                 kinds: ItemKinds | None) -> sp.csr_matrix:
    """A party's rows c_ij (users x pairs) capped at ``cap`` (cels.mechanism.conditions.apply_cap),
    and for the DP release at most Delta_k items of each kind a user, chosen from its
    ITEM_CHOICE key (cels.mechanism.dp_release.bounded_by_kind; ``items(cols)``: the encoded
    items of those columns), as every engine loads them."""
    capped = apply_cap(counts, cap).tocsr()
    return capped if kinds is None else bounded_by_kind(capped, users, items, draws.secret(ITEM_CHOICE), kinds)


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
