"""What every baseline sanitizer offers the ``cels sanitize --method`` front end."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, Protocol

from cels.baselines.release import ReleasedItem
from cels.logs.records import LogRecord


class Baseline(Protocol):
    """A baseline: its own command-line parameters and one release over a list of records."""

    name: str

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Add ``--<name>-...`` parameters; defaults left ``None`` are derived from --epsilon/--delta."""

    def run(self, records: list[LogRecord], args: argparse.Namespace, rng: Any) -> tuple[list[ReleasedItem], dict]:
        """Sanitize ``records`` (log order); return the released items and the report
        (``privacy``, ``sizes``, ``utility``)."""


Options = tuple[tuple[str, dict[str, Any]], ...]
"""A baseline's flags as one table: (name, argparse keywords) in ``--help`` order."""


def add_options(group: Any, prefix: str, options: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """``--{prefix}{name}`` for every (name, argparse keywords), dest ``{prefix}{name}`` with
    dashes as underscores (a baseline's flags as one table)."""
    for name, kwargs in options:
        flag = f"--{prefix}{name}"
        group.add_argument(flag, dest=flag[2:].replace("-", "_"), **kwargs)


def budget(args: argparse.Namespace) -> tuple[float, float]:
    """The (epsilon, delta) the front end passed; a clear error when they are absent or invalid."""
    epsilon = getattr(args, "epsilon", None)
    delta = getattr(args, "delta", None)
    if epsilon is None or not epsilon > 0:
        raise ValueError(f"--epsilon must be a positive number, got {epsilon!r}")
    if delta is None or not 0 < delta < 1:
        raise ValueError(f"--delta must lie in (0, 1), got {delta!r}")
    return float(epsilon), float(delta)


class TabledBaseline:
    """A :class:`Baseline` whose flags are the table ``options``: ``--{name}-{option}``."""

    name: str
    options: Options

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        add_options(group, f"{self.name}-", self.options)
