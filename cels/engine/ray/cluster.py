"""Start or join the party's Ray cluster, once per node process, and warm its task workers
(cels.engine.ray; docs/ray.md, "A party on a Ray cluster")."""


from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray._raylet import Config

from cels.crypto.streams import DrawKeys
from cels.engine.interface import EngineUnavailable
from cels.engine.options import LOCAL_RAY, EngineOptions
from cels.engine.ray.trust import private_dir, refuse_open_cluster, require_token_auth
from cels.engine.ray.reaper import SETTLE_SECONDS, watch
from cels.logs.model import SearchLog
from cels.logs.parquet import pyarrow_modules
from cels.logs.readers import LogFile
from cels.engine.routines import ItemBound
from cels.engine.ray.actors import ShardPool
from cels.engine.ray.work import RayWork

CONNECT_SECONDS = 5.0
"""How long the node waits for a Ray cluster address to answer: at start-up (else it refuses
to start) and at every StartSession (else it refuses the session)."""
LOCAL_RAY_CONFIG = {
    "max_direct_call_object_size": 4 << 20,
    "task_events_report_interval_ms": 0, "enable_timeline": False, "enable_metrics_collection": False, "event_stats": False,
}  # fmt: skip
"""Ray's system settings for the instance a node starts itself (``address = "local"``).

- Values up to 4 MiB pass in the call itself, not through the object store (Ray's default
  bound is 100 KiB): a pair-work task's ids and result (256 KiB of X25519 ids, 2 MiB of
  2048-bit Pohlig-Hellman ids per :data:`CHUNK_IDS`).  A task of 8,192 X25519 ids that only
  echoes them cost 6.3 ms of CPU over all processes through the store and 2.6 ms inline
  (docs/ray.md, "Where Ray's CPU goes").
- No task events, timeline, metrics or event-loop statistics, which nothing here reads (no
  dashboard).  One party of 1M pairs alone, every process's CPU counted: its first hash took
  8.9-9.1 CPU seconds with them off against 9.3-9.5 on (docs/ray.md, "What runs where").

A cluster the node joins keeps its operator's settings (``ray start --system-config`` on its
head: docs/ray.md)."""
WARM_SECONDS = 0.5
"""How long a warm-up task holds its CPU (:func:`warm_task_workers`): long enough that the tasks
of all the cluster's CPUs run at once, on as many workers."""
JOIN_ATTEMPTS = 3
"""Tries to join a cluster at start-up: a Ray client server that fails to start its per-client
server once (seen under compose) is not a cluster that is gone."""
JOIN_BACKOFF_SECONDS = 2.0
"""The wait before the second try, doubled before each later one."""


def check_reachable(address: str) -> None:
    """A TCP connection to the cluster's ``host:port`` (``ray://`` allowed), or a ValueError
    naming the address (Ray itself would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"engine.address {address!r} is neither \"local\" nor host:port")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ValueError(f"the Ray cluster at {address} is unreachable: {exc}") from None


def join(address: str) -> None:
    """``ray.init(address)``, tried :data:`JOIN_ATTEMPTS` times with backoff, else a ValueError
    naming the address and the last error."""
    for attempt in range(1, JOIN_ATTEMPTS + 1):
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as exc:
            ray.shutdown()  # whatever half of the join was made
            if attempt == JOIN_ATTEMPTS:
                raise ValueError(f"cannot join the Ray cluster at {address} ({JOIN_ATTEMPTS} attempts): {exc}") from None
            time.sleep(JOIN_BACKOFF_SECONDS * 2 ** (attempt - 1))


def stop_log_monitor() -> None:
    """End the log monitor of the Ray instance this process started.  It tails every worker's
    log files ten times a second for drivers that print them, and a node does not
    (``log_to_driver=False``; the files stay in the session directory): 0.67 % of a core per
    instance, about 1.2 CPU seconds of a 1M x 3 session on three instances (docs/ray.md,
    "Where Ray's CPU goes").  ``ray.init`` has no switch for it (``ray start
    --include-log-monitor=false`` has), so this ends it through Ray's handle on the node it
    started, a private one (tests/test_engine_ray.py checks that it is gone)."""
    ray._private.worker._global_node.kill_log_monitor(check_alive=False)


@ray.remote
def _warm_worker() -> None:
    """A task worker's imports, done before a session needs them (:func:`warm_task_workers`)."""
    try:
        pyarrow_modules()  # the reader tasks' Parquet
    except ValueError:
        pass  # no Parquet extra, so no Parquet log to read
    time.sleep(WARM_SECONDS)


