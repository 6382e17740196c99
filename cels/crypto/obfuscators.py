"""Single-use Paillier obfuscators r^N mod N^2, computed ahead of time (CELS section 4.2).

A Paillier encryption is (1 + mN) r^N mod N^2 and a re-randomisation multiplies by r^N: the
modular exponentiation r^N is the whole cost and does not depend on the message, so it can be
computed before the protocol needs it.  :class:`ObfuscatorPool` computes them in background
worker processes (all cores by default); :class:`ObfuscatorStock` keeps a node's pools for
the long-lived keys of its peers full while no session runs (the offline phase);
:class:`InlineObfuscators` computes them on demand in the calling process (tests, small jobs).
Every obfuscator is handed out once and then dropped.

Randomness: r is drawn with :mod:`secrets` inside the worker.  Obfuscators cross the process
boundary as big-endian bytes (never pickled objects).  This module stays import-light (no
numpy) because spawned workers import it.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import gmpy2


class ObfuscatorSource(Protocol):
    """Anything that hands out fresh r^N mod N^2 values for one public key N."""

    n: int

    def take(self, count: int) -> list:
        """Return ``count`` fresh obfuscators (gmpy2 mpz), each never handed out again."""
        ...


def random_unit(n) -> gmpy2.mpz:
    """A uniform r in Z_N^* drawn with :mod:`secrets`."""
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def obfuscators(n, count: int) -> list:
    """``count`` fresh values r^N mod N^2 (gmpy2 mpz), computed in this process."""
    n = gmpy2.mpz(n)
    nsquare = n * n
    return [gmpy2.powmod(random_unit(n), n, nsquare) for _ in range(count)]


def _worker_batch(n_bytes: bytes, count: int, width: int) -> list[bytes]:
    """Worker-process entry: ``count`` obfuscators as big-endian bytes of ``width`` bytes."""
    n = int.from_bytes(n_bytes, "big")
    return [int(x).to_bytes(width, "big") for x in obfuscators(n, count)]


class InlineObfuscators:
    """Obfuscators computed on demand in the calling process."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.seconds = 0.0

    def take(self, count: int) -> list:
        start = time.perf_counter()
        out = obfuscators(self.n, count)
        self.seconds += time.perf_counter() - start
        return out


class ObfuscatorPool:
    """Obfuscators for one public key, computed ahead of time by background worker processes.

    ``prefetch(count)`` queues work and returns at once; ``wait()`` blocks until it is done;
    ``take(count)`` hands out ready values (waiting for queued batches, queueing more when
    short).  Thread-safe: finished batches arrive through the executor's callbacks.  Pass
    ``executor`` to share worker processes between pools (:class:`ObfuscatorStock`); a pool
    that made its own executor shuts it down in :meth:`close` (or at the end of a ``with``).
    """

    def __init__(
        self,
        n: int,
        *,
        workers: int | None = None,
        batch: int = 16,
        executor: ProcessPoolExecutor | None = None,
        on_arrival: Callable[[], None] | None = None,
    ) -> None:
        self.n = int(n)
        self._on_arrival = on_arrival  # called after every finished batch (the stock's filler)
        self.batch = max(1, batch)
        self.workers = workers or os.cpu_count() or 1
        self._width = ((self.n * self.n).bit_length() + 7) // 8
        self._n_bytes = self.n.to_bytes((self.n.bit_length() + 7) // 8, "big")
        self._own_executor = executor is None
        self._executor = executor or ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        self._changed = threading.Condition()
        self._pending: set[Future] = set()
        self._queued = 0  # obfuscators in pending batches
        self._ready: deque = deque()
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

    def prefetch(self, count: int) -> None:
        """Queue ``count`` more obfuscators for background computation."""
        with self._changed:
            while count > 0:
                size = min(self.batch, count)
                future = self._executor.submit(_worker_batch, self._n_bytes, size, self._width)
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

    def take(self, count: int) -> list:
        with self._changed:
            short = count - len(self._ready) - self._queued
            if short > 0:
                self.prefetch(short)
            while len(self._ready) < count:
                self._raise_error()
                self._changed.wait()
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
        workers: int | None = None,
        nice: int = 0,
        batch: int = 16,
        idle_poll: float = 0.2,
    ) -> None:
        if any(t < 0 for t in targets.values()):
            raise ValueError(f"obfuscator stock targets must be >= 0, got {dict(targets)}")
        self.targets = dict(targets)
        self.batch = max(1, batch)
        self.workers = workers or os.cpu_count() or 1
        # nice: the workers' niceness increment (os.nice in each worker), so that an idle node's refill yields the host
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=os.nice, initargs=(nice,))
        self._pools: dict[int, ObfuscatorPool] = {}
        self._owners: dict[int, str] = {}
        self._lock = threading.Lock()
        self._running_sessions = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._poll = idle_poll
        self._thread = threading.Thread(target=self._fill, name="obfuscator-stock", daemon=True)
        self._thread.start()

    def add_key(self, n: int, owner: str) -> None:
        """Stock obfuscators for ``owner``'s public key N (a changed key replaces the old one)."""
        if owner not in self.targets:
            raise ValueError(f"no stock target for {owner!r}'s key")
        n = int(n)
        with self._lock:
            for old, name in list(self._owners.items()):
                if name == owner and old != n:
                    del self._owners[old]
                    self._pools.pop(old).close()
            if n not in self._pools:
                self._pools[n] = ObfuscatorPool(
                    n, workers=self.workers, batch=self.batch, executor=self._executor, on_arrival=self._wake.set
                )
            self._owners[n] = owner
        self._wake.set()

    def source(self, n: int) -> ObfuscatorSource:
        """Where a session takes obfuscators for key N: the stock, or a pool on the same workers."""
        with self._lock:
            pool = self._pools.get(int(n))
        return pool if pool is not None else ObfuscatorPool(int(n), workers=self.workers, batch=self.batch, executor=self._executor)

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
                    room = min(target - pool.ready - pool.queued, in_flight - queued)
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
