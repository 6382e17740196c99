"""Writers: a (sanitized) histogram back in its input's format, written atomically.

Rows with count 0 (pairs the mechanism suppressed) are not written.  Values are written as
stored (queries normalised, urls stripped), in UTF-8 whatever the input's encoding.  What a
format's text looks like is its object's (cels.logs.formats.LogFormat.write_text); the rows
and the MSNBC lines are written here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TextIO

from cels.logs.model import SearchLog
from cels.logs.records import LogRecord
from cels.logs.formats import AOL_HEADER, LogFormat, log_format
from cels.logs.parquet import is_parquet, write_parquet
from cels.logs.textio import open_text_output


def released_rows(log: SearchLog) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """Per user row j (in order), its ``(pair index, count)`` with count > 0; users without any skipped."""
    counts = log.counts.tocsr(copy=True)
    counts.sum_duplicates()
    for j in range(log.n_users):
        lo, hi = counts.indptr[j], counts.indptr[j + 1]
        cells = [(int(i), int(c)) for i, c in zip(counts.indices[lo:hi], counts.data[lo:hi]) if c > 0]
        if cells:
            yield j, cells


def write_log(log: SearchLog, path: str | os.PathLike[str], source: dict | None = None) -> int:
    """Write ``log`` to ``path`` in the format of ``source`` (default ``log.source``); returns data lines written.

    A log whose source names no format is written as a histogram TSV.  Any log to a path ending
    in ``.parquet`` is written as Parquet (cels.logs.parquet.write_parquet; returns the rows); a
    Parquet log to any other path as a histogram TSV (``user query url count``).
    """
    source = log.source if source is None else source
    fmt = log_format(source.get("format", "histogram"))
    if is_parquet(path):
        return write_parquet(log, path, source)
    with open_text_output(path, bom=fmt.keeps_bom(source)) as out:
        return fmt.write_text(log, out, source, path)


def write_text(fmt: LogFormat, log: SearchLog, out: TextIO, source: dict, path: str | os.PathLike[str]) -> int:
    """A delimited log as text (:meth:`LogFormat.write_text`): its format's header and columns,
    or a mapped log as it was read (its columns, header, delimiter and line ends)."""
    if fmt.layout is None:
        columns = {name: col - 1 for name, col in source["columns"].items()}
        newline = source.get("newline", "\n")
        if source.get("header") is not None:
            out.write(source["header"] + newline)
        return write_rows(log, out, columns, max(columns.values()) + 1, source.get("delimiter", "\t"), newline, path)
    out.write("\t".join(fmt.layout.header) + "\n")
    return write_rows(log, out, fmt.layout.columns, len(fmt.layout.header), "\t", "\n", path)


def write_records(records: Iterable[LogRecord], path: str | os.PathLike[str]) -> int:
    """Events in the AOL layout, in their order (a query without a click has an empty
    ClickURL; a record of count c is c lines), e.g. one party's share of a log whose item
    kinds need the order (cels.mechanism.item_kinds); returns the lines written."""
    written = 0
    with open_text_output(path) as out:
        out.write("\t".join(AOL_HEADER) + "\n")
        for rec in records:
            fields = [_checked(rec.user, "\t", path), _checked(rec.query, "\t", path), "", "", _checked(rec.url or "", "\t", path)]
            out.write(("\t".join(fields) + "\n") * rec.count)
            written += rec.count
    return written


def write_rows(
    log: SearchLog,
    out: TextIO,
    columns: dict[str, int],
    width: int,
    delimiter: str,
    newline: str,
    path: str | os.PathLike[str],
) -> int:
    """One line per (user, pair) with a count column, else the line repeated count times."""
    written = 0
    for j, cells in released_rows(log):
        user = _checked(log.users[j], delimiter, path)
        for i, count in cells:
            fields = [""] * width
            fields[columns["user"]] = user
            fields[columns["query"]] = _checked(log.pairs[i][0], delimiter, path)
            fields[columns["url"]] = _checked(log.pairs[i][1], delimiter, path)
            if "count" in columns:
                fields[columns["count"]] = str(count)
                repeat = 1
            else:
                repeat = count
            out.write((delimiter.join(fields) + newline) * repeat)
            written += repeat
    return written


def _checked(value: str, delimiter: str, path: str | os.PathLike[str]) -> str:
    if delimiter in value or "\n" in value or "\r" in value:
        raise ValueError(f"cannot write {value!r} to {path}: it contains the delimiter or a line break")
    return value
