"""Search-log formats: readers, writers, the histogram model and the synthetic log."""

from cels.logs.model import LogError, LogRecord, SearchLog, normalise_query

__all__ = ["LogError", "LogRecord", "SearchLog", "normalise_query"]
