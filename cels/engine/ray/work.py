"""A session's work on the party's Ray cluster: :class:`RayWork`, the sharded work
(cels.engine.work.ShardedWork) on P shard actors and pair-work tasks
(cels.engine.ray.runtime), with what its workers used (docs/ray.md, "What runs where")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from cels.crypto.streams import DrawKeys
from cels.engine.ray.actors import ShardPool
from cels.engine.ray.runtime import RayRuntime
from cels.engine.routines import ItemBound
from cels.engine.work import ShardedWork
from cels.logs.model import SearchLog
from cels.logs.readers import LogFile

USAGE_SECONDS = 10.0
"""How long a session's end waits for its shards' peak RSS (GetTimeoutError past it: the figure is lost)."""


class RayWork(ShardedWork):
    """The sharded work on ``shards`` shards of the party's cluster, its shard actors the node's
    warm ones where ``pool`` has them idle (:class:`ShardPool`), ``max_in_flight`` pair-work
    tasks at once, sized for ``cpus`` cores."""

    def __init__(
        self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, shards: int, max_in_flight: int,
        pool: ShardPool | None = None, cpus: int = 1, bound: ItemBound | None = None,
    ) -> None:
        super().__init__(log, cap, draws, RayRuntime(shards, pool), shards, max_in_flight, cpus, bound)

    def release(self) -> None:
        """The session ended here: its shard actors end or go back to the node's pool (cels.engine.ray.runtime.RayRuntime.release)."""
        self.runtime.release()
        self.log, self._actors = None, []

    def usage(self) -> dict[str, Any]:
        """What this session's workers used so far: every shard's peak RSS (asked of its actors
        now; none before the private solve or the sampling placed them), and the pair-work tasks'
        workers' peak RSS and CPU seconds."""
        kinds = [actors for actors in (self.log.actors if self.log else [], self._actors) if actors]
        answers = ray.get([a.peak_rss.remote() for actors in kinds for a in actors], timeout=USAGE_SECONDS)
        by_kind = [answers[k * self.shards : (k + 1) * self.shards] for k in range(len(kinds))]
        return {
            # shard s: the larger peak of its log shard and its user shard
            "shard_peak_rss_bytes": [max(rss for _, rss in peaks) for peaks in zip(*by_kind)],
            "node_rounds": self.node_rounds,
            "verdict_rounds": self.verdict_rounds,
            "verdict_passes": self.verdict_passes,
            "pair_tasks": self.pair_tasks.tasks,
            "pair_task_cpu_seconds": self.pair_tasks.cpu_seconds,
            "pair_worker_peak_rss_bytes": dict(sorted(self.pair_tasks.workers.items())),
        }
