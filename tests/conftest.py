"""Shared fixtures.  Real-data tests read the logs from ``$CELS_DATA`` (default ``../shared/data``
beside the repository) and fail, not skip, when they are missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("CELS_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = data_dir()
    missing = [n for n in ("aol-dev.tsv.gz", "msnbc990928.seq.gz") if not (path / n).is_file()]
    if missing:
        pytest.fail(f"real-data logs missing from {path}: {', '.join(missing)} (set CELS_DATA)")
    return path


@pytest.fixture(scope="session")
def aol_path(shared_data: Path) -> Path:
    return shared_data / "aol-dev.tsv.gz"


@pytest.fixture(scope="session")
def msnbc_path(shared_data: Path) -> Path:
    return shared_data / "msnbc990928.seq.gz"


@pytest.fixture(scope="session")
def recorded_session(tmp_path_factory):
    """One recorded in-memory session of the paper's Algorithm 2 (test-size keys) shared by the
    view tests: (root, options, log, logs, output, views of that session by node)."""
    from cels.inprocess import run_session
    from cels.logs import synthetic_log
    from cels.protocol.options import SessionOptions
    from cels.views import load_views

    log = synthetic_log(seed=11, users=36)
    logs = log.split_by_user(3)
    options = SessionOptions.create(
        3, epsilon=8.0, delta=0.9, objective="max-output", key_bits=256, group_bits=1024, solve="transformed"
    )
    root = tmp_path_factory.mktemp("recorded")
    output, _report = run_session(logs, options, record_view=str(root), allow_insecure_key_bits=True)
    return root, options, log, logs, output, load_views(root)[options.session_id]
