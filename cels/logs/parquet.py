"""Parquet logs (docs/formats.md, "Parquet"): a file, a directory of files (a dataset) or a
``file://`` URI, read row group by row group, record batch by record batch, with pyarrow.

Columns ``user``, ``query``, ``url`` and an optional ``count`` (default 1: a row is a click, as
an AOL row), or the names a column mapping gives.  A null or empty url is a query without a
click (as AOL).  Every row goes through the text readers' checks and limits (docs/formats.md,
"Limits"); a bad row raises :class:`LogError` naming the file, the row (its number in the file,
its row group and its row in that group) and the column, or is skipped and counted with
``lenient``.  A record batch whose every row passes is read through its distinct values
(:meth:`ParquetReader.histogram`), any other row by row.  pyarrow is the optional extra
``parquet``, imported only when the format is used.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from cels.logs.formats import HISTOGRAM, LogFormat
from cels.logs.model import HistogramBuilder, SearchLog
from cels.logs.records import MAX_COUNT, LogError, LogRecord
from cels.logs.options import Admission, LoadOptions, skip_or_raise

PARQUET_COLUMNS = {"user": "user", "query": "query", "url": "url", "count": "count"}
"""The column names read by default (and the names a log without a source is written with)."""
BATCH_ROWS = 8192
"""Rows converted to Python objects at once while reading."""
ROW_GROUP_ROWS = 65_536
"""The most rows of one row group the writer makes."""


def is_parquet(path: str | os.PathLike[str]) -> bool:
    """A path the writers write as Parquet whatever the log's format: it ends in ``.parquet``."""
    return str(path).endswith(".parquet")


def pyarrow_modules() -> tuple[Any, Any, Any]:
    """``pyarrow``, ``pyarrow.dataset``, ``pyarrow.parquet``; a clear error naming the extra if missing."""
    try:
        import pyarrow
        import pyarrow.dataset
        import pyarrow.parquet
    except ImportError:
        raise ValueError("the Parquet format needs pyarrow: pip install 'cels[parquet]'") from None
    return pyarrow, pyarrow.dataset, pyarrow.parquet


def pyarrow_compute() -> Any:
    """``pyarrow.compute`` (after :func:`pyarrow_modules` has checked the extra)."""
    pyarrow_modules()
    import pyarrow.compute

    return pyarrow.compute


def _distinct(pc: Any, array: Any, clean: Callable[[Any], Any]) -> tuple[list, np.ndarray]:
    """``array`` (no nulls) as ``clean`` of each of its distinct values, and each row's number
    among them."""
    encoded = pc.dictionary_encode(array)
    return [clean(value) for value in encoded.dictionary.to_pylist()], encoded.indices.to_numpy().astype(np.int64)


@dataclass(frozen=True)
class RowGroup:
    """One row group of a Parquet log: its file, its 0-based index there, its rows and the
    0-based number of its first row in the file."""

    file: str
    index: int
    rows: int
    first_row: int


