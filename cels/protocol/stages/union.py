"""Phase 5 of a party: the secure union of the sampled records (Algorithm 3, shuffled;
docs/protocol.md, "Union"): (user pseudonym, query, url, count) for every x_ij > 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from cels.crypto.groups import group_for_bits
from cels.logs.model import SearchLog
from cels.logs.records import LogRecord
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, Outgoing, malformed
from cels.protocol.secure_union import SecureUnion
from cels.engine.interface import LoadResult
from cels.protocol.stages.results import CountsResult, SamplingResult, UnionResult
from cels.protocol.stages.seat import Seat, Stage
from cels.engine.interface import PartyWork


def union_record(data: bytes) -> LogRecord:
    """Inverse of cels.engine.routines.encode_item for a record (user, query, url, count)."""
    try:
        user, query, url, count = json.loads(data.decode())
        if not (isinstance(user, str) and isinstance(query, str) and isinstance(url, str) and isinstance(count, int)):
            raise ValueError("field types")
    except (ValueError, UnicodeDecodeError) as exc:
        raise malformed(f"union record does not decode: {exc}") from None
    if count < 1:
        raise malformed(f"union record with count {count}")
    return LogRecord(user, query, url, count)


def output_log(union: UnionResult, loaded: LoadResult) -> SearchLog:
    """The union in the input's schema (records decode to (user, query, url, count)), in the
    order of their encodings: a function of the set of records alone, so the release says
    nothing of the union's order or of who contributed what, and a replayed session writes the
    same bytes."""
    return SearchLog.from_records((union_record(r) for r in sorted(union.records)), source=loaded.source)


class Union(Stage):
    """This party's records into the secure union; ``result``: :class:`UnionResult`."""

    phase = Phase.UNION

    def __init__(
        self, seat: Seat, work: PartyWork, counts: CountsResult, sampled: SamplingResult, rng: np.random.Generator, keeping: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(seat)
        self.work, self.counts, self.sampled, self.rng, self.keeping = work, counts, sampled, rng, keeping
        self.union: SecureUnion | None = None

    def start(self) -> list[Outgoing]:
        seat = self.seat
        records = self.work.records(self.sampled.sampled, self.counts.active, seat.options.keep_user_ids)
        self.union = SecureUnion(
            name=seat.name, session_id=seat.session_id, ring=seat.parties, records=records,
            group=group_for_bits(seat.options.group_bits, allow_paper_bits=seat.allow_insecure_key_bits), rng=self.rng, keeping=self.keeping,
        )  # fmt: skip
        return self.union.start()

    def on_message(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        out = self.union.receive(sender, envelope)
        if self.union.done:
            self.result = UnionResult(tuple(self.union.result or ()))
        return out
