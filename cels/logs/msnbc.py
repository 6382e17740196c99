"""UCI "MSNBC.com anonymous web data" (``msnbc990928.seq``): the reader (writer: cels.logs.writers).

The file opens with a ``%`` header naming the categories (one line of names, category k is the
k-th name), ends the header with ``% Sequences:`` and a blank line, then holds one line per user:
the page categories (1..17) visited, space separated, CRLF line endings.

Mapping to the search-log model: user ``u_j`` is the 1-based number of the data line, a visit
to category k is one click on the pair ``(name_k, str(k))`` (query = the category's name,
url = its number, so the pair survives every output format and maps back to k).  Pairs are
ordered by category number, users in file order; users without visits hold no row.

The whole file is parsed with numpy (digit runs -> values, newline positions -> users);
anything the fast path does not accept (a non-digit byte, a number outside 1..K) is parsed
again line by line, which names the bad line or skips it in lenient mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TextIO
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cels.logs.formats import LogFormat
from cels.logs.model import SearchLog
from cels.logs.records import LogError, LogRecord
from cels.logs.options import LoadOptions, skip_or_raise
from cels.logs.textio import read_bytes, undecodable
from cels.logs.writers import released_rows

HEADER_END = "% Sequences"
_MAX_HEADER_LINES = 50


@dataclass
class _Parsed:
    """The file split into header and data lines (bytes of the data part, max_users applied)."""

    source: dict
    pairs: list[tuple[str, str]]
    body: bytes
    first_data_line: int  # 1-based file line number of data line 1


def _split_header(path: str, data: bytes, options: LoadOptions) -> _Parsed:
    """Parse the ``%`` header: category names and the raw header lines (for the writer)."""
    header_lines: list[str] = []
    names: list[str] | None = None
    pos = 0
    newline = "\r\n" if data.split(b"\n", 1)[0].endswith(b"\r") else "\n"
    seen_end = False
    while pos < len(data) and len(header_lines) < _MAX_HEADER_LINES:
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        lineno = len(header_lines) + 1
        try:
            line = data[pos:end].decode(options.encoding).rstrip("\r")
        except UnicodeDecodeError as exc:
            if seen_end:
                break  # a data line: the data parser names it
            raise LogError(path, lineno, "header", undecodable(data[pos:end], exc, options.encoding)) from None
        if seen_end and line.strip():
            break
        header_lines.append(line)
        pos = end + 1
        if lineno == 1 and not line.startswith("%"):
            raise LogError(path, 1, "header", "an MSNBC .seq file starts with a '%' header line")
        if line.startswith(HEADER_END):
            if names is None:
                raise LogError(path, lineno, "header", "no line of category names before '% Sequences:'")
            seen_end = True
        elif seen_end:
            break  # the blank line closing the header
        elif line.strip() and not line.startswith("%"):
            if names is not None:
                raise LogError(path, lineno, "header", "a second line of category names")
            names = line.split()
    if not seen_end:
        raise LogError(path, None, "header", f"no '{HEADER_END}:' line in the first {_MAX_HEADER_LINES} lines")
    assert names is not None
    body = data[pos:]
    if options.max_users is not None:
        cut = _nth_newline(body, options.max_users)
        if cut is not None:
            body = body[: cut + 1]
    source = {
        "format": "msnbc",
        "path": path,
        "header_lines": header_lines,
        "categories": names,
        "newline": newline,
        "max_users": options.max_users,
        "skipped_lines": 0,
        "skipped_examples": [],
        "skipped_at": [],
    }
    pairs = [(options.normalise(name), str(k)) for k, name in enumerate(names, start=1)]
    return _Parsed(source, pairs, body, len(header_lines) + 1)


def _nth_newline(body: bytes, n: int) -> int | None:
    """Offset of the n-th ``\\n`` in ``body`` (None when there are fewer)."""
    newlines = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == ord("\n"))
    return int(newlines[n - 1]) if len(newlines) >= n else None


def _data_lines(path: str, parsed: _Parsed, options: LoadOptions) -> Iterator[tuple[int, int, list[int]]]:
    """Yield ``(user number, file line, category numbers)`` per data line; bad lines raise or are skipped."""
    lines = parsed.body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final line break ends the last line, it does not start a new one
    n_categories = len(parsed.pairs)
    for user, raw in enumerate(lines, start=1):
        lineno = parsed.first_data_line + user - 1
        try:
            values = _parse_line(path, lineno, raw, n_categories)
        except LogError as exc:
            skip_or_raise(options, parsed.source, exc)
            continue
        yield user, lineno, values


def _parse_line(path: str, lineno: int, raw: bytes, n_categories: int) -> list[int]:
    values = []
    for position, token in enumerate(raw.split(), start=1):
        if not token.isdigit() or not 1 <= int(token) <= n_categories:
            raise LogError(
                path,
                lineno,
                "category",
                f"visit {position} is {token.decode('ascii', 'backslashreplace')!r}, not a category number 1..{n_categories}",
            )
        values.append(int(token))
    return values


def iter_msnbc(path: str | os.PathLike[str], options: LoadOptions, source: dict | None = None) -> Iterator[LogRecord]:
    """One click record per category visit, in file order (``source``: as in iter_records)."""
    path = str(path)
    parsed = _split_header(path, read_bytes(path), options)
    if source is not None:
        source.update(parsed.source)
        parsed.source = source
    for user, lineno, values in _data_lines(path, parsed, options):
        for k in values:
            query, url = parsed.pairs[k - 1]
            yield LogRecord(str(user), query, url, 1, lineno)


def _fast_events(body: bytes, n_categories: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(0-based user index, 1-based category) of every visit, or None if any byte needs a closer look."""
    text = np.frombuffer(body, dtype=np.uint8)
    digit = (text >= ord("0")) & (text <= ord("9"))
    if not np.all(digit | np.isin(text, np.frombuffer(b" \t\r\n", dtype=np.uint8))):
        return None
    before = np.concatenate(([False], digit[:-1]))
    after = np.concatenate((digit[1:], [False]))
    starts = np.flatnonzero(digit & ~before)
    ends = np.flatnonzero(digit & ~after)
    if np.any(ends - starts > 1):  # three or more digits: leave it to the line parser
        return None
    value = text[starts].astype(np.int64) - ord("0")
    two = ends > starts
    value[two] = value[two] * 10 + text[ends[two]] - ord("0")
    if value.size and (value.min() < 1 or value.max() > n_categories):
        return None
    users = np.searchsorted(np.flatnonzero(text == ord("\n")), starts)
    return users, value


