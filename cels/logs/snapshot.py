"""A loaded log kept as arrays, so that a session's re-run reads it back instead of parsing its
input again (docs/deployment.md, "Resume after a node restart").

One ``.npz`` file (no pickled object: read with ``allow_pickle=False``): the user ids, the
queries and the urls each as one UTF-8 text joined by newlines, the histogram c_ij as its CSR
arrays, and the log's ``source`` as JSON.  A log with a newline inside a name (a delimited
reader never yields one; a Parquet column may) or a source that JSON cannot hold is not kept,
nor one the disk refuses: its re-run parses the input again.
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from cels.fileio import atomic_write
from cels.logs.model import SearchLog

log = logging.getLogger(__name__)

SNAPSHOT_MODE = 0o600
"""The snapshot holds the party's rows: its owner's only."""


def write_snapshot(searchlog: SearchLog, path: Path) -> bool:
    """``searchlog`` written to ``path`` (0600, atomically); False, and nothing written, where a
    name holds a newline, its source is not JSON, or the file cannot be written (a re-run then
    parses the input again)."""
    try:
        source = json.dumps(searchlog.source)
    except (TypeError, ValueError):
        return False
    columns = {"users": searchlog.users, "queries": [q for q, _ in searchlog.pairs], "urls": [u for _, u in searchlog.pairs]}
    arrays: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        text = "\n".join(values)
        if text.count("\n") != max(len(values) - 1, 0):
            return False
        arrays[name] = np.frombuffer(text.encode(), dtype=np.uint8)
    counts = searchlog.counts.tocsr()
    arrays.update(
        shape=np.array(counts.shape, dtype=np.int64), indptr=counts.indptr, indices=counts.indices, data=counts.data,
        source=np.frombuffer(source.encode(), dtype=np.uint8),
    )  # fmt: skip
    try:
        with atomic_write(path, "wb", file_mode=SNAPSHOT_MODE) as fh:
            np.savez(fh, **arrays)
    except OSError as exc:
        log.warning("the loaded log is not kept in %s (%s): a re-run parses the input again", path, exc)
        return False
    return True


def read_snapshot(path: Path) -> SearchLog | None:
    """The log kept at ``path``, or None where there is none or it does not read back whole."""
    try:
        with np.load(path, allow_pickle=False) as kept:
            n_users, n_pairs = (int(v) for v in kept["shape"])
            users, queries, urls = (_names(kept[name], size) for name, size in (("users", n_users), ("queries", n_pairs), ("urls", n_pairs)))
            counts = sp.csr_matrix((kept["data"], kept["indices"], kept["indptr"]), shape=(n_users, n_pairs))
            source = json.loads(kept["source"].tobytes())
        return SearchLog(users, list(zip(queries, urls)), counts, source)
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        log.warning("the kept log %s does not read back (%s): the input is parsed again", path, exc)
        return None


def _names(raw: np.ndarray, size: int) -> list[str]:
    """``size`` names joined by newlines in ``raw`` (ValueError if there are not that many)."""
    names = raw.tobytes().decode().split("\n") if size else []
    if len(names) != size:
        raise ValueError(f"{len(names)} names where {size} were kept")
    return names
