"""Pairwise-masked secure aggregation (Bonawitz et al., CCS 2017, without dropout recovery).

Every party k makes an X25519 key pair per session and gives its public key to every other
party over the mutually authenticated channel.  Parties k and l derive the shared seed
s_kl = HKDF-SHA256(X25519(k, l), info = label || context) and expand it, per round t, with
ChaCha20 into a vector PRG(s_kl, t) of uint64 words.  Party k's mask is

    mask_k = sum_{l > k} PRG(s_kl, t) - sum_{l < k} PRG(s_lk, t)   (mod 2^64)

so the masks of all r parties cancel in the sum and each masked vector alone is uniform to
anyone without the seeds (ChaCha20 as a PRF).  Each sum of a session has its own stream (the
nonce is stream || round), so no mask is ever used twice: VERDICTS for the rounds' verdicts,
NOISE for the noise shares, SUMS for the private mode's secure sums (round = the sum's
number).  A single party (r = 1) has no peers and a zero mask: the sum is its own vector,
which it would reveal anyway.

OR-aggregation of verdict bits v_kq in {0, 1}: party k sends w_kq = rho_kq * v_kq + mask_kq
with rho_kq uniform and non-zero; sum_k w_kq = sum_k rho_kq v_kq is 0 iff no party said 1,
except with probability <= r 2^-64 (a non-zero sum of uniform non-zero values hitting 0), and a
non-zero sum is uniform, so it tells neither which parties said 1 nor how many.
Randomness: the X25519 key and the rho come from the caller (a party passes its session keys'
secret and stream, so that every message it sends is a function of its draw keys and a
re-sent one is identical: docs/crypto.md, Randomness); by default, a key from ``cryptography``
(the OS CSPRNG) and rho from a fresh ChaCha20 stream keyed from :mod:`secrets`.

Parties are indices 0..r-1 in ring order and the context is bytes (the protocol layer,
cels.protocol.private_solve, maps party names to indices and passes the session id's bytes):
this module knows no names and no sessions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cels.crypto.streams import cipher_generator

SEED_LABEL = b"cels/pairwise-mask/v1\x00"
PUBLIC_KEY_BYTES = 32
VERDICTS = 0
"""Mask stream of the OR-aggregated verdicts (one round number per round)."""
NOISE = 1
"""Mask stream of the summed noise shares."""
SUMS = 2
"""Mask stream of the private mode's secure sums (one round number per sum of the session)."""


class MaskError(ValueError):
    """A peer's public key or a vector the aggregation cannot take."""


PRG_BLOCK_WORDS = 8
"""uint64 words of one ChaCha20 block (64 bytes): a PRG vector can start at any multiple."""


