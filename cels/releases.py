"""What a session publishes: the release kinds, one object each (docs/releases.md).

- ``sampled``: the sampled search log (CELS): user rows under fresh pseudonyms, (eps,
  delta)-probabilistic DP given counts that every partner learns exactly;
- ``dp``: a histogram of query-url pairs with noisy counts, (eps, delta)-DP end to end against
  recipients, computed so that no node ever holds a noise-free count
  (cels.protocol.stages.dp_release).

A kind names its output file and writes its output (atomically); the session option
``release`` (cels.protocol.options.RELEASES) picks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from cels.baselines.release import write_release
from cels.logs.model import SearchLog
from cels.logs.writers import write_log
from cels.protocol.options import SessionOptions
from cels.mechanism.dp_release import DpHistogram


@dataclass(frozen=True)
class ReleaseKind:
    """One kind of release: its name (the ``release`` option's value), the output's type, its
    file name and its writer."""

    name: str
    output_type: type
    stem: str
    fixed_suffix: str | None
    writer: Callable[[Any, str | os.PathLike[str]], None]

    def output_name(self, input_suffix: str) -> str:
        """The output file's name: the input's suffix for a log, the TSV of the release format otherwise."""
        return self.stem + (self.fixed_suffix or input_suffix)

    def write(self, output: Any, path: str | os.PathLike[str]) -> None:
        self.writer(output, path)


SAMPLED = ReleaseKind("sampled", SearchLog, "sanitized", None, write_log)
DP_HISTOGRAM = ReleaseKind("dp", DpHistogram, "dp-histogram", ".tsv", lambda h, path: write_release(list(h.items), path))
KINDS: dict[str, ReleaseKind] = {kind.name: kind for kind in (SAMPLED, DP_HISTOGRAM)}


def release_kind(options: SessionOptions | str) -> ReleaseKind:
    """The kind a session's options (or a report's ``release`` name) ask for."""
    return KINDS[options if isinstance(options, str) else options.release]


def write_output(output: SearchLog | DpHistogram, path: str | os.PathLike[str]) -> None:
    """Write a session's output with its kind's writer (atomic; a node's output writer)."""
    next(kind for kind in KINDS.values() if isinstance(output, kind.output_type)).write(output, path)


def report_kind(report: dict[str, Any]) -> ReleaseKind:
    """The kind of a session report (a DP histogram's carries ``release``)."""
    return KINDS[(report.get("release") or {}).get("kind", "sampled")]
