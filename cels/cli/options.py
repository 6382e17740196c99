"""The session options' flags, generated from their one declaration (cels.protocol.options.OPTIONS).

``cels simulate`` and ``cels bench protocol`` take every session option that has a flag
(:data:`SESSION_FLAGS`); ``cels sanitize`` the mechanism's (:data:`MECHANISM_FLAGS`).  A flag's
name, type, choices, metavar, default and help text are the option's; :func:`option_values`
reads the parsed values back under the options' names.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from cels.protocol.options import OPTIONS, Option

SESSION_FLAGS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.flag)
"""Every session option on the command line of ``cels simulate`` / ``cels bench protocol``."""
MECHANISM_FLAGS: tuple[Option, ...] = tuple(o for o in SESSION_FLAGS if o.mechanism)
"""The session options that are ``cels sanitize``'s (SanitizeParams)."""
DEMO_BUDGET = {"epsilon": 1.0, "delta": 0.4}
"""``cels simulate`` / ``cels bench protocol`` run without --epsilon / --delta; ``cels sanitize`` needs both."""


def add_option_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    options: Iterable[Option],
    defaults: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """One flag per option; ``defaults`` gives required options a default (else the flag is
    required), ``overrides`` changes argparse keywords of a command's flag (e.g. ``action``)."""
    defaults, overrides = defaults or {}, overrides or {}
    for declared in options:
        default = defaults.get(declared.name, declared.default)
        kwargs: dict[str, Any] = {"dest": declared.name, "help": declared.help if default is None or declared.kind is bool else with_default(declared.help, default)}
        if declared.kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=declared.kind, default=default, choices=declared.choices, metavar=declared.metavar)
            kwargs["required"] = declared.required and declared.name not in defaults
        parser.add_argument(declared.flag, **{**kwargs, **overrides.get(declared.name, {})})


def option_values(args: argparse.Namespace, options: Iterable[Option]) -> dict[str, Any]:
    """The parsed values of ``options``' flags, by option name."""
    return {o.name: getattr(args, o.name) for o in options}


def with_default(help: str, default: Any) -> str:
    """``help`` saying its default: in its closing parenthesis if it has one."""
    said = f"default {default:g}" if isinstance(default, float) else f"default {default}"
    return f"{help[:-1]}; {said})" if help.endswith(")") else f"{help} ({said})"
