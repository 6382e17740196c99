"""A party's own rules for the sessions it joins (docs/site-rules.md, "A party's policy").

The initiator chooses a session's parameters; each party node checks them against its own
``[policy]`` table (or ``--policy-*`` flags) when the session's StartSession arrives, before
its Ray cluster is asked, its budget reserved or a row of its log read.  A session outside
the policy is refused with FAILED_PRECONDITION: the peers and the controller are told
which party refused under which rule (``policy.max_epsilon``), the refusing node's log and
its own controller also the value.

Every rule is declared once (:data:`RULES`): its TOML key, flag, default, JSON schema, help
and the check come from that declaration.  The defaults protect a party that sets nothing:
the transformed solve (in which the solver can rebuild every party's rows, SECURITY.md) and
real user ids in the union are off, epsilon is at most 10 and delta at most 0.5.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from cels.protocol.options import RELEASES, SOLVE_MODES, SessionOptions
from cels.protocol.roles import Refusal
from cels.protocol.releases import DP_HISTOGRAM, SAMPLED, ReleaseKind

NAME = {"type": "string", "minLength": 1}
APPROVALS = ("auto", "manual")
"""How a party takes a session that its rules admit: at once, or once its operator approves it."""


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _flag_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


@dataclass(frozen=True)
class Rule:
    """One policy rule: its ``[policy]`` key, default, schema and help, how a flag's text
    becomes its value, and ``breaks(options, value)``: why a session breaks it, or None."""

    key: str
    default: Any
    help: str
    schema: dict[str, Any]
    parse: Callable[[str], Any]
    breaks: Callable[[SessionOptions, Any], str | None]
    kind: ReleaseKind | None = None
    """The one release kind whose sessions the rule reads (None: every session)."""

    def broken_by(self, options: SessionOptions, value: Any) -> str | None:
        """Why a session breaks the rule set to ``value``, or None."""
        if self.kind is not None and options.release_kind is not self.kind:
            return None
        return self.breaks(options, value)

    @property
    def flag(self) -> str:
        return "--policy-" + self.key.replace("_", "-")


def _ceiling(name: str) -> Callable[[SessionOptions, Any], str | None]:
    def breaks(options: SessionOptions, limit: float | None) -> str | None:
        value = getattr(options, name)
        return f"{name} = {value:g} is above {limit:g}" if limit is not None and value > limit else None

    return breaks


def _noise(options: SessionOptions, limit: float | None) -> str | None:
    if limit is None:
        return None
    if options.noise_epsilon is None:
        return f"the counts carry no noise (noise_epsilon is unset; at most {limit:g} required)"
    return f"noise_epsilon = {options.noise_epsilon:g} is above {limit:g}" if options.noise_epsilon > limit else None


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _dp_bound(options: SessionOptions, limit: int | None) -> str | None:
    total = options.item_kinds.total
    if limit is None or total <= limit:
        return None
    return f"the contribution bound Delta = {total} ({options.item_kinds.text()}) is above {limit}"


RULES: tuple[Rule, ...] = (
    Rule("initiators", (), "the party nodes that may start a session with this one, by certificate name (empty: any peer)",
         {"type": "array", "items": NAME}, _names,
         lambda o, v: f"the initiator {o.initiator} is not one of {', '.join(v)}" if v and o.initiator not in v else None),
    Rule("releases", RELEASES, "the release kinds this party takes part in", {"type": "array", "items": {"enum": list(RELEASES)}}, _names,
         lambda o, v: f"release = {o.release} is not one of {', '.join(v)}" if o.release not in v else None),
    Rule("solves", ("private",), "the solves of a sampled release this party takes part in; transformed lets the solver rebuild "
         "every party's rows (SECURITY.md) and is off unless listed", {"type": "array", "items": {"enum": list(SOLVE_MODES)}}, _names,
         lambda o, v: f"solve = {o.solve} is not one of {', '.join(v)}" if o.solve not in v else None, SAMPLED),
    Rule("max_epsilon", 10.0, "the largest epsilon of a session", {"type": "number", "exclusiveMinimum": 0}, float, _ceiling("epsilon")),
    Rule("max_delta", 0.5, "the largest delta of a session", {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, float, _ceiling("delta")),
    Rule("max_noise_epsilon", None, "a sampled release must put noise on its counts with at most this epsilon' (unset: noise optional)",
         {"type": "number", "exclusiveMinimum": 0}, float, _noise, SAMPLED),
    Rule("keep_user_ids", False, "allow sessions that put this party's real user ids into the union and the release",
         {"type": "boolean"}, _flag_bool,
         lambda o, v: "keep_user_ids would put this party's real user ids into the release" if o.keep_user_ids and not v else None),
    Rule("dp_min_collusion", 0, "a DP release must size its noise shares for coalitions of at least this many parties (t)",
         {"type": "integer", "minimum": 0}, int,
         lambda o, v: f"collusion t = {o.collusion} is below {v}" if o.collusion < v else None, DP_HISTOGRAM),
    Rule("dp_max_items_per_user", None, "the largest contribution bound of a DP release (Delta, the sum over its item kinds)",
         {"type": "integer", "minimum": 1}, int, _dp_bound, DP_HISTOGRAM),
    Rule("approve", "auto", "manual: a session another party starts waits, with nothing read or reserved, until this party's "
         "operator runs cels approve or cels reject (at most the session's approval_wait)", {"enum": list(APPROVALS)},
         _choice(*APPROVALS), lambda o, v: None),
)  # fmt: skip
"""Every rule of a party's policy, in the order they are checked."""

