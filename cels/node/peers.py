"""A node's gRPC channels to its peers, the refusal it answers a call with, and what a failed
call to a peer means for the session (an Abort: structured, never parsed from the details)."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from cels.node.settings import NodeConfig
from cels.node.framing import to_frames
from cels.node.tls import open_channel
from cels.protocol.aborts import DEADLINE, DIED, PROTOCOL_ERROR, REFUSED, UNREACHABLE, abort_notice, peer_abort
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

log = logging.getLogger("cels.node")
ABORT_METADATA = "cels-abort-bin"
"""Trailing metadata of a refusal: the serialised Abort the caller ends the session with (the
session is aborted at the callee already, or the callee refuses it)."""
CALL_FAILURES = {
    grpc.StatusCode.UNAVAILABLE: (UNREACHABLE, "did not answer"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (DEADLINE, "did not answer within the deadline"),
    grpc.StatusCode.CANCELLED: (DIED, "dropped the call"),
    grpc.StatusCode.PERMISSION_DENIED: (REFUSED, "refused the caller"),
    grpc.StatusCode.UNAUTHENTICATED: (REFUSED, "refused the caller's certificate"),
}
"""What a failed call to a peer says about that peer (any other code: it refused the message,
a protocol error)."""


TLS_REFUSALS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("certificate has expired", "CERTIFICATE_EXPIRED"), "a certificate has expired (the node's, or this side's)"),
    (("BAD_SIGNATURE", "certificate signature failure", "unable to get local issuer"),
     "its certificate is signed by another CA than this side's ca.pem"),
    (("Hostname Verification Check failed",), "its certificate names another node: a node other than the one asked for answers at that address"),
    (("Socket closed",), "it closed the TLS handshake: it refuses this side's certificate (signed by another CA, expired, or not one it serves)"),
)  # fmt: skip
"""What gRPC's text of a failed TLS handshake means (grpcio 1.7x with BoringSSL, measured:
tests/test_nodes.py), in the order they are tried; no digit (an Abort's reason)."""


def tls_refusal(exc: grpc.RpcError) -> str | None:
    """One line on why a call's TLS handshake failed, or None if the call failed otherwise: a
    refused handshake does not mend by waiting."""
    details = exc.details() or ""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    return next((f"TLS handshake refused: {why}" for marks, why in TLS_REFUSALS if any(mark in details for mark in marks)), None)


def rpc_text(exc: grpc.RpcError) -> str:
    """A failed call as one line (its str() is a multi-line dump)."""
    return f"{exc.code().name}: {exc.details()}"


def sent_abort(exc: grpc.RpcError) -> cels_pb2.Abort | None:
    """The Abort a refusal carries (ABORT_METADATA), if any."""
    for key, value in exc.trailing_metadata() or ():
        if key == ABORT_METADATA:
            try:
                return cels_pb2.Abort.FromString(value)
            except DecodeError:
                return None
    return None


def call_abort(session_id: str, peer: str, what: str, exc: grpc.RpcError, phase: Phase | None, joined: bool = True) -> cels_pb2.Abort:
    """The Abort a failed call to ``peer`` (``what``: e.g. "delivering sum_hop", "BEGIN")
    ends the session with: the one the refusal carries, else one blaming ``peer`` by the
    call's status code (a peer that ``joined`` the session and no longer answers died).  The
    refusal's details stay in this node's log."""
    carried = sent_abort(exc)
    if carried is not None:
        return peer_abort(carried, peer, session_id)
    if joined and exc.code() == grpc.StatusCode.UNAVAILABLE:
        return abort_notice(session_id, peer, DIED, f"{what}: stopped answering", phase)
    kind, why = CALL_FAILURES.get(exc.code(), (PROTOCOL_ERROR, "refused it"))
    return abort_notice(session_id, peer, kind, f"{what}: {why}", phase)



class Refused(Exception):
    """A call this node refuses with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


RECONNECT_SECONDS = 3.0
"""A call that finds its peer unreachable waits this long for the channel to reconnect, once
(a restarted peer; the channels' reconnect backoff is at most 2 s, cels.node.tls)."""


class PeerClients:
    """One channel per peer node, opened on first use."""

    def __init__(self, config: NodeConfig, on_sent: Callable[[str, str, int], None] | None = None) -> None:
        """``on_sent(peer, session_id, bytes)`` after every frame stream a peer took."""
        self.config = config
        self.on_sent = on_sent
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

    def deliver(self, peer: str, frames: list[cels_pb2.Frame], timeout: float) -> cels_pb2.Ack:
        ack = self._reaching(lambda **wait: self.stub(peer).Deliver(iter(frames), **wait), timeout)
        if self.on_sent is not None:
            self.on_sent(peer, frames[0].session_id, sum(f.ByteSize() for f in frames))
        return ack

    def try_deliver(self, peer: str, envelope: Envelope, timeout: float) -> None:
        """Best effort (Abort notices): failures are logged, not raised."""
        try:
            self.deliver(peer, to_frames(envelope, secrets.randbits(63)), timeout)
        except (grpc.RpcError, Refused) as exc:
            log.info("%s: could not tell %s: %s", self.config.name, peer, rpc_text(exc) if isinstance(exc, grpc.RpcError) else exc)

    def signal(self, peer: str, session_id: str, kind: int, timeout: float) -> cels_pb2.SessionState:
        request = cels_pb2.SessionSignal(session_id=session_id, kind=kind)
        if kind == cels_pb2.SessionSignal.PROBE:  # the watchdog's probes fail fast: it counts failures itself
            return self.stub(peer).Signal(request, timeout=timeout)
        return self._reaching(lambda **wait: self.stub(peer).Signal(request, **wait), timeout)

    @staticmethod
    def _reaching(call, timeout: float):
        """``call`` failing fast; if the peer was unreachable, once more waiting up to
        RECONNECT_SECONDS for the channel to connect (issue 13 item 10).  A connection refused
        means the first call never reached the peer, so the retry cannot deliver twice."""
        try:
            return call(timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            first = exc
        try:
            return call(timeout=min(timeout, RECONNECT_SECONDS), wait_for_ready=True)
        except grpc.RpcError as exc:
            raise first if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc from None

    def status(self, peer: str) -> cels_pb2.NodeStatus:
        """A peer's node key and stock (outside sessions; a short deadline)."""
        return self.stub(peer).Status(cels_pb2.NodeStatusRequest(), timeout=min(self.config.deadline, 10.0))

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()
