"""The DP histogram of query-url pairs, and of queries and query pairs on request
(docs/releases.md): contribution bounding, the release value, the single holder's release
and its utility measures.

Each user keeps at most Delta_0 distinct items of each kind (:func:`bounded_counts`,
cels.mechanism.item_kinds); an item's count n is its number of distinct users; the release
holds every item whose noisy count n + Z reaches the
threshold tau, with that same noisy count (Korolova et al. WWW 2009 and Google's partition
selection, with discrete noise: cels.mechanism.dp_histogram).  One holder draws Z itself
(:func:`sanitize_dp`, ``cels sanitize --release dp``); the parties of a session draw it as
shares inside the masked sum (cels.protocol.stages.dp_release), and with t = 0 both releases
have the same distribution.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from cels.baselines.release import ReleasedItem, write_release
from cels.crypto.streams import CipherRandom, DrawKeys
from cels.logs.model import SearchLog
from cels.mechanism.dp_histogram import count_scale, noise_shares, share_beta, threshold
from cels.mechanism.item_kinds import Item, ItemKinds, item_of, kind_of

ITEM_CHOICE = "item choice"
"""The label of a holder's session key for the choice of each user's pairs (DrawKeys.secret)."""
NOISE_SHARES = "noise shares"
"""The label of a holder's stream for its noise (a party's: its shares)."""
TOP = 100
"""Recall is measured over the true top this many pairs (docs/releases.md, "Utility")."""


@dataclass(frozen=True)
class DpHistogram:
    """A DP release: the items at or above ``threshold`` with their noisy counts n + Z, sorted
    by item (a function of the set alone)."""

    items: tuple[ReleasedItem, ...]
    threshold: int

    def __len__(self) -> int:
        return len(self.items)

    @classmethod
    def of(cls, items: Sequence[Item], counts: Sequence[int], tau: int) -> DpHistogram:
        """The release of ``items`` (cels.mechanism.item_kinds) with these noisy counts."""
        released = (kind_of(item).released_item(item, c) for item, c in zip(items, counts))
        return cls(tuple(sorted(released, key=lambda i: (i.kind, i.query, i.url or "", i.next_query or ""))), tau)


def write_histogram(histogram: DpHistogram, path: Any) -> None:
    """Write a DP histogram in the baselines' release format (atomic; cels.baselines.release)."""
    write_release(list(histogram.items), path)


def bounded_counts(
    counts: sp.spmatrix, users: Sequence[str], encoded: Callable[[list[int]], list[bytes]], key: bytes, max_items: int
) -> sp.csr_matrix:
    """``counts`` (users x pairs) with each user's at most ``max_items`` pairs of lowest
    priority kept, every kept entry 1 (a pair counts distinct users).  ``encoded(cols)``
    gives the pairs' encodings (cels.engine.routines.encode_item); a priority is the keyed
    BLAKE2b (``key``: the holder's :data:`ITEM_CHOICE` secret) of the user's JSON encoding
    followed by the pair's (an injective pair of JSON arrays), so the choice is uniform and
    the same for any split of the users (Korolova et al., "limit user activity")."""
    counts = sp.csr_matrix(counts, dtype=np.int64)
    counts.eliminate_zeros()
    keep = np.zeros(counts.nnz, dtype=bool)
    for row in range(counts.shape[0]):
        lo, hi = counts.indptr[row], counts.indptr[row + 1]
        if hi - lo <= max_items:
            keep[lo:hi] = True
            continue
        user = json_array(users[row])
        priority = [hashlib.blake2b(user + pair, key=key, digest_size=16).digest() for pair in encoded(counts.indices[lo:hi].tolist())]
        keep[lo + np.argsort(np.array(priority, dtype="S16"), kind="stable")[:max_items]] = True
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))[keep]
    return sp.csr_matrix((np.ones(len(rows), dtype=np.int64), (rows, counts.indices[keep])), shape=counts.shape)


