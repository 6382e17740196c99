"""What a baseline sanitizer releases, and the TSV file it is written to.

Every baseline publishes aggregate items with a noisy count, never user-level rows:

========== ============== ============= ============== =============================
type       query          url           next_query     count
========== ============== ============= ============== =============================
keyword    the keyword    (empty)       (empty)        noisy number of users/uses
query      the query      (empty)       (empty)        noisy count
click      the query      clicked url   (empty)        noisy click count
query_pair first query    (empty)       following one  noisy count of the transition
========== ============== ============= ============== =============================

The file is UTF-8 TSV with the header ``type<TAB>query<TAB>url<TAB>next_query<TAB>count``; an
empty field means "not applicable".  Counts are non-negative integers (noisy counts below 0 are
published as 0 or dropped, both post-processing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cels.fileio import atomic_write
from cels.logs.records import LogError

KINDS = ("keyword", "query", "click", "query_pair")
HEADER = ("type", "query", "url", "next_query", "count")


@dataclass(frozen=True, slots=True)
class ReleasedItem:
    """One published item: ``kind`` in :data:`KINDS`, its text fields and its noisy count."""

    kind: str
    query: str
    url: str | None = None
    next_query: str | None = None
    count: int = 0

    @property
    def key(self) -> tuple[str, str, str | None, str | None]:
        """The item without its count (what utility measures compare)."""
        return (self.kind, self.query, self.url, self.next_query)


def write_release(items: list[ReleasedItem], path: str | os.PathLike[str]) -> None:
    """Write ``items`` as the release TSV (module docstring) atomically."""
    with atomic_write(path, newline="\n") as fh:
        fh.write("\t".join(HEADER) + "\n")
        for number, item in enumerate(items, start=2):
            if item.kind not in KINDS:
                raise ValueError(f"{path}: item {number - 1} has unknown type {item.kind!r}")
            fields = (item.kind, item.query, item.url or "", item.next_query or "", str(int(item.count)))
            for name, value in zip(HEADER, fields):
                if "\t" in value or "\n" in value or "\r" in value:
                    raise LogError(str(path), number, name, "a tab or line break cannot be written in a TSV field")
            fh.write("\t".join(fields) + "\n")


def read_release(path: str | os.PathLike[str]) -> list[ReleasedItem]:
    """Read a file written by :func:`write_release`; bad lines raise :class:`LogError`."""
    items: list[ReleasedItem] = []
    with open(path, encoding="utf-8", newline="\n") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        if tuple(header) != HEADER:
            raise LogError(str(path), 1, None, f"expected header {' '.join(HEADER)!r}")
        for number, line in enumerate(fh, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(HEADER):
                raise LogError(
                    str(path), number, None, f"expected {len(HEADER)} tab-separated fields, got {len(fields)}"
                )
            kind, query, url, next_query, count = fields
            if kind not in KINDS:
                raise LogError(str(path), number, "type", f"unknown item type {kind!r}")
            try:
                value = int(count)
            except ValueError:
                raise LogError(str(path), number, "count", f"{count!r} is not an integer") from None
            if value < 0:
                raise LogError(str(path), number, "count", f"negative count {value}")
            items.append(ReleasedItem(kind, query, url or None, next_query or None, value))
    return items
