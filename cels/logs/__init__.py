"""Search-log formats: readers, writers, the histogram model and the synthetic log."""

from cels.logs.bench import bench_load
from cels.logs.model import LogError, LogRecord, SearchLog, normalise_query, split_records_by_user
from cels.logs.options import FORMATS, LoadOptions, default_data_dir, parse_columns
from cels.logs.readers import LogFile, iter_records, load_log
from cels.logs.synthetic import synthetic_log, write_synthetic
from cels.logs.writers import write_log, write_records

__all__ = [
    "LogFile",
    "FORMATS",
    "LoadOptions",
    "LogError",
    "LogRecord",
    "SearchLog",
    "bench_load",
    "default_data_dir",
    "iter_records",
    "load_log",
    "normalise_query",
    "parse_columns",
    "split_records_by_user",
    "synthetic_log",
    "write_log",
    "write_records",
    "write_synthetic",
]
