"""Envelopes as streams of Frames, each well under gRPC's 4 MB message limit."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from cels.node.settings import DEFAULT_MAX_MESSAGE_MIB
from cels.node.handlers import Unparsed
from cels.protocol.roles import Envelope, ProtocolError, check_session_id, quoted, step_name
from cels.protocol.wire import cels_pb2

CHUNK_BYTES = 1 << 20
"""Payload bytes per Frame (1 MiB: a quarter of gRPC's default 4 MB limit)."""


def to_frames(envelope: Envelope, message_id: int, chunk_bytes: int = CHUNK_BYTES) -> list[cels_pb2.Frame]:
    """Split the serialised envelope into Frames of at most ``chunk_bytes`` payload each."""
    data = envelope.SerializeToString()
    starts = range(0, max(len(data), 1), chunk_bytes)
    last = len(starts) - 1
    return [
        cels_pb2.Frame(
            session_id=envelope.session_id,
            message_id=message_id,
            index=k,
            last=k == last,
            data=data[start : start + chunk_bytes],
        )
        for k, start in enumerate(starts)
    ]


def from_frames(frames: Iterable[cels_pb2.Frame], max_bytes: int = DEFAULT_MAX_MESSAGE_MIB << 20) -> tuple[Envelope, int]:
    """Reassemble one envelope of at most ``max_bytes``; returns it with the frames' total wire size.

    Raises ProtocolError ``invalid_argument`` for bytes that are not a Frame, a bad session id,
    frames out of order, of mixed messages, a missing last frame, a message larger than
    ``max_bytes`` (refused at the frame that passes it: nothing more is buffered), or bytes
    that are not an Envelope with a step.
    """
    parts: list[bytes] = []
    first: cels_pb2.Frame | None = None
    complete = False
    size = wire = 0
    for frame in frames:
        if isinstance(frame, Unparsed):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, str(frame))
        check_session_id(frame.session_id)
        wire += frame.ByteSize()
        if complete:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, "frame after the last one")
        if first is None:
            first = frame
        elif (frame.session_id, frame.message_id) != (first.session_id, first.message_id):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, "frames of different messages in one stream")
        if frame.index != len(parts):
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"frame {frame.index} arrived where {len(parts)} was due")
        size += len(frame.data)
        if size > max_bytes:
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"message larger than this node's {max_bytes >> 20} MiB (its [node] max_message_mib)")
        parts.append(frame.data)
        complete = frame.last
    if not complete:
        raise ProtocolError(ProtocolError.INVALID_ARGUMENT, "stream ended without the last frame")
    assert first is not None
    try:
        envelope = Envelope.FromString(b"".join(parts))
    except DecodeError as exc:
        raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"frames do not parse as an Envelope: {exc}") from None
    step_name(envelope)
    if envelope.session_id != first.session_id:
        raise ProtocolError(
            ProtocolError.INVALID_ARGUMENT,
            f"envelope session {quoted(envelope.session_id)} differs from its frames' {quoted(first.session_id)}",
        )
    return envelope, wire