def prg_words(seed: bytes, round_number: int, length: int, stream: int = VERDICTS, offset: int = 0) -> np.ndarray:
    """Words ``offset`` .. ``offset + length`` of the uint64 vector ChaCha20(seed) with (stream,
    round number) as the nonce; ``offset`` is a multiple of :data:`PRG_BLOCK_WORDS` (the block
    counter starts there), so a vector made in pieces equals the vector made whole."""
    if offset % PRG_BLOCK_WORDS or not 0 <= offset // PRG_BLOCK_WORDS < 2**32:
        raise MaskError(f"PRG offset {offset}: not a multiple of {PRG_BLOCK_WORDS} words below 2^35")
    # `cryptography`: a 4-byte little-endian block counter, then the 12-byte nonce: stream (4 bytes), round (8 bytes)
    nonce = (offset // PRG_BLOCK_WORDS).to_bytes(4, "little") + stream.to_bytes(4, "little") + round_number.to_bytes(8, "little")
    encryptor = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8").astype(np.uint64)


class PairwiseMasks:
    """Party ``index``'s side of the masks among ``parties`` parties, indices 0..parties-1 in
    ring order, with HKDF info ``SEED_LABEL || context``; its X25519 ``private_key`` is made
    here unless given, and the OR shares' rho are drawn from ``rng`` (default: a fresh ChaCha20
    stream)."""

    def __init__(
        self, index: int, parties: int, context: bytes, private_key: X25519PrivateKey | None = None, rng: np.random.Generator | None = None
    ) -> None:
        if not 0 <= index < parties:
            raise MaskError(f"party index {index} outside 0..{parties - 1}")
        self.index, self.parties, self.context = index, parties, bytes(context)
        self._key = private_key or X25519PrivateKey.generate()
        self._rng = rng if rng is not None else cipher_generator()
        self._seeds: dict[int, bytes] = {}

    @classmethod
    def keyed(cls, index: int, parties: int, context: bytes, secret: bytes, rng: np.random.Generator) -> PairwiseMasks:
        """Party ``index``'s masks with the X25519 private key of the 32 bytes ``secret`` and
        rho from ``rng``: a holder's keys replayed, every masked vector is the same again."""
        return cls(index, parties, context, X25519PrivateKey.from_private_bytes(secret), rng)

    @property
    def public_key(self) -> bytes:
        return self._key.public_key().public_bytes_raw()

    @property
    def complete(self) -> bool:
        """Every other party's key is in."""
        return len(self._seeds) == self.parties - 1

    def add_peer(self, peer: int, public_key: bytes) -> None:
        """Derive s_{index,peer} from party ``peer``'s public key (once per peer)."""
        if peer == self.index or not 0 <= peer < self.parties:
            raise MaskError(f"no mask seed with party index {peer}")
        if peer in self._seeds:
            raise MaskError(f"second mask key from party index {peer}")
        if len(public_key) != PUBLIC_KEY_BYTES:
            raise MaskError(f"mask key: {len(public_key)} bytes, expected {PUBLIC_KEY_BYTES}")
        try:
            shared = self._key.exchange(X25519PublicKey.from_public_bytes(public_key))
        except ValueError as exc:  # a small-order point
            raise MaskError(f"mask key: {exc}") from None
        info = SEED_LABEL + self.context
        self._seeds[peer] = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)

    def mask(self, round_number: int, length: int, stream: int = VERDICTS, offset: int = 0) -> np.ndarray:
        """mask_index for one round (its entries ``offset`` .. ``offset + length``: :func:`prg_words`):
        + PRG of every later party, - PRG of every earlier one."""
        if not self.complete:
            raise MaskError("mask keys of some parties are missing")
        total = np.zeros(length, dtype=np.uint64)
        for peer, seed in self._seeds.items():
            words = prg_words(seed, round_number, length, stream, offset)
            total = total + words if peer > self.index else total - words  # wraps mod 2^64
        return total

    def masked_or_shares(self, round_number: int, verdicts: Sequence[int]) -> np.ndarray:
        """w_q = rho_q * v_q + mask_q (mod 2^64), rho_q uniform non-zero (OR-aggregation)."""
        v = np.asarray(verdicts, dtype=np.uint64)
        if v.size and v.max() > 1:
            raise MaskError("verdicts must be 0 or 1")
        rho = uniform_nonzero(len(v), self._rng)
        return rho * v + self.mask(round_number, len(v))

    def masked_values(self, values: Sequence[int], stream: int = NOISE, round_number: int = 0, offset: int = 0) -> np.ndarray:
        """w = values + mask (mod 2^64, two's complement): a signed integer vector whose sum over
        the parties is read back with :func:`signed`; ``values`` are the entries from ``offset``
        on of a longer vector (its masks: :meth:`mask`)."""
        v = np.asarray(values, dtype=np.int64).view(np.uint64)
        return v + self.mask(round_number, len(v), stream, offset)


def uniform_nonzero(length: int, rng: np.random.Generator) -> np.ndarray:
    """``length`` uniform non-zero uint64 values drawn from ``rng`` (uniform on [1, 2^64 - 1])."""
    return rng.integers(1, np.iinfo(np.uint64).max, size=length, dtype=np.uint64, endpoint=True)


def signed(total: np.ndarray) -> np.ndarray:
    """A sum mod 2^64 read as two's complement int64 (exact while |sum| < 2^63)."""
    return np.asarray(total, dtype=np.uint64).view(np.int64)


def aggregate(shares: Mapping[Any, np.ndarray]) -> np.ndarray:
    """The sum mod 2^64 of every party's masked vector, whatever the keys (the aggregator's
    only computation)."""
    vectors = list(shares.values())
    if not vectors or len({len(v) for v in vectors}) != 1:
        raise MaskError("masked vectors of different lengths")
    total = np.zeros(len(vectors[0]), dtype=np.uint64)
    for v in vectors:
        total = total + np.asarray(v, dtype=np.uint64)
    return total
