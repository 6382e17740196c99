"""A party node's engine settings, declared once (docs/ray.md, "A party on a Ray cluster").

Each field of :class:`EngineOptions` is a setting (cels.settings); the ``[engine]`` table's
schema (:data:`ENGINE_TABLE`), the flags (:func:`add_engine_arguments`, read back by
:func:`engine_options`) and the flags a simulated node is started with
(:meth:`EngineOptions.argv`) are generated from them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from cels.settings import add_arguments, argv, given, setting, table_schemas

ENGINES = {"local": "cels.engine.inprocess:InProcessEngine", "ray": "cels.engine.ray.cluster:RayEngine"}
"""The registry of engine kinds: each kind's backend class, named ``"module:class"`` and imported
when a node opens it (cels.engine.interface.open_engine): ``ray`` needs the ray extra."""
KINDS = tuple(ENGINES)
LOCAL_RAY = "local"
"""``address = "local"`` starts a Ray instance in this node's process; anything else joins that cluster."""


POSITIVE_INTEGER = {"type": "integer", "minimum": 1}


@dataclass(frozen=True)
class EngineOptions:
    """The ``[engine]`` table: ``kind``, and for ``ray`` the cluster ``address``, the number of
    user ``shards`` P and the pair-work tasks ``max_in_flight`` at once."""

    kind: str = setting("local", table="engine", key="kind", flag="--engine", schema={"enum": list(KINDS)},
                        help="local: in the node's process; ray: on the party's own Ray cluster (the ray extra)")
    address: str = setting(
        LOCAL_RAY, table="engine", key="address", flag="--engine-address", metavar="ADDR",
        help='"local" starts a Ray instance in the node; host:port or ray://host:port joins a running cluster',
        schema={"type": "string", "minLength": 1, "description": '"local" or a Ray cluster address host:port'},
    )
    shards: int = setting(1, table="engine", key="shards", flag="--shards", metavar="P", help="user-shard actors", schema=POSITIVE_INTEGER)
    max_in_flight: int = setting(4, table="engine", key="max_in_flight", flag="--max-in-flight", metavar="N", help="pair-work tasks at once",
                                 schema=POSITIVE_INTEGER)  # fmt: skip

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"engine.kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not isinstance(self.address, str) or not self.address.strip():
            raise ValueError(f"engine.address must be \"local\" or a Ray cluster address, not {self.address!r}")
        for name in ("shards", "max_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"engine.{name} must be a positive integer, not {value!r}")
        if self.kind == "local" and any(getattr(self, f.name) != f.default for f in SETTINGS if f.name != "kind"):
            raise ValueError("engine.address, engine.shards and engine.max_in_flight apply to kind = \"ray\" only")

    def argv(self) -> list[str]:
        """This engine as a party node's flags (its settings that are not the default)."""
        return argv(self)


SETTINGS = fields(EngineOptions)
ENGINE_TABLE: dict[str, Any] = table_schemas(EngineOptions)["engine"]
"""The ``[engine]`` table's schema (cels.node.schemas)."""


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's flags; given, they override the ``[engine]`` table."""
    add_arguments(parser.add_argument_group("engine (docs/ray.md, \"A party on a Ray cluster\")"), EngineOptions)


def engine_options(args: argparse.Namespace, table: Mapping[str, Any]) -> EngineOptions:
    """The checked engine: the flags given over the ``[engine]`` table (a ValueError naming the
    config file or the flags)."""
    try:
        return EngineOptions(**given(EngineOptions, args, {"engine": table}))
    except (TypeError, ValueError) as exc:
        where = f"{args.config} [engine]" if getattr(args, "config", None) and table else "the engine flags"
        raise ValueError(f"{where}: {exc}") from None
