"""The JSON schemas of the TOML files an operator writes (docs/deployment.md), one per file
kind: a party node's, a solver node's, and the session file of ``cels run``.

Each is data (a JSON schema, draft 2020-12), checked with ``jsonschema`` by
:func:`check_toml`, whose one line names the file, the table and the key, and says what was
expected: ``party.toml: [node] deadline: expected a number > 0, got "soon"``.  Every table and
every table's keys are closed (``additionalProperties: false``), so a typo is an unknown table or
key.  What a schema cannot say (a certificate naming its node, an initiator that is one of the
parties, a file that exists) stays with the code that reads the values.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from cels.engine.options import ENGINE_TABLE
from cels.node.ledger import LedgerPolicy
from cels.node.policy import POLICY_TABLE
from cels.node.settings import HOST_PORT, NAME, POSITIVE, DataSource, KeyPolicy, NodeConfig
from cels.protocol.options import OPTIONS, Option
from cels.settings import table_schemas

_JSON_TYPES = {float: "number", int: "integer", str: "string", bool: "boolean"}
_NODE_TABLES = {**table_schemas(NodeConfig), **table_schemas(KeyPolicy)}
"""The ``[node]``, ``[tls]``, ``[peers]``, ``[metrics]`` and ``[keys]`` tables, from the node's settings."""
SOLVER_TABLE = {"type": "object", "additionalProperties": False, "properties": {"time_limit": POSITIVE}}
PARTY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **_NODE_TABLES, **table_schemas(DataSource), **table_schemas(LedgerPolicy), "engine": ENGINE_TABLE, "policy": POLICY_TABLE,
    },
}  # fmt: skip
"""A party node's TOML (``cels-party --config``; cels.node.config)."""
SOLVER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {**_NODE_TABLES, "solver": SOLVER_TABLE},
}
"""A solver node's TOML (``cels-solver --config``)."""


def option_schema(declared: Option) -> dict[str, Any]:
    """The JSON schema of one session option's value (its type, choices and bounds)."""
    if declared.choices is not None:
        return {"enum": list(declared.choices)}
    if declared.kind is tuple:
        return {"type": "array", "items": NAME, **declared.bounds}
    return {"type": _JSON_TYPES[declared.kind], **declared.bounds}


def session_table() -> dict[str, Any]:
    """session.toml's ``[session]``: the session options of cels.protocol.options.OPTIONS that
    the file sets (SessionOptions checks what a schema cannot)."""
    keys = [o for o in OPTIONS if o.toml]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [o.name for o in keys if o.required and o.name != "session_id"],
        "properties": {o.name: option_schema(o) for o in keys},
    }


SESSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["run", "session"],
    "properties": {
        "run": {
            "type": "object",
            "additionalProperties": False,
            "required": ["initiator", "address", "output", "report"],
            "properties": {
                "initiator": NAME,
                "address": HOST_PORT,
                "ca": {"type": "string"},
                "cert": {"type": "string"},
                "key": {"type": "string"},
                "insecure": {"type": "boolean"},
                "output": {"type": "string"},
                "report": {"type": "string"},
                "timeout": POSITIVE,
                "wait": {**POSITIVE, "description": "seconds cels run waits for the nodes to answer (default 60)"},
                "resume": {"type": "boolean", "description": "run a session that a node's death aborted again with the nodes' kept "
                           "keys, once every node answers (at most 3 times; docs/deployment.md, \"Resume after a node restart\")"},
                "nodes": _NODE_TABLES["peers"],
            },
        },
        "session": session_table(),
    },
}
"""The session file of ``cels run`` (deploy/session.toml): [run] and [session]."""
NODE_SCHEMAS = {"data": PARTY_SCHEMA, "solver": SOLVER_SCHEMA}
"""A node's schema by its role table: ``data`` for a party node, ``solver`` for the solver."""

for _schema in (PARTY_SCHEMA, SOLVER_SCHEMA, SESSION_SCHEMA):
    Draft202012Validator.check_schema(_schema)

_FILES = ((SESSION_SCHEMA, "a session file (cels run --config)"), (PARTY_SCHEMA, "a party node's file (cels-party --config)"),
          (SOLVER_SCHEMA, "a solver node's file (cels-solver --config)"))  # fmt: skip
"""Whose tables are whose: a table unknown here but known there names the file it belongs in."""

_TYPES = {"number": "a number", "integer": "an integer", "string": "a string", "boolean": "true or false",
          "array": "an array", "object": "a table"}  # fmt: skip
_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<",
           "minItems": "with at least", "minLength": "of at least", "maxLength": "of at most", "multipleOf": "a multiple of"}  # fmt: skip


def check_toml(doc: dict[str, Any], path: str | os.PathLike[str], schema: dict[str, Any]) -> None:
    """ValueError with one line naming ``path``, the table and the key, unless ``doc`` (a parsed
    TOML file) fits ``schema``; of several faults, the one nearest the top of the file's tree."""
    errors = list(Draft202012Validator(schema).iter_errors(doc))
    if errors:
        error = min(errors, key=lambda e: len(e.absolute_path))
        raise ValueError(f"{path}: {_explain(error)}")


def _explain(error: ValidationError) -> str:
    """What is wrong where: ``[table] key: expected ..., got ...`` (or an unknown / missing table or key)."""
    where = list(error.absolute_path)
    table = f"[{where[0]}]" if where else ""
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in where[1:]).lstrip(".")
    at = f"{table} {key}".strip()
    if error.validator == "additionalProperties":
        known = list(error.schema["properties"])
        extra = next(k for k in error.instance if k not in error.schema["properties"])
        if where:
            return f"{at} unknown key {extra!r} (known: {', '.join(known)})"
        tables = ", ".join(f"[{t}]" for t in known)
        if not isinstance(error.instance[extra], dict):
            return f"key {extra!r} outside any table (tables: {tables})"
        owner = next((what for other, what in _FILES if other is not error.schema and extra in other["properties"]), None)
        return f"unknown table [{extra}] (known: {tables})" + (f": [{extra}] is a table of {owner}; is this the right file?" if owner else "")
    if error.validator == "required":
        missing = next(k for k in error.schema["required"] if k not in error.instance)
        return f"{at} needs {missing!r}" if where else f"needs the table [{missing}]"
    return f"{at}: expected {_expected(error.schema)}, got {json.dumps(error.instance, default=str)}"


def _expected(schema: dict[str, Any]) -> str:
    """A schema in words: ``a number > 0``, ``one of aol, msnbc``, or its ``description``."""
    if "description" in schema:
        return schema["description"]
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kind = _TYPES.get(schema.get("type", ""), "a value")
    if schema.get("type") == "array" and "items" in schema:
        kind += f" of {_TYPES[schema['items']['type']].split(' ', 1)[1]}s"
    bounds = []
    for keyword, relation in _BOUNDS.items():
        if keyword in schema:
            unit = {"minItems": " items", "minLength": " characters", "maxLength": " characters"}.get(keyword, "")
            bounds.append(f"{relation} {schema[keyword]}{unit}")
    return " ".join([kind, " and ".join(bounds)]).strip()
