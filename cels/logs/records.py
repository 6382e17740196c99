"""One event of a search log and the errors of reading one (docs/formats.md): the parts of the
data model that need no arrays, for readers, writers and flags (:mod:`cels.logs.model` holds
the histogram)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_WHITESPACE = re.compile(r"\s+")

MAX_COUNT = 2**31 - 1
"""The largest count one line may give, and the largest total c_i of one pair in one log
(docs/formats.md, "Limits"): the secure sums pack every party's count vector with this bound
(cels.protocol.stages.sums.COUNT_BOUND), so r parties' totals stay exact in int64 and in the packing."""
MAX_LOG_TOTAL = 2**53
"""The largest sum of all counts of one log: |D| and the frequencies c_i / |D| are then exact in
float64 as in int64, and the sums of up to 2^10 parties' logs stay below 2^63."""


def normalise_query(text: str) -> str:
    """Default pair normalisation (docs/formats.md): strip, collapse whitespace, lower-case."""
    return _WHITESPACE.sub(" ", text.strip()).lower()


class LogError(ValueError):
    """Bad input: names the file, the 1-based line and the field at fault.

    A Parquet row is named by ``row_group`` = (row group numbered from 0 as pyarrow does, 1-based
    row within it), ``line`` being its 1-based row number in the file."""

    def __init__(
        self, path: str, line: int | None, field: str | None, message: str, row_group: tuple[int, int] | None = None
    ) -> None:
        where = str(path)
        if row_group is not None:
            where += f", row {line} (row {row_group[1]} of row group {row_group[0]})"
        elif line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = message
        self.row_group = row_group

    def __reduce__(self):
        """Pickled as its parts (a reader task's error crosses to the node: cels.engine.sharded_log)."""
        return type(self), (self.path, self.line, self.field, self.reason, self.row_group)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One event of a log in log order: ``url`` is ``None`` for a query without a click."""

    user: str
    query: str
    url: str | None
    count: int = 1
    line: int = 0


Pair = tuple[str, str]
