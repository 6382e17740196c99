"""The ``CelsNode`` gRPC service: one sans-I/O role per session behind mutual TLS.

Delivery.  ``Deliver`` reassembles an envelope from its frames, checks that the certificate
names the envelope's sender and an expected node, and hands the envelope to the session's role
*inside the call*: a role's ProtocolError becomes FAILED_PRECONDITION / INVALID_ARGUMENT for
the sender.  The role's outgoing messages go to the session's outbox, one thread that sends
them in order and waits for each call to return before the next.  A message is therefore taken
by its recipient before anything it caused can be sent, so every node sees messages in causal
order, as the in-memory runner's FIFO queue does.

Session life.  The initiator (a party node asked by ``cels run`` through ``Run``) gives its own
role the StartSession, delivers StartSession to every other node (each creates its role and
holds what it sends), then BEGINs the session everywhere; nobody sends a step message to a node
that does not know the session yet.  When the initiator's role is ``done`` and its outbox is
empty it FINISHes the session everywhere, collecting every node's byte counts, and streams the
output and report to the controller.

Failure.  Any error (a refused or undeliverable message, an exception in a role, a peer that
stops answering the watchdog's probes, no progress anywhere for a deadline) aborts the session
on this node and sends Abort to every other node; the initiator reports the origin and reason.
An aborted session leaves nothing behind: roles are dropped, nothing is written, and the node
serves the next session.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import secrets
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from cels.node.config import NodeConfig
from cels.node.framing import CHUNK_BYTES, from_frames, to_frames
from cels.node.keys import NodeKeys
from cels.node.tls import open_channel, peer_names, server_credentials, warn_insecure
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Role, step_name
from cels.protocol.views import record_views
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

log = logging.getLogger("cels.node")

RoleFactory = Callable[[cels_pb2.SessionConfig, str, NodeKeys], Role]
"""Builds this node's role for a session: ``factory(config, node_name, keys)`` (``keys``: the
node key pair and obfuscators, cels.node.keys).  It may raise ValueError / OSError (e.g. a
malformed local log), which refuses the session."""

OutputWriter = Callable[[Any, Path], None]
"""Writes the initiator role's ``output`` to a file (the party node writes the log's format)."""

STATUS = {
    ProtocolError.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ProtocolError.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
}
KEPT_STATES = 256  # finished/aborted sessions remembered for probes
REORDER_WINDOW = 5.0  # seconds a message refused as out of order is held back and retried


class Refused(Exception):
    """A call this node refuses with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def completed(role: Role) -> bool:
    """A role's part is over: ``finished`` if it has one (the initiator: output and every
    node's report in), else ``done``; a role with neither is never waited for."""
    return bool(getattr(role, "finished", getattr(role, "done", True)))


def session_nodes(config: cels_pb2.SessionConfig) -> list[str]:
    """Every node of a session: the parties in ring order, then the solver."""
    return [p.name for p in config.parties] + ([config.solver.name] if config.solver.name else [])


