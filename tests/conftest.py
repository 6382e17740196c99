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
