"""One session's I/O on a node: its outbox thread (causal delivery), its watchdog thread, its
byte counters and the initiator's event queue (cels.node.sessions drives the SessionHost; the
link reaches it through :class:`LinkOwner`, so this module imports no driver)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from cels.node.settings import NodeConfig
from cels.node.framing import to_frames
from cels.node.peers import PeerClients, Refused, call_abort, rpc_text
from cels.protocol.aborts import DIED, FORGOTTEN, PROTOCOL_ERROR, UNREACHABLE, abort_notice, describe, peer_abort
from cels.protocol.hosted import Call, Effects, Event, HostedSession
from cels.protocol.host import SessionHost
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase, SessionState
from cels.protocol.roles import Envelope, ProtocolError, step_name
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_from_wire, phase_to_wire, state_from_wire, state_to_wire


PROBE_TIMEOUT_MAX = 5.0
"""The longest a peer's probe waits, and so how long it may stay unreachable before the
watchdog declares it gone (:meth:`SessionLink._watchdog`)."""

LINK_FLOOR = 125_000
"""Bytes per second: the slowest link a delivery is given time for (1 Mbit/s)."""


def delivery_timeout(deadline: float, size: int) -> float:
    """A Deliver call's timeout: the session's deadline (the recipient's step runs inside the
    call) plus ``size`` bytes at LINK_FLOOR, so a slow link does not break a big message."""
    return deadline + size / LINK_FLOOR


def hold_seconds(deadline: float) -> float:
    """How long a message refused as out of order is held back and retried: one second more
    than the watchdog needs to see a killed peer (2i + p, :meth:`SessionLink._watchdog`), so that a
    message waiting for a dead node's is refused only after the session is aborted, naming
    that node, not the recipient."""
    return 2 * min(1.0, deadline / 4) + min(5.0, deadline / 4) + 1.0


@dataclass
class PeerPhase:
    """A peer entered ``phase`` (seen by the initiator's watchdog), ``seconds`` into the session."""

    node: str
    phase: Phase
    seconds: float


LinkEvent = Event | Call | PeerPhase | cels_pb2.StepReport
"""What the initiator's Run stream reads from its link: the host's events and due calls, the
peers' phases and StepReports (cels.node.initiator)."""


class LinkOwner(Protocol):
    """What a link needs of the node that drives its session (cels.node.sessions.SessionDriver)."""

    config: NodeConfig
    host: SessionHost
    peers: PeerClients

    def take(self, sender: str, envelope: Envelope) -> None: ...
    def drained(self, session_id: str) -> None: ...
    def abort(self, session_id: str, origin: str, kind: int, reason: str, detail: str = "", unless: Callable[[HostedSession], bool] | None = None) -> None: ...
    def adopt(self, session_id: str, notice: cels_pb2.Abort, detail: str = "") -> None: ...
    def phase(self, session_id: str) -> Phase: ...
    def expire(self) -> None: ...
    def call(self, action: Callable[[float], Effects], session_id: str = "") -> Effects: ...


class SessionLink:
    """One session's I/O on this node: outbox thread, watchdog thread, byte counters, events."""

    def __init__(self, node: LinkOwner, options: SessionOptions) -> None:
        self.node, self.options, self.id = node, options, options.session_id
        self.others = [n for n in options.nodes if n != node.config.name]
        self.outbox: queue.Queue[tuple[str, Envelope] | None] = queue.Queue()
        self.events: queue.Queue[LinkEvent] = queue.Queue()  # read by the initiator's Run
        self.bytes_sent: Counter[str] = Counter()
        self.messages_sent: Counter[str] = Counter()
        self.largest_sent: Counter[str] = Counter()
        self.stopped = threading.Event()
        self.aborted = threading.Event()
        """Set with ``stopped`` when the session ended aborted: what is still queued goes nowhere,
        and this link's late failures decide nothing (a re-run may hold its id by then)."""
        self.busy = False
        self.deadline = options.deadline
        self.probe_timeout = min(self.deadline / 4, PROBE_TIMEOUT_MAX)
        self.started = time.perf_counter()
        """The session's origin on this node, on the host's meter (time.perf_counter): the Run
        stream's phase times count from it (cels.node.initiator)."""
        for target in (self._send_loop, self._watchdog):
            threading.Thread(target=target, name=f"{target.__name__}-{self.id}", daemon=True).start()

    def snapshot(self) -> cels_pb2.SessionState:
        state, notice = self.node.host.state(self.id)
        hosted = self.node.host.hosted(self.id)
        return cels_pb2.SessionState(
            session_id=self.id, state=state_to_wire(state), reason=describe(notice) if notice is not None else "", abort=notice,
            bytes_sent=dict(self.bytes_sent), messages_sent=dict(self.messages_sent), largest_sent=dict(self.largest_sent),
            busy_seconds=hosted.busy_seconds, progress=self.node.host.steps(self.id), busy=self.busy,
            phase=phase_to_wire(hosted.phase), approvals_pending=self.node.host.approvals_pending(self.id),
        )  # fmt: skip

    def sent(self, step: str, size: int) -> None:
        """Count one message of ``step`` this node sent (``size``: its frames' bytes)."""
        self.bytes_sent[step] += size
        self.messages_sent[step] += 1
        self.largest_sent[step] = max(self.largest_sent[step], size)

    def queued_bytes(self) -> int:
        """Bytes of the messages waiting in the outbox (not the one being delivered now)."""
        with self.outbox.mutex:
            return sum(item[1].ByteSize() for item in self.outbox.queue if item is not None)

    def _send_loop(self) -> None:
        """Send queued messages one at a time, in order (causal delivery: cels.node.sessions);
        once the outbox is empty, the role's next window of a pending Stream is queued
        (cels.protocol.roles.Stream) before the last message counts as done, so a call made
        after ``outbox.join()`` follows the whole Stream."""
        ids = itertools.count()
        while (item := self.outbox.get()) is not None:
            recipient, envelope = item
            try:
                if self.aborted.is_set():
                    continue
                if recipient == self.node.config.name:
                    self.node.take(self.node.config.name, envelope)
                    continue
                frames = to_frames(envelope, next(ids))
                size = sum(f.ByteSize() for f in frames)
                self.node.peers.deliver(recipient, frames, delivery_timeout(self.deadline, size))
                self.sent(step_name(envelope), size)
            except grpc.RpcError as exc:
                step = step_name(envelope)
                if not self.aborted.is_set():
                    notice = call_abort(self.id, recipient, f"delivering {step}", exc, self.node.phase(self.id))
                    self.node.adopt(self.id, notice, f"delivering {step} to {recipient} failed: {rpc_text(exc)}")
            except ProtocolError as exc:  # this node refused its own message
                if self.aborted.is_set():
                    pass
                elif exc.abort is not None:
                    self.node.adopt(self.id, exc.abort, str(exc))
                else:
                    self.node.abort(self.id, self.node.config.name, PROTOCOL_ERROR, f"refused its own {step_name(envelope)}", str(exc))
            except Refused as exc:  # no address for the recipient
                self.node.abort(self.id, recipient, UNREACHABLE, "this node has no address for it", str(exc))
            finally:
                if self.outbox.empty() and not self.aborted.is_set():  # the role's next window of a Stream, before this task is done (outbox.join)
                    self.node.drained(self.id)
                self.outbox.task_done()
        self.outbox.task_done()  # the stop: a Run stream joining the outbox goes on

    def _matters(self, peer: str, session: HostedSession) -> bool:
        """Whether ``peer`` gone ends the session here: any peer while this node's part runs;
        once it is over, only the initiator, whose FINISH or abort ends it (a peer gone after
        its part does not void the release, cels.node.initiator)."""
        return not session.finished or peer == self.options.initiator

    def _watched(self) -> list[str]:
        """The peers the watchdog probes: while the session runs, every peer that matters (the
        initiator, once its part is over, probes nobody); while it is prepared, the initiator
        (whether it still waits for parties' operators), and on the initiator the parties it
        waits for."""
        session = self.node.host.hosted(self.id)
        if session.state == SessionState.PREPARED:
            return sorted(session.initiation.awaiting) if session.initiation is not None else [self.options.initiator]
        return [peer for peer in self.others if self._matters(peer, session)]

    def _peer_gone(self, peer: str, kind: int, reason: str, detail: str) -> None:
        """Abort naming ``peer`` if it still matters, checked under the host's lock: a probe
        begun before this node's part ended decides nothing."""
        if not self.stopped.is_set():
            self.node.abort(self.id, peer, kind, reason, detail, unless=lambda session: not self._matters(peer, session))

    def _watchdog(self) -> None:
        """Probe every peer while running; the host's timers end stalled or never-begun sessions.

        With interval i = min(1 s, deadline/4) and probe timeout p = min(5 s, deadline/4), a
        killed peer is detected within 2i + p and a hung one within 2(i + p)."""
        interval = min(1.0, self.deadline / 4)
        unreachable_since: dict[str, float] = {}
        last_total = -1
        phases: dict[str, Phase | None] = {}
        while not self.stopped.wait(interval):
            self.node.expire()
            if self.node.host.state(self.id)[0] not in (SessionState.PREPARED, SessionState.RUNNING):
                continue
            total, anyone_busy = 0, False
            for peer in self._watched():
                try:
                    state = self.node.peers.signal(peer, self.id, cels_pb2.SessionSignal.PROBE, self.probe_timeout)
                except grpc.RpcError as exc:
                    since = unreachable_since.setdefault(peer, time.monotonic())
                    if time.monotonic() - since >= self.probe_timeout:
                        # a peer that took part and now refuses connections died; one that does not answer is unreachable
                        kind = DIED if exc.code() == grpc.StatusCode.UNAVAILABLE else UNREACHABLE
                        detail = f"{peer} at {self.node.config.peers.get(peer)} unreachable for {time.monotonic() - since:.1f}s: {rpc_text(exc)}"
                        self._peer_gone(peer, kind, "stopped answering", detail)
                    continue
                unreachable_since.pop(peer, None)
                said = state_from_wire(state.state)
                if said is SessionState.UNKNOWN:
                    self._peer_gone(peer, DIED, FORGOTTEN, f"{peer} no longer knows session {self.id}")
                elif said is SessionState.ABORTED and not self.stopped.is_set():
                    peer_said = peer_abort(state.abort, peer, self.id) if state.HasField("abort") else abort_notice(self.id, peer, PROTOCOL_ERROR, "reports the session aborted", None)
                    self.node.adopt(self.id, peer_said, f"{peer}'s probe reports the session aborted")
                if state.approvals_pending:  # the initiator waits for parties' operators: so does this node
                    self.node.call(lambda now: self.node.host.awaits_approvals(self.id), self.id)
                total, anyone_busy = total + state.progress, anyone_busy or state.busy
                entered = phase_from_wire(state.phase)
                if self.options.initiator == self.node.config.name and entered is not None and entered != phases.get(peer, Phase.READY):
                    phases[peer] = entered  # a peer entered a phase: the initiator streams it (Run)
                    self.events.put(PeerPhase(peer, entered, time.perf_counter() - self.started))
            if total != last_total or anyone_busy:
                last_total = total
                self.node.host.touch(self.id, time.monotonic())
