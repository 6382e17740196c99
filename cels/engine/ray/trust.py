"""A party's Ray cluster as a trust boundary (docs/ray.md, "A party on a Ray cluster:
who may reach it").

Everything on a party's Ray cluster is the party's own: its rows, its universe key, its
draw root.  So the node starts or joins a cluster only with Ray's token authentication on
(Ray 2.52 and later: every RPC to the GCS, the raylets and the workers carries the token),
and its own instance keeps its session directory, logs and spilled objects under a 0700
directory of the node's, removed when the node stops and, after a crash, by the reaper or
the next node that starts.  Ray binds its GCS, raylets and workers on every interface even
when given a loopback node address (Ray 2.60, measured): the token is what refuses a
stranger there.  A cluster the node joins is its operator's: the node calls it once without
a token (:func:`refuse_open_cluster`) and refuses to join one that answers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from cels.workers import process_alive

MIN_RAY = (2, 52)
"""The first Ray release with token authentication."""
AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_SOURCES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
DIR_PREFIX = "cr-"
"""A node's own Ray directory: ``cr-PID-<8 random characters>`` (cels Ray) where Ray puts its own, under
``RAY_TMPDIR`` or /tmp, with Ray's directory ``r`` in it: short, as Ray's socket paths must
fit 107 bytes."""


def require_token_auth(version: str, joining: bool) -> None:
    """Turn Ray's token authentication on for this process (``RAY_AUTH_MODE=token`` when
    unset), or ValueError naming the setting that keeps it off: an older Ray, another
    ``RAY_AUTH_MODE``, or (``joining`` a cluster) no token to present."""
    if tuple(int(part) for part in version.split(".")[:2]) < MIN_RAY:
        raise ValueError(f"Ray {version} has no token authentication; a party's Ray cluster needs Ray >= {'.'.join(map(str, MIN_RAY))}")
    mode = os.environ.get(AUTH_MODE, "")
    if mode and mode != "token":
        raise ValueError(f"{AUTH_MODE}={mode!r} turns Ray's token authentication off: a party's Ray cluster holds its rows and keys (unset it, or set {AUTH_MODE}=token)")
    os.environ[AUTH_MODE] = "token"
    if joining and not any(os.environ.get(name) for name in TOKEN_SOURCES) and not default_token().is_file():
        raise ValueError(f"joining a Ray cluster needs its token: {' or '.join(TOKEN_SOURCES)}, or {default_token()}")


PROBES = {"gcs": "/ray.rpc.NodeInfoGcsService/GetClusterId", "client": "/ray.rpc.RayletDriver/ClusterInfo"}
"""The call a joined cluster is probed with, by address kind (``host:port``: its GCS;
``ray://host:port``: its client server), sent without a token and with an empty request."""
UNREACHED = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
"""Probe outcomes that say nothing about the cluster's authentication (it did not answer)."""


def refuse_open_cluster(address: str, timeout: float = 5.0) -> None:
    """ValueError if the Ray cluster at ``address`` takes a call that carries no token: its
    authentication is off, and anyone who reaches the address can run code beside the party's
    rows.  With token authentication Ray answers UNAUTHENTICATED (Ray 2.60, measured on the GCS
    and the client server).  Over Ray's TLS (``RAY_USE_TLS``) the probe presents Ray's own
    certificate; a cluster that does not answer is left to ``ray.init`` to report."""
    import grpc

    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    if os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):
        ca, cert, key = (Path(os.environ[name]).read_bytes() for name in ("RAY_TLS_CA_CERT", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY"))
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca, key, cert))
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            channel.unary_unary(PROBES["client" if client else "gcs"])(b"", timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED or exc.code().name in UNREACHED:
                return
    raise ValueError(
        f"the Ray cluster at {address} answers calls that carry no token: its token authentication is off, and anyone who "
        f"reaches it can run code beside this party's rows (start every node of it with {AUTH_MODE}=token; docs/ray.md, "
        "\"Who may reach a party's Ray cluster\")"
    )


def default_token() -> Path:
    """Where Ray looks for the token when no variable names one."""
    return Path.home() / ".ray" / "auth_token"


def private_dir() -> Path:
    """A new 0700 directory of this node's for its own Ray instance (Ray makes the temporary
    directory it is given world-writable: the parent's mode is what keeps others out); the
    directories of nodes that died without removing theirs are removed first."""
    remove_stale()
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=ray_root()))


def ray_root() -> Path:
    """Where Ray keeps its temporary directories: ``RAY_TMPDIR``, else /tmp (not ``TMPDIR``,
    often too long for Ray's socket paths)."""
    given = os.environ.get("RAY_TMPDIR")
    return Path(given) if given else (Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir()))


def remove_stale(root: Path | None = None) -> list[Path]:
    """Remove this user's node Ray directories whose node process is gone; the ones removed."""
    removed = []
    for entry in Path(root or ray_root()).glob(f"{DIR_PREFIX}*-*"):
        pid = entry.name[len(DIR_PREFIX) :].partition("-")[0]
        if pid.isdigit() and entry.is_dir() and entry.stat().st_uid == os.getuid() and not process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