def bounded_by_kind(
    counts: sp.spmatrix, users: Sequence[str], encoded: Callable[[list[int]], list[bytes]], key: bytes, kinds: ItemKinds
) -> sp.csr_matrix:
    """:func:`bounded_counts` of each kind's columns with its own bound (a column's kind read
    from its encoding); one kind of pairs is :func:`bounded_counts` itself."""
    if kinds.only_pairs:
        return bounded_counts(counts, users, encoded, key, kinds.total)
    counts = sp.csr_matrix(counts, dtype=np.int64)
    bounded = sp.csr_matrix(counts.shape, dtype=np.int64)
    for columns, bound in kinds.column_bounds(encoded(list(range(counts.shape[1])))):
        only = sp.diags(np.isin(np.arange(counts.shape[1]), columns).astype(np.int64), dtype=np.int64)
        bounded = bounded + bounded_counts(counts @ only, users, encoded, key, bound)
    return bounded.tocsr()


def json_array(*fields: str | int) -> bytes:
    """The compact JSON array of ``fields``, UTF-8: a pair's encoding as the parties hash it
    (cels.engine.routines.encode_item writes the same bytes)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def distinct_users(log: SearchLog, bound: int | ItemKinds, draws: DrawKeys) -> np.ndarray:
    """n per item of ``log`` (its ``pairs`` are items of the ``bound``'s kinds) after the
    bound: its distinct users among those who kept it."""
    items = log.pairs
    encoded = lambda cols: [json_array(*items[c]) for c in cols]  # noqa: E731
    bounded = bounded_by_kind(log.counts, log.users, encoded, draws.secret(ITEM_CHOICE), ItemKinds.of(bound))
    return np.asarray(bounded.sum(axis=0)).ravel().astype(np.int64)


def sanitize_dp(
    log: SearchLog, epsilon: float, delta: float, bound: int | ItemKinds, draws: DrawKeys, parties: int = 1, collusion: int = 0
) -> tuple[DpHistogram, np.ndarray, np.ndarray]:
    """One holder's DP histogram of ``log``'s items (``bound``: Delta_0 of pairs, or the item
    kinds and their bounds, whose sum Delta sizes the noise: cels.mechanism.item_kinds): the
    bound, n per item, Z the sum of ``parties`` noise shares
    X - Y, X, Y ~ NB(1/h, alpha), h = parties - collusion (one share of one: the discrete
    Laplace of scale Delta_0/eps), tau at beta = parties/h; returns the release, n and n + Z
    over the log's pairs (the last two for the operator report only).  With ``parties`` r and
    ``collusion`` t it is the distribution of a session's release (cels.protocol.stages.dp_release)."""
    total = ItemKinds.of(bound).total
    n = distinct_users(log, bound, draws)
    rng, scale = CipherRandom(generator=draws.stream(NOISE_SHARES)), count_scale(epsilon, total)
    noisy = n.copy()
    for _ in range(parties):
        noisy += noise_shares(len(n), scale, parties - collusion, rng)
    tau = threshold(epsilon, delta, total, share_beta(parties, collusion))
    kept = np.flatnonzero((n > 0) & (noisy >= tau))  # a pair no user kept is not the holder's to release
    return DpHistogram.of([log.pairs[i] for i in kept], noisy[kept], tau), n, noisy


def release_utility(release: DpHistogram, true_counts: dict[Item, int], top: int = TOP) -> dict[str, Any]:
    """Items released, recall of the true top ``top`` items (by count; ties by item), and the
    mean relative error |n + Z - n| / n of the released counts against ``true_counts`` (the
    counts before the bound, or after it: the caller says which)."""
    ranked = sorted(true_counts.items(), key=lambda kv: (-kv[1], kind_of(kv[0]).name, kv[0]))[:top]
    released = {item_of(i): i.count for i in release.items}
    errors = [abs(c - true_counts[k]) / true_counts[k] for k, c in released.items() if true_counts.get(k)]
    return {
        "released": len(released),
        f"recall_top{top}": (sum(1 for k, _ in ranked if k in released) / len(ranked)) if ranked else 0.0,
        "relative_error": float(np.mean(errors)) if errors else None,
    }