class Session:
    """One session on this node: its role, outbox, counters and watchdog."""

    def __init__(self, node: Node, config: cels_pb2.SessionConfig, role: Role, initiator: str) -> None:
        self.node, self.config, self.role, self.initiator = node, config, role, initiator
        self.id = config.session_id
        self.nodes = session_nodes(config)
        self.others = [n for n in self.nodes if n != node.config.name]
        self.deadline = config.deadline_ms / 1000 if config.deadline_ms else node.config.deadline
        self.state = "prepared"
        self.origin = self.reason = ""
        self.role_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.outbox: queue.Queue[Outgoing | None] = queue.Queue()
        self.held: list[Outgoing] = []
        self.bytes_sent: Counter[str] = Counter()
        self.messages_sent: Counter[str] = Counter()
        self.busy_seconds = 0.0
        self.progress = 0
        self.version = 0  # roles' successful steps; wakes held-back messages
        self.changed = threading.Condition()
        self.busy = False
        self.stopped = threading.Event()
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()  # read by the initiator's Run
        self.threads: list[threading.Thread] = []

    @property
    def is_initiator(self) -> bool:
        return self.initiator == self.node.config.name

    # -- role ------------------------------------------------------------------------------

    def take(self, sender: str, envelope: Envelope | None) -> None:
        """Give one envelope to the role (serialised per session) and queue what it sends.

        ``envelope=None`` begins the role (its ``start()``, if it has one).  A role that
        aborts itself (its ``aborted`` is set) aborts the session.

        Hold-back: gRPC keeps each sender's messages in order but not messages of different
        senders (in memory, all messages one step sends are queued before any reply to them).
        A message the role refuses as out of order is therefore retried whenever the role has
        taken another message, for at most the reorder window; only then is it refused.
        The role's state is unchanged by a refused message (roles contract).
        """
        deadline = time.monotonic() + self.reorder_window
        while True:
            seen = self.version
            try:
                self._take_once(sender, envelope)
                return
            except ProtocolError as exc:
                remaining = deadline - time.monotonic()
                if exc.code != ProtocolError.FAILED_PRECONDITION or envelope is None or remaining <= 0:
                    raise
                log.info("%s: holding back %s from %s: %s", self.node.config.name, step_name(envelope), sender, exc)
                with self.changed:
                    self.changed.wait_for(lambda: self.version != seen or self.state in ("aborted", "done"), remaining)

    @property
    def reorder_window(self) -> float:
        return min(REORDER_WINDOW, self.deadline / 4)

    def _take_once(self, sender: str, envelope: Envelope | None) -> None:
        with self.role_lock:
            if self.state in ("aborted", "done"):
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {self.id} is {self.state} on {self.node.config.name}")
            self.busy, start = True, time.perf_counter()
            try:
                if envelope is not None:
                    outgoing = self.role.receive(sender, envelope)
                else:
                    outgoing = self.role.start() if hasattr(self.role, "start") else []
            finally:
                seconds = time.perf_counter() - start
                self.busy_seconds += seconds
                self.busy = False
                self.progress += 1
            log.info(
                "%s: session %s: %s from %s took %.2f s",
                self.node.config.name, self.id, envelope.WhichOneof("step") if envelope else "start", sender, seconds,
            )  # fmt: skip
            failed = getattr(self.role, "aborted", None)
            if failed is None:
                for message in outgoing:
                    self.send(message)
            finished = completed(self.role)
        with self.changed:
            self.version += 1
            self.changed.notify_all()
        if failed is not None:
            self.abort(failed.origin or self.node.config.name, failed.reason)
            return
        if envelope is not None and envelope.WhichOneof("step") == "step_report" and self.is_initiator:
            self.events.put(("progress", envelope.step_report))
        if finished and self.is_initiator:
            self.events.put(("done", None))

    def send(self, message: Outgoing) -> None:
        if self.state == "prepared":
            self.held.append(message)
        else:
            self.outbox.put(message)

    # -- lifecycle -------------------------------------------------------------------------

    def begin(self) -> None:
        """Start the role, release what it held, start the outbox and the watchdog."""
        with self.state_lock:
            if self.state != "prepared":
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {self.id} is {self.state}, cannot begin")
            self.state = "running"
        with self.role_lock:
            for message in self.held:
                self.outbox.put(message)
            self.held.clear()
        for target, name in ((self._send_loop, "outbox"), (self._watchdog, "watchdog")):
            thread = threading.Thread(target=target, name=f"{name}-{self.id}", daemon=True)
            thread.start()
            self.threads.append(thread)
        self.take(self.node.config.name, None)

    def abort(self, origin: str, reason: str, broadcast: bool = True) -> bool:
        """Drop the session on this node; tell every other node.  False if it was over already."""
        with self.state_lock:
            if self.state in ("aborted", "done"):
                return False
            self.state, self.origin, self.reason = "aborted", origin, reason
        log.warning("%s: session %s aborted: %s: %s", self.node.config.name, self.id, origin, reason)
        self._stop()
        with self.changed:
            self.changed.notify_all()
        self.events.put(("aborted", cels_pb2.Abort(session_id=self.id, origin=origin, reason=reason)))
        if broadcast:
            abort = Envelope(
                session_id=self.id,
                sender=self.node.config.name,
                abort=cels_pb2.Abort(session_id=self.id, origin=origin, reason=reason),
            )
            for peer in self.others:
                threading.Thread(target=self.node.peers.try_deliver, args=(peer, abort, self.probe_timeout), daemon=True).start()
        return True

    def finish(self) -> None:
        """The session ended with output: wait (a deadline at most) until the role is done and
        everything it sent is delivered, then stop the threads."""
        limit = time.monotonic() + self.deadline
        while not completed(self.role) and self.state != "aborted" and time.monotonic() < limit:
            time.sleep(0.01)
        self.drain()
        with self.state_lock:
            if self.state == "aborted":
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {self.id} was aborted: {self.origin}: {self.reason}")
            self.state = "done"
        self._stop()

    def drain(self) -> None:
        """Wait (at most a deadline) until every queued message has been sent."""
        limit = time.monotonic() + self.deadline
        while self.outbox.unfinished_tasks and time.monotonic() < limit and self.state != "aborted":
            time.sleep(0.01)

    def _stop(self) -> None:
        self.stopped.set()
        self.outbox.put(None)
        self.node.retire(self)

    def snapshot(self) -> cels_pb2.SessionState:
        return cels_pb2.SessionState(
            session_id=self.id,
            state=self.state,
            reason=f"{self.origin}: {self.reason}" if self.state == "aborted" else "",
            bytes_sent=dict(self.bytes_sent),
            messages_sent=dict(self.messages_sent),
            busy_seconds=self.busy_seconds,
            progress=self.progress,
            busy=self.busy,
        )

    # -- threads ---------------------------------------------------------------------------

    @property
    def probe_timeout(self) -> float:
        """Timeout of a probe, and how long a peer may stay unreachable (a quarter deadline, at most 5 s)."""
        return min(self.deadline / 4, 5.0)

    def _send_loop(self) -> None:
        """Send queued messages one at a time, in order (causal delivery, see module doc)."""
        message_ids = itertools.count()
        while True:
            item = self.outbox.get()
            try:
                if item is None or self.stopped.is_set():
                    if item is None:
                        return
                    continue
                recipient, envelope = item
                step = step_name(envelope)
                if recipient == self.node.config.name:
                    self.node.take_local(self, envelope)
                    continue
                frames = to_frames(envelope, next(message_ids))
                try:
                    self.node.peers.deliver(recipient, frames, self.deadline)
                except grpc.RpcError as exc:
                    self.abort(recipient, f"delivering {step} to {recipient} failed: {exc.code().name}: {exc.details()}")
                    continue
                self.bytes_sent[step] += sum(f.ByteSize() for f in frames)
                self.messages_sent[step] += 1
                self.progress += 1
            except Exception as exc:  # a local failure (e.g. in the role) ends the session, not the node
                self.abort(self.node.config.name, f"{type(exc).__name__}: {exc}")
            finally:
                self.outbox.task_done()

    def _watchdog(self) -> None:
        """Probe every other node; abort if one is gone or nothing moves for a deadline.

        With interval i = min(1 s, deadline/4) and probe timeout p = min(5 s, deadline/4), a
        killed peer (connection refused) is detected within 2i + p and a hung one within
        2(i + p): at most the deadline, and 7 s / 12 s for long deadlines."""
        interval = min(1.0, self.deadline / 4)
        unreachable_since: dict[str, float] = {}
        last_total, last_change = -1, time.monotonic()
        while not self.stopped.wait(interval):
            total, anyone_busy = self.progress, self.busy
            for peer in self.others:
                try:
                    state = self.node.peers.signal(peer, self.id, cels_pb2.SessionSignal.PROBE, self.probe_timeout)
                except grpc.RpcError as exc:
                    since = unreachable_since.setdefault(peer, time.monotonic())
                    if time.monotonic() - since >= self.probe_timeout:
                        self.abort(peer, f"{peer} unreachable for {time.monotonic() - since:.1f}s: {exc.code().name}: {exc.details()}")
                        return
                    continue
                unreachable_since.pop(peer, None)
                if state.state == "aborted":
                    origin, _, reason = state.reason.partition(": ")
                    self.abort(origin or peer, reason, broadcast=False)
                    return
                if state.state == "unknown":
                    self.abort(peer, f"{peer} no longer knows session {self.id} (restarted?)")
                    return
                total += state.progress
                anyone_busy |= state.busy
            now = time.monotonic()
            if total != last_total or anyone_busy:
                last_total, last_change = total, now
            elif now - last_change > self.deadline:
                self.abort(self.node.config.name, f"no progress on any node for {self.deadline:g}s")
                return


