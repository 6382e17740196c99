"""Packed Paillier: vectors and matrices of signed fixed-point values under a key of
:mod:`cels.crypto.paillier`.

Used by the secure counts sum (CELS Algorithm 1) and the secure NLP (Algorithm 2).

Keys: N = pq from phe's prime generator, with p = q = 3 mod 4 and gcd(p - 1, q - 1) = 2 (an
admissible modulus for Damgard-Jurik-Nielsen); g = N + 1, and the public key also carries
h_s = h^N mod N^2 with h = -x^2 mod N, so that Enc(m) = (1 + mN) s mod N^2 with a fresh
encryption of zero s = h_s^a (DJN, the default) or r^N (textbook).  Everything else is gmpy2:

* **Packing.**  A value v becomes the integer round(v 2^scale_bits) + B, where B (the
  ``offset``) bounds |round(v 2^scale_bits)|; it lies in [0, 2B].  ``slots`` such values of
  ``slot_bits`` bits each share one plaintext.  Summing t packed vectors gives slots in
  [0, 2tB], so ``slot_bits`` = bits(2 B summands) (rounded up to whole bytes) leaves room for
  ``summands`` additions; ``terms`` counts the additions so far and an addition beyond
  ``summands`` raises :class:`PackingOverflowError` -- never a silent wrap.  Decoding
  subtracts terms * B from every slot.
* **Direction.**  The slots of a ciphertext run *down a column*: column j of a rows x cols
  matrix is ceil(rows / slots) ciphertexts, stored consecutively (column-major blocks).  A
  permutation of the columns (variables x_i, Algorithm 2 lines 10-11) therefore moves whole
  ciphertexts.  A 1-D vector is encrypted as one column, so its entries are packed together.
* **Operations.**  Encrypt (one multiplication by a precomputed obfuscator s, see
  :mod:`cels.crypto.obfuscators`), add two encrypted matrices (c1 c2 mod N^2), add a
  plaintext matrix ((1 + mN) c mod N^2, no encryption), re-randomise (c s mod N^2),
  decrypt with CRT (mod p^2 and q^2), and big-endian bytes for the wire (never pickle).
* **Key sizes.**  2048 bits by default, 3072 allowed; 512 and 1024 (the paper's tables) and
  smaller test keys only with ``allow_insecure_key_bits=True``.

The DJN obfuscators rest on an assumption beyond DCR (docs/crypto.md, "Obfuscators").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gmpy2
import numpy as np
import phe
import phe.util

from cels.crypto.obfuscators import ObfuscatorSource
from cels.crypto.paillier import CiphertextError, PrivateKey, PublicKey

MAX_ENCODED_BOUND = 2**62  # B: encoded values v + B must fit an unsigned 64-bit integer


class PackingOverflowError(ValueError):
    """A value outside the packing's bound, or more additions than the packing has room for."""


