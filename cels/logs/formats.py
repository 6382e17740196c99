"""The log formats (docs/formats.md), one object each.

A :class:`LogFormat` says what its columns are (fixed, numbered or named), whether a directory
can be one log (a Parquet dataset), which extra its reader needs, how its options are checked,
and which modules read and write it (:meth:`~LogFormat.records`, :meth:`~LogFormat.load`,
:meth:`~LogFormat.write_text`).  Code elsewhere asks the object, never the format's name.
Declaring them loads no reader: a method imports its module when it runs (``cels sanitize
--help`` lists :data:`FORMATS` only), and the readers import this module, not the reverse.
"""

from __future__ import annotations

import codecs
import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

AOL_HEADER = ("AnonID", "Query", "QueryTime", "ItemRank", "ClickURL")
HISTOGRAM_HEADER = ("user", "query", "url", "count")
COLUMN_NAMES = ("user", "query", "url", "count")
REQUIRED_COLUMNS = ("user", "query", "url")


@dataclass(frozen=True)
class Layout:
    """Where a delimited format keeps its fields: 0-based columns and the names errors use."""

    columns: dict[str, int]
    names: dict[str, str]
    url_optional: bool = False  # AOL rows without a click may stop after QueryTime
    max_fields: int | None = None
    header: tuple[str, ...] = ()  # every column's name, where the format fixes them
    header_mark: str | None = None  # a first field that marks the header line (AOL: AnonID)

    def field_name(self, col: int) -> str:
        """The name errors use for 0-based column ``col``."""
        for name, c in self.columns.items():
            if c == col:
                return self.names[name]
        return self.header[col] if col < len(self.header) else f"column {col + 1}"


AOL_LAYOUT = Layout(
    {"user": 0, "query": 1, "url": 4},
    {"user": "AnonID", "query": "Query", "url": "ClickURL"},
    url_optional=True,
    max_fields=len(AOL_HEADER),
    header=AOL_HEADER,
    header_mark=AOL_HEADER[0],
)
HISTOGRAM_LAYOUT = Layout({name: k for k, name in enumerate(HISTOGRAM_HEADER)}, {n: n for n in HISTOGRAM_HEADER}, header=HISTOGRAM_HEADER)


@dataclass(frozen=True)
class LogFormat:
    """One format.  ``columns`` is "fixed" (``layout``), "numbers" (a 1-based mapping, which it
    needs; the log is written back as it was read: header, delimiter, line ends, byte-order
    mark) or "names" (column names, optional); ``dataset``: a directory of files can be one
    log; ``extra``: the pip extra its reader needs; ``release_suffix``: a release made from it
    is written with this suffix (None: the input's own); ``utf8``: its strings are UTF-8 (no
    ``encoding``).  ``reader`` and ``writer`` name its modules, which offer ``records``,
    ``load`` and ``write_text`` taking the format first."""

    name: str
    columns: str = "fixed"
    layout: Layout | None = None
    dataset: bool = False
    extra: str | None = None
    release_suffix: str | None = None
    utf8: bool = False
    reader: str = "cels.logs.readers"
    writer: str = "cels.logs.writers"

    def parse_columns(self, spec: str) -> dict[str, int] | dict[str, str]:
        """``--columns`` for this format (:func:`parse_columns`)."""
        return parse_columns(spec, by_name=self.columns == "names")

    def exists(self, path: Path) -> bool:
        """A log of this format can be at ``path``."""
        return path.is_file() or (self.dataset and path.is_dir())

    def check(self, columns: dict | None, encoding: str) -> None:
        """Refuse a column mapping or an encoding this format does not take (ValueError)."""
        if self.columns == "numbers":
            if columns is None:
                raise ValueError(f"format {self.name!r} needs a column mapping, e.g. user=1,query=2,url=4")
            check_columns(columns)
        elif self.columns == "names":
            if columns is not None:
                check_columns(columns, by_name=True)
        elif columns is not None:
            raise ValueError(f"format {self.name!r} has fixed columns; a column mapping is for 'tsv' and 'parquet' only")
        if self.utf8 and codecs.lookup(encoding).name != "utf-8":
            raise ValueError(f"{self.name.title()} strings are UTF-8; an encoding ({encoding!r}) is for the text formats only")

    def layout_for(self, columns: dict | None) -> Layout:
        """Where a delimited log of this format keeps its fields (its own, or the mapping's)."""
        if self.layout is not None:
            return self.layout
        assert columns is not None
        return Layout({name: col - 1 for name, col in columns.items()}, {n: n for n in columns})

    def keeps_bom(self, source: dict) -> bool:
        """The text written back starts with the input's byte-order mark (a mapped log, as read)."""
        return self.columns == "numbers" and bool(source.get("bom"))

    def records(self, path: str | os.PathLike[str], options: Any, source: dict | None = None) -> Iterator[Any]:
        """The events of the log at ``path`` in file order; ``source`` is filled while reading."""
        return importlib.import_module(self.reader).records(self, path, options, source)

    def load(self, path: str | os.PathLike[str], options: Any) -> Any:
        """The histogram c_ij of the log at ``path``, its ``source`` saying how to write it back."""
        return importlib.import_module(self.reader).load(self, path, options)

    def write_text(self, log: Any, out: TextIO, source: dict, path: str | os.PathLike[str]) -> int:
        """``log`` as text in this format; its data lines."""
        return importlib.import_module(self.writer).write_text(self, log, out, source, path)


