"""A node's gRPC channels to its peers, and the refusal it answers a call with."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

import grpc

from cels.node.config import NodeConfig
from cels.node.framing import to_frames
from cels.node.tls import open_channel
from cels.protocol.roles import Envelope
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

log = logging.getLogger("cels.node")


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

    def deliver(self, peer: str, frames: list[cels_pb2.Frame], timeout: float) -> None:
        self._reaching(lambda **wait: self.stub(peer).Deliver(iter(frames), **wait), timeout)
        if self.on_sent is not None:
            self.on_sent(peer, frames[0].session_id, sum(f.ByteSize() for f in frames))

    def try_deliver(self, peer: str, envelope: Envelope, timeout: float) -> None:
        """Best effort (Abort notices): failures are logged, not raised."""
        try:
            self.deliver(peer, to_frames(envelope, secrets.randbits(63)), timeout)
        except (grpc.RpcError, Refused) as exc:
            log.info("%s: could not tell %s: %s", self.config.name, peer, exc)

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
