"""The in-process engine (``kind = "local"``, the default): every session's work in the party
node's own process (:class:`cels.protocol.work.InProcessWork`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cels.crypto.streams import DrawKeys
from cels.logs.model import SearchLog
from cels.protocol.work import InProcessWork, ItemBound, PartyWork


class InProcessEngine:
    """Every session's work in this process (the default)."""

    def check(self) -> None:
        """This process is always there."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> PartyWork:
        return InProcessWork(log, cap, draws, bound)

    def usage(self, work: PartyWork) -> dict[str, Any]:
        """Everything ran in the node's process (its peak RSS is the node's)."""
        return {"kind": "local"}

    def release(self, work: PartyWork) -> None:
        """Nothing of a session outlives it outside the node's process."""

    def close(self) -> None:
        """Nothing runs outside the node's process."""