def cluster_cpus() -> int:
    """The CPUs of the Ray cluster this process is connected to (at least one)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def warm_task_workers() -> None:
    """One warm-up task per CPU of the cluster, all at once, so that each lands on a worker of
    its own: every idle task worker has imported this module (numpy, scipy, the curve's
    library) and pyarrow before a session's first reader or pair-work task, which would
    otherwise pay for it (docs/ray.md, "Warm shards")."""
    ray.get([_warm_worker.remote() for _ in range(cluster_cpus())])


class RayEngine:
    """The node's connection to its Ray cluster, made once per node process; ``reaper``: the
    watcher that ends the Ray instance the node started, if it started one (cels.engine.ray.reaper);
    ``pool``: the node's warm shard actors (:class:`ShardPool`), if it keeps any."""

    def __init__(
        self, options: EngineOptions, reaper: subprocess.Popen | None = None, pool: ShardPool | None = None, own_dir: Path | None = None
    ) -> None:
        self.options, self.reaper, self.pool, self.own_dir = options, reaper, pool, own_dir

    @classmethod
    def start(cls, options: EngineOptions) -> RayEngine:
        """Start a local Ray instance (``address = "local"``) under a 0700 directory of the
        node's, watched by a reaper, or join the cluster at ``address``, with Ray's token
        authentication on either way (cels.engine.ray.trust); then start the node's warm
        shard actors."""
        reaper, own_dir = None, None
        if not ray.is_initialized():
            require_token_auth(ray.__version__, joining=options.address != LOCAL_RAY)
            Config.initialize("")  # Ray read RAY_AUTH_MODE when it was imported: this process reads it again, as ray.init does when it turns tokens on
            if options.address == LOCAL_RAY:
                own_dir = private_dir()
                context = ray.init(include_dashboard=False, log_to_driver=False, _system_config=LOCAL_RAY_CONFIG, _temp_dir=str(own_dir / "r"))
                stop_log_monitor()
                reaper = watch(context.address_info["session_dir"], own_dir)
            else:
                check_reachable(options.address)
                refuse_open_cluster(options.address)
                join(options.address)
        pool = ShardPool.start(options.shards)
        warm_task_workers()
        return cls(options, reaper, pool, own_dir)

    def check(self) -> None:
        """A StartSession: the cluster this node joined still answers (within
        :data:`CONNECT_SECONDS`) and still refuses calls without its token, or a
        :class:`EngineUnavailable` naming the address to this node's log and controller, before the
        session loads anything.  A Ray instance of the node's own
        lives and dies with the node: nothing to check."""
        if self.options.address != LOCAL_RAY:
            try:
                check_reachable(self.options.address)
            except ValueError as exc:
                raise EngineUnavailable("its Ray cluster does not answer", str(exc)) from None
            try:  # restarted since without its token authentication
                refuse_open_cluster(self.options.address)
            except ValueError as exc:
                raise EngineUnavailable("its Ray cluster accepts unauthenticated calls", str(exc)) from None

    def work(self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> RayWork:
        """A session's work, sized to the cluster's CPUs as it is now (one that scales up is
        counted at the next session)."""
        cpus = cluster_cpus()
        return RayWork(log, cap, draws, self.options.shards, self.options.max_in_flight, self.pool, cpus, bound)

    def usage(self, work: RayWork) -> dict[str, Any]:
        """The engine and what the session's workers used (:meth:`RayWork.usage`), or why it is unknown."""
        engine = {"kind": "ray", "address": self.options.address, "shards": self.options.shards, "max_in_flight": self.options.max_in_flight}
        try:
            return engine | work.usage()
        except ray.exceptions.RayError as exc:  # a shard's actor is gone: its figure is lost, the session is not
            return engine | {"error": f"{type(exc).__name__}: {exc}"}

    def release(self, work: RayWork) -> None:
        """A session ended: its shard actors and their placement group go (on a cluster that
        is gone they went with it)."""
        try:
            work.release()
        except ray.exceptions.RayError:
            pass

    def close(self) -> None:
        """Shut the Ray instance this node started down (its raylet, GCS and agents), or leave
        the cluster it joined: no Ray process outlives a stopped node."""
        if self.pool is not None:
            self.pool.close()
        ray.shutdown()
        if self.reaper is not None:  # it ends what shutdown left, removes the node's Ray directory (and then ends itself)
            self.reaper.stdin.close()
            self.reaper.wait(SETTLE_SECONDS + 5)