def load_msnbc(path: str | os.PathLike[str], options: LoadOptions) -> SearchLog:
    """The histogram c_ij = visits of user j to category i, built without per-visit objects."""
    path = str(path)
    parsed = _split_header(path, read_bytes(path), options)
    n_categories = len(parsed.pairs)
    fast = _fast_events(parsed.body, n_categories)
    if fast is None:
        user_list: list[int] = []
        value_list: list[int] = []
        for user, _, values in _data_lines(path, parsed, options):
            user_list.extend([user - 1] * len(values))
            value_list.extend(values)
        fast = np.asarray(user_list, dtype=np.int64), np.asarray(value_list, dtype=np.int64)
    users, values = fast
    keys, counts = np.unique(users * n_categories + (values - 1), return_counts=True)
    rows, cols = np.divmod(keys, n_categories)
    user_ids, row_index = np.unique(rows, return_inverse=True)
    categories, col_index = np.unique(cols, return_inverse=True)
    histogram = sp.csr_matrix(
        (counts.astype(np.int64), (row_index, col_index)), shape=(len(user_ids), len(categories)), dtype=np.int64
    )
    return SearchLog(
        [str(u + 1) for u in user_ids.tolist()],
        [parsed.pairs[c] for c in categories.tolist()],
        histogram,
        parsed.source,
    )


def records(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions, source: dict | None = None) -> Iterator[LogRecord]:
    """:meth:`LogFormat.records` of MSNBC."""
    return iter_msnbc(path, options, source)


def load(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions) -> SearchLog:
    """:meth:`LogFormat.load` of MSNBC."""
    return load_msnbc(path, options)


def write_text(fmt: LogFormat, log: SearchLog, out: TextIO, source: dict, path: str | os.PathLike[str]) -> int:
    """An MSNBC log as text (:meth:`LogFormat.write_text`): the ``%`` header, then one line per
    user with visits, each category repeated count times."""
    categories = source.get("categories")
    header = source.get("header_lines")
    if not categories or not header:
        raise ValueError("writing MSNBC needs source['categories'] and source['header_lines'] of an MSNBC input")
    number = np.zeros(log.n_pairs, dtype=np.int64)
    for i, (query, url) in enumerate(log.pairs):
        if not (url.isascii() and url.isdigit() and 1 <= int(url) <= len(categories)):
            raise ValueError(f"pair ({query!r}, {url!r}) is not an MSNBC category 1..{len(categories)}")
        number[i] = int(url)
    newline = source.get("newline", "\r\n")
    for line in header:
        out.write(line + newline)
    written = 0
    for _, cells in released_rows(log):
        visits = sorted((int(number[i]), c) for i, c in cells)
        out.write("".join(f"{k} " * c for k, c in visits) + newline)
        written += 1
    return written
