"""The engine interface (docs/ray.md, "A party on a Ray cluster"): what the protocol's phase
machines ask of a party's rows (:class:`PartyWork`, with its index and its sampler), what a
party node asks of the engine its ``[engine]`` table names (:class:`Engine`), and
:func:`open_engine`, which starts the kind named in the registry
(cels.engine.options.ENGINES).  The backends: :mod:`cels.engine.inprocess` (``kind =
"local"``) and :mod:`cels.engine.ray` (``kind = "ray"``, the ray extra, imported only when
asked for).  Both run the same Ray-free work (:class:`cels.engine.work.ShardedWork` over
:mod:`cels.engine.sharded_log`), each on its own :class:`cels.engine.runtime.Runtime`: the
in-process engine is its one-shard case.

The phase machines never hold a party's users: they ask a :class:`PartyWork` for everything
that runs over its rows -- hashing its pair ids, another layer of the commutative hash on a
peer's ids, the per-pair vectors of the secure sums, the constraint rows, the private solve's
verdicts, the sampling draws and the output records -- and keep only what the protocol needs
(vectors over pairs, bitmaps, id lists).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from cels.crypto.streams import DrawKeys
from cels.engine.options import ENGINES, EngineOptions
from cels.engine.routines import CommutativeHash, ItemBound
from cels.lazy import resolve
from cels.logs.model import SearchLog


@dataclass(frozen=True)
class LoadResult:
    """The log is loaded and capped: how many distinct pairs this party holds (its own
    pairs; the work keeps which), and the log's source."""

    own_pairs: int
    source: dict


class WorkFailure(Exception):
    """The party's work cannot go on (its engine lost a worker it could not replace): the
    session ends with ``reason`` (generic, no digit, what the peers are told); the message is
    the detail for this node's log."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


WORKER_LOST = "engine worker lost"
"""What the peers are told when the engine loses a worker for good (no digit: docs/security.md)."""


class WorkerLost(WorkFailure):
    """The engine lost a shard or a task's worker (a Ray actor or worker died): "engine worker
    lost" to the peers; ``actor_id`` names the lost shard's actor where the backend knows it."""

    def __init__(self, detail: str, actor_id: str | None = None) -> None:
        super().__init__(WORKER_LOST, detail)
        self.actor_id = actor_id


class EngineUnavailable(ValueError):
    """The engine cannot take a session now (its cluster does not answer, or accepts
    unauthenticated calls): ``public`` is what the peers are told, the message the detail."""

    def __init__(self, public: str, detail: str) -> None:
        super().__init__(detail)
        self.public = public


class Sampler(Protocol):
    """One party's side of the exact staged sampling (docs/protocol.md, phase 4): each stage
    :meth:`propose` draws and gives (pairs in the stage, this party's stage totals) for the
    secure sum; :meth:`settle` takes the summed totals."""

    stage: int

    @property
    def done(self) -> bool: ...
    def propose(self) -> tuple[np.ndarray, np.ndarray]: ...
    def settle(self, stage_totals: np.ndarray) -> np.ndarray: ...
    def result(self) -> sp.csr_matrix: ...


class UnionIndex(Protocol):
    """P_1's sorted union of the complete id sets (cels.engine.variable_index): a
    :class:`IndexPart` in this process, or a ``RangedIndex`` over a cluster's shards."""

    def add(self, owner: str, keys: np.ndarray) -> None: ...
    def complete(self, owner: str) -> None: ...
    def size(self) -> int: ...
    def columns(self, owner: str, first: int, stop: int) -> np.ndarray: ...
    def close(self) -> None: ...