class ParquetLog:
    """The files of one Parquet log (a file or a dataset directory, sorted by path) and their row groups."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        pa, ds, pq = pyarrow_modules()
        self.path = str(path)
        try:
            dataset = ds.dataset(self.path, format="parquet")  # a directory skips files named .* or _*
        except (pa.ArrowException, OSError) as exc:
            raise LogError(self.path, None, None, f"cannot open as Parquet: {exc}") from None
        self.filesystem = dataset.filesystem
        self.schemas: dict[str, Any] = {}  # file -> its Arrow schema
        self.row_groups: list[RowGroup] = []
        for file in sorted(dataset.files):
            try:
                metadata = pq.read_metadata(file, filesystem=self.filesystem)
            except (pa.ArrowException, OSError) as exc:
                raise LogError(file, None, None, f"not a Parquet file: {exc}") from None
            self.schemas[file] = metadata.schema.to_arrow_schema()
            first = 0
            for g in range(metadata.num_row_groups):
                rows = metadata.row_group(g).num_rows
                self.row_groups.append(RowGroup(file, g, rows, first))
                first += rows
        if not self.schemas:
            raise LogError(self.path, None, None, "no Parquet file in this directory")


class ParquetReader:
    """Streams the records of a Parquet log (or of some of its row groups) and fills ``source``."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, row_groups: Sequence[RowGroup] | None = None) -> None:
        self.log = ParquetLog(path)
        self.options = options
        self.names: dict[str, str] = dict(options.columns or {k: v for k, v in PARQUET_COLUMNS.items() if k != "count"})  # type: ignore[arg-type]
        self.row_groups = self.log.row_groups if row_groups is None else list(row_groups)
        self.source: dict = {
            "format": "parquet",
            "path": self.log.path,
            "columns": dict(self.names),
            "files": len(self.log.schemas),
            "row_groups": len(self.row_groups),
            "max_users": options.max_users,
            "skipped_lines": 0,
            "skipped_examples": [],
            "skipped_at": [],
        }
        if options.columns is None and any(PARQUET_COLUMNS["count"] in schema.names for schema in self.log.schemas.values()):
            self.names["count"] = self.source["columns"]["count"] = PARQUET_COLUMNS["count"]

    def records(self) -> Iterator[LogRecord]:
        """The rows in file order (files sorted by path), each checked (docs/formats.md, Limits)."""
        admission = Admission(self.options.max_users)
        for group, first, columns in self._batches():
            yield from self._batch_records(group, first, columns, admission)

    def histogram(self) -> SearchLog:
        """The log's histogram c_ij, the same as ``SearchLog.from_records(self.records())``, a
        record batch at a time: a batch whose every row passes the checks at once (no null or
        empty user, no null query, integer counts in 1..MAX_COUNT, the log's total within its
        limit, no cut to the first ``max_users`` users) is numbered over its distinct values
        (:meth:`_coded`); any other goes row by row, so a bad row's error or skip is the row
        reader's."""
        histogram = HistogramBuilder()
        admission = Admission(self.options.max_users)
        for group, first, columns in self._batches():
            if not self._coded(histogram, admission, columns):
                for record in self._batch_records(group, first, columns, admission):
                    histogram.add(record)
        return histogram.log(self.source)

    def _batches(self) -> Iterator[tuple[RowGroup, int, dict[str, Any]]]:
        """``(group, rows of the group before this batch, the batch's columns)`` for every record
        batch of at most BATCH_ROWS rows, in file order, each column checked (:meth:`_validated`)."""
        for file, groups in itertools.groupby(self.row_groups, key=lambda group: group.file):
            self._check_schema(file, self.log.schemas[file])
            with self.log.filesystem.open_input_file(file) as handle:
                parquet = pyarrow_modules()[2].ParquetFile(handle)
                for group in groups:
                    first = 0
                    batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group.index], columns=list(self.names.values()), use_threads=False)
                    for batch in batches:
                        yield group, first, {name: self._validated(group, batch.column(column), name) for name, column in self.names.items()}
                        first += batch.num_rows

    def _batch_records(self, group: RowGroup, first: int, columns: dict[str, Any], admission: Admission) -> Iterator[LogRecord]:
        """The checked records of one batch, row by row (its columns converted to Python values
        at once); a bad row raises, or is skipped and counted with ``lenient``."""
        values = {name: array.to_pylist() for name, array in columns.items()}
        for k in range(len(values["user"])):
            where = (group.file, group.first_row + first + k + 1, group.index, first + k + 1)
            try:
                record = self._record(values, k, where)
                if not admission.admit(record, lambda reason: self._error(where, self.names.get("count"), reason)):
                    continue
            except LogError as exc:
                skip_or_raise(self.options, self.source, exc)
                continue
            yield record

    def _coded(self, histogram: HistogramBuilder, admission: Admission, columns: dict[str, Any]) -> bool:
        """Add one batch to ``histogram`` through its distinct values if every row passes the
        checks: the users stripped, the queries normalised and the urls stripped once per
        distinct value (``options.normalise`` is a function of its text).  False, having added
        nothing, if a row does not."""
        if admission.max_users is not None:  # the cut to the first users is made row by row, in file order
            return False
        pa, pc = pyarrow_modules()[0], pyarrow_compute()
        user, query, url = columns["user"], columns["query"], columns["url"]
        if user.null_count or query.null_count:
            return False
        if "count" in columns:
            count = columns["count"]
            if not pa.types.is_integer(count.type) or count.null_count:
                return False
            if len(count) and (pc.min(count).as_py() < 1 or pc.max(count).as_py() > MAX_COUNT):
                return False
            counts = count.to_numpy().astype(np.int64)
        else:
            counts = np.ones(len(user), dtype=np.int64)
        users, user_codes = _distinct(pc, user, lambda value: str(value).strip())
        if "" in users or not admission.admit_batch(int(counts.sum())):
            return False
        queries, query_codes = _distinct(pc, query, self.options.normalise)
        urls, url_codes = _distinct(pc, url.fill_null(""), lambda value: value.strip() or None)
        clicks = np.flatnonzero(np.array([u is not None for u in urls], dtype=bool)[url_codes]) if urls else np.zeros(0, dtype=np.int64)
        if len(clicks):
            keys, pair_codes = np.unique(query_codes[clicks] * len(urls) + url_codes[clicks], return_inverse=True)
            query_of, url_of = np.divmod(keys, len(urls))
            pairs = list(zip(map(queries.__getitem__, query_of.tolist()), map(urls.__getitem__, url_of.tolist())))
            histogram.add_coded(users, user_codes[clicks], pairs, pair_codes.ravel(), counts[clicks])
        return True

    def _check_schema(self, file: str, schema: Any) -> None:
        """Every mapped column exists, with a type the format reads (refused for the whole file)."""
        pa = pyarrow_modules()[0]
        kinds = {
            "user": (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer),
            "query": (pa.types.is_string, pa.types.is_large_string),
            "url": (pa.types.is_string, pa.types.is_large_string),
            "count": (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string),
        }
        for name, column in self.names.items():
            if column not in schema.names:
                raise LogError(file, None, column, f"no such column (the file has {', '.join(schema.names)}); map the columns with --columns {name}=NAME,...")
            kind = schema.field(column).type
            if not any(test(kind) for test in kinds[name]):
                wanted = "an integer or string" if name == "count" else "a string" + (" or integer" if name == "user" else "")
                raise LogError(file, None, column, f"column type {kind}; {name} must be {wanted} column")

    @staticmethod
    def _error(where: tuple[str, int, int, int], column: str | None, reason: str) -> LogError:
        file, line, group, row = where
        return LogError(file, line, column, reason, row_group=(group, row))

    def _validated(self, group: RowGroup, array: Any, name: str) -> Any:
        """One column of a record batch, its UTF-8 and offsets checked."""
        pa = pyarrow_modules()[0]
        try:
            array.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise LogError(group.file, None, self.names[name], f"row group {group.index}: {exc}") from None
        return array

    def _record(self, values: dict[str, list], k: int, where: tuple[str, int, int, int]) -> LogRecord:
        names = self.names
        user, query, url = values["user"][k], values["query"][k], values["url"][k]
        if user is None:
            raise self._error(where, names["user"], "null user id")
        user = str(user).strip()
        if not user:
            raise self._error(where, names["user"], "empty user id")
        if query is None:
            raise self._error(where, names["query"], "null query")
        count = 1
        if "count" in values:
            count = values["count"][k]
            if isinstance(count, str):
                text = count.strip()
                count = int(text) if text.isascii() and text.isdigit() else None
                if count is None:
                    raise self._error(where, names["count"], f"{values['count'][k]!r} is not a positive integer")
            if count is None or count < 1:
                raise self._error(where, names["count"], f"{'null' if count is None else count} is not a positive integer")
            if count > MAX_COUNT:
                raise self._error(
                    where, names["count"],
                    f"{count} is above the largest count a row may give, {MAX_COUNT} (2^31 - 1; docs/formats.md, Limits)",
                )  # fmt: skip
        url = url.strip() if url is not None else ""
        return LogRecord(user, self.options.normalise(query), url or None, count, where[1])


