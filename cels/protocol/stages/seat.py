"""A party's place in a session and the phase machines' common shape (docs/protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Outgoing, addressed, fail


@dataclass(frozen=True)
class Seat:
    """P_k in the ring P_1 .. P_r of one session: what every phase machine of a party reads."""

    name: str
    options: SessionOptions
    allow_insecure_key_bits: bool = False

    @property
    def session_id(self) -> str:
        return self.options.session_id

    @property
    def parties(self) -> list[str]:
        return list(self.options.parties)

    @property
    def k(self) -> int:
        return self.parties.index(self.name)

    @property
    def r(self) -> int:
        return len(self.options.parties)

    @property
    def successor(self) -> str:
        return self.parties[(self.k + 1) % self.r]

    @property
    def predecessor(self) -> str:
        return self.parties[self.k - 1]

    @property
    def key_holder(self) -> str:
        """P_1: Algorithm 1's key, assembles the universe."""
        return self.parties[0]

    @property
    def index_holder(self) -> str:
        """Who assembles the universe: P_1 (CELS section 4.2), or the solver in the DP release,
        so that no party learns which of its pairs another party holds (docs/releases.md)."""
        return self.options.solver if self.options.release_kind.private_universe else self.key_holder

    @property
    def solver(self) -> str:
        return self.options.solver

    @property
    def b(self) -> float:
        return self.options.b

    def send(self, recipients: str | list[str], **step) -> list[Outgoing]:
        """The same step message from this party to each recipient (in the given order)."""
        return addressed(self.session_id, self.name, recipients, **step)

    def expect_sender(self, sender: str, expected: str, step: str) -> None:
        if sender != expected:
            raise fail(f"{self.name}: {step} from {sender!r}, expected from {expected!r}")


class Stage:
    """One phase machine: it runs in ``phase``, begins with :meth:`start`, takes its step
    messages through its handlers (each returns the messages to send) and holds its frozen
    ``result`` once its phase is over."""

    phase: ClassVar[Phase] = Phase.READY

    def __init__(self, seat: Seat) -> None:
        self.seat = seat
        self.result: Any = None

    def start(self) -> list[Outgoing]:
        return []

    def on_sum_total(self, sum_id: str, total: np.ndarray) -> list[Outgoing]:
        """A secure sum this machine started is over (the machines that run sums take it)."""
        raise fail(f"{self.seat.name}: secure sum {sum_id!r} ended in phase {self.phase!r}")