class PartyWork(Protocol):
    """What a phase machine asks of the party's rows (users x pairs, c_ij capped)."""

    def load(self) -> LoadResult:
        """Load and cap the log: how many distinct pairs this party holds, and its source."""
        ...

    def hashed_ids(self, cipher: CommutativeHash, size: int) -> Iterator[np.ndarray]:
        """This party's layer on its own pair ids (universe phase, first hop), in the order of
        their :func:`pair_digests`: :func:`id_array` chunks of ``size`` ids (the last maybe
        fewer), each made as it is asked for."""
        ...

    def apply_layer(self, cipher: CommutativeHash, ids: np.ndarray) -> np.ndarray:
        """This party's layer on a peer's ids (universe phase, later hops), an :func:`id_array` of
        the cipher's width in and out."""
        ...

    def union(self, width: int) -> UnionIndex:
        """P_1: an empty sorted union of complete sets of ``width``-byte union keys (the index),
        held where the work runs."""
        ...

    def keep_returned(self, first: int, keys: np.ndarray) -> None:
        """Own ids ``first``.. (in the order :meth:`hashed_ids` gave them) came back with every
        layer: their union keys, kept where the work runs."""
        ...

    def sorted_returned(self, size: int) -> Iterator[np.ndarray]:
        """Every kept union key, sorted (the complete set P_k sends P_1): chunks of ``size``
        (at least one, the last maybe shorter), each made as it is asked for."""
        ...

    def place_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The sorted union keys ``first``.. (:meth:`sorted_returned`'s order) are columns
        ``columns`` of the index of ``n`` pairs."""
        ...

    def place_sent_columns(self, n: int, first: int, columns: np.ndarray) -> None:
        """The DP release: own ids ``first``.. in the order :meth:`hashed_ids` gave them are
        columns ``columns`` of the index of ``n`` pairs (the party never saw them with every layer)."""
        ...

    def index(self, n: int) -> np.ndarray:
        """Every own pair's column is placed: the local counts c^k over the index of ``n``
        pairs, in the smallest unsigned integer type that holds them."""
        ...

    def held_whole(self, totals: np.ndarray) -> np.ndarray:
        """The indicator "one of my users holds all of pair i" (the unique pairs' secure sum),
        one byte per pair."""
        ...

    def constraint_rows(self, active: np.ndarray, totals: np.ndarray) -> sp.csr_matrix:
        """This party's ln t rows over the ``active`` pairs (totals c over them), dominated rows pruned."""
        ...

    def verdicts(self, rows: sp.spmatrix, loads: np.ndarray, proposals: np.ndarray, b: float) -> np.ndarray:
        """The private solve's verdicts of its rows on one round's proposals (cels.mechanism.greedy)."""
        ...

    def sampler(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray, theta: float) -> Sampler:
        """The staged exact sampling over this party's users (cels.engine.sampling), each
        stage's draws from the users' buckets (cels.engine.user_draws)."""
        ...

    def local_sample(self, active: np.ndarray, totals: np.ndarray, x: np.ndarray) -> sp.csr_matrix:
        """The paper's local sampling: floor(x_i c_i^k / c_i) multinomial trials over its users
        (split over the users' buckets, then within each: cels.engine.user_draws)."""
        ...

    def records(self, sampled: sp.csr_matrix, active: np.ndarray, keep_user_ids: bool) -> list[bytes]:
        """(user pseudonym, query, url, count) for every x_ij > 0 drawn, encoded for the union
        (pseudonyms from the users' buckets)."""
        ...

    def items(self, columns: np.ndarray) -> list[bytes]:
        """The DP release: the encoded pair (query, url) of each of its own ``columns`` (b"" for
        a dummy id's); KeyError names a column that is not its own."""
        ...


class Engine(Protocol):
    """Builds each session's :class:`PartyWork` over the party's log (capped at ``cap``), drawing
    from the party's session keys ``draws``."""

    def check(self) -> None:
        """A session starts: the engine can take its work, or :class:`EngineUnavailable`
        refuses the session before anything is loaded."""

    def work(self, log: SearchLog | Callable[[], SearchLog], cap: int, draws: DrawKeys, bound: ItemBound | None = None) -> PartyWork:
        """A session's work over ``log`` (capped at ``cap``; ``bound``: the DP release's contribution bound)."""
        ...

    def usage(self, work: PartyWork) -> dict[str, Any]:
        """The engine, and what a session's ``work`` used outside the node's process (peak
        RSS, CPU seconds), for the node's per-session summary (``cels status``)."""
        ...

    def release(self, work: PartyWork) -> None:
        """A session ended: what its ``work`` holds outside the node's process goes."""

    def close(self) -> None:
        """The node stops: no worker of the engine outlives it."""


def open_engine(options: EngineOptions) -> Engine:
    """The node's engine, started once per node process: for ``ray`` this starts or joins the
    cluster now, so an unreachable address refuses the node before any session (a ValueError
    naming the address)."""
    try:
        backend = resolve(ENGINES[options.kind])
    except ImportError as exc:
        raise ValueError(f"engine.kind = {options.kind!r} needs the {options.kind} extra (pip install 'cels[{options.kind}]'): {exc}") from None
    return backend.start(options)
