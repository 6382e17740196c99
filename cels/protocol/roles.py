"""The contract every sans-I/O role follows, and the errors it raises."""

from __future__ import annotations

from typing import Protocol

from cels.protocol.wire import cels_pb2

Envelope = cels_pb2.Envelope
Outgoing = tuple[str, cels_pb2.Envelope]
"""A message to send: (recipient node name, envelope)."""


class ProtocolError(Exception):
    """A message the role cannot take.

    ``code`` is ``"failed_precondition"`` (unknown session, message out of protocol order,
    unexpected sender) or ``"invalid_argument"`` (malformed content); the gRPC adapters map
    it to the status code of the same name.
    """

    FAILED_PRECONDITION = "failed_precondition"
    INVALID_ARGUMENT = "invalid_argument"

    def __init__(self, code: str, message: str) -> None:
        if code not in (self.FAILED_PRECONDITION, self.INVALID_ARGUMENT):
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(message)
        self.code = code


class Role(Protocol):
    """One node's part in one session."""

    name: str

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Take one step message; return the messages it causes. Raises ProtocolError."""
        ...


def step_name(envelope: Envelope) -> str:
    """The protocol step an envelope carries (its ``step`` oneof field name)."""
    name = envelope.WhichOneof("step")
    if name is None:
        raise ProtocolError(ProtocolError.INVALID_ARGUMENT, "envelope carries no step message")
    return name
