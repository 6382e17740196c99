"""The CelsNode service registered with raw requests: each RPC parses its own request.

gRPC's generated registration parses a request before any node code runs and answers bytes
that are no request message with INTERNAL "Exception deserializing request!".  Here every
method takes bytes (identity deserialiser) and parses them itself: such bytes get
INVALID_ARGUMENT naming the RPC, and so does a session id over MAX_SESSION_ID characters
(Frame, SessionSignal), before anything quotes it.  Every refusal's details are cut to
MAX_DETAILS characters: they travel as gRPC metadata, and quoting a peer's strings unbounded
made the reply itself fail (docs/security.md, "What a node answers a peer's bad message").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from cels.protocol.options import check_session_id
from cels.protocol.roles import ProtocolError
from cels.protocol.wire import cels_pb2

SERVICE = cels_pb2.DESCRIPTOR.services_by_name["CelsNode"]
MAX_DETAILS = 1000
"""Characters of a refusal's details (gRPC's metadata limit is 16 KiB in all)."""


def parse(message_type: type[Message], data: bytes, rpc: str) -> Message:
    """``data`` as a ``message_type``; ProtocolError INVALID_ARGUMENT if it is not one, or if
    it carries a session id that is too long."""
    try:
        message = message_type.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{rpc}: the request does not parse as {message_type.DESCRIPTOR.name}: {exc}") from None
    if "session_id" in message_type.DESCRIPTOR.fields_by_name:
        try:
            check_session_id(message.session_id)
        except ValueError as exc:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{rpc}: {exc}") from None
    return message


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


def _handler(method: Any, rpc: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """The handler of one method: parse (a refusal is INVALID_ARGUMENT), then the node's RPC."""
    request_type = getattr(cels_pb2, method.input_type.name)
    serializer = getattr(cels_pb2, method.output_type.name).SerializeToString

    if method.client_streaming:
        def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            # a bad frame raises ProtocolError inside the RPC, which answers it INVALID_ARGUMENT
            return rpc((parse(request_type, data, method.name) for data in requests), ClippedContext(context))

        return grpc.stream_unary_rpc_method_handler(stream, response_serializer=serializer)

    def unary(data: bytes, context: grpc.ServicerContext) -> Any:
        clipped = ClippedContext(context)
        try:
            request = parse(request_type, data, method.name)
        except ProtocolError as exc:
            clipped.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return rpc(request, clipped)

    make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
    return make(unary, response_serializer=serializer)


def add_node_service(node: Any, server: grpc.Server) -> None:
    """Serve ``node``'s RPCs (Deliver, Signal, Run, Status: methods named as in the proto)."""
    handlers = {method.name: _handler(method, getattr(node, method.name)) for method in SERVICE.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
