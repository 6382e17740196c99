"""Readers: AOL TSV, generic delimited text, histogram TSV (here), MSNBC (cels.logs.msnbc) and
Parquet (cels.logs.parquet).

:func:`iter_records` yields the events in log order; :func:`load_log` builds the histogram
c_ij (CELS section 2.1).  Bad input raises :class:`LogError` naming file, line and field; in
lenient mode the line is skipped and counted in ``source["skipped_lines"]``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cels.logs.model import SearchLog, check_pair_totals
from cels.logs.records import MAX_COUNT, LogError, LogRecord
from cels.logs.formats import Layout, LogFormat
from cels.logs.options import Admission, LoadOptions, skip_or_raise
from cels.logs.snapshot import read_snapshot, write_snapshot
from cels.logs.textio import BOM, iter_lines, undecodable

logger = logging.getLogger(__name__)


class DelimitedReader:
    """Streams the records of one AOL / tsv / histogram file and fills ``source`` while reading."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, layout: Layout) -> None:
        self.path = str(path)
        self.options = options
        self.layout = layout
        self.source: dict = {
            "format": options.format,
            "path": self.path,
            "delimiter": options.delimiter,
            "columns": {name: col + 1 for name, col in self.layout.columns.items()},
            "header": None,
            "newline": "\n",
            "bom": False,
            "max_users": options.max_users,
            "skipped_lines": 0,
            "skipped_examples": [],
            "skipped_at": [],
        }

    def records(self) -> Iterator[LogRecord]:
        admission = Admission(self.options.max_users)
        for lineno, raw, ending in iter_lines(self.path):
            try:
                text = self._decode(raw, lineno)
            except LogError as exc:
                skip_or_raise(self.options, self.source, exc)
                continue
            if lineno == 1:
                self.source["newline"] = ending.decode("ascii") or "\n"
                if text.startswith(BOM):
                    text = text[1:]
                    self.source["bom"] = True
                fields = text.split(self.options.delimiter)
                if self._is_header(fields):
                    self.source["header"] = text
                    continue
            else:
                fields = text.split(self.options.delimiter)
            if not text.strip():
                continue  # blank lines (e.g. a trailing one) carry no event
            try:
                record = self._parse(fields, lineno)
                if not admission.admit(record, lambda reason: LogError(self.path, lineno, self.layout.names.get("count"), reason)):
                    continue
            except LogError as exc:
                skip_or_raise(self.options, self.source, exc)
                continue
            yield record

    def _decode(self, raw: bytes, lineno: int) -> str:
        """The line in ``options.encoding``; bytes not valid in it raise LogError naming the field."""
        try:
            return raw.decode(self.options.encoding)
        except UnicodeDecodeError as exc:
            before = raw[: exc.start].decode(self.options.encoding).split(self.options.delimiter)
            field = self.layout.field_name(len(before) - 1)
            raise LogError(self.path, lineno, field, undecodable(raw, exc, self.options.encoding)) from None

    def _is_header(self, fields: list[str]) -> bool:
        """Forced by ``options.header``; else AOL: first field ``AnonID``; with a count column:
        the count field is not a number; tsv without a count column: a header is assumed."""
        if self.options.header is not None:
            return self.options.header
        if self.layout.header_mark is not None:
            return fields[0].strip() == self.layout.header_mark
        col = self.layout.columns.get("count")
        if col is None:
            return True
        return col >= len(fields) or not _is_number(fields[col].strip())

    def _parse(self, fields: list[str], lineno: int) -> LogRecord:
        layout = self.layout
        if layout.max_fields is not None and len(fields) > layout.max_fields:
            raise LogError(self.path, lineno, None, f"{len(fields)} fields; this format has at most {layout.max_fields}")
        values: dict[str, str] = {}
        for name, col in layout.columns.items():
            if col < len(fields):
                values[name] = fields[col].strip()
            elif not (name == "url" and layout.url_optional):
                raise LogError(
                    self.path,
                    lineno,
                    layout.names[name],
                    f"missing: the line has {len(fields)} field(s), {layout.names[name]} is column {col + 1}",
                )
        if not values["user"]:
            raise LogError(self.path, lineno, layout.names["user"], "empty user id")
        count = 1
        if "count" in values:
            if not _is_number(values["count"]) or int(values["count"]) < 1:
                raise LogError(
                    self.path, lineno, layout.names["count"], f"{values['count']!r} is not a positive integer"
                )
            count = int(values["count"])
            if count > MAX_COUNT:
                raise LogError(
                    self.path, lineno, layout.names["count"],
                    f"{count} is above the largest count a line may give, {MAX_COUNT} (2^31 - 1; docs/formats.md, Limits)",
                )  # fmt: skip
        query = self.options.normalise(fields[layout.columns["query"]])
        return LogRecord(values["user"], query, values.get("url") or None, count, lineno)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def iter_records(path: str | os.PathLike[str], options: LoadOptions, source: dict | None = None) -> Iterator[LogRecord]:
    """The events of the log in file order (``url`` None for a query without a click);
    ``source``, if given, is filled as ``load_log``'s (skipped lines included) while reading."""
    return options.log_format.records(path, options, source)


def records(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions, source: dict | None = None) -> Iterator[LogRecord]:
    """The events of a delimited log (AOL, tsv, histogram: :meth:`LogFormat.records`)."""
    reader = DelimitedReader(path, options, fmt.layout_for(options.columns))
    if source is not None:
        source.update(reader.source)
        reader.source = source
    return reader.records()


def load(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions) -> SearchLog:
    """The histogram of a delimited log (:meth:`LogFormat.load`)."""
    reader = DelimitedReader(path, options, fmt.layout_for(options.columns))
    log = SearchLog.from_records(reader.records())
    log.source = reader.source
    return log


@dataclass(frozen=True)
class LogFile:
    """A party's log where it lives (a file, or a Parquet dataset) and how to read it; calling
    it loads the whole log (:func:`load_log`).  An engine may read it in pieces instead
    (cels.engine.sharded_log: a Parquet dataset's row groups on the party's cluster).
    ``snapshot``: where a node keeps the loaded log for a session's re-run
    (cels.logs.snapshot): read from there if it is there, else written there once loaded."""

    path: Path
    options: LoadOptions
    snapshot: Path | None = None

    def __call__(self) -> SearchLog:
        if self.snapshot is None:
            return load_log(self.path, self.options)
        log = read_snapshot(self.snapshot)
        if log is None:
            log = load_log(self.path, self.options)
            write_snapshot(log, self.snapshot)
        return log


def load_log(path: str | os.PathLike[str], options: LoadOptions) -> SearchLog:
    """The histogram c_ij of the log at ``path``; ``source`` records how to write it back."""
    log = options.log_format.load(path, options)
    if log.n_pairs == 0:
        raise LogError(str(path), None, None, f"no query-url pair in {path}")
    check_pair_totals(log, str(path))
    logger.info(
        "loaded %s (%s): %d users, %d pairs, |D| = %d, %d bad lines skipped",
        path, options.format, log.n_users, log.n_pairs, log.size, log.source.get("skipped_lines", 0),
    )
    return log
