"""Search-log formats: readers, writers, the histogram model and the synthetic log (each name
imported from its module on first use: :mod:`cels.lazy`)."""

from cels.lazy import lazy_exports

SOURCES = {
    "bench_load": "bench",
    "SearchLog": "model",
    "split_records_by_user": "model",
    "LogError": "records",
    "LogRecord": "records",
    "normalise_query": "records",
    "FORMATS": "formats",
    "LoadOptions": "options",
    "default_data_dir": "options",
    "parse_columns": "formats",
    "LogFile": "readers",
    "iter_records": "readers",
    "load_log": "readers",
    "synthetic_log": "synthetic",
    "write_synthetic": "synthetic",
    "write_log": "writers",
    "write_records": "writers",
}
__all__ = sorted(SOURCES)
__getattr__ = lazy_exports(__name__, SOURCES)
