"""Load-time benchmark: ``python -m cels.logs PATH --format msnbc`` prints :func:`bench_load` as JSON.

``peak_rss_bytes`` is the process's high-water mark (``getrusage`` ``ru_maxrss``) after the
load; run from a fresh process (as the command does) it is the load's own peak memory.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from cels.logs.options import LoadOptions
from cels.logs.readers import load_log


def _max_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def bench_load(path: str | os.PathLike[str], options: LoadOptions) -> dict:
    """Load ``path`` once: wall seconds, peak RSS bytes and the histogram's size."""
    rss_before = _max_rss_bytes()
    start = time.perf_counter()
    log = load_log(path, options)
    seconds = time.perf_counter() - start
    return {
        "path": str(path),
        "format": options.format,
        "max_users": options.max_users,
        "seconds": round(seconds, 3),
        "peak_rss_bytes": _max_rss_bytes(),
        "peak_rss_before_bytes": rss_before,
        "users": log.n_users,
        "pairs": log.n_pairs,
        "events": log.size,
        "skipped_lines": log.source.get("skipped_lines", 0),
    }

