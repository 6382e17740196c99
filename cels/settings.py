"""Settings declared once: a dataclass field carries its flag, help, TOML place and schema.

A node's configuration (cels.node.config), its key policy (cels.node.keys) and its engine
(cels.engine.options) are dataclasses whose fields are made by :func:`setting`.  From that one
declaration come the TOML tables' JSON schemas (:func:`table_schemas`), the flags
(:func:`add_arguments`), the values of the flags given over the TOML file (:func:`given`), and
the flags that give a value back (:func:`argv`); defaults and help live in the field only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One setting's declaration besides its default.

    ``table``/``key``: where the TOML file sets it (``key`` None: the whole table is its
    value, as ``[peers]``); ``schema``: the JSON-schema keywords of its TOML value; ``flag``:
    the flag that overrides it (none: TOML only), ``repeat``: given once per item, each parsed
    by ``item`` (a pair NAME=VALUE makes a table); ``path``: a file path, relative to the
    TOML file; ``shown``: the default as its help shows it (else the default itself);
    ``flag_value``: what a boolean setting's flag sets."""

    table: str
    key: str | None
    help: str
    schema: Mapping[str, Any]
    flag: str | None = None
    metavar: str | None = None
    repeat: bool = False
    item: Callable[[str], Any] | None = None
    path: bool = False
    shown: str | None = None
    flag_value: Any = True
    """What a flag without a value (a boolean setting's) sets: ``--no-header`` sets False."""

    @property
    def dest(self) -> str:
        """The flag's attribute in a parsed namespace (``--engine-address``: ``engine_address``)."""
        return (self.flag or "").removeprefix("--").replace("-", "_")


def setting(default: Any = MISSING, *, default_factory: Callable[[], Any] | Any = MISSING, **declared: Any) -> Any:
    """A dataclass field and its :class:`Setting` (``declared``: its keywords)."""
    return field(default=default, default_factory=default_factory, metadata={"setting": Setting(**declared)})


def declared(cls: type) -> list[tuple[Field, Setting]]:
    """The fields of ``cls`` that are settings, with their declarations, in order."""
    return [(f, f.metadata["setting"]) for f in fields(cls) if "setting" in f.metadata]


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def table_schemas(cls: type) -> dict[str, dict[str, Any]]:
    """The JSON schema of each TOML table the settings of ``cls`` live in (closed: a typo is an unknown key)."""
    tables: dict[str, dict[str, Any]] = {}
    for _f, s in declared(cls):
        if s.key is None:
            tables[s.table] = dict(s.schema)
        else:
            tables.setdefault(s.table, {"type": "object", "additionalProperties": False, "properties": {}})["properties"][s.key] = dict(s.schema)
    return tables


_FLAG_TYPES: dict[str, Callable[[str], Any]] = {"integer": int, "number": float, "string": str}


def add_arguments(group: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """The flags of the settings of ``cls``; given, they override the TOML file."""
    for f, s in declared(cls):
        if s.flag is None:
            continue
        default = default_of(f)
        shown = s.shown if s.shown is not None else (None if isinstance(default, bool) or default in (None, "", ()) else default)
        help_text = s.help + ("" if shown is None or s.repeat else f" (default {shown})")
        if s.repeat:
            group.add_argument(s.flag, dest=s.dest, action="append", default=[], metavar=s.metavar, help=help_text)
        elif s.schema.get("type") == "boolean":
            group.add_argument(s.flag, dest=s.dest, action="store_const", const=s.flag_value, default=None, help=help_text)
        else:
            kind = Path if s.path else _FLAG_TYPES.get(s.schema.get("type", "string"), str)
            group.add_argument(s.flag, dest=s.dest, type=kind, choices=s.schema.get("enum"), metavar=s.metavar, help=help_text)


def given(cls: type, args: argparse.Namespace | None, doc: Mapping[str, Any], base: Path | None = None) -> dict[str, Any]:
    """The values the TOML file ``doc`` (its tables) and the flags in ``args`` give the settings
    of ``cls``: a flag over its TOML key; a repeated flag's items added to its TOML table; a TOML
    path made relative to ``base``.  What neither gives is left out (the field's default)."""
    values: dict[str, Any] = {}
    for f, s in declared(cls):
        table = doc.get(s.table, {})
        value = table if s.key is None else table.get(s.key, MISSING)
        if value is not MISSING and s.key is None and not table:
            value = MISSING
        if value is not MISSING and s.path and base is not None:
            value = base / value
        flag = getattr(args, s.dest, None) if args is not None and s.flag is not None else None
        if s.repeat and flag:
            items = [s.item(text) for text in flag] if s.item is not None else list(flag)
            if isinstance(default_of(f), dict):
                value = {**(value if value is not MISSING else {}), **dict(items)}
            else:
                value = items
        elif not s.repeat and flag is not None:
            value = flag
        if value is not MISSING:
            values[f.name] = value
    return values


def argv(value: Any) -> list[str]:
    """The flags that give ``value`` (a dataclass of settings) its settings that are not the default."""
    out: list[str] = []
    for f, s in declared(type(value)):
        now = getattr(value, f.name)
        if s.flag is None or now == default_of(f):
            continue
        if s.schema.get("type") == "boolean":
            out += [s.flag] if now == s.flag_value else []
            continue
        items = ([f"{k}={v}" for k, v in now.items()] if isinstance(now, dict) else [str(v) for v in now]) if s.repeat else [str(now)]
        out += [a for item in items for a in ([f"{s.flag}={item}"] if item.startswith("-") else [s.flag, item])]  # "-x" would read as a flag
    return out


def markdown_table(*classes: type) -> str:
    """The settings of ``classes`` as a Markdown reference table (docs carry it; a test keeps it current)."""
    lines = ["| TOML | flag | default | what |", "| --- | --- | --- | --- |"]
    for cls in classes:
        for f, s in declared(cls):
            default = default_of(f)
            shown = s.shown or ("unset" if default in (None, "", (), {}) else str(default).lower() if isinstance(default, bool) else str(default))
            where = f"`[{s.table}]`" + (f" `{s.key}`" if s.key else " (the table)")
            lines.append(f"| {where} | {f'`{s.flag}`' if s.flag else '-'} | {shown} | {s.help} |")
    return "\n".join(lines)
