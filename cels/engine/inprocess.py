"""The in-process engine (``kind = "local"``, the default): every session's work in the party
node's own process, exactly as CELS section 4.2 describes one party's computation.  It is the
one-shard case of the sharded work the Ray engine runs (cels.engine.work.ShardedWork), with
every shard and task call run at once in the node (cels.engine.runtime.InProcessRuntime)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cels.crypto.streams import DrawKeys
from cels.engine.options import EngineOptions
from cels.engine.routines import ItemBound
from cels.engine.runtime import InProcessRuntime
from cels.engine.work import ShardedWork
from cels.logs.model import SearchLog
from cels.logs.readers import LogFile


def in_process_work(log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> ShardedWork:
    """A session's work over ``log`` in this process: one shard, one task at a time."""
    return ShardedWork(log, cap, draws, InProcessRuntime(), bound=bound)


class InProcessEngine:
    """Every session's work in this process (the default)."""

    @classmethod
    def start(cls, options: EngineOptions) -> InProcessEngine:
        """This process is the engine: nothing to start."""
        return cls()

    def check(self) -> None:
        """This process is always there."""

    def work(self, log: SearchLog | Callable[[], SearchLog] | LogFile, cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> ShardedWork:
        return in_process_work(log, cap, draws, bound)

    def usage(self, work: ShardedWork) -> dict[str, Any]:
        """Everything ran in the node's process (its peak RSS is the node's)."""
        return {"kind": "local"}

    def release(self, work: ShardedWork) -> None:
        """Nothing of a session outlives it outside the node's process."""

    def close(self) -> None:
        """Nothing runs outside the node's process."""
