"""The ``CelsNode`` gRPC service: a node's sessions (cels.node.sessions) behind mutual TLS.

``Deliver`` reassembles an envelope, checks that the certificate names its sender, and gives
it to the host inside the call (a ProtocolError becomes FAILED_PRECONDITION / INVALID_ARGUMENT
for the sender).  What the host returns goes to the session's outbox (cels.node.link), one
thread that sends in order and waits for each call, so every node sees messages in causal
order.  ``Signal`` takes BEGIN, FINISH and the watchdog's PROBE; ``Run`` starts a session as
its initiator and streams it (cels.node.initiator); ``Status`` serves the node key, and its
operators the stock, sessions and ledger.

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

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from cels.crypto.key_sizes import DEFAULT_KEY_BITS
from cels.node.settings import NodeConfig
from cels.node.framing import from_frames
from cels.node.handlers import Unparsed, add_node_service
from cels.node.health import add_health
from cels.node.initiator import OutputWriter, follow
from cels.node.keys import NodeKeys
from cels.node.ledger import Ledger
from cels.node.peers import ABORT_METADATA, PeerClients, Refused
from cels.node.session_store import SessionStore, list_resumable
from cels.node.sessions import NOTICE_SECONDS, SessionDriver
from cels.node.telemetry import CountingPool, NodeTelemetry
from cels.node.tls import peer_identity, server_credentials, warn_insecure
from cels.protocol.aborts import CANCELLED, DIED
from cels.protocol.hosted import Screen
from cels.protocol.host import SessionHost
from cels.protocol.options import SessionOptions
from cels.protocol.phases import SessionState
from cels.protocol.roles import SEND_WINDOW, ProtocolError, Refusal, Role, check_session_id, malformed, quoted
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from cels.protocol.wire.codec import state_to_wire

log = logging.getLogger("cels.node")

NodeRoleFactory = Callable[[SessionOptions, NodeKeys], Role]
"""This node's role for a session; ``keys``: the node key pair and obfuscators (cels.node.keys)."""
STATUS = {ProtocolError.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION, ProtocolError.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT}
SIGNALS = {cels_pb2.SessionSignal.PROBE, cels_pb2.SessionSignal.BEGIN, cels_pb2.SessionSignal.FINISH}
SERVER_POOL = 32
"""Threads serving RPCs at most (started on demand, ended after idle seconds: cels.node.pool); a
held out-of-order message occupies one."""
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
"""gRPC sets SO_REUSEPORT on its listeners by default, so a second node on a taken address
would bind it too and share its connections; without it the second node cannot serve (exit 1)."""


