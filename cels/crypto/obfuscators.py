"""Single-use Paillier obfuscators r^N mod N^2, computed ahead of time (CELS section 4.2).

A Paillier encryption is (1 + mN) r^N mod N^2 and a re-randomisation multiplies by r^N: the
modular exponentiation r^N is the whole cost and does not depend on the message, so it can be
computed before the protocol needs it.  :class:`ObfuscatorPool` computes them in background
worker processes (all cores by default); :class:`InlineObfuscators` computes them on demand in
the calling process (tests, small jobs).  Every obfuscator is handed out once and then dropped.

Randomness: r is drawn with :mod:`secrets` inside the worker.  Obfuscators cross the process
boundary as big-endian bytes (never pickled objects).  This module stays import-light (no
numpy) because spawned workers import it.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
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
    short).  Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, n: int, *, workers: int | None = None, batch: int = 16) -> None:
        self.n = int(n)
        self.batch = max(1, batch)
        self.workers = workers or os.cpu_count() or 1
        self._width = ((self.n * self.n).bit_length() + 7) // 8
        self._n_bytes = self.n.to_bytes((self.n.bit_length() + 7) // 8, "big")
        self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        self._pending: deque[tuple[Future, int]] = deque()
        self._queued = 0  # obfuscators in pending batches
        self._ready: deque = deque()
        self.handed_out = 0

    def prefetch(self, count: int) -> None:
        """Queue ``count`` more obfuscators for background computation."""
        while count > 0:
            size = min(self.batch, count)
            self._pending.append((self._executor.submit(_worker_batch, self._n_bytes, size, self._width), size))
            self._queued += size
            count -= size

    def wait(self, on_batch: Callable[[int], None] | None = None) -> None:
        """Block until every queued obfuscator is computed; ``on_batch(size)`` reports progress."""
        while self._pending:
            size = self._collect()
            if on_batch is not None:
                on_batch(size)

    def take(self, count: int) -> list:
        short = count - len(self._ready) - self._queued
        if short > 0:
            self.prefetch(short)
        while len(self._ready) < count:
            self._collect()
        self.handed_out += count
        return [self._ready.popleft() for _ in range(count)]

    def _collect(self) -> int:
        future, size = self._pending.popleft()
        self._queued -= size
        self._ready.extend(gmpy2.mpz(int.from_bytes(b, "big")) for b in future.result())
        return size

    def close(self) -> None:
        for future, _size in self._pending:
            future.cancel()
        self._pending.clear()
        self._queued = 0
        self._ready.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ObfuscatorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
