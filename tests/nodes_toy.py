"""A toy protocol behind the real node adapters (transport tests, no crypto).

Parties P_1..P_r each hold a log; the value of a party is its log's size |D_k| (read with the
real reader and format flags).  P_1 starts a ring: each party adds its value to a running total
(a SumResult "toy-ring") and forwards it; the last party hands it to the solver, which sends
the total ("toy-total") to every party.  The initiator's output is the total.  The session
config's ``solver_time_limit`` (seconds) slows every hop; its ``breakpoints`` adds that many
padding values to every ring hop (framing).

Run as ``python tests/nodes_toy.py NODE-FLAGS`` to serve a toy node (party if the name starts
with "party", else solver).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cels.logs import load_log  # noqa: E402
from cels.node.config import add_data_arguments, add_node_arguments, data_source, node_config  # noqa: E402
from cels.node.process import serve  # noqa: E402
from cels.node.service import Node  # noqa: E402
from cels.protocol.roles import Envelope, ProtocolError  # noqa: E402
from cels.protocol.wire import cels_pb2  # noqa: E402


def fail(message: str) -> ProtocolError:
    return ProtocolError(ProtocolError.FAILED_PRECONDITION, message)


class ToyRole:
    def __init__(self, name: str, config: cels_pb2.SessionConfig, value: int = 0) -> None:
        self.name, self.value = name, value
        self.session_id = config.session_id
        self.parties = [p.name for p in config.parties]
        self.solver = config.solver.name
        self.initiator = config.initiator or self.parties[0]
        self.delay = config.solver_time_limit
        self.payload = config.breakpoints
        self.done = False
        self.aborted = None
        self.forwarded = False
        self.output: int | None = None
        self.report: dict | None = None

    def _msg(self, sum_id: str, total: int) -> Envelope:
        values = [total] + [7] * (self.payload if sum_id == "toy-ring" else 0)
        return Envelope(
            session_id=self.session_id,
            sender=self.name,
            sum_result=cels_pb2.SumResult(session_id=self.session_id, sum_id=sum_id, values=values),
        )

    def _next(self) -> str:
        k = self.parties.index(self.name)
        return self.parties[k + 1] if k + 1 < len(self.parties) else self.solver

    def start(self) -> list:
        if self.name != self.parties[0] or self.forwarded:
            return []
        self.forwarded = True
        time.sleep(self.delay)
        return [(self._next(), self._msg("toy-ring", self.value))]

    def receive(self, sender: str, envelope: Envelope) -> list:
        step = envelope.WhichOneof("step")
        if step == "step_report":
            return []
        if step != "sum_result":
            raise fail(f"{self.name}: toy roles do not take {step}")
        msg = envelope.sum_result
        if not msg.values:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: {msg.sum_id} without values")
        if any(v != 7 for v in msg.values[1:]):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: padding corrupted")
        time.sleep(self.delay)
        if msg.sum_id == "toy-ring" and self.name == self.solver:
            if sender != self.parties[-1]:
                raise fail(f"{self.name}: toy-ring from {sender}, expected {self.parties[-1]}")
            self.done = True
            return [(p, self._msg("toy-total", msg.values[0])) for p in self.parties]
        if msg.sum_id == "toy-ring":
            k = self.parties.index(self.name)
            if k == 0 or self.forwarded or sender != self.parties[k - 1]:
                raise fail(f"{self.name}: toy-ring from {sender} out of order")
            self.forwarded = True
            return [(self._next(), self._msg("toy-ring", msg.values[0] + self.value))]
        if msg.sum_id == "toy-total" and sender == self.solver and self.forwarded:
            self.done = True
            self.output = msg.values[0]
            self.report = {"total": self.output, "initiator": self.initiator}
            if self.name == self.initiator:
                return []
            report = cels_pb2.StepReport(session_id=self.session_id, node=self.name, phase="toy", seconds=0.0)
            return [(self.initiator, Envelope(session_id=self.session_id, sender=self.name, step_report=report))]
        raise fail(f"{self.name}: {msg.sum_id} from {sender} out of order")


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
        factory = lambda session, name, _keys: ToyRole(name, session, load_log(path, options).size)  # noqa: E731
    else:
        factory = lambda session, name, _keys: ToyRole(name, session)  # noqa: E731
    return serve(Node(config, factory, write_total))


if __name__ == "__main__":
    sys.exit(main())
