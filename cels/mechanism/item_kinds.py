"""What a DP histogram counts (docs/releases.md, "Item kinds"): query-url pairs by default,
queries and query pairs on request, each kind with its own bound Delta_k per user.

A user keeps at most Delta_k distinct items of kind k, so it changes the histogram by at most
Delta = sum_k Delta_k counts.  Every item gets noise of the same scale Delta / eps: kind k's
share of epsilon is eps_k = eps * Delta_k / Delta (its counts are a discrete Laplace mechanism
of sensitivity Delta_k at that scale), and the shares add up to eps (Dwork and Roth 2014,
Theorem 3.16).  The threshold is the one of a single histogram with Delta_0 = Delta, so the
selection keeps its delta for the kinds together (cels.mechanism.dp_histogram.threshold).

An item is a tuple of the fields its id encodes (cels.engine.routines.encode_item): a pair is
``(query, url)``, the bytes of the sampled release's ids; a query ``(1, query)``; a query pair
``(2, first, second)``.  A JSON array that starts with a number is no pair's, and a dummy id's
starts with the string "padding" and has three fields: the encodings of different kinds
never meet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.baselines.items import item_stream, user_histories
from cels.baselines.release import ReleasedItem
from cels.logs.model import SearchLog
from cels.logs.records import LogRecord

Item = tuple
"""An item's fields, as its id encodes them (module docstring)."""


@dataclass(frozen=True)
class ItemKind:
    """One kind of item: its ``--items`` name, its type in the release format
    (cels.baselines.release) and the leading number of its encoding (None: a pair's)."""

    name: str
    released: str
    tag: int | None

    def item(self, query: str, url: str | None, next_query: str | None) -> Item:
        """The item of a user's event of this kind (cels.baselines.items.item_stream's key)."""
        if self.tag is None:
            return (query, url)
        return (self.tag, query) if next_query is None else (self.tag, query, next_query)

    def released_item(self, item: Item, count: int) -> ReleasedItem:
        """The item as one line of the release, with its noisy count."""
        if self.tag is None:
            return ReleasedItem(self.released, item[0], item[1], None, int(count))
        return ReleasedItem(self.released, item[1], None, item[2] if len(item) == 3 else None, int(count))


PAIRS = ItemKind("pairs", "click", None)
QUERIES = ItemKind("queries", "query", 1)
QUERY_PAIRS = ItemKind("query-pairs", "query_pair", 2)
ITEM_KINDS = {kind.name: kind for kind in (PAIRS, QUERIES, QUERY_PAIRS)}
_BY_RELEASED = {kind.released: kind for kind in ITEM_KINDS.values()}
_BY_TAG = {kind.tag: kind for kind in ITEM_KINDS.values()}


def kind_of(item: Item) -> ItemKind:
    """The kind of an item (a pair's first field is a string, the others' a number)."""
    return _BY_TAG[None if isinstance(item[0], str) else item[0]]


def kind_of_encoding(data: bytes) -> ItemKind:
    """The kind of an encoded item (cels.engine.routines.encode_item): a pair's JSON array starts
    with a string, the others' with their number."""
    return PAIRS if data[1:2] == b'"' else _BY_TAG[int(data[1:2])]


def item_of(released: ReleasedItem) -> Item:
    """The item of a released line (the inverse of :meth:`ItemKind.released_item`)."""
    return _BY_RELEASED[released.kind].item(released.query, released.url, released.next_query)


def checked_item(fields: object) -> Item:
    """A decoded id's fields as an item, or ValueError if they are no kind's."""
    if isinstance(fields, list) and all(isinstance(f, str) for f in fields) and len(fields) == 2:
        return tuple(fields)
    if isinstance(fields, list) and fields and fields[0] in (QUERIES.tag, QUERY_PAIRS.tag) and not isinstance(fields[0], bool):
        expected = 2 if fields[0] == QUERIES.tag else 3
        if len(fields) == expected and all(isinstance(f, str) for f in fields[1:]):
            return tuple(fields)
    raise ValueError(f"{str(fields)[:80]} is no item of {', '.join(ITEM_KINDS)}")


@dataclass(frozen=True)
class ItemKinds:
    """A session's item kinds, each with its bound Delta_k (module docstring)."""

    bounds: tuple[tuple[ItemKind, int], ...]

    @classmethod
    def parse(cls, text: str, default_bound: int) -> ItemKinds:
        """``KIND[:D],...`` (``--items``): a kind without a bound keeps ``default_bound``
        (``--max-items-per-user``); ValueError in one line for an unknown or repeated kind or a
        bound below 1."""
        bounds: dict[ItemKind, int] = {}
        for part in text.split(","):
            name, _, bound = part.strip().partition(":")
            if name not in ITEM_KINDS:
                raise ValueError(f"--items: unknown item kind {name!r}; choose from {', '.join(ITEM_KINDS)}")
            kind = ITEM_KINDS[name]
            if kind in bounds:
                raise ValueError(f"--items: {name} is given twice")
            try:
                bounds[kind] = int(bound) if bound else default_bound
            except ValueError:
                raise ValueError(f"--items: {name}'s bound {bound!r} is not an integer") from None
            if bounds[kind] < 1:
                raise ValueError(f"--items: {name}'s bound Delta_0 = {bounds[kind]} must be at least 1")
        return cls(tuple(bounds.items()))

    @classmethod
    def of(cls, bound: int | ItemKinds) -> ItemKinds:
        """``bound`` as item kinds: an int Delta_0 is the default release, query-url pairs only."""
        return bound if isinstance(bound, ItemKinds) else cls(((PAIRS, int(bound)),))

    @property
    def total(self) -> int:
        """Delta = sum_k Delta_k: how many items one user may change (the L1 sensitivity)."""
        return sum(bound for _, bound in self.bounds)

    @property
    def only_pairs(self) -> bool:
        """The default release: query-url pairs only (the log's histogram c_ij is its input)."""
        return [kind for kind, _ in self.bounds] == [PAIRS]

    def epsilon_shares(self, epsilon: float) -> dict[str, float]:
        """eps_k = eps * Delta_k / Delta per kind (module docstring): they add up to eps."""
        return {kind.name: epsilon * bound / self.total for kind, bound in self.bounds}

    def text(self) -> str:
        """The canonical ``--items`` value, every bound written out."""
        return ",".join(f"{kind.name}:{bound}" for kind, bound in self.bounds)

    def histogram(self, records: Iterable[LogRecord], source: dict | None = None) -> SearchLog:
        """users x items of these kinds, c_ij = how often user j's events make item i
        (cels.baselines.items.item_stream: a query event, a click, a transition), items in
        the order they are first seen; a log whose ``pairs`` are items."""
        users: list[str] = []
        index: dict[Item, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        for user, history in user_histories(records).items():
            row = len(users)
            users.append(user)
            for kind, _ in self.bounds:
                for _kind, query, url, next_query in item_stream(history, kind.released):
                    rows.append(row)
                    cols.append(index.setdefault(kind.item(query, url, next_query), len(index)))
        counts = sp.csr_matrix((np.ones(len(rows), dtype=np.int64), (rows, cols)), shape=(len(users), len(index)), dtype=np.int64)
        counts.sum_duplicates()
        return SearchLog(users, list(index), counts, dict(source or {}))

    def column_bounds(self, encoded: list[bytes]) -> list[tuple[np.ndarray, int]]:
        """The columns of each kind among the ``encoded`` items and the kind's bound."""
        tags = np.array([kind_of_encoding(data).name for data in encoded], dtype=object)
        return [(np.flatnonzero(tags == kind.name), bound) for kind, bound in self.bounds]