AOL = LogFormat("aol", layout=AOL_LAYOUT)
HISTOGRAM = LogFormat("histogram", layout=HISTOGRAM_LAYOUT)
PARQUET = LogFormat("parquet", columns="names", dataset=True, extra="parquet", release_suffix=".parquet", utf8=True,
                    reader="cels.logs.parquet", writer="cels.logs.parquet")  # fmt: skip
LOG_FORMATS: dict[str, LogFormat] = {
    f.name: f for f in (AOL, LogFormat("msnbc", reader="cels.logs.msnbc", writer="cels.logs.msnbc"), LogFormat("tsv", columns="numbers"), HISTOGRAM, PARQUET)
}
FORMATS = tuple(LOG_FORMATS)
"""The formats' names (``--format``)."""


def log_format(name: str) -> LogFormat:
    """The format named ``name`` (a ValueError naming the choices)."""
    if name not in LOG_FORMATS:
        raise ValueError(f"unknown log format {name!r}; choose one of {', '.join(FORMATS)}")
    return LOG_FORMATS[name]


def check_columns(columns: dict[str, int] | dict[str, str], by_name: bool = False) -> None:
    """Raise ValueError unless ``columns`` maps user, query, url (and maybe count) to distinct
    columns: numbers >= 1, or (``by_name``) non-empty column names."""
    unknown = sorted(set(columns) - set(COLUMN_NAMES))
    if unknown:
        raise ValueError(f"unknown column name(s) {', '.join(unknown)}; use {', '.join(COLUMN_NAMES)}")
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise ValueError(f"column mapping lacks {', '.join(missing)} (needs user, query and url)")
    for name, col in columns.items():
        if by_name:
            if not isinstance(col, str) or not col:
                raise ValueError(f"column {name}={col!r}: give the column's name")
        elif not isinstance(col, int) or isinstance(col, bool) or col < 1:
            raise ValueError(f"column {name}={col!r}: columns are numbered from 1")
    if len(set(columns.values())) != len(columns):
        raise ValueError(f"two names share one column in {format_columns(columns)}")


def parse_columns(spec: str, by_name: bool = False) -> dict[str, int] | dict[str, str]:
    """``"user=1,query=2,url=4[,count=N]"`` -> ``{"user": 1, "query": 2, "url": 4, ...}`` (1-based);
    ``by_name`` (Parquet): ``"user=AnonID,query=Query,url=ClickURL"`` -> column names."""
    columns: dict = {}
    for item in spec.split(","):
        name, sep, number = item.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"column mapping {spec!r}: {item.strip()!r} is not name=number")
        if name in columns:
            raise ValueError(f"column mapping {spec!r}: {name} given twice")
        if by_name:
            columns[name] = number.strip()
            continue
        try:
            columns[name] = int(number.strip())
        except ValueError:
            raise ValueError(f"column mapping {spec!r}: {name}={number.strip()!r} is not a column number") from None
    try:
        check_columns(columns, by_name)
    except ValueError as exc:
        raise ValueError(f"column mapping {spec!r}: {exc}") from None
    return columns


def format_columns(columns: dict[str, int] | dict[str, str]) -> str:
    """Inverse of :func:`parse_columns`."""
    return ",".join(f"{name}={col}" for name, col in columns.items())