class PeerClients:
    """One channel per peer node, opened on first use."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, cels_pb2_grpc.CelsNodeStub] = {}
        self._lock = threading.Lock()

    def stub(self, peer: str) -> cels_pb2_grpc.CelsNodeStub:
        with self._lock:
            if peer not in self._stubs:
                address = self.config.peers.get(peer)
                if address is None:
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{self.config.name} has no address for node {peer!r}")
                tls = (None, None, None) if self.config.insecure else (self.config.ca, self.config.cert, self.config.key)
                self._channels[peer] = open_channel(address, peer, *tls)
                self._stubs[peer] = cels_pb2_grpc.CelsNodeStub(self._channels[peer])
            return self._stubs[peer]

    def deliver(self, peer: str, frames: list[cels_pb2.Frame], timeout: float) -> None:
        self.stub(peer).Deliver(iter(frames), timeout=timeout)

    def try_deliver(self, peer: str, envelope: Envelope, timeout: float) -> None:
        """Best effort (Abort notices): failures are logged, not raised."""
        try:
            self.deliver(peer, to_frames(envelope, secrets.randbits(63)), timeout)
        except (grpc.RpcError, Refused) as exc:
            log.info("%s: could not tell %s: %s", self.config.name, peer, exc)

    def signal(self, peer: str, session_id: str, kind: int, timeout: float) -> cels_pb2.SessionState:
        return self.stub(peer).Signal(cels_pb2.SessionSignal(session_id=session_id, kind=kind), timeout=timeout)

    def status(self, peer: str) -> cels_pb2.NodeStatus:
        """A peer's node key and stock (outside sessions; a short deadline)."""
        return self.stub(peer).Status(cels_pb2.NodeStatusRequest(), timeout=min(self.config.deadline, 10.0))

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()


