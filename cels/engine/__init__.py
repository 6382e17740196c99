"""Where a party's local work runs (docs/deployment.md, "A party on a Ray cluster").

A party node picks its engine once, from its ``[engine]`` table or flags: ``local`` (the
default) runs the work in the node's process (:class:`cels.protocol.work.InProcessWork`);
``ray`` starts or joins the party's own Ray cluster once per node process and gives every
session a :class:`cels.engine.ray_work.RayWork`.  ``ray`` is an optional extra, imported only
here and only when asked for.  The protocol (cels.protocol) never sees the engine: it talks
to a :class:`cels.protocol.work.LocalWork`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cels.crypto.streams import DrawKeys
from cels.engine.options import EngineOptions
from cels.logs.model import SearchLog
from cels.protocol.work import InProcessWork, ItemBound, LocalWork

__all__ = ["Engine", "EngineOptions", "LocalEngine", "open_engine"]


class Engine(Protocol):
    """Builds each session's :class:`LocalWork` over the party's log (capped at ``cap``), drawing
    from the party's session keys ``draws``."""

    def check(self) -> None:
        """A session starts: the engine can take its work, or a
        :class:`cels.protocol.roles.Refusal` refuses the session before anything is loaded."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> LocalWork:
        """A session's work over ``log`` (capped at ``cap``; ``bound``: the DP release's contribution bound)."""
        ...

    def usage(self, work: LocalWork) -> dict[str, Any]:
        """The engine, and what a session's ``work`` used outside the node's process (peak
        RSS, CPU seconds), for the node's per-session summary (``cels status``)."""
        ...

    def release(self, work: LocalWork) -> None:
        """A session ended: what its ``work`` holds outside the node's process goes."""

    def close(self) -> None:
        """The node stops: no worker of the engine outlives it."""


class LocalEngine:
    """Every session's work in this process (the default)."""

    def check(self) -> None:
        """This process is always there."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> LocalWork:
        return InProcessWork(log, cap, draws, bound)

    def usage(self, work: LocalWork) -> dict[str, Any]:
        """Everything ran in the node's process (its peak RSS is the node's)."""
        return {"kind": "local"}

    def release(self, work: LocalWork) -> None:
        """Nothing of a session outlives it outside the node's process."""

    def close(self) -> None:
        """Nothing runs outside the node's process."""


def open_engine(options: EngineOptions) -> Engine:
    """The node's engine, started once per node process: for ``ray`` this starts or joins the
    cluster now, so an unreachable address refuses the node before any session (a ValueError
    naming the address)."""
    if options.kind == "local":
        return LocalEngine()
    try:
        from cels.engine.ray_work import RayEngine
    except ImportError as exc:
        raise ValueError(f"engine.kind = \"ray\" needs the ray extra (pip install 'cels[ray]'): {exc}") from None
    return RayEngine.start(options)