POLICY_TABLE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {rule.key: {**rule.schema, "description": rule.help} for rule in RULES},
}
"""The ``[policy]`` table's JSON schema (cels.node.schemas)."""


@dataclass(frozen=True)
class PartyPolicy:
    """A party's rules, one value per :data:`RULES` entry (``values``; a rule not set keeps its default)."""

    values: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, table: dict[str, Any], args: argparse.Namespace | None = None) -> PartyPolicy:
        """The ``[policy]`` table with the ``--policy-*`` flags over it."""
        values = {rule.key: rule.default for rule in RULES}
        values.update({key: tuple(value) if isinstance(value, list) else value for key, value in table.items()})
        for rule in RULES:
            given = getattr(args, f"policy_{rule.key}", None) if args is not None else None
            if given is not None:
                values[rule.key] = given
        for error in Draft202012Validator(POLICY_TABLE).iter_errors({k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}):
            key = error.absolute_path[0] if error.absolute_path else "?"
            raise ValueError(f"policy.{key} (--policy-{str(key).replace('_', '-')}): {error.message}")
        return cls(tuple(values.items()))

    def value(self, key: str) -> Any:
        return dict(self.values)[key]

    def check(self, node: str, options: SessionOptions) -> None:
        """Refusal naming the first rule ``options`` breaks (public: "policy.<key>", which
        peers and controllers see; the detail with the values: the node's log and its own
        controller)."""
        for rule in RULES:
            reason = rule.broken_by(options, self.value(rule.key))
            if reason is not None:
                raise Refusal(f"policy.{rule.key}", f"{node} refuses session {options.session_id}: policy.{rule.key}: {reason}")

    def awaits(self, node: str, options: SessionOptions) -> bool:
        """Whether ``node``'s operator approves the session first (``approve = "manual"``; a
        session its own controller started on it is approved already).  A session that leaves
        no time for it (approval_wait = 0) is refused."""
        if self.value("approve") != "manual" or options.initiator == node:
            return False
        if options.approval_wait <= 0:
            raise Refusal("policy.approve", f"{node} refuses session {options.session_id}: policy.approve: its operator approves "
                          "sessions by hand, and approval_wait = 0 leaves no time for it (--approval-wait)")  # fmt: skip
        return True

    def allows_transformed(self) -> bool:
        return "transformed" in self.value("solves")


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--policy-*`` flag per rule, over the ``[policy]`` table."""
    g = parser.add_argument_group("policy: what sessions this party joins (docs/site-rules.md, \"A party's policy\")")
    for rule in RULES:
        shown = ",".join(rule.default) if isinstance(rule.default, tuple) else rule.default
        g.add_argument(rule.flag, dest=f"policy_{rule.key}", type=rule.parse, metavar=rule.key.upper(), help=f"{rule.help} (default {shown})")


def admitting(options: SessionOptions) -> list[str]:
    """The ``--policy-*`` flags under which a party admits ``options`` (``cels simulate``: the
    simulated parties' operators are the one user who asked for the session)."""
    flags = ["--policy-releases", options.release, "--policy-solves", options.solve]
    defaults = {rule.key: rule.default for rule in RULES}
    flags += ["--policy-max-epsilon", repr(max(options.epsilon, defaults["max_epsilon"])), "--policy-max-delta", repr(max(options.delta, defaults["max_delta"]))]
    return flags + (["--policy-keep-user-ids", "true"] if options.keep_user_ids else [])


def policy_table() -> str:
    """The rules as a Markdown table (docs/site-rules.md carries it; a test keeps it current)."""
    lines = ["| `[policy]` key | flag | default | what |", "| --- | --- | --- | --- |"]
    for rule in RULES:
        shown = ", ".join(rule.default) if isinstance(rule.default, tuple) else ("unset" if rule.default is None else str(rule.default).lower())
        lines.append(f"| `{rule.key}` | `{rule.flag}` | {shown or 'any'} | {rule.help} |")
    return "\n".join(lines)