def load_parquet(path: str | os.PathLike[str], options: LoadOptions, row_groups: Sequence[RowGroup] | None = None) -> SearchLog:
    """The histogram c_ij of the Parquet log at ``path`` (of ``row_groups`` only, if given)."""
    return ParquetReader(path, options, row_groups).histogram()


def write_parquet(log: SearchLog, path: str | os.PathLike[str], source: dict | None = None, row_group_rows: int = ROW_GROUP_ROWS) -> int:
    """``log`` as Parquet at ``path`` (atomically: cels.fileio): one row per (user, pair) with
    count > 0 in user order, in row groups of at most ``row_group_rows`` rows; columns named as
    ``source["columns"]`` maps them (a Parquet input's), else ``user, query, url, count``.
    Returns the rows written."""
    from cels.fileio import atomic_write

    pa, _, pq = pyarrow_modules()
    names = {**PARQUET_COLUMNS, **((source or {}).get("columns") or {})} if (source or {}).get("format") == "parquet" else dict(PARQUET_COLUMNS)
    if len(set(names.values())) != len(names):
        raise ValueError(f"cannot write Parquet columns {names}: two share one name")
    schema = pa.schema([(names["user"], pa.string()), (names["query"], pa.string()), (names["url"], pa.string()), (names["count"], pa.int64())])
    counts = log.counts.tocsr(copy=True)
    counts.sum_duplicates()
    rows = np.repeat(np.arange(log.n_users, dtype=np.int64), np.diff(counts.indptr))
    keep = counts.data > 0
    rows, cols, data = rows[keep], counts.indices[keep], counts.data[keep]
    with atomic_write(path, mode="wb") as sink, pq.ParquetWriter(sink, schema) as writer:
        for lo in range(0, len(data), row_group_rows):
            hi = lo + row_group_rows
            pairs = [log.pairs[i] for i in cols[lo:hi]]
            columns = [
                pa.array([log.users[j] for j in rows[lo:hi]], pa.string()),
                pa.array([q for q, _ in pairs], pa.string()),
                pa.array([u for _, u in pairs], pa.string()),
                pa.array(data[lo:hi], pa.int64()),
            ]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema), row_group_size=row_group_rows)
    return int(len(data))


def records(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions, source: dict | None = None) -> Iterator[LogRecord]:
    """:meth:`LogFormat.records` of Parquet."""
    reader = ParquetReader(path, options)
    if source is not None:
        source.update(reader.source)
        reader.source = source
    return reader.records()


def load(fmt: LogFormat, path: str | os.PathLike[str], options: LoadOptions) -> SearchLog:
    """:meth:`LogFormat.load` of Parquet."""
    return load_parquet(path, options)


def write_text(fmt: LogFormat, log: SearchLog, out: TextIO, source: dict, path: str | os.PathLike[str]) -> int:
    """A Parquet log to a text path: a histogram TSV (user, query, url, count; docs/formats.md)."""
    return HISTOGRAM.write_text(log, out, source, path)