class Node(SessionDriver, cels_pb2_grpc.CelsNodeServicer):
    """A party or solver node: its sessions (SessionDriver), its keys, its gRPC server."""

    def __init__(
        self, config: NodeConfig, factory: NodeRoleFactory, output_writer: OutputWriter | None = None, *, encrypts: bool = False,
        ledger: Ledger | None = None, session_ended: Callable[[str], object] | None = None, on_stop: Callable[[], object] | None = None,
        screen: Screen | None = None, store: SessionStore | None = None,
    ) -> None:
        """``output_writer``: a party's (the solver writes no output); ``ledger``: a party's
        privacy budget ledger, reported to its operators (cels.node.telemetry);
        ``session_ended(session_id)`` is called once when a session ends here, done or aborted
        (the party node's ledger releases its reservation, cels.node.ledger); ``on_stop()`` last
        when the node stops (a party's engine shuts its Ray workers down, cels.engine);
        ``screen``: a party's policy on a new session, before anything is read or reserved, and
        whether its operator approves it first (cels.node.policy); ``store``: the unfinished
        sessions' keys, for a re-run after a restart (cels.node.session_store)."""
        from cels.views import record_views

        self.output_writer, self.on_stop = output_writer, on_stop
        telemetry = NodeTelemetry(config.name, "party" if output_writer is not None else "solver", ledger)
        peers = PeerClients(config, on_sent=telemetry.frames_sent)
        keys = NodeKeys(config.name, list(config.peers), config.keys, peers.status, allow_insecure_key_bits=config.min_key_bits < DEFAULT_KEY_BITS, encrypts=encrypts)

        def refusing(check: Callable[[SessionOptions], Any]) -> Callable[[SessionOptions], Any]:
            def checked(options: SessionOptions) -> Any:
                try:
                    return check(options)
                except (ValueError, OSError) as exc:  # the host refuses the session with this reason
                    self.telemetry.session_refused(options.session_id, options.initiator, str(exc))
                    raise

            return checked

        def screened(options: SessionOptions) -> bool:
            self._admit(options)
            return screen is not None and screen(options)

        make_role = refusing(lambda options: factory(options, self.keys))
        roles = record_views(make_role, config.record_view) if config.record_view else make_role
        kept = store is not None and store.directory is not None
        host = SessionHost(config.name, roles, time.perf_counter, send_window=SEND_WINDOW, screen=refusing(screened), record=store.record if kept else None)
        super().__init__(config, host, peers, keys, telemetry, session_ended, store)
        self.server: grpc.Server | None = None

    def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        pool = CountingPool(SERVER_POOL, thread_name_prefix=self.config.name)
        self.telemetry.watch_pool(pool)
        self.server = grpc.server(pool, options=SERVER_OPTIONS)
        add_node_service(self, self.server)  # requests parsed in the handlers: garbage gets INVALID_ARGUMENT
        known = None if self.config.insecure else {*self.config.peers, *self.config.controllers, self.config.name}
        add_health(self.server, self.keys, known)  # SERVING once the node key exists, to known callers only (cels.node.health)
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
        for session_id in list(self.links):
            if not self.host.hosted(session_id).finished:
                self.abort(session_id, self.config.name, DIED, "node shutting down")
        limit = time.monotonic() + NOTICE_SECONDS
        for notice in list(self.notices):
            notice.join(max(0.0, limit - time.monotonic()))
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
        self.keys.close()
        self.peers.close()
        self.telemetry.close()
        if self.on_stop is not None:
            self.on_stop()

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

    # -- RPCs --------------------------------------------------------------------------------
    def Deliver(self, request_iterator: Iterator[cels_pb2.Frame], context: grpc.ServicerContext) -> cels_pb2.Ack:
        try:
            envelope, size = from_frames(request_iterator, self.config.max_message_mib << 20)
            sender = self.authenticate(context, envelope.sender, set(self.config.peers))
            self.telemetry.frames_received(sender, envelope.session_id, size)
            self.take(sender, envelope)
            awaiting = envelope.HasField("start_session") and self.host.state(envelope.session_id)[0] == SessionState.AWAITING_APPROVAL
            return cels_pb2.Ack(session_id=envelope.session_id, awaiting_approval=awaiting)
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
                threading.Thread(target=self.begin, args=(sid,), name=f"begin-{sid}", daemon=True).start()
            elif request.kind == cels_pb2.SessionSignal.FINISH:
                self.finish(sid)
            return self.session_state(sid)
        except ProtocolError as exc:
            self.refuse(context, exc)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")

    def session_state(self, session_id: str) -> cels_pb2.SessionState:
        """A session as this node knows it: live, its final state once ended, else UNKNOWN."""
        link = self.link(session_id)
        if link is None:
            return cels_pb2.SessionState(session_id=session_id, state=state_to_wire(SessionState.UNKNOWN))
        return link.snapshot() if session_id in self.links else link.final

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
        status = self.keys.status(len(self.links), with_stock=caller in operators)
        if caller in operators:
            status.sessions.extend(self.telemetry.sessions())
            list_resumable(status, self.store, self.links)
            ledger = self.telemetry.ledger_status()
            if ledger is not None:
                status.ledger.CopyFrom(ledger)
        return status

    def Decide(self, request: cels_pb2.ApprovalDecision, context: grpc.ServicerContext) -> cels_pb2.SessionState:
        """This node's operator (its controllers, or its own certificate: ``cels approve``)
        approves or rejects a session that awaits it; the session's state after."""
        try:
            caller = self.authenticate(context, None, {*self.config.controllers, self.config.name})
            if isinstance(request, Unparsed):
                raise malformed(str(request))
            check_session_id(request.session_id)
            self.decide(request.session_id, request.approve)
            log.warning("%s: session %s %s by %s", self.config.name, request.session_id, "approved" if request.approve else "rejected", caller)
            return self.session_state(request.session_id)
        except ProtocolError as exc:
            self.refuse(context, exc, controller=True)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        raise AssertionError("unreachable")

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
            self.call(lambda now: self.host.initiate(options, now), options.session_id)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.config.name}: bad session config: {exc}")
        except ProtocolError as exc:
            self.refuse(context, exc, controller=True)
        except Refused as exc:
            context.abort(exc.code, str(exc))
        sid = options.session_id
        context.add_callback(lambda: self.abort(sid, self.config.name, CANCELLED, "its cels run client went away"))
        yield from follow(self, self.link(sid), self.output_writer, request.output_name or "sanitized.out")
