"""What a session publishes: the release kinds, one object each (docs/releases.md).

- ``sampled``: the sampled search log (CELS): user rows under fresh pseudonyms, (eps,
  delta)-probabilistic DP given counts that every partner learns exactly;
- ``dp``: a histogram of query-url pairs with noisy counts, (eps, delta)-DP end to end against
  recipients, computed so that no node ever holds a noise-free count
  (cels.protocol.stages.dp_release).

A kind says everything that differs between the two: which roles' machines run
(cels.protocol.machines), who assembles the universe, what a session spends, what the ledger
calls its guarantee, how its options are checked, and how its output is named, reported and
written.  The session option ``release`` names it; nothing else compares that name.  This
module is light (the flags' choices come from it): what a kind runs is imported when it runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cels.lazy import resolve
from cels.protocol.phases import Phase


@dataclass(frozen=True)
class ReleaseKind:
    """One kind of release (the ``release`` option's value is its ``name``).  What it runs is
    named ``"module:function"`` and imported when it runs: this module is light, and it is the
    top of its layer (the functions import the session options, which name the kinds)."""

    name: str
    help: str
    guarantee: str
    """What the ledger calls an entry of this kind: the two do not mean the same (eps, delta)."""
    end_to_end: bool
    """DP against the recipients whatever the counts (else: given the exact counts)."""
    solves: bool
    """Phase 3 runs (the ``solve`` option applies), then the sampling and the union."""
    private_universe: bool
    """Each user's items are bounded and each id set padded at its party, and the solver, not
    P_1, assembles the universe: no party learns which of its items another holds."""
    charged_from: Phase
    """The phase in which a party's data for the release leaves it: reaching it charges the
    session in the party's ledger (cels.node.ledger), whatever happens after."""
    demo_delta: float
    """The delta ``cels simulate``, ``sanitize`` and the benchmarks take when none is given."""
    stem: str
    fixed_suffix: str | None
    writer: str
    """``writer(output, path)``: writes a session's output (atomic)."""
    reporter: str
    """``reporter(result)``: the initiator's report of a finished session (cels.session_report)."""
    spender: str
    """``spender(options)``: (eps, delta, eps') a session spends in a party's ledger."""
    checker: str | None = None
    """``checker(options)``: refuses (ValueError), in one line before any work, options this kind cannot run."""

    def machine(self, solve: str) -> str:
        """The roles' machines a session of this kind runs (cels.protocol.machines): a sampled
        release's solve mode, or the kind's own."""
        return solve if self.solves else self.name

    def output_name(self, input_suffix: str) -> str:
        """The output file's name: the input's suffix for a log, the TSV of the release format otherwise."""
        return self.stem + (self.fixed_suffix or input_suffix)

    def write(self, output: Any, path: str | os.PathLike[str]) -> None:
        resolve(self.writer)(output, path)

    def report(self, result: Any) -> dict:
        return resolve(self.reporter)(result)

    def spends(self, options: Any) -> tuple[float, float, float]:
        return resolve(self.spender)(options)

    def check(self, options: Any) -> None:
        if self.checker is not None:
            resolve(self.checker)(options)


SAMPLED = ReleaseKind(
    "sampled", "the sampled log of user rows (CELS): probabilistic DP given exact counts",
    "probabilistic DP of the sampling given the counts", end_to_end=False, solves=True, private_universe=False,
    charged_from=Phase.UNION, demo_delta=0.4, stem="sanitized", fixed_suffix=None, writer="cels.logs.writers:write_log",
    reporter="cels.session_report:sampled_session_report", spender="cels.protocol.options:sampled_spends",
)  # fmt: skip
DP_HISTOGRAM = ReleaseKind(
    "dp", "a DP histogram of items with noisy counts, DP end to end", "DP end to end", end_to_end=True, solves=False,
    private_universe=True, charged_from=Phase.COUNTS, demo_delta=1e-6, stem="dp-histogram", fixed_suffix=".tsv", writer="cels.mechanism.dp_release:write_histogram",
    reporter="cels.session_report:dp_session_report", spender="cels.protocol.stages.dp_release:session_spends",
    checker="cels.mechanism.dp_histogram:check_session",
)  # fmt: skip
KINDS: dict[str, ReleaseKind] = {kind.name: kind for kind in (SAMPLED, DP_HISTOGRAM)}


def release_kind(name: str) -> ReleaseKind:
    """The kind named ``name`` (a ``release`` option's or a report's)."""
    return KINDS[name]


def write_output(output: Any, path: str | os.PathLike[str]) -> None:
    """Write a session's output with its kind's writer (atomic; a node's output writer)."""
    from cels.mechanism.dp_release import DpHistogram

    (DP_HISTOGRAM if isinstance(output, DpHistogram) else SAMPLED).write(output, path)


def report_kind(report: dict[str, Any]) -> ReleaseKind:
    """The kind of a session report (a DP histogram's carries ``release``)."""
    return KINDS[(report.get("release") or {}).get("kind", SAMPLED.name)]