class Node(cels_pb2_grpc.CelsNodeServicer):
    """A party or solver node: sessions of roles made by ``factory``.  ``encrypts``: the role
    encrypts under its peers' keys (a party), so the node stocks obfuscators for them."""

    def __init__(
        self, config: NodeConfig, factory: RoleFactory, output_writer: OutputWriter | None = None, *, encrypts: bool = False
    ) -> None:
        self.config = config
        self.factory = record_views(factory, config.record_view) if config.record_view else factory
        self.output_writer = output_writer
        self.peers = PeerClients(config)
        self.keys = NodeKeys(
            config.name, list(config.peers), config.keys, self.peers.status,
            allow_insecure_key_bits=config.min_key_bits < 2048, encrypts=encrypts,
        )  # fmt: skip
        self.sessions: dict[str, Session] = {}
        self.past: OrderedDict[str, cels_pb2.SessionState] = OrderedDict()
        self.lock = threading.Lock()
        self.server: grpc.Server | None = None

    # -- server ----------------------------------------------------------------------------

    def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix=self.config.name))
        cels_pb2_grpc.add_CelsNodeServicer_to_server(self, self.server)
        if self.config.insecure:
            warn_insecure(self.config.name)
            port = self.server.add_insecure_port(self.config.listen)
        else:
            assert self.config.ca and self.config.cert and self.config.key
            port = self.server.add_secure_port(
                self.config.listen, server_credentials(self.config.ca, self.config.cert, self.config.key)
            )
        if port == 0:
            raise OSError(f"{self.config.name}: cannot listen on {self.config.listen}")
        self.server.start()
        self.keys.start()
        log.info("%s: serving on %s", self.config.name, self.config.listen)
        return port

    def stop(self, grace: float = 1.0) -> None:
        with self.lock:
            running = list(self.sessions.values())
        for session in running:
            session.abort(self.config.name, "node shutting down")
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
        self.keys.close()
        self.peers.close()

    def wait(self) -> None:
        assert self.server is not None
        self.server.wait_for_termination()

    # -- identity --------------------------------------------------------------------------

    def authenticate(self, context: grpc.ServicerContext, claimed: str | None, allowed: set[str]) -> str:
        """The caller's node name: one its certificate carries and ``allowed`` contains."""
        if self.config.insecure:
            if claimed is None:
                return "?"
            if claimed not in allowed:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{self.config.name} does not expect node {claimed!r}")
            return claimed
        names = peer_names(context)
        if claimed is not None:
            if claimed not in names:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"message claims sender {claimed!r} but the certificate names {sorted(names)}",
                )
            names = {claimed}
        known = names & allowed
        if not known:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{self.config.name} does not expect a peer named {sorted(names)}")
        return sorted(known)[0]

    # -- sessions --------------------------------------------------------------------------

    def open_session(self, config: cels_pb2.SessionConfig, initiator: str) -> Session:
        """Check the session's public parameters and build this node's role for it."""
        nodes = session_nodes(config)
        if not config.session_id:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "session config without a session id")
        if self.config.name not in nodes:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {config.session_id} does not include {self.config.name}")
        if len(set(nodes)) != len(nodes):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"session {config.session_id} names a node twice: {nodes}")
        unknown = [n for n in nodes if n != self.config.name and n not in self.config.peers]
        if unknown:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{self.config.name} has no peer named {', '.join(unknown)}")
        if initiator not in [p.name for p in config.parties]:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"initiator {initiator!r} is not a party of the session")
        if config.initiator and config.initiator != initiator:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION, f"session {config.session_id} names initiator {config.initiator!r}, not {initiator!r}"
            )
        if config.key_bits and config.key_bits < self.config.min_key_bits:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.config.name} refuses {config.key_bits}-bit keys (minimum {self.config.min_key_bits}; "
                "smaller keys only to reproduce the paper, --min-key-bits)",
            )
        with self.lock:
            if config.session_id in self.sessions or config.session_id in self.past:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {config.session_id} exists already")
        try:
            role = self.factory(config, self.config.name, self.keys)
        except (ValueError, OSError) as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{self.config.name}: {exc}") from None
        session = Session(self, config, role, initiator)
        with self.lock:
            if config.session_id in self.sessions:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {config.session_id} exists already")
            self.sessions[config.session_id] = session
        self.keys.session_started()
        return session

    def session(self, session_id: str) -> Session:
        with self.lock:
            session = self.sessions.get(session_id)
            past = self.past.get(session_id)
        if session is not None:
            return session
        if past is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {session_id} is over on {self.config.name} ({past.state})")
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"unknown session {session_id!r} on {self.config.name}")

    def retire(self, session: Session) -> None:
        """Forget a finished or aborted session's role; remember its final state."""
        with self.lock:
            if self.sessions.get(session.id) is session:
                del self.sessions[session.id]
                self.keys.session_ended()
            self.past[session.id] = session.snapshot()
            while len(self.past) > KEPT_STATES:
                self.past.popitem(last=False)

    def _take(self, session: Session, sender: str, envelope: Envelope) -> None:
        """Give a delivered envelope to the role.

        A ProtocolError only refuses the call (the role's state is unchanged, and the sender,
        whose delivery failed, aborts the session); any other exception aborts the session here.
        """
        step = step_name(envelope)
        try:
            session.take(sender, envelope)
        except (Refused, ProtocolError):
            raise
        except Exception as exc:
            reason = f"{self.config.name} failed on {step}: {type(exc).__name__}: {exc}"
            session.abort(self.config.name, reason)
            raise Refused(grpc.StatusCode.INTERNAL, reason) from None

    def take_local(self, session: Session, envelope: Envelope) -> None:
        """A message the role sends to its own node."""
        try:
            session.take(self.config.name, envelope)
        except ProtocolError as exc:
            session.abort(self.config.name, f"{exc.code}: {exc}")

    # -- RPCs ------------------------------------------------------------------------------

    def Deliver(self, request_iterator: Iterator[cels_pb2.Frame], context: grpc.ServicerContext) -> cels_pb2.Ack:
        try:
            envelope, _ = from_frames(request_iterator)
            sender = self.authenticate(context, envelope.sender, set(self.config.peers))
            step = step_name(envelope)
            if step == "start_session":
                self.open_session(envelope.start_session.config, initiator=sender)
            elif step == "abort":
                session = self.session(envelope.session_id)
                session.abort(envelope.abort.origin or sender, envelope.abort.reason, broadcast=False)
            else:
                session = self.session(envelope.session_id)
                if sender not in session.nodes:
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{sender} is not a node of session {session.id}")
                self._take(session, sender, envelope)
            return cels_pb2.Ack(session_id=envelope.session_id)
        except ProtocolError as exc:
            context.abort(STATUS[exc.code], f"{self.config.name}: {exc}")
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")  # context.abort raises

    def Signal(self, request: cels_pb2.SessionSignal, context: grpc.ServicerContext) -> cels_pb2.SessionState:
        try:
            self.authenticate(context, None, set(self.config.peers))
            if request.kind == cels_pb2.SessionSignal.PROBE:
                with self.lock:
                    session = self.sessions.get(request.session_id)
                    past = self.past.get(request.session_id)
                if session is not None:
                    return session.snapshot()
                return past if past is not None else cels_pb2.SessionState(session_id=request.session_id, state="unknown")
            session = self.session(request.session_id)
            try:
                session.begin() if request.kind == cels_pb2.SessionSignal.BEGIN else session.finish()
            except (Refused, ProtocolError):
                raise
            except Exception as exc:
                session.abort(self.config.name, f"{type(exc).__name__}: {exc}")
                raise Refused(grpc.StatusCode.INTERNAL, f"{self.config.name}: {type(exc).__name__}: {exc}") from None
            return session.snapshot()
        except ProtocolError as exc:
            context.abort(STATUS[exc.code], f"{self.config.name}: {exc}")
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")

    def Run(self, request: cels_pb2.RunRequest, context: grpc.ServicerContext) -> Iterator[cels_pb2.RunEvent]:
        """Start a session as its initiator; stream progress, then the output and the report."""
        try:
            self.authenticate(context, None, set(self.config.controllers))
            config = cels_pb2.SessionConfig()
            config.CopyFrom(request.config)
            if not config.session_id:
                config.session_id = secrets.token_hex(8)
            if not config.initiator:
                config.initiator = self.config.name
            session = self.open_session(config, initiator=self.config.name)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        context.add_callback(lambda: session.abort("controller", "the cels run client went away"))
        yield from self._initiate(session, request.output_name or "sanitized.out")

    def Status(self, request: cels_pb2.NodeStatusRequest, context: grpc.ServicerContext) -> cels_pb2.NodeStatus:
        """The node key for peers; with the obfuscator stock for controllers only (how many
        obfuscators a session used tells its message sizes, e.g. the universe size)."""
        try:
            caller = self.authenticate(context, None, set(self.config.peers) | set(self.config.controllers))
        except Refused as exc:
            context.abort(exc.code, str(exc))
        with self.lock:
            running = len(self.sessions)
        return self.keys.status(running, with_stock=caller in self.config.controllers)

    def _initiate(self, session: Session, output_name: str) -> Iterator[cels_pb2.RunEvent]:
        me = self.config.name
        start = Envelope(session_id=session.id, sender=me, start_session=cels_pb2.StartSession(config=session.config))
        t0 = time.perf_counter()
        target = me
        try:
            for target in session.others:
                frames = to_frames(start, 0)
                self.peers.deliver(target, frames, session.deadline)
                session.bytes_sent["start_session"] += sum(f.ByteSize() for f in frames)
                session.messages_sent["start_session"] += 1
            for target in session.others:
                self.peers.signal(target, session.id, cels_pb2.SessionSignal.BEGIN, session.deadline)
            target = me
            session.begin()
        except grpc.RpcError as exc:
            session.abort(target, f"{exc.code().name}: {exc.details()}")
        except Exception as exc:  # the initiator's own role or state failed
            session.abort(me, f"{type(exc).__name__}: {exc}")
        while True:
            kind, value = session.events.get()
            if kind == "progress":
                yield cels_pb2.RunEvent(progress=value)
            elif kind == "aborted":
                yield cels_pb2.RunEvent(aborted=value)
                return
            elif kind == "done":
                break
        try:
            states = self._finish_everywhere(session)
            report = dict(getattr(session.role, "report", None) or {})
            output = getattr(session.role, "output", None)
            session.finish()
        except (grpc.RpcError, Refused) as exc:
            detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
            session.abort(me, f"finishing the session failed: {detail}")
            yield cels_pb2.RunEvent(aborted=cels_pb2.Abort(session_id=session.id, origin=me, reason=detail))
            return
        while not session.events.empty():  # progress reported while the others finished
            kind, value = session.events.get_nowait()
            if kind == "progress":
                yield cels_pb2.RunEvent(progress=value)
        report["session_id"] = session.id
        report["wall_seconds"] = time.perf_counter() - t0
        report["wire"] = wire_report(states)
        with tempfile.TemporaryDirectory(prefix="cels-output-") as tmp:
            path = Path(tmp) / Path(output_name).name
            if self.output_writer is None or output is None:
                raise RuntimeError(f"{me}: the session ended without an output to write")
            self.output_writer(output, path)
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK_BYTES):
                    yield cels_pb2.RunEvent(output_chunk=chunk)
        yield cels_pb2.RunEvent(report_json=json.dumps(report, default=_json_default))

    def _finish_everywhere(self, session: Session) -> dict[str, cels_pb2.SessionState]:
        """Send what is queued, then FINISH every other node and collect their counters."""
        session.drain()
        if session.state == "aborted":
            raise Refused(grpc.StatusCode.ABORTED, f"{session.origin}: {session.reason}")
        states = {self.config.name: session.snapshot()}
        for peer in session.others:
            states[peer] = self.peers.signal(peer, session.id, cels_pb2.SessionSignal.FINISH, session.deadline)
        return states


def wire_report(states: dict[str, cels_pb2.SessionState]) -> dict[str, Any]:
    """Bytes and messages every node put on the wire (frames included), per step message."""
    nodes = {
        name: {
            "bytes_sent": dict(sorted(state.bytes_sent.items())),
            "messages_sent": dict(sorted(state.messages_sent.items())),
            "bytes_total": sum(state.bytes_sent.values()),
            "busy_seconds": round(state.busy_seconds, 6),
        }
        for name, state in states.items()
    }
    return {"nodes": nodes, "bytes_total": sum(n["bytes_total"] for n in nodes.values())}


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
