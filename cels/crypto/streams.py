"""The one source of privacy-relevant randomness: a ChaCha20 cipher stream (docs/crypto.md,
Randomness).

Every draw a release depends on (multinomial and Poisson sampling, pseudonyms, the noise and
its Polya shares, the paper mode's A_k and F_k, the column permutations, the union's shuffles,
the baselines' noise and selections) comes from :func:`cipher_generator`: numpy's
``Generator`` over randomgen's ``ChaCha`` bit generator with the full 20 rounds, keyed with 256
bits from :mod:`secrets`.  ChaCha20 is assumed to be a pseudo-random function, so whoever sees
outputs cannot predict the next ones (unlike PCG64 or the Mersenne Twister, whose state
follows from their outputs).

An explicit integer ``seed`` replays a stream for tests, benchmarks and reproduced figures:
anyone who knows it can replay every draw, so a seeded release is NOT private.

The exact rational samplers (:mod:`cels.mechanism.noise`) and the baselines are written against
:class:`random.Random` (``randrange`` over integers of any size, ``sample``, ``shuffle``).
:class:`CipherRandom` gives them that interface over the same stream instead of rewriting
them against raw 64-bit words: the standard library's own rejection loop (``_randbelow`` over
:meth:`CipherRandom.getrandbits`) stays exact for any bound, and a ``CipherRandom`` over a
party's generator makes one stream serve numpy and rational draws alike.
"""

from __future__ import annotations

import random
import secrets

import numpy as np
from randomgen import ChaCha

ROUNDS = 20
"""ChaCha20: the full-strength round count (fewer rounds trade security for speed)."""

KEY_BITS = 256


def cipher_generator(seed: int | None = None) -> np.random.Generator:
    """A numpy Generator over ChaCha20.  Without ``seed``: a fresh 256-bit key from ``secrets``
    (set directly as the key; a seed would pass through a 128-bit SeedSequence pool).  With an
    integer ``seed`` in [0, 2^256): the same stream every time, for tests and reproduction
    only, never private."""
    if seed is None:
        return np.random.Generator(ChaCha(key=secrets.randbits(KEY_BITS), rounds=ROUNDS))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**KEY_BITS:
        raise ValueError(f"a stream seed must be an integer in [0, 2^{KEY_BITS}), got {seed!r}")
    return np.random.Generator(ChaCha(seed=int(seed), rounds=ROUNDS))


class CipherRandom(random.Random):
    """:class:`random.Random` drawing from a ChaCha20 stream: ``CipherRandom()`` (fresh key from
    ``secrets``), ``CipherRandom(seed)`` (replayable, not private) or
    ``CipherRandom(generator=g)`` (the same stream as the numpy Generator ``g``).

    As the random module requires of a subclass with another core generator, it overrides
    :meth:`random`, :meth:`getrandbits`, :meth:`seed`, :meth:`getstate` and :meth:`setstate`;
    every other method (``randrange``, ``shuffle``, ``sample``, ``uniform``, ...) derives from
    them.  The Mersenne Twister state inherited from the base class is never read.
    """

    def __init__(self, seed: int | None = None, *, generator: np.random.Generator | None = None) -> None:
        if generator is not None and seed is not None:
            raise ValueError("give a seed or a generator, not both")
        if generator is None:
            self.seed(seed)
        else:
            self.generator = generator
            self.gauss_next = None

    def seed(self, a: int | None = None, version: int = 2) -> None:  # noqa: ARG002 - the base class's signature
        """Start a new stream: a fresh key from ``secrets`` or the replayable stream of ``a``."""
        self.generator = cipher_generator(a)
        self.gauss_next = None

    def random(self) -> float:
        """A float in [0, 1) from the top 53 bits of one 64-bit word."""
        return float(self.generator.random())

    def getrandbits(self, k: int) -> int:
        """k uniform bits from ceil(k / 64) 64-bit words of the stream."""
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        if 0 < k <= 64:  # the rational samplers' usual case: one word, no array
            return int(self.generator.bit_generator.random_raw()) >> (64 - k)
        words = -(-k // 64)
        raw = self.generator.bit_generator.random_raw(words).astype("<u8").tobytes()
        return int.from_bytes(raw, "little") >> (64 * words - k)

    def getstate(self) -> tuple[dict, float | None]:
        """The stream's position (its state includes the key: treat it as a secret)."""
        return self.generator.bit_generator.state, self.gauss_next

    def setstate(self, state: tuple[dict, float | None]) -> None:
        """Return to a position from :meth:`getstate`."""
        self.generator.bit_generator.state, self.gauss_next = state
