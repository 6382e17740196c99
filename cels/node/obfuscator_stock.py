"""A node's offline phase for obfuscators (CELS section 4.2; docs/crypto.md, "Obfuscators"):
pools of worker processes that compute them ahead of time, and the stock that keeps a pool
full for every long-lived public key the node encrypts under while no session runs.

The workers run the pure :func:`cels.crypto.obfuscators.obfuscator_batch` (spawned workers
import only that module); obfuscators cross the process boundary as big-endian bytes (never
pickled objects).  :class:`ObfuscatorPool` is an
:class:`~cels.crypto.obfuscators.ObfuscatorSource`; cels.node.keys is the stock's user.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import gmpy2

from cels.crypto.obfuscators import DEFAULT_OBFUSCATOR_MODE, ObfuscatorSource, check_mode, obfuscator_batch
from cels.crypto.paillier import PublicKey
from cels.workers import worker_pool


class ObfuscatorPool:
    """Obfuscators for one public key, computed ahead of time by background worker processes.

    ``prefetch(count)`` queues work and returns at once; ``wait()`` blocks until it is done;
    ``take(hs, count)`` hands out ready values, waiting for queued batches and queueing
    more when what is ready or queued is already promised to other waiting takers.
    Thread-safe: finished batches arrive through the executor's callbacks.  ``hs`` (the
    key's h_s) may be left out and is then learned from the first ``take``; DJN prefetching
    needs it.  Pass ``executor`` to share worker processes between pools
    (:class:`ObfuscatorStock`); a pool that made its own executor shuts it down in
    :meth:`close` (or at the end of a ``with``).
    """

    def __init__(
        self,
        n: int,
        *,
        hs: int | None = None,
        mode: str = DEFAULT_OBFUSCATOR_MODE,
        workers: int | None = None,
        batch: int = 16,
        executor: ProcessPoolExecutor | None = None,
        on_arrival: Callable[[], None] | None = None,
    ) -> None:
        self.n = int(n)
        self.hs = None if hs is None else int(hs)
        self.mode = check_mode(mode)
        self._on_arrival = on_arrival  # called after every finished batch (the stock's filler)
        self.batch = max(1, batch)
        self.workers = workers or os.cpu_count() or 1
        self._width = ((self.n * self.n).bit_length() + 7) // 8
        self._n_bytes = self.n.to_bytes((self.n.bit_length() + 7) // 8, "big")
        self._own_executor = executor is None
        self._executor = executor or worker_pool(self.workers)
        self._changed = threading.Condition()
        self._pending: set[Future] = set()
        self._queued = 0  # obfuscators in pending batches
        self._ready: deque = deque()
        self._reserved = 0  # obfuscators promised to takers still waiting for them
        self._error: BaseException | None = None
        self.handed_out = 0

    @property
    def ready(self) -> int:
        """Obfuscators computed and not yet handed out."""
        return len(self._ready)

    @property
    def queued(self) -> int:
        """Obfuscators in batches that are still being computed."""
        return self._queued

    @property
    def available(self) -> int:
        """Ready or queued obfuscators not yet promised to a waiting taker."""
        return len(self._ready) + self._queued - self._reserved

    def prefetch(self, count: int) -> None:
        """Queue ``count`` more obfuscators for background computation."""
        with self._changed:
            if self.hs is None and self.mode == "djn":
                raise ValueError("DJN obfuscators need the key's h_s: pass hs= or take() first")
            hs_bytes = (self.hs or 0).to_bytes(self._width, "big")
            while count > 0:
                size = min(self.batch, count)
                future = self._executor.submit(obfuscator_batch, self._n_bytes, hs_bytes, self.mode, size, self._width)
                self._pending.add(future)
                self._queued += size
                future.add_done_callback(lambda f, size=size: self._arrived(f, size))
                count -= size

    def _arrived(self, future: Future, size: int) -> None:
        with self._changed:
            if future in self._pending:
                self._pending.discard(future)
                self._queued -= size
                if not future.cancelled():
                    if future.exception() is not None:
                        self._error = future.exception()
                    else:
                        self._ready.extend(gmpy2.mpz(int.from_bytes(b, "big")) for b in future.result())
            self._changed.notify_all()
        if self._on_arrival is not None:
            self._on_arrival()

    def wait(self, on_batch: Callable[[int], None] | None = None) -> None:
        """Block until every queued obfuscator is computed; ``on_batch(size)`` reports progress."""
        with self._changed:
            while self._queued:
                before = self._queued
                self._changed.wait()
                self._raise_error()
                if on_batch is not None and self._queued < before:
                    on_batch(before - self._queued)

    def take(self, hs: int, count: int) -> list:
        hs = int(hs)
        with self._changed:
            if self.hs is None:
                self.hs = hs
            elif self.hs != hs:
                raise ValueError("obfuscators were asked for a key with another h_s than the pool's")
            short = count - self.available
            if short > 0:
                self.prefetch(short)
            self._reserved += count  # so that a concurrent taker queues its own (issue 13 item 7)
            try:
                while len(self._ready) < count:
                    self._raise_error()
                    self._changed.wait()
            finally:
                self._reserved -= count
            self.handed_out += count
            return [self._ready.popleft() for _ in range(count)]

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"obfuscator worker failed: {self._error!r}") from self._error

    def close(self) -> None:
        with self._changed:
            pending, self._pending = list(self._pending), set()
            self._queued = 0
            self._ready.clear()
        for future in pending:
            future.cancel()
        if self._own_executor:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ObfuscatorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class StockLevel:
    """One key's stock on a node (what ``Status`` reports)."""

    owner: str
    n: int
    ready: int
    target: int
    handed_out: int


