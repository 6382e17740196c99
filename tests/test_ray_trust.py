"""A party's Ray cluster as a trust boundary (cels.engine.ray.trust; docs/ray.md):
token authentication required, the node's own Ray directory private and removed."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

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
        # two tries, a second apart, instead of Ray's 20: the GCS answers the first at once
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path), "RAY_NUM_REDIS_GET_RETRIES": "2"}
        done = subprocess.run([sys.executable, "-c", STRANGER, gcs], env=env, capture_output=True, text=True, timeout=120)
        assert "REFUSED" in done.stdout and "JOINED" not in done.stdout, done.stdout + done.stderr[-2000:]
        assert "InvalidAuthToken" in done.stderr, done.stderr[-2000:]  # refused for its missing token, not for a timeout
    finally:
        own = engine.own_dir
        engine.close()
    assert own is not None and not own.exists()  # the reaper removed it with the instance


def test_a_cluster_that_takes_calls_without_a_token_is_refused_before_the_node_joins(tmp_path, monkeypatch, ray_token) -> None:
    """The review's open item: the node refused to start without tokens itself, but joined a
    cluster whose own authentication was off.  Now it calls the cluster once without a token
    (its GCS, or its client server for ray://) and refuses one that answers."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from cels.engine import EngineOptions, open_engine
    from cels.engine.ray.trust import refuse_open_cluster
    from cels.node.cluster import LOOPBACK, free_port

    refuse_open_cluster(f"{LOOPBACK}:{free_port()}", timeout=1.0)  # nobody answers: left to ray.init to report
    with ray_head("cels-open-", {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}) as (port, client):
        for address in (f"{LOOPBACK}:{port}", f"ray://{LOOPBACK}:{client}"):
            with pytest.raises(ValueError, match=f"the Ray cluster at {address} answers calls that carry no token"):
                refuse_open_cluster(address)
        with pytest.raises(ValueError, match="answers calls that carry no token"):
            open_engine(EngineOptions(kind="ray", address=f"{LOOPBACK}:{port}", shards=1, max_in_flight=1))


def test_a_ray_hosts_certificate_names_its_addresses_and_a_clients_none(tmp_path) -> None:
    """cels ray-tls: the party's Ray CA made once and kept (0700, key 0600); a Ray host's
    certificate names the addresses Ray dials it by, a client's names only its holder."""
    from cryptography import x509

    from cels.cli import main
    from cels.engine.ray.tls import host_addresses

    assert main(["ray-tls", "--ca", str(tmp_path / "ca"), "--name", "ray-head", "--out", str(tmp_path / "head")]) == 0
    assert main(["ray-tls", "--ca", str(tmp_path / "ca"), "--name", "party-1", "--client", "--out", str(tmp_path / "p1")]) == 0
    assert stat.S_IMODE((tmp_path / "ca").stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) & 0o077 for p in (tmp_path / "ca").iterdir()}["ca.key"] == 0
    ca = (tmp_path / "ca" / "ca.pem").read_bytes()
    assert (tmp_path / "head" / "ca.pem").read_bytes() == ca == (tmp_path / "p1" / "ca.pem").read_bytes()  # one CA: made once, then kept
    sans = {}
    for who in ("head", "p1"):
        cert = x509.load_pem_x509_certificate((tmp_path / who / "tls.pem").read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans[who] = ({*names.get_values_for_type(x509.DNSName)}, {str(a) for a in names.get_values_for_type(x509.IPAddress)})
        assert stat.S_IMODE((tmp_path / who / "tls.key").stat().st_mode) == 0o600
    assert {"ray-head", "localhost", socket.gethostname()} == sans["head"][0] and sans["head"][1] == set(host_addresses()) >= {"127.0.0.1"}
    assert sans["p1"] == ({"party-1"}, set())


@pytest.mark.cluster_long
def test_a_party_joins_its_tls_cluster_and_a_process_without_its_ca_certificate_cannot(tmp_path, ray_token) -> None:
    """The compose cluster profile's set-up on 127.0.0.1: a head with token auth and TLS, its
    certificate issued on its host (cels ray-tls); the party node joins it with ray:// and a
    client certificate of the same CA, and runs a task; a process without TLS is refused."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from cels.engine.ray.tls import write_ray_tls
    from cels.node.cluster import LOOPBACK

    write_ray_tls(tmp_path / "ca", tmp_path / "head", "ray-head")
    write_ray_tls(tmp_path / "ca", tmp_path / "party-1", "party-1", client=True)
    plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_TLS") and k != "RAY_USE_TLS"} | {"RAY_USAGE_STATS_ENABLED": "0"}

    def tls(who: str) -> dict[str, str]:
        files = {"RAY_TLS_SERVER_CERT": "tls.pem", "RAY_TLS_SERVER_KEY": "tls.key", "RAY_TLS_CA_CERT": "ca.pem"}
        return plain | {"RAY_USE_TLS": "1"} | {var: str(tmp_path / who / f) for var, f in files.items()}

    with ray_head("cels-tls-", tls("head")) as (_port, client):
        party = (
            "from cels.engine import EngineOptions, open_engine\n"
            f"engine = open_engine(EngineOptions(kind='ray', address='ray://{LOOPBACK}:{client}', shards=1, max_in_flight=1))\n"
            "import ray\n"
            "print('TASK', ray.get(ray.remote(lambda: 41 + 1).remote()))\n"
            "engine.close()\n"
        )
        joined = subprocess.run([sys.executable, "-c", party], env=tls("party-1"), capture_output=True, text=True, timeout=180)
        assert "TASK 42" in joined.stdout, joined.stdout[-2000:] + joined.stderr[-3000:]
        stranger = subprocess.run([sys.executable, "-c", STRANGER, f"ray://{LOOPBACK}:{client}"], env=plain, capture_output=True, text=True, timeout=180)
        assert "REFUSED" in stranger.stdout and "JOINED" not in stranger.stdout, stranger.stdout + stranger.stderr[-2000:]


@contextlib.contextmanager
def ray_head(prefix: str, env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """A Ray head on 127.0.0.1 started with ``env`` (one CPU): its GCS and client server ports,
    once the client server listens; its processes ended after, and none may be left."""
    import shutil
    import tempfile

    from cels.node.cluster import LOOPBACK, free_port
    from test_engine_raylets import RAY_CLI, cluster_processes, end_processes

    temp_dir = tempfile.mkdtemp(prefix=prefix)  # short: Ray's socket paths must fit 107 bytes
    port, client = free_port(), free_port()
    try:
        started = subprocess.run(
            [RAY_CLI, "start", "--head", "--port", str(port), "--ray-client-server-port", str(client), "--node-ip-address", LOOPBACK,
             "--num-cpus", "1", "--temp-dir", temp_dir, "--include-dashboard=false", "--disable-usage-stats",
             "--dashboard-agent-listen-port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        limit = time.monotonic() + 60  # the client server comes up after `ray start` returns
        while True:
            try:
                socket.create_connection((LOOPBACK, client), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < limit, "the Ray client server never listened"
                time.sleep(0.5)
        yield port, client
    finally:
        left = end_processes(cluster_processes(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, sorted(left)
