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
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
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


INDEX_BITS = 64
"""An indexed stream starts at ChaCha counter ``index << 64``: 2^64 blocks before the next index."""


class DrawKeys:
    """One holder's keys for one session, every one derived from a 256-bit root by HKDF-SHA256
    under a label (docs/crypto.md, Randomness):

    - :meth:`stream`: a ChaCha20 stream for draws the holder makes in one sequence;
    - :meth:`indexed`: the stream of one index (a user bucket and a stage, say) under a label's
      key, starting at ChaCha counter ``index << 64``: the same draws whichever process makes
      them and in whatever order, which is what lets a party's users be split over any number
      of workers without changing the release;
    - :meth:`secret`: 32 raw bytes (a curve scalar, an HMAC key).

    ``DrawKeys.fresh()`` takes the root from :mod:`secrets`; ``DrawKeys.replay(seed, holder)``
    derives it from an explicit seed and the holder's name, for tests and reproduction only
    (anyone who knows the seed replays every draw: NOT private)."""

    def __init__(self, root: bytes, *, seeded: bool) -> None:
        if len(root) != KEY_BITS // 8:
            raise ValueError(f"a draw root key has {KEY_BITS // 8} bytes, not {len(root)}")
        self._root, self.seeded = root, seeded

    @classmethod
    def fresh(cls) -> DrawKeys:
        """A root of 256 bits from :mod:`secrets` (every session, by default)."""
        return cls(secrets.token_bytes(KEY_BITS // 8), seeded=False)

    @classmethod
    def replay(cls, seed: int, holder: str) -> DrawKeys:
        """The root of ``seed`` for ``holder``: the same draws in every run with that seed."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**KEY_BITS:
            raise ValueError(f"a replay seed must be an integer in [0, 2^{KEY_BITS}), got {seed!r}")
        return cls(_hkdf(int(seed).to_bytes(KEY_BITS // 8, "big"), b"cels replay " + holder.encode()), seeded=True)

    @classmethod
    def of(cls, seed: int | None, holder: str) -> DrawKeys:
        """:meth:`fresh` keys, or with a ``seed`` the :meth:`replay` of ``holder``'s."""
        return cls.fresh() if seed is None else cls.replay(seed, holder)

    def root_bytes(self) -> bytes:
        """The raw root key: how the keys reach the party's own workers, which rebuild them
        with ``DrawKeys(root, seeded=...)`` (never a pickled key object)."""
        return self._root

    def secret(self, label: str) -> bytes:
        """The 32-byte key of ``label`` (HKDF-SHA256 of the root, info = label)."""
        return _hkdf(self._root, label.encode())

    def stream(self, label: str) -> np.random.Generator:
        """The ChaCha20 stream keyed by :meth:`secret` of ``label``."""
        return self.indexed(label, 0)

    def indexed(self, label: str, index: int) -> np.random.Generator:
        """Stream ``index`` (in [0, 2^64)) under ``label``'s key: ChaCha20 from counter ``index << 64``."""
        if not 0 <= index < 2**INDEX_BITS:
            raise ValueError(f"a stream index must be in [0, 2^{INDEX_BITS}), got {index}")
        key = int.from_bytes(self.secret(label), "little")
        return np.random.Generator(ChaCha(key=key, counter=index << INDEX_BITS, rounds=ROUNDS))


def _hkdf(material: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BITS // 8, salt=None, info=info).derive(material)