class ObfuscatorStock:
    """A node's offline phase: obfuscators for the long-lived public keys it encrypts under.

    The keys are the node keys of its peers (and its own), learned before any session.  A
    background thread keeps ``targets[owner]`` obfuscators ready for each owner's key, in
    worker processes shared by all keys, but only while no session runs (:meth:`pause` and
    :meth:`resume` count running sessions), so the refill never competes with a session's
    online work.  A session takes
    from :meth:`source`: a stocked key's pool, else a pool on the same workers for that key.
    """

    def __init__(
        self,
        targets: Mapping[str, int],
        *,
        mode: str = DEFAULT_OBFUSCATOR_MODE,
        workers: int | None = None,
        nice: int = 0,
        batch: int = 16,
        idle_poll: float = 0.2,
    ) -> None:
        if any(t < 0 for t in targets.values()):
            raise ValueError(f"obfuscator stock targets must be >= 0, got {dict(targets)}")
        self.targets = dict(targets)
        self.mode = check_mode(mode)
        self.batch = max(1, batch)
        self.workers = workers or os.cpu_count() or 1
        # nice: the workers' niceness increment (os.nice in each worker), so that an idle node's refill yields the host
        self._executor = worker_pool(self.workers, nice)
        self._pools: dict[int, ObfuscatorPool] = {}
        self._owners: dict[int, str] = {}
        self._lock = threading.Lock()
        self._running_sessions = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._poll = idle_poll
        self._thread = threading.Thread(target=self._fill, name="obfuscator-stock", daemon=True)
        self._thread.start()

    def add_key(self, public_key: PublicKey, owner: str) -> None:
        """Stock obfuscators for ``owner``'s public key (a changed key replaces the old one)."""
        if owner not in self.targets:
            raise ValueError(f"no stock target for {owner!r}'s key")
        n = int(public_key.n)
        with self._lock:
            for old, name in list(self._owners.items()):
                if name == owner and old != n:
                    del self._owners[old]
                    self._pools.pop(old).close()
            if n not in self._pools:
                self._pools[n] = ObfuscatorPool(
                    n, hs=int(public_key.hs), mode=self.mode, workers=self.workers, batch=self.batch,
                    executor=self._executor, on_arrival=self._wake.set,
                )  # fmt: skip
            self._owners[n] = owner
        self._wake.set()

    def source(self, n: int) -> ObfuscatorSource:
        """Where a session takes obfuscators for key N: the stock, or a pool on the same workers."""
        with self._lock:
            pool = self._pools.get(int(n))
        if pool is None:
            pool = ObfuscatorPool(int(n), mode=self.mode, workers=self.workers, batch=self.batch, executor=self._executor)
        return pool

    def pause(self) -> None:
        """A session starts: stop queueing refills."""
        with self._lock:
            self._running_sessions += 1

    def resume(self) -> None:
        """A session ended: refill once no session runs."""
        with self._lock:
            self._running_sessions = max(0, self._running_sessions - 1)
        self._wake.set()

    def levels(self) -> list[StockLevel]:
        with self._lock:
            return [
                StockLevel(owner, n, self._pools[n].ready, self.targets[owner], self._pools[n].handed_out)
                for n, owner in self._owners.items()
            ]

    def full(self) -> bool:
        """Every stocked key has its target of obfuscators ready."""
        return all(level.ready >= level.target for level in self.levels())

    def _fill(self) -> None:
        """Top every key up to ``target``, a few batches per worker in flight at a time; woken
        by every finished batch, a new key and the end of a session."""
        in_flight = 2 * self.workers * self.batch
        while not self._stop.is_set():
            self._wake.clear()  # a wake-up from here on is seen by the wait below
            with self._lock:
                idle = self._running_sessions == 0
                pools = [(self._pools[n], self.targets[owner]) for n, owner in self._owners.items()]
            queued = sum(pool.queued for pool, _ in pools)
            if idle:
                for pool, target in pools:
                    room = min(target - pool.available, in_flight - queued)
                    if room > 0:
                        pool.prefetch(room)
                        queued += room
            self._wake.wait(self._poll)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ObfuscatorStock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
