"""The CelsNode service's registration with requests parsed inside the handler (issue 13 item 11).

gRPC's generated registration parses a request before any node code runs, and bytes that are
not the method's message then get INTERNAL "Exception deserializing request!".  Here every
method takes a tolerant parser instead: bytes that do not parse become :class:`Unparsed`,
which the node answers with INVALID_ARGUMENT like any other malformed message.  Every
refusal's details are cut to MAX_DETAILS characters (:class:`ClippedContext`): they travel as
gRPC metadata, and a peer's long string quoted in one made the reply itself fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from cels.protocol.wire import cels_pb2

SERVICE = "cels.v1.CelsNode"


@dataclass(frozen=True)
class Unparsed:
    """Request bytes that are not the message ``expected``."""

    expected: str
    error: str

    def __str__(self) -> str:
        return f"bytes that are not a {self.expected}: {self.error}"


def tolerant(message: type[Message]) -> Callable[[bytes], Message | Unparsed]:
    """``message.FromString`` that returns :class:`Unparsed` instead of raising."""

    def parse(data: bytes) -> Message | Unparsed:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Unparsed(message.DESCRIPTOR.name, str(exc)[:200])

    return parse


MAX_DETAILS = 1000
"""Characters of a refusal's details (gRPC's metadata limit is 16 KiB in all)."""


class ClippedContext:
    """A servicer context whose aborts carry at most MAX_DETAILS characters of details."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        if len(details) > MAX_DETAILS:
            details = f"{details[: MAX_DETAILS - 40]}... ({len(details)} characters)"
        self._context.abort(code, details)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def clipped(method: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
    """``method`` called with a :class:`ClippedContext`."""
    return lambda request, context: method(request, ClippedContext(context))


def add_node_service(servicer: Any, server: grpc.Server) -> None:
    """Register ``servicer``'s Deliver, Signal, Run, Status and Decide as the generated code does,
    with tolerant request parsers."""
    handlers = {
        "Deliver": grpc.stream_unary_rpc_method_handler(
            clipped(servicer.Deliver), request_deserializer=tolerant(cels_pb2.Frame), response_serializer=cels_pb2.Ack.SerializeToString
        ),
        "Signal": grpc.unary_unary_rpc_method_handler(
            clipped(servicer.Signal), request_deserializer=tolerant(cels_pb2.SessionSignal), response_serializer=cels_pb2.SessionState.SerializeToString
        ),
        "Run": grpc.unary_stream_rpc_method_handler(
            clipped(servicer.Run), request_deserializer=tolerant(cels_pb2.RunRequest), response_serializer=cels_pb2.RunEvent.SerializeToString
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            clipped(servicer.Status), request_deserializer=tolerant(cels_pb2.NodeStatusRequest), response_serializer=cels_pb2.NodeStatus.SerializeToString
        ),
        "Decide": grpc.unary_unary_rpc_method_handler(
            clipped(servicer.Decide), request_deserializer=tolerant(cels_pb2.ApprovalDecision), response_serializer=cels_pb2.SessionState.SerializeToString
        ),
    }  # fmt: skip
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
