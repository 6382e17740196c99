"""A party node's engine settings, declared once (docs/ray.md, "A party on a Ray cluster").

Each field of :class:`EngineOptions` carries its :class:`Setting`; the ``[engine]`` table's
schema (:data:`ENGINE_TABLE`), the flags (:func:`add_engine_arguments`, read back by
:func:`engine_options`) and the flags a simulated node is started with
(:meth:`EngineOptions.argv`) are generated from them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

KINDS = ("local", "ray")
LOCAL_RAY = "local"
"""``address = "local"`` starts a Ray instance in this node's process; anything else joins that cluster."""


@dataclass(frozen=True)
class Setting:
    """One engine setting: its flag, help (the default is added where it is shown) and its
    JSON-schema keywords in the ``[engine]`` table."""

    flag: str
    help: str
    schema: Mapping[str, Any]
    metavar: str | None = None


def setting(default: Any, flag: str, help: str, schema: Mapping[str, Any], metavar: str | None = None) -> Any:
    """An EngineOptions field and its :class:`Setting`."""
    return field(default=default, metadata={"setting": Setting(flag, help, schema, metavar)})


POSITIVE_INTEGER = {"type": "integer", "minimum": 1}


@dataclass(frozen=True)
class EngineOptions:
    """The ``[engine]`` table: ``kind``, and for ``ray`` the cluster ``address``, the number of
    user ``shards`` P and the pair-work tasks ``max_in_flight`` at once."""

    kind: str = setting("local", "--engine", "local: in the node's process; ray: on the party's own Ray cluster (the ray extra)", {"enum": list(KINDS)})
    address: str = setting(
        LOCAL_RAY, "--engine-address", '"local" starts a Ray instance in the node; host:port or ray://host:port joins a running cluster',
        {"type": "string", "minLength": 1, "description": '"local" or a Ray cluster address host:port'}, "ADDR",
    )  # fmt: skip
    shards: int = setting(1, "--shards", "user-shard actors", POSITIVE_INTEGER, "P")
    max_in_flight: int = setting(4, "--max-in-flight", "pair-work tasks at once", POSITIVE_INTEGER, "N")

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
        return [a for f in SETTINGS if getattr(self, f.name) != f.default for a in (f.metadata["setting"].flag, str(getattr(self, f.name)))]


SETTINGS = fields(EngineOptions)
ENGINE_TABLE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {f.name: dict(f.metadata["setting"].schema) for f in SETTINGS},
}
"""The ``[engine]`` table's schema (cels.node.schemas)."""


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's flags; given, they override the ``[engine]`` table."""
    group = parser.add_argument_group("engine (docs/ray.md, \"A party on a Ray cluster\")")
    for f in SETTINGS:
        declared = f.metadata["setting"]
        choices = declared.schema.get("enum")
        kind = int if declared.schema.get("type") == "integer" else str
        group.add_argument(declared.flag, dest=_dest(f), type=kind, choices=choices, metavar=declared.metavar,
                           help=f"{declared.help} (default {f.default})")  # fmt: skip


def engine_options(args: argparse.Namespace, table: Mapping[str, Any]) -> EngineOptions:
    """The checked engine: the flags given over the ``[engine]`` table (a ValueError naming the
    config file or the flags)."""
    given = {**table, **{f.name: getattr(args, _dest(f)) for f in SETTINGS if getattr(args, _dest(f), None) is not None}}
    try:
        return EngineOptions(**given)
    except (TypeError, ValueError) as exc:
        where = f"{args.config} [engine]" if getattr(args, "config", None) and table else "the engine flags"
        raise ValueError(f"{where}: {exc}") from None


def _dest(setting_field: Any) -> str:
    """The flag's attribute in the parsed namespace (``--engine-address``: ``engine_address``)."""
    return setting_field.metadata["setting"].flag.removeprefix("--").replace("-", "_")
