"""The engine interface (docs/ray.md, "A party on a Ray cluster"): what a party node asks
of the engine its ``[engine]`` table names, and :func:`open_engine`, which starts it.  The
backends: :mod:`cels.engine.inprocess` (``kind = "local"``) and :mod:`cels.engine.ray`
(``kind = "ray"``, the ray extra, imported only when asked for)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cels.crypto.streams import DrawKeys
from cels.engine.inprocess import InProcessEngine
from cels.engine.options import EngineOptions
from cels.logs.model import SearchLog
from cels.protocol.work import ItemBound, PartyWork


class Engine(Protocol):
    """Builds each session's :class:`PartyWork` over the party's log (capped at ``cap``), drawing
    from the party's session keys ``draws``."""

    def check(self) -> None:
        """A session starts: the engine can take its work, or a
        :class:`cels.protocol.roles.Refusal` refuses the session before anything is loaded."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> PartyWork:
        """A session's work over ``log`` (capped at ``cap``; ``bound``: the DP release's contribution bound)."""
        ...

    def usage(self, work: PartyWork) -> dict[str, Any]:
        """The engine, and what a session's ``work`` used outside the node's process (peak
        RSS, CPU seconds), for the node's per-session summary (``cels status``)."""
        ...

    def release(self, work: PartyWork) -> None:
        """A session ended: what its ``work`` holds outside the node's process goes."""

    def close(self) -> None:
        """The node stops: no worker of the engine outlives it."""


def open_engine(options: EngineOptions) -> Engine:
    """The node's engine, started once per node process: for ``ray`` this starts or joins the
    cluster now, so an unreachable address refuses the node before any session (a ValueError
    naming the address)."""
    if options.kind == "local":
        return InProcessEngine()
    try:
        from cels.engine.ray.cluster import RayEngine
    except ImportError as exc:
        raise ValueError(f"engine.kind = \"ray\" needs the ray extra (pip install 'cels[ray]'): {exc}") from None
    return RayEngine.start(options)
