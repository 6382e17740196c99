"""A party's Ray cluster as a trust boundary (cels.engine.ray.trust; docs/ray.md):
token authentication required, the node's own Ray directory private and removed."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from cels.engine.ray.trust import DIR_PREFIX, private_dir, remove_stale, require_token_auth

STRANGER = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as exc:
    print("REFUSED", type(exc).__name__)
else:
    print("JOINED")
"""


def test_token_authentication_is_turned_on_or_the_setting_that_keeps_it_off_is_named(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    require_token_auth("2.60.0", joining=False)
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ValueError, match="RAY_AUTH_MODE='disabled' turns Ray's token authentication off"):
        require_token_auth("2.60.0", joining=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ValueError, match=r"Ray 2.9.3 has no token authentication; a party's Ray cluster needs Ray >= 2.52"):
        require_token_auth("2.9.3", joining=False)
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    with pytest.raises(ValueError, match="joining a Ray cluster needs its token"):
        require_token_auth("2.60.0", joining=True)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    require_token_auth("2.60.0", joining=True)


def test_a_nodes_ray_directory_is_private_and_a_dead_nodes_is_removed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    own = private_dir()
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.name.startswith(f"{DIR_PREFIX}{os.getpid()}-")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f"{DIR_PREFIX}{dead}-abcdefgh"
    (stale / "ray" / "spill").mkdir(parents=True)
    (stale / "ray" / "spill" / "rows").write_bytes(b"x")
    other = tmp_path / "cels-ray-12345678"  # not a node's: kept
    other.mkdir()
    assert remove_stale(tmp_path) == [stale]
    assert not stale.exists() and own.exists() and other.exists()


@pytest.mark.slow
def test_a_stranger_without_the_token_cannot_join_the_nodes_own_instance(tmp_path) -> None:
    """The review's experiment: a second process with no token joined the cluster and ran a
    task.  Now the node's own instance requires the token; its directory is 0700."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from cels.engine import EngineOptions, open_engine

    if ray.is_initialized():  # another module's instance: this test needs the node's own
        ray.shutdown()
    engine = open_engine(EngineOptions(kind="ray", shards=1, max_in_flight=1))
    try:
        assert os.environ["RAY_AUTH_MODE"] == "token"
        assert engine.own_dir is not None and stat.S_IMODE(engine.own_dir.stat().st_mode) == 0o700
        gcs = ray.get_runtime_context().gcs_address
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path), "RAY_gcs_rpc_server_reconnect_timeout_s": "3"}
        done = subprocess.run([sys.executable, "-c", STRANGER, gcs], env=env, capture_output=True, text=True, timeout=120)
        assert "REFUSED" in done.stdout and "JOINED" not in done.stdout, done.stdout + done.stderr[-2000:]
    finally:
        own = engine.own_dir
        engine.close()
    assert own is not None and not own.exists()  # the reaper removed it with the instance


def test_a_cluster_that_takes_calls_without_a_token_is_refused_before_the_node_joins(tmp_path, monkeypatch, ray_token) -> None:
    """The review's open item: the node refused to start without tokens itself, but joined a
    cluster whose own authentication was off.  Now it calls the cluster once without a token
    (its GCS, or its client server for ray://) and refuses one that answers."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    import shutil
    import tempfile

    from cels.engine import EngineOptions, open_engine
    from cels.engine.ray.trust import refuse_open_cluster
    from cels.node.cluster import LOOPBACK, free_port
    from test_engine_raylets import RAY_CLI, cluster_processes, end_processes

    refuse_open_cluster(f"{LOOPBACK}:{free_port()}", timeout=1.0)  # nobody answers: left to ray.init to report
    temp_dir = tempfile.mkdtemp(prefix="cels-open-")  # short: Ray's socket paths must fit 107 bytes
    port, client = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    started = subprocess.run(
        [RAY_CLI, "start", "--head", "--port", str(port), "--ray-client-server-port", str(client), "--node-ip-address", LOOPBACK,
         "--num-cpus", "1", "--temp-dir", temp_dir, "--include-dashboard=false", "--disable-usage-stats",
         "--dashboard-agent-listen-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        limit = time.monotonic() + 60  # the client server comes up after `ray start` returns
        while True:
            try:
                socket.create_connection((LOOPBACK, client), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < limit, "the Ray client server never listened"
                time.sleep(0.5)
        for address in (f"{LOOPBACK}:{port}", f"ray://{LOOPBACK}:{client}"):
            with pytest.raises(ValueError, match=f"the Ray cluster at {address} answers calls that carry no token"):
                refuse_open_cluster(address)
        with pytest.raises(ValueError, match="answers calls that carry no token"):
            open_engine(EngineOptions(kind="ray", address=f"{LOOPBACK}:{port}", shards=1, max_in_flight=1))
    finally:
        left = end_processes(cluster_processes(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, sorted(left)
