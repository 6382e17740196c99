"""The initiator's side of ``cels run`` on a node: the Run stream.

The host decides the initiator's steps (cels.protocol.host: StartSession to every other node,
BEGIN everywhere, its own begin; FINISH everywhere once its role is finished, its own finish).
This driver only makes each due :class:`~cels.protocol.hosted.Call` over gRPC, after the
session's outbox has delivered what came before it, and reports the answer back; meanwhile it
streams the session's progress (StepReports, phase starts), then the output and the report, or
the Abort.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from cels.node.framing import CHUNK_BYTES, to_frames
from cels.node.link import PeerPhase, SessionLink
from cels.node.peers import Refused, call_abort, rpc_text
from cels.node.sessions import SessionDriver
from cels.protocol.aborts import UNREACHABLE, abort_notice
from cels.protocol.hosted import ABORTED, DONE, Call, Event, Step
from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_to_wire, table_message

OutputWriter = Callable[[Any, Path], None]
"""Writes the initiator role's ``output`` to a file (the party node writes the log's format)."""
REFUSALS = {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
"""The codes a node refuses with; a FINISH failing with any other (UNAVAILABLE, DEADLINE_EXCEEDED,
CANCELLED by a stopping server, ...) means the peer is gone, not that it refuses."""
SIGNALS = {Step.BEGIN: cels_pb2.SessionSignal.BEGIN, Step.FINISH: cels_pb2.SessionSignal.FINISH}


def follow(driver: SessionDriver, link: SessionLink, write_output: OutputWriter, output_name: str) -> Iterator[cels_pb2.RunEvent]:
    """The Run stream of a session this node initiates (its host has made the first call due)."""
    me, sid, t0 = driver.config.name, link.id, time.perf_counter()
    answers: dict[str, cels_pb2.SessionState] = {}
    while True:
        item = link.events.get()
        if isinstance(item, Call):
            answer = make_call(driver, link, item)
            if answer is not None and item.step is Step.FINISH:
                answers[item.node] = answer
        elif isinstance(item, cels_pb2.StepReport):  # a node left a phase (its report)
            yield cels_pb2.RunEvent(progress=item)
        elif isinstance(item, PeerPhase) and item.phase is not Phase.FAILED:  # OVER: it left its last phase
            yield _phase_start(sid, item.node, item.phase, item.seconds)
        elif isinstance(item, Event) and item.kind == "phase":  # this node, the initiator
            if item.old not in (Phase.READY, Phase.OVER):
                report = cels_pb2.StepReport(session_id=sid, node=me, phase=phase_to_wire(item.old), seconds=item.seconds, bytes_sent=item.bytes_sent)
                yield cels_pb2.RunEvent(progress=report)
            if item.phase is not Phase.FAILED:  # when it happened, not when the stream got to it (a step's events come together)
                yield _phase_start(sid, me, item.phase, item.at - link.started)
        elif isinstance(item, Event) and item.kind == "awaiting":  # a party's operator approves first
            yield cels_pb2.RunEvent(awaiting_approval=item.node)
        elif isinstance(item, Event) and item.kind == "approved":
            yield cels_pb2.RunEvent(approved=item.node)
        elif isinstance(item, Event) and item.kind == ABORTED:  # the caller is this node's controller: its own failure's details too
            yield cels_pb2.RunEvent(aborted=item.abort, detail=item.detail if item.abort.origin == me else "")
            return
        elif isinstance(item, Event) and item.kind == DONE:
            break
    role = driver.host.role(sid)
    report = {**(role.report or {}), "session_id": sid, "wall_seconds": time.perf_counter() - t0, "wire": wire_report({me: link.final, **answers})}
    if gone := driver.host.gone_at_finish(sid):
        report["unreachable_at_finish"] = gone
    with tempfile.TemporaryDirectory(prefix="cels-output-") as tmp:
        path = Path(tmp) / Path(output_name).name
        write_output(role.output, path)
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                yield cels_pb2.RunEvent(output_chunk=chunk)
    yield cels_pb2.RunEvent(report=table_message(report))


def make_call(driver: SessionDriver, link: SessionLink, call: Call) -> cels_pb2.SessionState | None:
    """Make ``call`` once the messages before it are delivered, and report the outcome to the
    host; the node's answer to a BEGIN or FINISH (None for a StartSession, or a failure)."""
    sid, node = call.session_id, call.node
    link.outbox.join()
    with driver.lock:
        if driver.host.next_call(sid) != call:  # the session ended meanwhile
            return None
    answer, awaiting = None, False
    try:
        if call.step is Step.START:
            frames = to_frames(call.envelope, 0)
            awaiting = driver.peers.deliver(node, frames, link.deadline).awaiting_approval
            link.sent(call.step.value, sum(f.ByteSize() for f in frames))
        else:
            answer = driver.peers.signal(node, sid, SIGNALS[call.step], link.deadline)
    except grpc.RpcError as exc:
        notice = call_abort(sid, node, call.step.value, exc, call.phase, joined=call.step is not Step.START)
        detail, refused = f"{call.step} to {node} at {driver.config.peers.get(node)} failed: {rpc_text(exc)}", exc.code() in REFUSALS
        driver.call(lambda now: driver.host.unanswered(sid, node, notice, now, detail, refused=refused), sid)
        return None
    except Refused as exc:  # no address for a node of the session
        notice, detail = abort_notice(sid, node, UNREACHABLE, "this node has no address for it", call.phase), str(exc)
        driver.call(lambda now: driver.host.unanswered(sid, node, notice, now, detail), sid)
        return None
    driver.call(lambda now: driver.host.answered(sid, node, now, awaiting=awaiting), sid)
    return answer


def _phase_start(session_id: str, node: str, phase: Phase, seconds: float) -> cels_pb2.RunEvent:
    start = cels_pb2.PhaseStart(session_id=session_id, node=node, phase=phase_to_wire(phase), seconds_since_start=seconds)
    return cels_pb2.RunEvent(phase_start=start)


def wire_report(states: dict[str, cels_pb2.SessionState]) -> dict[str, Any]:
    """Bytes and messages every node put on the wire (frames included), per step message."""
    nodes = {
        name: {
            "bytes_sent": dict(sorted(state.bytes_sent.items())),
            "messages_sent": dict(sorted(state.messages_sent.items())),
            "largest_message_bytes": dict(sorted(state.largest_sent.items())),
            "bytes_total": sum(state.bytes_sent.values()),
            "busy_seconds": round(state.busy_seconds, 6),
        }
        for name, state in states.items()
    }
    largest = max((size for state in states.values() for size in state.largest_sent.values()), default=0)
    return {"nodes": nodes, "bytes_total": sum(n["bytes_total"] for n in nodes.values()), "largest_message_bytes": largest}
