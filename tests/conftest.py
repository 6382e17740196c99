"""Shared fixtures.  Real-data tests read the logs from ``$CELS_DATA`` (default ``../shared/data``
beside the repository) and fail, not skip, when they are missing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("CELS_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session", autouse=True)
def operator_report_dir(tmp_path_factory) -> Path:
    """Operator reports a test does not place go to a temporary directory, not the user's home
    (cels.reports: $CELS_REPORT_DIR; node processes and CLI subprocesses inherit it)."""
    path = tmp_path_factory.mktemp("operator-reports")
    os.environ["CELS_REPORT_DIR"] = str(path)
    return path


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


@dataclass
class RecordedSession:
    """One finished in-memory session with every node's view recorded."""

    root: Path  # the views' directory
    options: Any  # SessionOptions
    log: Any  # the whole synthetic log
    logs: list  # party k's share
    roles: dict  # node -> role
    views: dict  # node -> NodeView


@pytest.fixture(scope="session")
def recorded_session(tmp_path_factory) -> RecordedSession:
    """3 parties over a 36-user synthetic log, the transformed solve, max-output, test-size keys
    (256-bit Paillier, 1024-bit group); read by tests/test_views.py and tests/test_protocol_views.py."""
    from cels.logs import synthetic_log
    from cels.protocol.options import SessionOptions
    from cels.views import load_views, record_session

    log = synthetic_log(seed=11, users=36)
    logs = log.split_by_user(3)
    options = SessionOptions.create(
        3, epsilon=8.0, delta=0.9, objective="max-output", key_bits=256, group_bits=1024, solve="transformed"
    )
    root = tmp_path_factory.mktemp("recorded")
    roles = record_session(logs, options, root, allow_insecure_key_bits=True)
    return RecordedSession(root, options, log, logs, roles, load_views(root)[options.session_id])


@pytest.fixture
def rounds_on_the_user_shards(monkeypatch):
    """Every round of the private solve walked on a Ray party's user shards, as a log whose
    rounds are larger than cels.engine.ray.runtime.NODE_WALK_NONZEROS would be (test logs are
    small: their rounds would be walked on the node)."""
    monkeypatch.setattr("cels.engine.ray.runtime.RayRuntime.node_walk_nonzeros", -1)


@pytest.fixture
def ray_token(monkeypatch):
    """Ray's token authentication on for this test and what it starts (a party's Ray cluster
    requires it: cels.engine.ray.trust), with a token in Ray's default file (made, 0600, as
    ``ray get-auth-token --generate`` would, if there is none)."""
    import secrets

    from cels.engine.ray.trust import default_token

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    token = default_token()
    if not token.is_file() and not os.environ.get("RAY_AUTH_TOKEN"):
        token.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return token
