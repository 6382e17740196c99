"""A party node's ``[engine]`` table, checked once (docs/deployment.md, "A party on a Ray cluster")."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("local", "ray")
LOCAL_RAY = "local"
"""``address = "local"`` starts a Ray instance in this node's process; anything else joins that cluster."""


@dataclass(frozen=True)
class EngineOptions:
    """The ``[engine]`` table: ``kind``, and for ``ray`` the cluster ``address``, the number of
    user ``shards`` P and the pair-work tasks ``max_in_flight`` at once."""

    kind: str = "local"
    address: str = LOCAL_RAY
    shards: int = 1
    max_in_flight: int = 4

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"engine.kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not isinstance(self.address, str) or not self.address.strip():
            raise ValueError(f"engine.address must be \"local\" or a Ray cluster address, not {self.address!r}")
        for field in ("shards", "max_in_flight"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"engine.{field} must be a positive integer, not {value!r}")
        if self.kind == "local" and (self.address, self.shards, self.max_in_flight) != (LOCAL_RAY, 1, 4):
            raise ValueError("engine.address, engine.shards and engine.max_in_flight apply to kind = \"ray\" only")
