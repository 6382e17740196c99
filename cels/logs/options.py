"""How to read a log: the format, the column mapping and the reader's switches."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cels.logs.formats import LogFormat, log_format
from cels.logs.records import MAX_LOG_TOTAL, LogError, LogRecord, normalise_query
from cels.logs.textio import ENCODING, check_encoding

SKIPPED_EXAMPLES = 5  # reasons kept in source["skipped_examples"] (and file:line:field in source["skipped_at"])


@dataclass
class LoadOptions:
    """Reader switches.

    ``columns`` maps ``user``/``query``/``url``[/``count``] to 1-based columns (``tsv``), or to
    column names (``parquet``, default the names themselves).
    ``header``: ``None`` detects it (see docs/formats.md), ``True``/``False`` force it.
    ``lenient`` skips bad lines (counted in ``source["skipped_lines"]``) instead of failing.
    ``max_users`` keeps the first N users in file order.
    ``encoding`` decodes the bytes, strictly: a byte sequence not valid in it is bad input
    (default UTF-8; ``latin-1`` for old logs, docs/formats.md).
    """

    format: str
    columns: dict[str, int] | dict[str, str] | None = None
    header: bool | None = None
    lenient: bool = False
    delimiter: str = "\t"
    max_users: int | None = None
    normalise: Callable[[str], str] = normalise_query
    encoding: str = ENCODING

    @property
    def log_format(self) -> LogFormat:
        """The format object (cels.logs.formats)."""
        return log_format(self.format)

    def __post_init__(self) -> None:
        self.log_format.check(self.columns, self.encoding)
        if len(self.delimiter) != 1 or self.delimiter in "\r\n":
            raise ValueError(f"delimiter must be one character other than a line break, not {self.delimiter!r}")
        if self.max_users is not None and self.max_users < 1:
            raise ValueError(f"max_users must be a positive number of users, not {self.max_users}")
        check_encoding(self.encoding)


def skip_or_raise(options: LoadOptions, source: dict, error: LogError) -> None:
    """Lenient mode: count the bad line in ``source`` (keeping the first reasons); else raise."""
    if not options.lenient:
        raise error
    source["skipped_lines"] += 1
    if len(source["skipped_examples"]) < SKIPPED_EXAMPLES:
        source["skipped_examples"].append(str(error))
        source["skipped_at"].append(":".join(str(part) for part in (error.path, error.line, error.field) if part is not None))


class Admission:
    """What a reader keeps of the records it parsed: the first ``max_users`` users' records
    (file order), while the log's counts add up to at most MAX_LOG_TOTAL (docs/formats.md, Limits)."""

    def __init__(self, max_users: int | None) -> None:
        self.max_users = max_users
        self.kept: set[str] = set()
        self.total = 0  # the counts of the records kept so far

    def admit(self, record: LogRecord, refusal: Callable[[str], LogError]) -> bool:
        """True: keep ``record``; False: a user past ``max_users`` (dropped); raises
        ``refusal(reason)`` when its count takes the log's total above MAX_LOG_TOTAL."""
        if self.max_users is not None and record.user not in self.kept:
            if len(self.kept) >= self.max_users:
                return False
            self.kept.add(record.user)
        if self.total + record.count > MAX_LOG_TOTAL:
            raise refusal(
                f"the log's counts add up to {self.total + record.count} here, above the {MAX_LOG_TOTAL} (2^53) a log may total "
                "(docs/formats.md, Limits)"
            )
        self.total += record.count
        return True

    def admit_batch(self, total: int) -> bool:
        """True, counting them: a batch of records whose counts add up to ``total`` keeps the
        log within MAX_LOG_TOTAL; False, counting nothing: one of its records would not
        (:meth:`admit` names it).  Only where no user is cut (``max_users`` None)."""
        if self.total + total > MAX_LOG_TOTAL:
            return False
        self.total += total
        return True


def default_data_dir() -> Path:
    """Where the real logs live: ``$CELS_DATA``, else ``<repo>/../shared/data``.

    ``<repo>`` is the checkout holding this package (editable install); when the package is
    installed elsewhere (no ``pyproject.toml`` beside it) the fallback is ``cwd/../shared/data``.
    """
    env = os.environ.get("CELS_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo.parent / "shared" / "data"
    return Path.cwd().parent / "shared" / "data"
