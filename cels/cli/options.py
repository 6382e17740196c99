"""The session options' flags, generated from their one declaration (cels.protocol.options.OPTIONS).

``cels simulate`` and ``cels bench protocol`` take every session option that has a flag
(:data:`SESSION_FLAGS`); ``cels sanitize`` the mechanism's (:data:`MECHANISM_FLAGS`).  A flag's
name, type, choices, metavar, default and help text are the option's; :func:`option_values`
reads the parsed values back under the options' names.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from cels.mechanism.defaults import INTEGER_METHODS
from cels.protocol.options import OPTIONS, Option
from cels.protocol.releases import KINDS

SESSION_FLAGS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.flag)
"""Every session option on the command line of ``cels simulate`` / ``cels bench protocol``."""
MECHANISM_FLAGS: tuple[Option, ...] = tuple(o for o in SESSION_FLAGS if o.mechanism)
"""The session options that are ``cels sanitize``'s (SanitizeParams)."""
HOLDER_FLAGS: tuple[Option, ...] = tuple(o for o in SESSION_FLAGS if o.holder)
"""The session options ``cels sanitize`` takes besides the mechanism's (the release kind)."""
DEMO_BUDGET = {"epsilon": 1.0, "delta": None}
"""``cels simulate`` / ``cels bench protocol`` run without --epsilon / --delta (delta: by the
release kind, :data:`DEMO_DELTA`); ``cels sanitize`` needs both."""
DEMO_DELTA = {kind.name: kind.demo_delta for kind in KINDS.values()}
"""delta when a demo command is given none: the sampled release's per-user disclosure
probability (probabilistic DP), or approximate DP's negligible delta for the DP histogram."""


def delimiter(text: str) -> str:
    """``--delimiter``: one character; ``tab`` or ``\\t`` for a tab."""
    value = "\t" if text in ("tab", "\\t") else text
    if len(value) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not one character (use 'tab' for a tab)")
    return value


def single_holder_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The optimal method's flags that are no session option (``cels simulate`` refuses them)."""
    parser.add_argument("--preprocess", action="store_true", help="App. C: drop user logs that move a count by more than d")
    parser.add_argument("--integer", choices=INTEGER_METHODS, default="mip", help="integer counts: HiGHS MIP + greedy (default), greedy fill, or floor")


def add_force_argument(parser: argparse.ArgumentParser) -> None:
    """``--force``: replace outputs that exist (without it an earlier release is never lost)."""
    parser.add_argument("--force", action="store_true", help="replace the output, its release note and the report if they exist (default: refuse)")


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
        shown = ", ".join(f"{v:g} for --release {k}" for k, v in DEMO_DELTA.items()) if declared.name == "delta" and declared.name in defaults else default
        kwargs: dict[str, Any] = {"dest": declared.name, "help": declared.help if shown is None or declared.kind is bool else with_default(declared.help, shown)}
        if declared.kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=declared.kind, default=default, choices=declared.choices, metavar=declared.metavar)
            kwargs["required"] = declared.required and declared.name not in defaults
        parser.add_argument(declared.flag, **{**kwargs, **overrides.get(declared.name, {})})


def option_values(args: argparse.Namespace, options: Iterable[Option]) -> dict[str, Any]:
    """The parsed values of ``options``' flags, by option name."""
    return {o.name: getattr(args, o.name) for o in options}


def session_values(args: argparse.Namespace) -> dict[str, Any]:
    """A demo command's session options (:data:`SESSION_FLAGS`), delta by the release kind if not given."""
    values = option_values(args, SESSION_FLAGS)
    if values["delta"] is None:
        values["delta"] = DEMO_DELTA[values["release"]]
    return values


def with_default(help: str, default: Any) -> str:
    """``help`` saying its default: in its closing parenthesis if it has one."""
    said = f"default {default:g}" if isinstance(default, float) else f"default {default}"
    return f"{help[:-1]}; {said})" if help.endswith(")") else f"{help} ({said})"


def add_seed_argument(parser: argparse.ArgumentParser) -> None:
    """``--seed S`` of the nodes and the commands that start them: every party's draws replayed
    from S (cels.crypto.streams.DrawKeys.replay)."""
    parser.add_argument(
        "--seed", type=int, metavar="S",
        help="replay every draw of every session from seed S (tests and reproduction only: the release is then NOT private)",
    )  # fmt: skip


def seed_argv(args: argparse.Namespace) -> list[str]:
    """The ``--seed`` given, as a node's command line."""
    return [] if args.seed is None else ["--seed", str(args.seed)]


class DeferredParser(argparse.ArgumentParser):
    """A sub-subcommand's parser (``cels bench protocol``, ``cels experiment fig4``) whose flags
    and description come from its module, imported only when this parser parses (its
    ``--help`` included): listing the benchmarks imports none of them."""

    def __init__(self, *args: Any, module: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.module = module

    def load(self) -> DeferredParser:
        """Add the module's flags and description (once)."""
        if self.module:
            module, self.module = importlib.import_module(self.module), ""
            self.description = self.description or module.__doc__
            module.add_arguments(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super(DeferredParser, self.load()).parse_known_args(args, namespace)
