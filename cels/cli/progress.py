"""Live progress of a distributed session on the console (``cels run``, ``cels simulate``).

The initiator streams RunEvents: ``phase_start`` when a node enters a phase and ``progress``
(a StepReport) when it leaves it.  :class:`SessionProgress` prints one line per event, each
node's phases in protocol order (docs/protocol.md: load, universe, counts, solve -- or nlp
with ``--solve transformed`` --, sampling, union; the solver takes part in that one phase) whatever order the reports arrive in, keeps one
tqdm bar per running phase (nodes done / nodes in it; on a terminal only), and at the end
lists what no event carried from the session report.

A peer sends its StepReports (busy seconds, bytes) only once its part is over; the initiator's
watchdog sees it enter each phase.  So a peer entering a phase ends its earlier ones: they are
printed as "ended" (with the wall clock seen here) and counted in the bars when that happens,
and the "done" lines with the peer's own figures follow when its reports arrive.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import IO, Any

from typing import NamedTuple

from tqdm import tqdm

from cels.protocol.options import SessionOptions
from cels.protocol.phases import party_phases, solve_phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_label


class Ended(NamedTuple):
    """A node left a phase: its busy seconds and bytes sent in it (a StepReport, or the report's)."""

    node: str
    phase: str
    seconds: float
    bytes_sent: int

class SessionProgress:
    """Renders a session's phase events: ``start`` takes the PhaseStarts, ``step`` the StepReports."""

    def __init__(self, options: SessionOptions, stream: IO[str] | None = None, bars: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.expected = {party: party_phases(options.solve) for party in options.parties}
        self.expected[options.solver] = (solve_phase(options.solve),)
        self.initiator = options.initiator
        self.t0 = time.monotonic()
        self.ended: dict[str, dict[str, Ended]] = {node: {} for node in self.expected}
        self.printed: dict[str, int] = {node: 0 for node in self.expected}  # phases printed, in protocol order
        self.started: set[tuple[str, str]] = set()
        self.shown: set[tuple[str, str]] = set()
        self.counted: set[tuple[str, str]] = set()  # (node, phase) counted as ended in its bar
        self.bars: dict[str, tqdm] = {}
        self.show_bars = bars
        self.lines: list[str] = []
        self.seen: dict[tuple[str, str, str], float] = {}  # (node, phase, "start" | "end") -> seconds since t0

    def _write(self, line: str) -> None:
        self.lines.append(line)
        tqdm.write(line, file=self.stream)

    def _line(self, node: str, phase: str, what: str) -> str:
        role = " (initiator)" if node == self.initiator else ""
        return f"  [{time.monotonic() - self.t0:7.1f} s] {node + role:>22} {phase:<9} {what}"

    def _bar(self, phase: str) -> tqdm:
        if phase not in self.bars:
            size = shutil.get_terminal_size()  # COLUMNS / LINES, the terminal's size, or 80 x 24 where it says 0
            total = sum(phase in phases for phases in self.expected.values())
            self.bars[phase] = tqdm(
                total=total, desc=f"{phase:<9}", unit="node", file=self.stream, leave=False,
                disable=None if self.show_bars is None else not self.show_bars,  # None: bars on a terminal only
                # a terminal that reports 0 x 0 (a pty nobody sized: script, docker exec -t, CI) got no bar at all
                ncols=size.columns, nrows=size.lines,
            )  # fmt: skip
        return self.bars[phase]

    def _count(self, node: str, phase: str) -> None:
        """``node`` left ``phase``: one more node done in that phase's bar (once)."""
        if (node, phase) in self.counted:
            return
        self.counted.add((node, phase))
        bar = self._bar(phase)
        bar.update(1)
        if bar.n >= (bar.total or 0):
            bar.close()

    def start(self, event: cels_pb2.PhaseStart) -> None:
        """A node entered a phase (RunEvent ``phase_start``): its earlier phases are over."""
        node, phase = event.node, phase_label(event.phase)
        if (node, phase) in self.started:
            return
        now = time.monotonic() - self.t0
        self.seen[(node, phase, "start")] = now
        phases = self.expected.get(node, ())
        for earlier in phases[: phases.index(phase)] if phase in phases else ():
            if (node, earlier) not in self.counted:
                began = self.seen.get((node, earlier, "start"))
                self._count(node, earlier)
                self._write(self._line(node, earlier, "ended" + (f"  {now - began:8.2f} s wall" if began is not None else "")))
        self.started.add((node, phase))
        self._bar(phase)
        self._write(self._line(node, phase, "started"))

    def step(self, step_report: cels_pb2.StepReport) -> None:
        """A node finished a phase (RunEvent ``progress``): print it once every earlier phase
        of that node is printed, so each node's lines come in protocol order."""
        report = Ended(step_report.node, phase_label(step_report.phase), step_report.seconds, step_report.bytes_sent)
        phases = self.expected[report.node]
        self.seen.setdefault((report.node, report.phase, "end"), time.monotonic() - self.t0)
        self.ended.setdefault(report.node, {})[report.phase] = report
        self.printed.setdefault(report.node, 0)
        if report.phase not in phases:  # a phase outside the protocol order (e.g. control)
            self._print_end(report)
            return
        self._flush(report.node)

    def _flush(self, node: str, everything: bool = False) -> None:
        phases, ended = self.expected[node], self.ended[node]
        while self.printed[node] < len(phases):
            phase = phases[self.printed[node]]
            if phase not in ended:
                if not everything:
                    return
            else:
                self._print_end(ended[phase])
            self.printed[node] += 1

    def _print_end(self, report: Ended) -> None:
        self.shown.add((report.node, report.phase))
        self._count(report.node, report.phase)
        what = f"done   {report.seconds:8.2f} s busy {report.bytes_sent / 1e6:9.3f} MB sent"
        self._write(self._line(report.node, report.phase, what))

    def finish(self, report: dict[str, Any]) -> None:
        """The session ended with output: print the phases no event carried from the report's
        per-phase costs, then close the bars."""
        for phase, entry in report.get("phases", {}).items():
            for node, seconds in entry.get("seconds", {}).items():
                if phase not in self.ended.setdefault(node, {}):
                    self.ended[node][phase] = Ended(node, phase, seconds, int(entry.get("bytes", {}).get(node, 0)))
        for node in list(self.ended):
            self.printed.setdefault(node, 0)
            self._flush(node, everything=True)
            for phase, rep in self.ended[node].items():
                if (node, phase) not in self.shown:
                    self._print_end(rep)
        self.close()

    def phase_wall_seconds(self) -> dict[str, float]:
        """Wall-clock seconds of each phase as this console saw the initiator's events: from it
        entering the phase to entering its next one (to leaving it, for the last).  The phases
        follow one another (docs/protocol.md) and the initiator takes part in each; the
        solver's phase lies inside the initiator's phase of the same name."""
        phases = self.expected[self.initiator]
        walls = {}
        for k, phase in enumerate(phases):
            start = self.seen.get((self.initiator, phase, "start"))
            following = self.seen.get((self.initiator, phases[k + 1], "start")) if k + 1 < len(phases) else None
            end = following if following is not None else self.seen.get((self.initiator, phase, "end"))
            if start is not None and end is not None:
                walls[phase] = end - start
        return walls

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
