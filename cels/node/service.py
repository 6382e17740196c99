"""The ``CelsNode`` gRPC service: a SessionHost (cels.protocol.host) behind mutual TLS.

The host owns every session's lifecycle; this adapter keeps delivery, threads, TLS and the
watchdog.  ``Deliver`` reassembles an envelope, checks that the certificate names its sender,
and gives it to the host inside the call (a ProtocolError becomes FAILED_PRECONDITION /
INVALID_ARGUMENT for the sender).  What the host returns goes to the session's outbox, one
thread that sends in order and waits for each call, so every node sees messages in causal
order.  gRPC keeps one sender's messages in order but not those of different senders: a
message the host refuses as out of order is retried whenever the host has taken another one,
for at most a reorder window, and only then refused.

Failure: a refused or undeliverable message, a peer that stops answering the watchdog's probes
or reports the session aborted, a session that never begins or stops moving (the host's
timers) aborts the session here, and the host's Abort notices go to every other node.  A
refusal carries the Abort its sender should end the session with as trailing metadata
(cels.node.peers.ABORT_METADATA): a delivery refused because the recipient's session is
aborted already blames the node that aborted it, not the recipient, and no node reads an
origin out of an error's text.  What a peer is told is generic (cels.protocol.aborts); the
details go to this node's log, one line per abort.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from cels.crypto.paillier import DEFAULT_KEY_BITS
from cels.node.config import NodeConfig
from cels.node.wire import PeerPhase, Wire, hold_seconds
from cels.node.framing import CHUNK_BYTES, from_frames, to_frames
from cels.node.handlers import Unparsed, add_node_service
from cels.node.health import add_health
from cels.node.keys import NodeKeys
from cels.node.ledger import Ledger
from cels.node.peers import ABORT_METADATA, PeerClients, Refused, call_abort, rpc_text
from cels.node.telemetry import CountingPool, NodeTelemetry
from cels.node.tls import peer_identity, server_credentials, warn_insecure
from cels.protocol.aborts import BEFORE_START, CANCELLED, DIED, PROTOCOL_ERROR, UNREACHABLE, abort_notice, describe
from cels.protocol.phases import Phase, SessionState
from cels.protocol.host import ABORTED, DONE, KEPT_STATES, Effects, Event, SessionHost
from cels.protocol.options import SessionOptions
from cels.protocol.roles import Envelope, ProtocolError, Refusal, Role, check_session_id, malformed, quoted, step_name
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

log = logging.getLogger("cels.node")

NodeRoleFactory = Callable[[SessionOptions, NodeKeys], Role]
"""This node's role for a session; ``keys``: the node key pair and obfuscators (cels.node.keys)."""
OutputWriter = Callable[[Any, Path], None]
"""Writes the initiator role's ``output`` to a file (the party node writes the log's format)."""
STATUS = {ProtocolError.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION, ProtocolError.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT}
SIGNALS = {cels_pb2.SessionSignal.PROBE, cels_pb2.SessionSignal.BEGIN, cels_pb2.SessionSignal.FINISH}
REFUSALS = {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
"""The codes a node refuses with; a FINISH failing with any other (UNAVAILABLE, DEADLINE_EXCEEDED,
CANCELLED by a stopping server, ...) means the peer is gone, not that it refuses."""
SERVER_POOL = 32
"""Threads serving RPCs at most (started on demand, ended after idle seconds: cels.node.pool); a
held out-of-order message occupies one."""
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
"""gRPC sets SO_REUSEPORT on its listeners by default, so a second node on a taken address
would bind it too and share its connections; without it the second node cannot serve (exit 1)."""
NOTICE_SECONDS = 5.0
"""Deadline of an Abort notice to a peer; a stopping node waits this long for its notices."""


class Node(cels_pb2_grpc.CelsNodeServicer):
    """A party or solver node: its SessionHost, the wires of its sessions, its keys."""

    def __init__(
        self, config: NodeConfig, factory: NodeRoleFactory, output_writer: OutputWriter | None = None, *, encrypts: bool = False,
        ledger: Ledger | None = None, session_ended: Callable[[str], object] | None = None,
    ) -> None:
        """``output_writer``: a party's (the solver writes no output); ``ledger``: a party's
        privacy budget ledger, reported to its operators (cels.node.telemetry);
        ``session_ended(session_id)`` is called once when a session ends here, done or aborted
        (the party node's ledger releases its reservation, cels.node.ledger)."""
        from cels.views import record_views

        self.config, self.output_writer, self.session_ended = config, output_writer, session_ended
        self.telemetry = NodeTelemetry(config.name, "party" if output_writer is not None else "solver", ledger)
        self.peers = PeerClients(config, on_sent=self.telemetry.frames_sent)
        self.keys = NodeKeys(config.name, list(config.peers), config.keys, self.peers.status, allow_insecure_key_bits=config.min_key_bits < DEFAULT_KEY_BITS, encrypts=encrypts)
        def make_role(options: SessionOptions) -> Role:
            try:
                self._admit(options)
                return factory(options, self.keys)
            except (ValueError, OSError) as exc:  # the host refuses the session with this reason
                self.telemetry.session_refused(options.session_id, options.initiator, str(exc))
                raise

        self.host = SessionHost(config.name, record_views(make_role, config.record_view) if config.record_view else make_role, time.perf_counter)
        self.wires: dict[str, Wire] = {}
        self.ended_wires: OrderedDict[str, Wire] = OrderedDict()
        self.lock = threading.Lock()  # the host: one call at a time
        self.changed = threading.Condition(self.lock)
        self.server: grpc.Server | None = None
        self.notices: list[threading.Thread] = []  # Abort notices in flight

    def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        pool = CountingPool(SERVER_POOL, thread_name_prefix=self.config.name)
        self.telemetry.watch_pool(pool)
        self.server = grpc.server(pool, options=SERVER_OPTIONS)
        add_node_service(self, self.server)  # requests parsed in the handlers: garbage gets INVALID_ARGUMENT
        add_health(self.server, self.keys)  # SERVING once the node key exists (cels.node.health)
        try:
            if self.config.insecure:
                warn_insecure(self.config.name)
                port = self.server.add_insecure_port(self.config.listen)
            else:
                port = self.server.add_secure_port(self.config.listen, server_credentials(self.config.ca, self.config.cert, self.config.key))
        except RuntimeError:  # grpcio raises when no address binds
            port = 0
        if port == 0:
            raise OSError(f"{self.config.name}: cannot listen on {self.config.listen} (the address is taken, or not this host's)")
        if self.config.metrics_listen is not None:  # before serving: a taken port stops the node at start-up
            metrics_port = self.telemetry.serve(self.config.metrics_listen)
            log.info("%s: metrics on http://%s:%d/metrics", self.config.name, self.config.metrics_listen.rpartition(":")[0], metrics_port)
        self.server.start()
        self.keys.start()
        log.info("%s: serving on %s", self.config.name, self.config.listen)
        return port

    def stop(self, grace: float = 1.0) -> None:
        """Abort every session whose part on this node is not over, let the Abort notices
        reach the peers (at most NOTICE_SECONDS), then stop serving.  A session whose part is
        over is left to the initiator's FINISH (a node gone then does not void the release)."""
        for session_id in list(self.wires):
            if not self.host.role(session_id).finished:
                self.abort(session_id, self.config.name, DIED, "node shutting down")
        limit = time.monotonic() + NOTICE_SECONDS
        for notice in list(self.notices):
            notice.join(max(0.0, limit - time.monotonic()))
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
        self.keys.close()
        self.peers.close()
        self.telemetry.close()

    def wait(self) -> None:
        assert self.server is not None
        self.server.wait_for_termination()

    def authenticate(self, context: grpc.ServicerContext, claimed: str | None, allowed: set[str]) -> str:
        """The caller's node name: one its certificate carries and ``allowed`` contains."""
        names = {claimed} if self.config.insecure else {self.identify(context)}
        if claimed is not None and claimed not in names:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"message claims sender {quoted(claimed)} but the certificate names {sorted(names)}")
        known = (names & {claimed} if claimed is not None else names) & allowed
        if not known and not (self.config.insecure and claimed is None):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{self.config.name} does not expect a peer named {sorted(n for n in names if n)}")
        return sorted(known)[0] if known else "?"

    def identify(self, context: grpc.ServicerContext) -> str:
        """The caller's one name; a node (a peer) must also be able to serve (EKU serverAuth)."""
        try:
            identity = peer_identity(context)
        except ValueError as exc:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"{self.config.name} refuses the caller's certificate: {exc}") from None
        if identity.name in self.config.peers and not identity.serves:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"{self.config.name} refuses {identity.name!r}: a node's certificate needs extended key usage serverAuth too")
        return identity.name

    # -- the host, and acting on what it returns ---------------------------------------------
    def call(self, action: Callable[[float], Effects], session_id: str = "") -> Effects:
        """One host call under the lock; then act on its effects."""
        with self.lock:
            wire = self.wires.get(session_id)
            if wire is not None:
                wire.busy = True
            try:
                effects = action(time.monotonic())
            finally:
                if wire is not None:
                    wire.busy = False
                self.host.touch(session_id, time.monotonic())  # a long step is not a stall
                self.changed.notify_all()
            self._act(effects)
        return effects

    def _act(self, effects: Effects) -> None:
        for event in effects.events:
            self._event(event)
        for recipient, envelope in effects.messages:
            wire = self.wires.get(envelope.session_id)
            if envelope.WhichOneof("step") == "abort" or wire is None:
                notice = threading.Thread(target=self.peers.try_deliver, args=(recipient, envelope, NOTICE_SECONDS), daemon=True)
                notice.start()
                self.notices = [n for n in self.notices if n.is_alive()] + [notice]
            else:
                wire.outbox.put((recipient, envelope))

    def _event(self, event: Event) -> None:
        name, sid = self.config.name, event.session_id
        if event.kind == "created":
            self.wires[sid] = Wire(self, self.host.role(sid).options)
            self.keys.session_started()
            self.telemetry.session_created(sid, self.wires[sid].options.initiator)
        elif event.kind == "phase":
            log.info("%s: session %s: %s done in %.2f s, now %s", name, sid, event.old, event.seconds, event.phase)
            self.telemetry.session_phase(sid, event.old, event.phase)
        elif event.kind in (ABORTED, DONE):
            notice = event.abort
            self.telemetry.session_ended(sid, event.kind, notice.origin if notice else "", describe(notice) if notice else "")
            if notice is not None:  # one line: what the peers were told, then this node's own details
                log.warning("%s: session %s aborted: %s%s", name, sid, describe(notice), f"; {event.detail}" if event.detail else "")
            else:
                log.info("%s: session %s %s", name, sid, event.kind)
            if self.session_ended is not None:
                self.session_ended(sid)
            wire = self.wires.pop(sid, None)
            if wire is not None:
                wire.stopped.set()
                wire.outbox.put(None)
                self.keys.session_ended()
                wire.final = wire.snapshot()
                self.ended_wires[sid] = wire
                while len(self.ended_wires) > KEPT_STATES:
                    self.ended_wires.popitem(last=False)
        wire = self.wires.get(sid) or self.ended_wires.get(sid)
        if wire is not None and wire.options.initiator == name:
            wire.events.put(event)

    def take(self, sender: str, envelope: Envelope) -> None:
        """Give an envelope to the host, holding back one refused as out of order (module doc)."""
        limit = time.monotonic() + hold_seconds(self.host.sessions[envelope.session_id].options.deadline) if envelope.session_id in self.host.sessions else 0
        while True:
            try:
                self.call(lambda now: self._deliver(sender, envelope, now), envelope.session_id)
                return
            except ProtocolError as exc:
                if exc.code != ProtocolError.FAILED_PRECONDITION or step_name(envelope) in ("start_session", "abort") or time.monotonic() >= limit:
                    raise
                with self.changed:
                    self.changed.wait(limit - time.monotonic())

    def _deliver(self, sender: str, envelope: Envelope, now: float) -> Effects:
        effects = self.host.deliver(sender, envelope, now)
        wire = self.wires.get(envelope.session_id)
        if step_name(envelope) == "step_report" and wire is not None:
            wire.events.put(envelope.step_report)  # the initiator streams it, before "finished"
        return effects

    def abort(self, session_id: str, origin: str, kind: int, reason: str, detail: str = "", unless: Callable[[Role], bool] | None = None) -> None:
        """Abort the session naming ``origin`` (``kind``, generic ``reason``; ``detail`` for this
        node's log); not if ``unless(role)`` holds under the host lock."""

        def act(now: float) -> Effects:
            if unless is not None and session_id in self.host.sessions and unless(self.host.role(session_id)):
                return Effects()
            return self.host.abort(session_id, origin, kind, reason, now, detail)

        self.call(act, session_id)

    def adopt(self, session_id: str, notice: cels_pb2.Abort, detail: str = "") -> None:
        """Abort the session with an Abort another node made (a refusal's, a probe's)."""
        self.call(lambda now: self.host.adopt(session_id, notice, now, detail), session_id)

    def phase(self, session_id: str) -> str:
        """This node's phase in a session (the phase an abort it sees is reported in)."""
        return self.host.role(session_id).phase

    def refuse(self, context: grpc.ServicerContext, exc: ProtocolError, controller: bool = False) -> None:
        """Refuse a call with a ProtocolError: its status code, its message naming this node
        once, and its Abort (if any) as trailing metadata for the caller to end the session with.
        Its ``detail`` goes to this node's log, and to the caller only if it is this node's
        ``controller``."""
        if exc.abort is not None:
            context.set_trailing_metadata(((ABORT_METADATA, exc.abort.SerializeToString()),))
        text = str(exc)
        text = text if text.startswith(f"{self.config.name}: ") else f"{self.config.name}: {text}"
        if exc.detail:
            log.warning("%s (%s)", text, exc.detail)
            text = f"{text} ({exc.detail})" if controller else text
        context.abort(STATUS[exc.code], text)

    def expire(self) -> None:
        self.call(self.host.expire)

    # -- RPCs --------------------------------------------------------------------------------
    def Deliver(self, request_iterator: Iterator[cels_pb2.Frame], context: grpc.ServicerContext) -> cels_pb2.Ack:
        try:
            envelope, size = from_frames(request_iterator)
            sender = self.authenticate(context, envelope.sender, set(self.config.peers))
            self.telemetry.frames_received(sender, envelope.session_id, size)
            self.take(sender, envelope)
            return cels_pb2.Ack(session_id=envelope.session_id)
        except ProtocolError as exc:
            self.refuse(context, exc)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")  # context.abort raises

    def _admit(self, options: SessionOptions) -> None:
        """This node's policy on a new session (ValueError refuses it): its peers, its smallest
        key size."""
        unknown = [n for n in options.nodes if n != self.config.name and n not in self.config.peers]
        if unknown:
            raise Refusal("a node of the session is not its peer", f"{self.config.name} has no peer named {', '.join(unknown)}")
        if options.key_bits < self.config.min_key_bits:
            raise Refusal(
                "keys below its minimum size",
                f"{self.config.name} refuses {options.key_bits}-bit keys (minimum {self.config.min_key_bits}; smaller keys only to reproduce the paper, --min-key-bits)",
            )

    def Signal(self, request: cels_pb2.SessionSignal, context: grpc.ServicerContext) -> cels_pb2.SessionState:
        try:
            self.authenticate(context, None, set(self.config.peers))
            if isinstance(request, Unparsed):
                raise malformed(str(request))
            check_session_id(request.session_id)
            if request.kind not in SIGNALS:
                raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"unknown signal kind {request.kind}")
            sid = request.session_id
            if request.kind == cels_pb2.SessionSignal.BEGIN:  # refused now, or begun in the background
                with self.lock:
                    self.host.check(sid, "begin")
                threading.Thread(target=self._begin, args=(sid,), name=f"begin-{sid}", daemon=True).start()
            elif request.kind == cels_pb2.SessionSignal.FINISH:
                self.call(lambda now: self.host.finish(sid, now), sid)
            wire = self.wires.get(sid) or self.ended_wires.get(sid)
            if wire is None:
                return cels_pb2.SessionState(session_id=sid, state=SessionState.UNKNOWN)
            return wire.snapshot() if sid in self.wires else wire.final
        except ProtocolError as exc:
            self.refuse(context, exc)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")

    def _begin(self, session_id: str) -> None:
        """BEGIN's work (the log's load and the first hashes: seconds at scale) off the Signal
        call, so that the initiator's BEGINs start every party at once, not one after another.
        A role failure aborts the session (host); a refusal here means it ended meanwhile."""
        try:
            self.call(lambda now: self.host.begin(session_id, now), session_id)
        except ProtocolError as exc:
            log.info("%s: session %s not begun: %s", self.config.name, session_id, exc)

    def Status(self, request: cels_pb2.NodeStatusRequest, context: grpc.ServicerContext) -> cels_pb2.NodeStatus:
        """The node key for peers; for its operators only (controllers, and whoever holds this
        node's own certificate: ``cels status``) also the obfuscator stock (how many obfuscators
        a session used tells its message sizes, e.g. the universe size), its sessions and a
        party's ledger."""
        operators = {*self.config.controllers, self.config.name}
        try:
            caller = self.authenticate(context, None, set(self.config.peers) | operators)
            if isinstance(request, Unparsed):
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(request))
        except Refused as exc:
            context.abort(exc.code, str(exc))
        status = self.keys.status(len(self.wires), with_stock=caller in operators)
        if caller in operators:
            status.sessions.extend(self.telemetry.sessions())
            ledger = self.telemetry.ledger_status()
            if ledger is not None:
                status.ledger.CopyFrom(ledger)
        return status

    def Run(self, request: cels_pb2.RunRequest, context: grpc.ServicerContext) -> Iterator[cels_pb2.RunEvent]:
        """Start a session as its initiator; stream progress, then the output and the report."""
        try:
            self.authenticate(context, None, set(self.config.controllers))
            if isinstance(request, Unparsed):
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(request))
            config = cels_pb2.SessionConfig()
            config.CopyFrom(request.config)
            options = SessionOptions.from_config(config)
            if options.initiator != self.config.name:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"session {options.session_id} names initiator {options.initiator!r}, not {self.config.name!r}")
            self.call(lambda now: self.host.create(options, now), options.session_id)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.config.name}: bad session config: {exc}")
        except ProtocolError as exc:
            self.refuse(context, exc, controller=True)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        sid = options.session_id
        context.add_callback(lambda: self.abort(sid, self.config.name, CANCELLED, "its cels run client went away"))
        yield from self._initiate(self.wires[options.session_id], request.output_name or "sanitized.out")

    def _initiate(self, wire: Wire, output_name: str) -> Iterator[cels_pb2.RunEvent]:
        me, sid, t0 = self.config.name, wire.id, time.perf_counter()
        start = Envelope(session_id=sid, sender=me, start_session=cels_pb2.StartSession(config=wire.options.to_config()))
        target, what = me, "start_session"
        try:
            for target in wire.others:
                frames = to_frames(start, 0)
                self.peers.deliver(target, frames, wire.deadline)
                wire.bytes_sent["start_session"] += sum(f.ByteSize() for f in frames)
                wire.messages_sent["start_session"] += 1
            what = "BEGIN"
            for target in wire.others:
                self.peers.signal(target, sid, cels_pb2.SessionSignal.BEGIN, wire.deadline)
            target = me
            self.call(lambda now: self.host.begin(sid, now), sid)
        except grpc.RpcError as exc:
            started = what != "start_session"
            notice = call_abort(sid, target, what, exc, self.phase(sid) if started else BEFORE_START, joined=started)
            self.adopt(sid, notice, f"{what} to {target} at {self.config.peers.get(target)} failed: {rpc_text(exc)}")
        except Refused as exc:  # no address for a node of the session
            self.abort(sid, target, UNREACHABLE, "this node has no address for it", str(exc))
        except ProtocolError:  # a peer aborted it before it began (e.g. its log failed to load)
            pass  # the host queued that abort, with its origin, as this wire's event
        while not isinstance(event := wire.events.get(), Event) or event.kind not in ("finished", ABORTED):
            if isinstance(event, cels_pb2.StepReport):  # a node left a phase (its report)
                yield cels_pb2.RunEvent(progress=event)
            elif isinstance(event, PeerPhase) and event.phase not in (Phase.OVER, Phase.FAILED):
                yield cels_pb2.RunEvent(phase_start=cels_pb2.StepReport(session_id=sid, node=event.node, phase=event.phase, seconds=event.seconds))
            elif isinstance(event, Event) and event.kind == "phase":  # this node, the initiator
                if event.old not in (Phase.READY, Phase.OVER):
                    yield cels_pb2.RunEvent(progress=cels_pb2.StepReport(session_id=sid, node=me, phase=event.old, seconds=event.seconds, bytes_sent=event.bytes_sent))
                if event.phase not in (Phase.OVER, Phase.FAILED):
                    since = time.monotonic() - wire.started
                    yield cels_pb2.RunEvent(phase_start=cels_pb2.StepReport(session_id=sid, node=me, phase=event.phase, seconds=since))
        if event.kind == ABORTED:
            yield cels_pb2.RunEvent(aborted=event.abort)
            return
        wire.outbox.join()
        role = self.host.role(sid)
        states, gone = {me: wire.snapshot()}, {}
        for peer in wire.others:
            try:
                states[peer] = self.peers.signal(peer, sid, cels_pb2.SessionSignal.FINISH, wire.deadline)
            except grpc.RpcError as exc:
                if exc.code() in REFUSALS:  # the peer refuses: its part is not over, or it aborted
                    notice = call_abort(sid, peer, "FINISH", exc, role.phase)
                    self.adopt(sid, notice, f"FINISH at {peer} failed: {rpc_text(exc)}")
                    yield cels_pb2.RunEvent(aborted=notice)
                    return
                gone[peer] = rpc_text(exc)  # its part was over (its last report arrived): the release stands
        try:
            self.call(lambda now: self.host.finish(sid, now), sid)
        except ProtocolError as exc:  # aborted meanwhile (a controller that went away, shutdown)
            yield cels_pb2.RunEvent(aborted=exc.abort or abort_notice(sid, me, PROTOCOL_ERROR, "cannot finish", role.phase))
            return
        report = {**(role.report or {}), "session_id": sid, "wall_seconds": time.perf_counter() - t0, "wire": wire_report(states)}
        if gone:
            report["unreachable_at_finish"] = gone
        with tempfile.TemporaryDirectory(prefix="cels-output-") as tmp:
            path = Path(tmp) / Path(output_name).name
            self.output_writer(role.output, path)
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK_BYTES):
                    yield cels_pb2.RunEvent(output_chunk=chunk)
        yield cels_pb2.RunEvent(report_json=json.dumps(report, default=_json_default))


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
