"""A toy protocol behind the real node adapters (transport tests, no crypto).

Parties P_1..P_r each hold a log; the value of a party is its log's size |D_k| (read with the
real reader and format flags).  P_1 starts a ring: each party adds its value to a running total
(a SumResult "toy-ring") and forwards it; the last party hands it to the solver, which sends
the total ("toy-total") to every party.  The initiator's output is the total.  The session's
``cap`` (milliseconds) slows every hop; its ``min_count`` adds that many padding values to every
ring hop (framing).

Run as ``python tests/nodes_toy.py NODE-FLAGS`` to serve a toy node (party if the name starts
with "party", else solver).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cels.protocol.phases import Phase
from cels.logs import load_log  # noqa: E402
from cels.node.config import add_data_arguments, add_node_arguments, data_source, node_config  # noqa: E402
from cels.node.process import serve  # noqa: E402
from cels.node.service import Node  # noqa: E402
from cels.protocol.options import SessionOptions  # noqa: E402
from cels.protocol.rolebase import Machine, PhaseRow, SessionRole, Takes, charges  # noqa: E402
from cels.protocol.roles import Envelope, ProtocolError, fail  # noqa: E402
from cels.protocol.wire import cels_pb2  # noqa: E402


class ToyRole(SessionRole):
    """The toy ring (module doc) as a role under the real SessionHost contract."""

    def __init__(self, name: str, options: SessionOptions, value: int = 0) -> None:
        super().__init__(name, options, TOY, charges(TOY))
        self.value = value
        self.delay = (options.cap or 0) / 1000  # the toy reads its knobs from two spare options
        self.payload = options.min_count
        self.forwarded = False
        self.reported: set[str] = set()

    @property
    def finished(self) -> bool:
        others = set(self.nodes) - {self.name}
        return self.done and (self.name != self.initiator or self.reported == others)

    def _msg(self, sum_id: str, total: int) -> Envelope:
        values = [total] + [7] * (self.payload if sum_id == "toy-ring" else 0)
        return self._envelope(sum_result=cels_pb2.SumResult(session_id=self.session_id, sum_id=sum_id, values=values))

    def _next(self) -> str:
        k = self.parties.index(self.name)
        return self.parties[k + 1] if k + 1 < len(self.parties) else self.solver

    def _begin(self) -> list:
        self._enter(Phase.COUNTS)  # a ring sum, as the counts phase
        if self.name != self.parties[0]:
            return []
        self.forwarded = True
        time.sleep(self.delay)
        return [(self._next(), self._msg("toy-ring", self.value))]

    def _on_step_report(self, sender: str, msg: cels_pb2.StepReport) -> list:
        self.reported.add(sender)
        return []

    def _on_sum_result(self, sender: str, msg: cels_pb2.SumResult) -> list:
        if not msg.values:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: {msg.sum_id} without values")
        if any(v != 7 for v in msg.values[1:]):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: padding corrupted")
        time.sleep(self.delay)
        if msg.sum_id == "toy-ring" and self.name == self.solver:
            if sender != self.parties[-1]:
                raise fail(f"{self.name}: toy-ring from {sender}, expected {self.parties[-1]}")
            self._finish()
            return [(p, self._msg("toy-total", msg.values[0])) for p in self.parties]
        if msg.sum_id == "toy-ring":
            k = self.parties.index(self.name)
            if k == 0 or self.forwarded or sender != self.parties[k - 1]:
                raise fail(f"{self.name}: toy-ring from {sender} out of order")
            self.forwarded = True
            return [(self._next(), self._msg("toy-ring", msg.values[0] + self.value))]
        if msg.sum_id == "toy-total" and sender == self.solver and self.forwarded:
            self.output = msg.values[0]
            self.report = {"total": self.output, "initiator": self.initiator}
            self._finish()
            return []
        raise fail(f"{self.name}: {msg.sum_id} from {sender} out of order")

    def _report(self) -> list:
        return [] if self.name == self.initiator else super()._report()


REPORT = Takes(ToyRole._on_step_report)
TOY = Machine("toy", {
    Phase.COUNTS: PhaseRow({"sum_result": Takes(ToyRole._on_sum_result, by_sum_id=True), "step_report": REPORT}),
    Phase.OVER: PhaseRow({"step_report": REPORT}),
})  # fmt: skip
"""The toy's machine: its ring's sums, and the reports the initiator collects."""


def write_total(total: int, path: Path) -> None:
    path.write_text(f"total\t{total}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    config = node_config(args, "data")
    if config.name.startswith("party"):
        path, options = data_source(args, config.extra)
        factory = lambda session, _keys: ToyRole(config.name, session, load_log(path, options).size)  # noqa: E731
    else:
        factory = lambda session, _keys: ToyRole(config.name, session)  # noqa: E731
    return serve(Node(config, factory, write_total))


if __name__ == "__main__":
    sys.exit(main())