@dataclass(frozen=True)
class Packing:
    """How signed fixed-point values share a plaintext (see the module docstring)."""

    slot_bits: int
    slots: int
    scale_bits: int
    offset: int
    summands: int

    @classmethod
    def for_values(cls, public_key: PublicKey, bound: float, summands: int, scale_bits: int = 0) -> Packing:
        """Slots for values |v| <= ``bound`` with ``scale_bits`` fractional bits, and room for
        ``summands`` packed additions (the number of parties, plus any extra additions)."""
        if summands < 1:
            raise ValueError("packing: summands must be >= 1")
        if not (bound >= 0 and math.isfinite(bound)):
            raise ValueError(f"packing: bound must be finite and >= 0, got {bound}")
        offset = max(1, math.ceil(bound * 2**scale_bits))
        if offset > MAX_ENCODED_BOUND:
            raise PackingOverflowError(f"packing: bound * 2^scale_bits = {offset} exceeds 2^62")
        slot_bits = 8 * math.ceil((2 * offset * summands).bit_length() / 8)
        slots = (public_key.bits - 1) // slot_bits
        if slots < 1:
            raise PackingOverflowError(f"packing: a {slot_bits}-bit slot does not fit a {public_key.bits}-bit key")
        return cls(slot_bits, slots, scale_bits, offset, summands)

    @property
    def slot_bytes(self) -> int:
        return self.slot_bits // 8

    def blocks(self, rows: int) -> int:
        """Ciphertexts per column of ``rows`` values."""
        return max(1, -(-rows // self.slots))

    def check_key(self, public_key: PublicKey) -> None:
        """The packed plaintext must stay below N, with headroom for ``summands`` additions."""
        if self.slot_bits % 8 or self.slots < 1 or self.summands < 1 or not 0 < self.offset <= MAX_ENCODED_BOUND:
            raise CiphertextError(f"packing {self} is malformed")
        if self.slots * self.slot_bits > public_key.bits - 1:
            raise CiphertextError(f"packing: {self.slots} slots of {self.slot_bits} bits exceed the {public_key.bits}-bit key")
        if (2 * self.offset * self.summands).bit_length() > self.slot_bits:
            raise CiphertextError(f"packing: {self.slot_bits}-bit slots leave no headroom for {self.summands} summands")

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """Fixed-point integers round(v 2^scale_bits) as int64; raises if |.| > offset."""
        values = np.asarray(values)
        if values.dtype.kind in "iub":
            ints = values.astype(np.int64)
            big = np.abs(ints) > (self.offset >> self.scale_bits)
            ints = ints << self.scale_bits
        elif values.dtype.kind == "f":
            if not np.all(np.isfinite(values)):
                bad = np.argwhere(~np.isfinite(values))[0]
                raise PackingOverflowError(f"value at index {tuple(bad)} is not finite: {values[tuple(bad)]}")
            scaled = np.rint(values * float(2**self.scale_bits))
            big = np.abs(scaled) > float(self.offset)
            ints = np.where(big, 0, scaled).astype(np.int64)
        else:
            raise TypeError(f"packing: cannot encode values of dtype {values.dtype}")
        if np.any(big) or np.any(np.abs(ints) > self.offset):
            index = tuple(np.argwhere(big | (np.abs(ints) > self.offset))[0])
            raise PackingOverflowError(
                f"value {values[index]} at index {index} exceeds the packing bound "
                f"{self.offset / 2**self.scale_bits} (scale 2^-{self.scale_bits})"
            )
        return ints

    def encode(self, matrix: np.ndarray) -> list[int]:
        """Plaintexts of a rows x cols matrix, column-major blocks of ``slots`` rows each
        (the first row of a block in the most significant slot); padding slots hold 0."""
        ints = self.quantize(matrix)
        rows, cols = ints.shape
        blocks = self.blocks(rows)
        encoded = np.ascontiguousarray((ints + self.offset).astype(">u8").T)  # cols x rows, in [0, 2B]
        padded = np.zeros((cols, blocks * self.slots, 8), dtype=np.uint8)
        padded[:, :rows, :] = encoded.view(np.uint8).reshape(cols, rows, 8)
        width = self.slot_bytes
        if width >= 8:
            slot = np.zeros((cols, blocks * self.slots, width), dtype=np.uint8)
            slot[:, :, width - 8 :] = padded
        else:
            slot = padded[:, :, 8 - width :]
        data = np.ascontiguousarray(slot).reshape(cols * blocks, self.slots * width)
        return [int.from_bytes(row.tobytes(), "big") for row in data]

    def decode(self, plaintexts: Sequence[int], rows: int, cols: int, terms: int) -> np.ndarray:
        """Inverse of :meth:`encode` after ``terms`` packed additions: a rows x cols int64
        array of fixed-point integers (sums of ``terms`` quantized values)."""
        width, length = self.slot_bytes, self.slots * self.slot_bytes
        try:
            data = b"".join(int(m).to_bytes(length, "big") for m in plaintexts)
        except OverflowError:
            raise CiphertextError("decrypted plaintext is wider than its packing (wrong key or packing)") from None
        raw = np.frombuffer(data, dtype=np.uint8).reshape(cols, -1, width)[:, :rows, :]
        top = 2 * self.offset * terms
        if width <= 7:
            wide = np.zeros((cols, rows, 8), dtype=np.uint8)
            wide[:, :, 8 - width :] = raw
            slots = wide.view(">u8").reshape(cols, rows).astype(np.int64)
            if np.any(slots > top):
                raise CiphertextError("decrypted slot above its headroom (wrong key, packing or terms)")
            out = slots - terms * self.offset
        else:
            flat = [int.from_bytes(cell.tobytes(), "big") for cell in raw.reshape(-1, width)]
            if any(v > top for v in flat):
                raise CiphertextError("decrypted slot above its headroom (wrong key, packing or terms)")
            sums = [v - terms * self.offset for v in flat]
            if any(abs(v) >= 2**63 for v in sums):
                raise PackingOverflowError("decrypted fixed-point sums do not fit 64-bit integers")
            out = np.array(sums, dtype=np.int64).reshape(cols, rows)
        return np.ascontiguousarray(out.T)

    def offset_bytes(self) -> bytes:
        """The slot offset, big-endian (its wire form)."""
        return self.offset.to_bytes((self.offset.bit_length() + 7) // 8 or 1, "big")


@dataclass
class EncryptedMatrix:
    """An encrypted rows x cols matrix: column j is ``ciphertexts[j*b:(j+1)*b]``,
    b = ``packing.blocks(rows)``; ``terms`` packed vectors have been summed into it."""

    public_key: PublicKey
    rows: int
    cols: int
    packing: Packing
    terms: int
    ciphertexts: list

    @property
    def blocks(self) -> int:
        return self.packing.blocks(self.rows)

    def _with(self, ciphertexts: list, terms: int | None = None) -> EncryptedMatrix:
        return EncryptedMatrix(self.public_key, self.rows, self.cols, self.packing, self.terms if terms is None else terms, ciphertexts)

    def _check_terms(self, terms: int) -> int:
        if terms > self.packing.summands:
            raise PackingOverflowError(
                f"adding would make {terms} summands; the packing has headroom for {self.packing.summands}"
            )
        return terms

    def add(self, other: EncryptedMatrix) -> EncryptedMatrix:
        """Homomorphic sum of two encrypted matrices under the same key and packing (c1 c2 mod N^2)."""
        if other.public_key != self.public_key or other.packing != self.packing:
            raise ValueError("encrypted matrices under different keys or packings cannot be added")
        if (other.rows, other.cols) != (self.rows, self.cols):
            raise ValueError(f"shape mismatch: {self.rows}x{self.cols} + {other.rows}x{other.cols}")
        terms = self._check_terms(self.terms + other.terms)
        nsq = self.public_key.nsquare
        return self._with([a * b % nsq for a, b in zip(self.ciphertexts, other.ciphertexts)], terms)

    def add_plain(self, matrix: np.ndarray) -> EncryptedMatrix:
        """Add a plaintext matrix (Algorithm 1 line 4 without an encryption): c (1 + mN) mod N^2.

        The result is *not* re-randomised; call :meth:`rerandomize` before it leaves the party."""
        matrix = _as_matrix(matrix)
        if matrix.shape != (self.rows, self.cols):
            raise ValueError(f"shape mismatch: {self.rows}x{self.cols} + plaintext {matrix.shape}")
        terms = self._check_terms(self.terms + 1)
        n, nsq = self.public_key.n, self.public_key.nsquare
        plain = self.packing.encode(matrix)
        return self._with([c * (1 + m * n) % nsq for c, m in zip(self.ciphertexts, plain)], terms)

    def permute_columns(self, perm: Sequence[int]) -> EncryptedMatrix:
        """New column j = old column ``perm[j]`` (numpy ``M[:, perm]``); moves whole ciphertexts.

        Not re-randomised: call :meth:`rerandomize` before forwarding (Algorithm 2 line 11)."""
        perm = np.asarray(perm, dtype=np.int64)
        if perm.shape != (self.cols,) or not np.array_equal(np.sort(perm), np.arange(self.cols)):
            raise ValueError(f"not a permutation of {self.cols} columns")
        b = self.blocks
        return self._with([c for j in perm for c in self.ciphertexts[j * b : (j + 1) * b]])

    def rerandomize(self, obfuscators: ObfuscatorSource) -> EncryptedMatrix:
        """Multiply every ciphertext by a fresh encryption of zero (single-use obfuscators)."""
        _check_source(self.public_key, obfuscators)
        nsq = self.public_key.nsquare
        fresh = obfuscators.take(int(self.public_key.hs), len(self.ciphertexts))
        return self._with([c * r % nsq for c, r in zip(self.ciphertexts, fresh)])

    def ciphertext_bytes(self) -> list[bytes]:
        """Every ciphertext, big-endian at the key's fixed width (the wire form)."""
        width = self.public_key.ciphertext_bytes
        return [int(c).to_bytes(width, "big") for c in self.ciphertexts]

    @classmethod
    def from_bytes(
        cls, public_key: PublicKey, rows: int, cols: int, packing: Packing, terms: int, raws: Sequence[bytes]
    ) -> EncryptedMatrix:
        """Parse and validate received ciphertexts: packing fits the key, ciphertext count, and
        every ciphertext is exactly ``ciphertext_bytes`` long, below N^2 and invertible mod N^2."""
        packing.check_key(public_key)
        if terms < 1 or terms > packing.summands:
            raise CiphertextError(f"encrypted matrix: terms {terms} outside 1..{packing.summands}")
        expected = cols * packing.blocks(rows)
        if rows < 1 or len(raws) != expected:
            raise CiphertextError(f"encrypted {rows}x{cols} matrix needs {expected} ciphertexts, got {len(raws)}")
        width, n, nsq = public_key.ciphertext_bytes, public_key.n, public_key.nsquare
        ciphertexts = []
        for i, raw in enumerate(raws):
            if len(raw) != width:
                raise CiphertextError(f"ciphertext {i}: {len(raw)} bytes, expected {width}")
            c = gmpy2.mpz(int.from_bytes(raw, "big"))
            if c >= nsq:
                raise CiphertextError(f"ciphertext {i}: not below N^2")
            if gmpy2.gcd(c, n) != 1:
                raise CiphertextError(f"ciphertext {i}: not invertible mod N^2")
            ciphertexts.append(c)
        return cls(public_key, rows, cols, packing, terms, ciphertexts)


def _as_matrix(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim == 1:
        return values.reshape(-1, 1)
    if values.ndim != 2 or values.shape[0] < 1:
        raise ValueError(f"expected a non-empty vector or matrix, got shape {values.shape}")
    return values


def _check_source(public_key: PublicKey, obfuscators: ObfuscatorSource) -> None:
    if int(obfuscators.n) != int(public_key.n):
        raise ValueError("obfuscators were computed for a different public key")


def encrypt(public_key: PublicKey, values: np.ndarray, packing: Packing, obfuscators: ObfuscatorSource) -> EncryptedMatrix:
    """Encrypt a matrix (or a 1-D vector, as one column) packed down its columns:
    Enc(m) = (1 + mN) s mod N^2 with one precomputed obfuscator s per ciphertext."""
    packing.check_key(public_key)
    _check_source(public_key, obfuscators)
    matrix = _as_matrix(values)
    n, nsq = public_key.n, public_key.nsquare
    plain = packing.encode(matrix)
    fresh = obfuscators.take(int(public_key.hs), len(plain))
    ciphertexts = [(1 + m * n) * r % nsq for m, r in zip(plain, fresh)]
    return EncryptedMatrix(public_key, matrix.shape[0], matrix.shape[1], packing, 1, ciphertexts)


DECRYPT_CHUNK = 256
"""Ciphertexts per task when a pool decrypts (each task is a few hundred ms at 2048 bits)."""


class Executor(Protocol):
    """A pool the caller owns and passes in: a ``concurrent.futures`` executor (processes or
    threads), whose ``submit`` returns a future."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...


def int_bytes(x) -> bytes:
    """A non-negative integer as minimal big-endian bytes (the wire's encoding of N and ciphertexts)."""
    return int(x).to_bytes((int(x).bit_length() + 7) // 8 or 1, "big")


def _decrypt_chunk(n: bytes, hs: bytes, p: bytes, q: bytes, ciphertexts: list[bytes]) -> list[bytes]:
    """Pool entry (a worker process or thread): CRT decryption of big-endian ciphertexts under
    the key (N, h_s, p, q)."""
    public = phe.PaillierPublicKey(int.from_bytes(n, "big"))
    public_key = PublicKey(public.n, int.from_bytes(hs, "big"))
    key = PrivateKey.from_phe(public_key, phe.PaillierPrivateKey(public, int.from_bytes(p, "big"), int.from_bytes(q, "big")))
    return [int_bytes(m) for m in key.decrypt_raw_list([gmpy2.mpz(int.from_bytes(c, "big")) for c in ciphertexts])]


def decrypt_raw_many(private_key: PrivateKey, ciphertexts: Sequence, executor: Executor | None = None) -> list:
    """CRT decryption of many ciphertexts, in chunks on ``executor`` if given: a process pool,
    or a thread pool (the exponentiations release the GIL).  The key's factors and the
    ciphertexts reach the pool as big-endian bytes (nothing pickled)."""
    if executor is None or len(ciphertexts) < 2 * DECRYPT_CHUNK:
        return private_key.decrypt_raw_list(ciphertexts)
    public_key = private_key.public_key
    key = [int_bytes(v) for v in (public_key.n, public_key.hs, private_key.p, private_key.q)]
    chunks = [
        executor.submit(_decrypt_chunk, *key, [int_bytes(c) for c in ciphertexts[i : i + DECRYPT_CHUNK]])
        for i in range(0, len(ciphertexts), DECRYPT_CHUNK)
    ]
    return [gmpy2.mpz(int.from_bytes(m, "big")) for chunk in chunks for m in chunk.result()]


def decrypt_fixed(private_key: PrivateKey, encrypted: EncryptedMatrix, executor: Executor | None = None) -> np.ndarray:
    """Decrypt (CRT) to the rows x cols int64 fixed-point sums, value * 2^scale_bits."""
    if encrypted.public_key != private_key.public_key:
        raise ValueError("encrypted matrix is under a different public key")
    plain = decrypt_raw_many(private_key, encrypted.ciphertexts, executor)
    return encrypted.packing.decode(plain, encrypted.rows, encrypted.cols, encrypted.terms)


def decrypt(private_key: PrivateKey, encrypted: EncryptedMatrix, executor: Executor | None = None) -> np.ndarray:
    """Decrypt to a rows x cols numpy array: int64 when ``scale_bits`` = 0, else float64."""
    fixed = decrypt_fixed(private_key, encrypted, executor)
    scale = encrypted.packing.scale_bits
    return fixed if scale == 0 else fixed.astype(np.float64) / float(2**scale)
