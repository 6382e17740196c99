"""Pohlig-Hellman commutative cipher over a safe-prime group (CELS Algorithm 3).

E_e(x) = x^e mod p and D_d(y) = y^d mod p with e odd and invertible mod p - 1 and
d = e^-1 mod (p - 1), so E_a(E_b(x)) = E_b(E_a(x)) and the cipher is deterministic: equal
plaintexts under the same keys give equal ciphertexts (the secure union removes duplicates
that way).  Keys come from :mod:`secrets`, fresh for every session.

Messages live in the quadratic-residue subgroup of prime order q = (p - 1) / 2, so that the
cipher leaks no Legendre symbol.  Byte strings are encoded injectively:

* record = 4-byte big-endian length || data, zero-padded to a multiple of C bytes,
  C = (bits(q) - 1) // 8 (255 bytes for a 2048-bit group);
* every C-byte chunk is an integer x = int(chunk) + 2 in [2, 2^(8C) + 1] within [2, q]
  (never 1, the one element every key fixes); the element is x if x is a QR mod p, else
  p - x (exactly one of them is: p = 3 mod 4);
* decoding maps y to y if y <= q else p - y, drops the +2, and reads the length prefix.

So the empty string, non-UTF-8 bytes and records of any length round-trip; the chunks of a
record are encrypted and travel together (``EncryptedRecord.chunks``).  The number of chunks
of a record (its length in units of C bytes) is visible to every party unless every record
is padded to an agreed number of chunks (``encode_record(..., chunks=k)``).
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Sequence

import gmpy2

from cels.crypto.groups import DEFAULT_GROUP_BITS, SafePrimeGroup, group_for_bits

LENGTH_PREFIX_BYTES = 4
HASH_DOMAIN = b"cels/pohlig-hellman-hash/v1\x00"


class CommutativeCipherError(ValueError):
    """Malformed group elements or an undecodable record."""


CHUNK_SHIFT = 2  # chunk value c is carried as x = c + 2: x = 1 would be a fixed point of E


def chunk_bytes(group: SafePrimeGroup) -> int:
    """Payload bytes per group element: 2^(8C) + 1 < q keeps x = chunk + 2 within [2, q]."""
    return (group.q.bit_length() - 2) // 8


def to_subgroup(group: SafePrimeGroup, x: int) -> gmpy2.mpz:
    """x in [1, q] -> x or p - x, whichever is a quadratic residue mod p."""
    x = gmpy2.mpz(x)
    return x if gmpy2.legendre(x, group.p) == 1 else group.p - x


def from_subgroup(group: SafePrimeGroup, y: int) -> gmpy2.mpz:
    """Inverse of :func:`to_subgroup`: y if y <= q else p - y."""
    y = gmpy2.mpz(y)
    return y if y <= group.q else group.p - y


def encode_record(group: SafePrimeGroup, data: bytes, chunks: int | None = None) -> list[gmpy2.mpz]:
    """Injective encoding of a byte string as QR-subgroup elements: as few as it needs, or
    exactly ``chunks`` (zero padding; a longer record is an error) to hide its length."""
    size = chunk_bytes(group)
    if len(data) >= 2 ** (8 * LENGTH_PREFIX_BYTES):
        raise CommutativeCipherError(f"record of {len(data)} bytes is too long")
    framed = len(data).to_bytes(LENGTH_PREFIX_BYTES, "big") + bytes(data)
    needed = -(-len(framed) // size)
    if chunks is not None and needed > chunks:
        raise CommutativeCipherError(f"record of {len(data)} bytes needs {needed} chunks, more than the agreed {chunks}")
    framed += bytes((chunks or needed) * size - len(framed))
    return [to_subgroup(group, int.from_bytes(framed[i : i + size], "big") + CHUNK_SHIFT) for i in range(0, len(framed), size)]


def decode_record(group: SafePrimeGroup, elements: Sequence[int]) -> bytes:
    """Inverse of :func:`encode_record`; raises on elements no encoding produces."""
    size = chunk_bytes(group)
    limit = 2 ** (8 * size) + CHUNK_SHIFT
    parts = []
    for i, y in enumerate(elements):
        x = from_subgroup(group, y)
        if not CHUNK_SHIFT <= x < limit:
            raise CommutativeCipherError(f"chunk {i} is not the encoding of any record chunk")
        parts.append(int(x - CHUNK_SHIFT).to_bytes(size, "big"))
    framed = b"".join(parts)
    if len(framed) < LENGTH_PREFIX_BYTES:
        raise CommutativeCipherError("record has no chunks")
    length = int.from_bytes(framed[:LENGTH_PREFIX_BYTES], "big")
    end = LENGTH_PREFIX_BYTES + length
    if end > len(framed) or any(framed[end:]):
        raise CommutativeCipherError("record length prefix does not match its chunks")
    return framed[LENGTH_PREFIX_BYTES:end]


def element_to_bytes(group: SafePrimeGroup, y: int) -> bytes:
    return int(y).to_bytes(group.element_bytes, "big")


def element_from_bytes(group: SafePrimeGroup, raw: bytes) -> gmpy2.mpz:
    """Parse a received element: exact length, 1 < y < p, and a quadratic residue."""
    if len(raw) != group.element_bytes:
        raise CommutativeCipherError(f"group element of {len(raw)} bytes, expected {group.element_bytes}")
    y = gmpy2.mpz(int.from_bytes(raw, "big"))
    if not 1 < y < group.p or gmpy2.legendre(y, group.p) != 1:
        raise CommutativeCipherError("group element outside the quadratic-residue subgroup")
    return y


def hash_to_element(group: SafePrimeGroup, data: bytes) -> gmpy2.mpz:
    """Hash a byte string into the QR subgroup (SHAKE-256 to C bytes, then as a chunk)."""
    digest = hashlib.shake_256(HASH_DOMAIN + data).digest(chunk_bytes(group))
    return to_subgroup(group, int.from_bytes(digest, "big") + CHUNK_SHIFT)


class PohligHellman:
    """One party's Pohlig-Hellman key pair (e, d) for one session; e drawn with :mod:`secrets`,
    or from ``rng`` (a cipher stream, cels.crypto.streams.DrawKeys)."""

    def __init__(self, group: SafePrimeGroup | None = None, rng: random.Random | None = None) -> None:
        self.group = group or group_for_bits(DEFAULT_GROUP_BITS)
        order = self.group.p - 1
        randbelow = rng.randrange if rng is not None else secrets.randbelow
        while True:
            e = randbelow(order - 3) + 3  # odd, in [3, p - 2], gcd(e, p - 1) = 1
            if e % 2 == 1 and gmpy2.gcd(e, order) == 1:
                break
        self._set(e)

    @classmethod
    def from_exponent(cls, group: SafePrimeGroup, raw: bytes) -> PohligHellman:
        """The key whose exponent e is the big-endian ``raw`` (:meth:`exponent_bytes`)."""
        e = int.from_bytes(raw, "big")
        if not (3 <= e <= group.p - 2 and gmpy2.gcd(e, group.p - 1) == 1):
            raise ValueError("not a Pohlig-Hellman exponent of this group")
        key = cls.__new__(cls)
        key.group = group
        key._set(e)
        return key

    def _set(self, e: int) -> None:
        self._e = gmpy2.mpz(e)
        self._d = gmpy2.invert(self._e, self.group.p - 1)

    def exponent_bytes(self) -> bytes:
        """The secret exponent e, big-endian: how the key reaches the party's own workers, which
        rebuild it with :meth:`from_exponent` (never a pickled key object)."""
        return int(self._e).to_bytes((self.group.p.bit_length() + 7) // 8, "big")

    def encrypt(self, element: int) -> gmpy2.mpz:
        """E_e(x) = x^e mod p."""
        return gmpy2.powmod(element, self._e, self.group.p)

    def decrypt(self, element: int) -> gmpy2.mpz:
        """D_d(y) = y^d mod p."""
        return gmpy2.powmod(element, self._d, self.group.p)

    def encrypt_record(self, chunks: Sequence[int]) -> list[gmpy2.mpz]:
        return [self.encrypt(c) for c in chunks]

    def decrypt_record(self, chunks: Sequence[int]) -> list[gmpy2.mpz]:
        return [self.decrypt(c) for c in chunks]


class PohligHellmanHash:
    """Commutative hashing of identifiers with Pohlig-Hellman (universe phase, never decrypted).

    ``hash(ids)`` maps each id into the group and applies this party's key; ``apply`` adds
    this party's layer to elements other parties produced.  Same interface as
    :class:`cels.crypto.ec_hash.X25519Hash`.
    """

    name = "pohlig-hellman"

    def __init__(self, group: SafePrimeGroup | None = None, rng: random.Random | None = None) -> None:
        self.cipher = PohligHellman(group, rng)
        self.group = self.cipher.group

    @classmethod
    def from_exponent(cls, group: SafePrimeGroup, raw: bytes) -> PohligHellmanHash:
        """The hash keyed by the exponent ``raw`` (:meth:`exponent_bytes`)."""
        out = cls.__new__(cls)
        out.cipher, out.group = PohligHellman.from_exponent(group, raw), group
        return out

    def exponent_bytes(self) -> bytes:
        """The secret exponent (see :meth:`PohligHellman.exponent_bytes`)."""
        return self.cipher.exponent_bytes()

    def hash(self, ids: Sequence[bytes]) -> list[bytes]:
        return [element_to_bytes(self.group, self.cipher.encrypt(hash_to_element(self.group, i))) for i in ids]

    def apply(self, elements: Sequence[bytes]) -> list[bytes]:
        return [element_to_bytes(self.group, self.cipher.encrypt(element_from_bytes(self.group, e))) for e in elements]
