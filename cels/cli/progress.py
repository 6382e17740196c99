"""Live progress of a distributed session on the console (``cels run``, ``cels simulate``).

The initiator streams a RunEvent ``phase_start`` whenever a node enters a phase (``over``: it
left its last one), stamped with when it happened, in seconds since the session began on the
initiator: its own phases from its host's events, its peers' from its watchdog's probes (so
within about a second).  :class:`SessionProgress` prints one line per node and phase when the
node leaves it, each node's phases in protocol order (docs/protocol.md: load, universe, counts,
solve -- or nlp with ``--solve transformed`` --, sampling, union; the solver takes part in that
one phase), with the phase's wall-clock seconds on that node.  There is one definition of time
on the console: wall-clock seconds between those stamps.  What each node spent inside its role
(busy seconds) and sent is in the operator report.  At the end it prints one line per phase,
in protocol order: its wall-clock seconds on the initiator, which takes part in every phase (the
report's ``phase_wall_seconds``: they add up to the session's), and the megabytes every node
sent in it.  A peer's phase that began and ended between two probes is shown ``ended``,
without seconds.  On a terminal,
one bar shows the phase under way, nodes done of nodes in it.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import IO, Any

from tqdm import tqdm

from cels.protocol.options import SessionOptions
from cels.protocol.machines import party_machine, solver_machine
from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_label


class SessionProgress:
    """Renders a session's phase events: ``start`` takes the PhaseStarts, ``step`` the StepReports."""

    def __init__(self, options: SessionOptions, stream: IO[str] | None = None, bars: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        party = party_machine(options).phases
        self.expected = {name: party for name in options.parties}
        self.expected[options.solver] = solver_machine(options).phases
        self.order = party
        """Every phase of the session in protocol order (the solver's is one of the parties')."""
        self.initiator = options.initiator
        self.t0 = time.monotonic()
        self.entered: dict[tuple[str, str], float] = {}
        """(node, phase) -> seconds since the session began on the initiator."""
        self.left: dict[tuple[str, str], float] = {}
        self.latest = 0.0
        self.show_bars = bars
        self.bar: tqdm | None = None
        self.bar_phase = ""

    def _write(self, line: str) -> None:
        tqdm.write(line, file=self.stream)

    def start(self, event: cels_pb2.PhaseStart) -> None:
        """A node entered a phase at ``event.seconds_since_start`` (RunEvent ``phase_start``):
        the phases before it on that node are over then."""
        node, phase = event.node, phase_label(event.phase)
        phases = self.expected.get(node)
        if phases is None:
            return
        at = event.seconds_since_start
        self.latest = max(self.latest, at)
        before = phases if phase == Phase.OVER else phases[: phases.index(phase)] if phase in phases else ()
        for earlier in before:
            if (node, earlier) not in self.left:
                self._leave(node, earlier, at)
        if phase in phases:
            self.entered.setdefault((node, phase), at)
            self._show(phase)

    def step(self, step_report: cels_pb2.StepReport) -> None:
        """A node's report of a phase it left (RunEvent ``progress``; its seconds are busy
        seconds, in the operator report).  The initiator's come just before its next stamp, which
        ends the phase; a peer's come when its part is over, so they end what no probe saw end."""
        node, phase = step_report.node, phase_label(step_report.phase)
        phases = self.expected.get(node, ())
        if node != self.initiator and phase in phases:  # it left this phase and every one before it
            for earlier in phases[: phases.index(phase) + 1]:
                if (node, earlier) not in self.left:
                    self._leave(node, earlier, max(self.latest, time.monotonic() - self.t0))

    def _leave(self, node: str, phase: str, at: float) -> None:
        """``node`` left ``phase`` at ``at``: its line, once, with the phase's wall-clock seconds there."""
        self.left[(node, phase)] = at
        began = self.entered.get((node, phase))
        took = f"{at - began:8.2f} s" if began is not None else f"{'ended':>10}"  # began and ended between two probes
        role = " (initiator)" if node == self.initiator else ""
        self._write(f"  [{at:7.1f} s] {node + role:>22} {phase:<9} {took}")
        if phase == self.bar_phase and self.bar is not None:
            self.bar.update(1)

    def _show(self, phase: str) -> None:
        """The bar follows the latest phase in protocol order that a node entered."""
        if self.bar_phase and self.order.index(phase) <= self.order.index(self.bar_phase):
            return
        if self.bar is not None:
            self.bar.close()
        nodes = [node for node, phases in self.expected.items() if phase in phases]
        size = shutil.get_terminal_size()  # COLUMNS / LINES, the terminal's size, or 80 x 24 where it says 0
        self.bar_phase = phase
        self.bar = tqdm(
            total=len(nodes), initial=sum((n, phase) in self.left for n in nodes), desc=f"{phase:<9}", file=self.stream,
            leave=False, bar_format="{desc} {bar} {n_fmt}/{total_fmt} nodes done",
            disable=None if self.show_bars is None else not self.show_bars,  # None: a bar on a terminal only
            ncols=size.columns, nrows=size.lines,  # a terminal that reports 0 x 0 (a pty nobody sized) still gets one
        )  # fmt: skip

    def finish(self, report: dict[str, Any]) -> None:
        """The session ended with output: end what no stamp ended, then one line per phase."""
        end = max(self.latest, *self.left.values(), 0.0)
        for node, phases in self.expected.items():
            for phase in phases:
                if (node, phase) in self.entered and (node, phase) not in self.left:
                    self._leave(node, phase, end)
        self.close()
        walls = self.phase_wall_seconds()
        costs = report.get("phases", {})
        self._write("phases (wall-clock seconds on the initiator, which takes part in each; megabytes all nodes sent in it):")
        for phase in self.order:
            if phase in walls or phase in costs:
                wall = f"{walls[phase]:8.2f} s" if phase in walls else "       - s"
                self._write(f"  {phase:<9} {wall} {costs.get(phase, {}).get('bytes_total', 0) / 1e6:10.3f} MB")

    def phase_wall_seconds(self) -> dict[str, float]:
        """Wall-clock seconds of each phase on the initiator, which takes part in every one (the
        solver's phase lies inside the initiator's of the same name): from its stamp entering the
        phase to its stamp leaving it, so they add up to the session's time (the report's
        ``phase_wall_seconds``)."""
        walls = {}
        for phase in self.order:
            key = (self.initiator, phase)
            if key in self.entered and key in self.left:
                walls[phase] = self.left[key] - self.entered[key]
        return walls

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
