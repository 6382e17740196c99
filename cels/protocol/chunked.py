"""Lists sent as consecutive chunks of bounded size (docs/protocol.md, "Universe" and "Counts").

A list of n items goes as chunks [first, first + count) with ``more`` set on all but the last;
an empty list is one empty chunk.  A message of one chunk that starts at 0 and is the last has
its position fields at their protobuf defaults, so its bytes are those of an unchunked message.
"""

from __future__ import annotations

from cels.protocol.roles import fail, malformed


class ChunkCursor:
    """Where the next chunk of one streamed list (chunks of at most ``size``) must start; it
    refuses a chunk out of place (FAILED_PRECONDITION) or of a wrong size (INVALID_ARGUMENT)."""

    def __init__(self, what: str, size: int) -> None:
        self.what, self.size, self.position, self.done = what, size, 0, False

    def take(self, first: int, count: int, more: bool) -> None:
        """Chunk [first, first + count) arrived; ``more``: further chunks follow."""
        if self.done:
            raise fail(f"{self.what}: a chunk after the last one")
        if first != self.position:
            raise fail(f"{self.what}: a chunk from {first} on, expected the one from {self.position} on")
        if count > self.size or (more and count == 0):
            raise malformed(f"{self.what}: a chunk of {count} items (1..{self.size}, or an empty list's only chunk)")
        self.position, self.done = first + count, not more
