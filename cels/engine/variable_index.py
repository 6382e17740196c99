"""The index of variables (CELS section 4.2; docs/protocol.md, "Universe streamed in chunks"):
P_1's sorted union of the complete id sets.

Every owner's complete set reaches P_1 as its union keys, sorted and distinct, in chunks.  A
:class:`IndexPart` keeps a set's chunks until the set is complete, then merges it into its
sorted union (a binary search and one insert) and keeps only where each set's keys sit.  A
:class:`RangedIndex` splits the union by key range over several parts (the log shards of a
party on a Ray cluster, cels.engine.ray), so no part and not the node holds the whole of
it: the keys are uniform, so each part holds about 1/P of them.  Plain numpy, no protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

PREFIX_VALUES = 1 << 16
"""A key's range is fixed by its first two bytes, read big-endian (so the ranges sort as the keys do)."""


def increasing(ids: np.ndarray, before: np.ndarray) -> bool:
    """Whether ``ids`` (after the ids ``before``, at most one) are strictly increasing as bytes
    (the same-width ``S`` view compares as bytes do)."""
    keys = np.concatenate([before, ids]).view(f"S{ids.dtype.itemsize}")
    return bool(np.all(keys[1:] > keys[:-1]))


def merged(union: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted union of ``union`` and ``ids`` (each sorted and distinct, same width), where
    each of ``ids`` sits in it, and where the ids new to it were inserted (positions in
    ``union``, ascending): an old position p moves to p + (insertions at or before p)."""
    width = union.dtype.itemsize
    keys, asked = union.view(f"S{width}"), ids.view(f"S{width}")
    at = np.searchsorted(keys, asked)
    found = keys[np.minimum(at, max(len(union) - 1, 0))] == asked if len(union) else np.zeros(len(ids), dtype=bool)
    inserted = at[~found]
    positions = np.empty(len(ids), dtype=np.int64)
    positions[found] = moved(at[found], inserted)
    positions[~found] = inserted + np.arange(len(inserted))  # np.insert keeps equal points in order
    return np.insert(union, inserted, ids[~found]), positions, inserted


def moved(positions: np.ndarray, inserted: np.ndarray) -> np.ndarray:
    """Positions in a union after :func:`merged` inserted ids at ``inserted``."""
    return positions + np.searchsorted(inserted, positions, side="right")


class IndexPart:
    """The sorted union of complete sets of ``width``-byte keys (or the part of it in one key
    range): each set's chunks, sorted and distinct across chunks (P_1's universe stage checks
    that), are kept until :meth:`complete`, then merged in."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.union = np.zeros(0, dtype=f"V{width}")
        self.pending: dict[str, list[np.ndarray]] = {}  # each incomplete set's chunks so far
        self.positions: dict[str, np.ndarray] = {}  # each complete set: where its keys sit in the union

    def add(self, owner: str, keys: np.ndarray) -> None:
        """A chunk of ``owner``'s complete set, after its chunks before."""
        self.pending.setdefault(owner, []).append(keys)

    def complete(self, owner: str) -> None:
        """``owner``'s set is whole: merged into the union, every set's positions moved."""
        keys = np.concatenate([np.zeros(0, dtype=self.union.dtype), *self.pending.pop(owner, [])])
        self.union, at, inserted = merged(self.union, keys)
        for other, before in self.positions.items():
            self.positions[other] = moved(before, inserted)
        self.positions[owner] = at

    def size(self) -> int:
        """Keys in the union (every set complete: the index size)."""
        return len(self.union)

    def columns(self, owner: str, first: int, stop: int) -> np.ndarray:
        """Where ``owner``'s keys ``first``..``stop`` (in its sorted order) sit in the union."""
        return self.positions[owner][first:stop]

    def close(self) -> None:
        """Drop the union and the positions (the index is sent)."""
        self.__init__(self.width)


PART_CALLS = frozenset({"add", "complete", "size", "columns", "close"})
"""The :class:`IndexPart` methods a :class:`RangedIndex` calls where a part lives."""
PartCall = Callable[[Sequence[tuple[int, str, tuple]]], list]
"""Runs each (part, IndexPart method, arguments) where the part lives, and returns their results in order."""


def prefixes(keys: np.ndarray) -> np.ndarray:
    """Each key's first two bytes, big-endian (what puts it in a part's key range)."""
    raw = keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    return raw[:, 0].astype(np.int64) << 8 | (raw[:, 1] if keys.dtype.itemsize > 1 else 0)


def range_starts(parts: int) -> list[int]:
    """The first prefix of each of ``parts`` key ranges, and the end: part s holds the keys
    whose prefix is in [starts[s], starts[s + 1])."""
    return [s * PREFIX_VALUES // parts for s in range(parts + 1)]


def ranges(keys: np.ndarray, parts: int) -> np.ndarray:
    """Where the sorted ``keys`` cross from one part's key range to the next: part s holds
    ``keys[bounds[s]:bounds[s + 1]]``."""
    return np.searchsorted(prefixes(keys), range_starts(parts))


def part_of(keys: np.ndarray, parts: int) -> np.ndarray:
    """The part whose key range holds each of ``keys`` (in any order)."""
    return np.searchsorted(range_starts(parts), prefixes(keys), side="right") - 1


class RangedIndex:
    """The sorted union split by key range over ``parts`` :class:`IndexPart`\\ s, which ``call``
    reaches: the whole union is the parts' unions one after another, so a key's column is
    its part's offset (the keys in the parts before) plus its position there.  The node
    keeps only how many keys of each set went to each part."""

    def __init__(self, call: PartCall, parts: int) -> None:
        self.call, self.parts = call, parts
        self.counts: dict[str, np.ndarray] = {}  # set -> its keys in each part
        self.offsets: np.ndarray | None = None  # part -> its first column (once every set is in)

    def add(self, owner: str, keys: np.ndarray) -> None:
        bounds = ranges(keys, self.parts)
        counts = self.counts.setdefault(owner, np.zeros(self.parts, dtype=np.int64))
        counts += np.diff(bounds)
        self.call([(s, "add", (owner, keys[lo:hi])) for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo])

    def complete(self, owner: str) -> None:
        self.counts.setdefault(owner, np.zeros(self.parts, dtype=np.int64))
        self.call([(s, "complete", (owner,)) for s in range(self.parts)])

    def size(self) -> int:
        sizes = self.call([(s, "size", ()) for s in range(self.parts)])
        self.offsets = np.cumsum([0, *sizes])
        return int(self.offsets[-1])

    def columns(self, owner: str, first: int, stop: int) -> np.ndarray:
        starts = np.cumsum([0, *self.counts[owner]])  # owner's sorted keys: part s holds starts[s]..starts[s+1]
        asked = [(s, max(first, starts[s]), min(stop, starts[s + 1])) for s in range(self.parts)]
        asked = [(s, lo, hi) for s, lo, hi in asked if hi > lo]
        found = self.call([(s, "columns", (owner, int(lo - starts[s]), int(hi - starts[s]))) for s, lo, hi in asked])
        return np.concatenate([np.zeros(0, dtype=np.int64), *(cols + self.offsets[s] for (s, _, _), cols in zip(asked, found))])

    def close(self) -> None:
        self.call([(s, "close", ()) for s in range(self.parts)])
