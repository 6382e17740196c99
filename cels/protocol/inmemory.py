"""Run sans-I/O roles against each other in one process (tests, benchmarks, attacks).

Every envelope is serialised and parsed again on the way, exactly as it would cross the
wire, so the byte counts are the real wire sizes (framing excluded).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cels.protocol.roles import Envelope, Outgoing, Role, step_name


@dataclass
class TrafficStats:
    """Bytes and messages sent, per (sender, step), and seconds spent inside each role."""

    bytes_sent: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    messages: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_sent.values())

    def bytes_by_node(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (sender, _step), n in self.bytes_sent.items():
            out[sender] += n
        return dict(out)


class InMemoryNetwork:
    """Deliver messages among named roles in FIFO order until no message is left."""

    def __init__(self, roles: Mapping[str, Role], max_messages: int = 10_000_000) -> None:
        self.roles = dict(roles)
        self.stats = TrafficStats()
        self.max_messages = max_messages
        self.log: list[tuple[str, str, str, int]] = []  # (sender, recipient, step, bytes)

    def run(self, initial: Iterable[Outgoing], sender: str = "initiator") -> TrafficStats:
        queue: deque[tuple[str, str, bytes]] = deque()
        self._enqueue(queue, sender, initial)
        delivered = 0
        while queue:
            src, dst, data = queue.popleft()
            if dst not in self.roles:
                raise KeyError(f"message from {src} to unknown node {dst!r}")
            delivered += 1
            if delivered > self.max_messages:
                raise RuntimeError("in-memory network: message limit reached (a role loops?)")
            envelope = Envelope.FromString(data)
            start = time.perf_counter()
            out = self.roles[dst].receive(src, envelope)
            self.stats.seconds[dst] += time.perf_counter() - start
            self._enqueue(queue, dst, out)
        return self.stats

    def _enqueue(self, queue: deque, src: str, messages: Iterable[Outgoing]) -> None:
        for dst, envelope in messages:
            data = envelope.SerializeToString()
            step = step_name(envelope)
            self.stats.bytes_sent[(src, step)] += len(data)
            self.stats.messages[(src, step)] += 1
            self.log.append((src, dst, step, len(data)))
            queue.append((src, dst, data))
