"""Single-use Paillier obfuscators -- fresh encryptions of zero -- as pure functions of the
key's integers (CELS section 4.2; docs/crypto.md, "Obfuscators").

A Paillier encryption is (1 + mN) s mod N^2 and a re-randomisation multiplies by s, where the
obfuscator s is a fresh encryption of zero.  Two modes (``OBFUSCATOR_MODES``):

* ``"djn"`` (the default): s = h_s^a mod N^2 with h_s = h^N mod N^2 published with the key
  (h = -x^2 mod N, Damgard-Jurik-Nielsen 2010) and a uniform of ceil(|N|/2) bits from
  :mod:`secrets`, computed with a fixed-base table of 8-bit windows (:class:`FixedBaseTable`):
  one multiplication mod N^2 per window, about 14x cheaper than r^N at 2048 bits.  Secure
  under DCR plus the small-exponent assumption stated in docs/crypto.md.
* ``"textbook"``: s = r^N mod N^2 with r uniform in Z_N^* (one full modular exponentiation).

Everything here takes N and h_s as integers and returns integers: :func:`obfuscators` in the
calling process, :func:`obfuscator_batch` as big-endian bytes (what a worker process of a
node's pool runs, cels.node.obfuscator_stock), :class:`InlineObfuscators` as an
:class:`ObfuscatorSource` computing on demand.  Pools, the offline stock and their threads
live in the node layer.  Every obfuscator is handed out once and then dropped.

This module stays import-light (no numpy) because spawned workers import it.
"""

from __future__ import annotations

import functools
import secrets
from typing import Protocol

import gmpy2

OBFUSCATOR_MODES = ("djn", "textbook")
DEFAULT_OBFUSCATOR_MODE = "djn"
WINDOW_BITS = 8
"""Fixed-base window: 256 powers per window, one multiplication per 8 exponent bits."""


def check_mode(mode: str) -> str:
    if mode not in OBFUSCATOR_MODES:
        raise ValueError(f"obfuscator mode must be one of {OBFUSCATOR_MODES}, got {mode!r}")
    return mode


def djn_exponent_bits(n) -> int:
    """Bits of the DJN exponent a: ceil(|N| / 2) (1024 at 2048 bits), as in DJN 2010 and libdjn."""
    return (int(n).bit_length() + 1) // 2


class FixedBaseTable:
    """base^e mod ``modulus`` for 0 <= e < 2^``exponent_bits`` by 8-bit windows.

    Row i holds base^(j 2^(8i)) for j = 0..255, so base^e is the product of one entry per
    window (the bytes of e): ceil(exponent_bits / 8) - 1 multiplications mod ``modulus``,
    no squaring.  At 2048 bits (modulus N^2, 1024-bit exponents) the table is 128 rows of 256
    4096-bit values, about 17 MB, built with 32,640 multiplications."""

    def __init__(self, base, modulus, exponent_bits: int) -> None:
        if exponent_bits < 1:
            raise ValueError("fixed-base table: exponent_bits must be >= 1")
        self.modulus = gmpy2.mpz(modulus)
        self.windows = -(-exponent_bits // WINDOW_BITS)
        g = gmpy2.mpz(base) % self.modulus
        self._rows: list[list] = []
        for _ in range(self.windows):
            row = [gmpy2.mpz(1), g]
            for _ in range(2, 1 << WINDOW_BITS):
                row.append(row[-1] * g % self.modulus)
            self._rows.append(row)
            g = row[-1] * g % self.modulus  # base^(2^(8(i+1)))

    @property
    def nbytes(self) -> int:
        """Bytes of the table's values (each entry a full-width residue mod ``modulus``)."""
        return self.windows * (1 << WINDOW_BITS) * ((self.modulus.bit_length() + 7) // 8)

    def pow(self, exponent: int):
        """base^exponent mod modulus, for 0 <= exponent < 2^(8 windows)."""
        digits = int(exponent).to_bytes(self.windows, "little")
        m = self.modulus
        acc = self._rows[0][digits[0]]
        for row, d in zip(self._rows[1:], digits[1:]):
            if d:
                acc = acc * row[d] % m
        return acc


@functools.lru_cache(maxsize=4)
def djn_table(n: int, hs: int) -> FixedBaseTable:
    """The fixed-base table of h_s mod N^2 for DJN exponents; cached per key (a session
    encrypts under at most a few keys; 17 MB each at 2048 bits)."""
    n = gmpy2.mpz(n)
    return FixedBaseTable(hs, n * n, djn_exponent_bits(n))


def random_unit(n) -> gmpy2.mpz:
    """A uniform r in Z_N^* drawn with :mod:`secrets`."""
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def obfuscators(n, hs, count: int, mode: str = DEFAULT_OBFUSCATOR_MODE) -> list:
    """``count`` fresh encryptions of zero under the key (N, h_s), computed in this process:
    h_s^a (``"djn"``, a of :func:`djn_exponent_bits` bits) or r^N (``"textbook"``)."""
    n = gmpy2.mpz(n)
    if check_mode(mode) == "djn":
        table, bits = djn_table(int(n), int(hs)), djn_exponent_bits(n)
        return [table.pow(secrets.randbits(bits)) for _ in range(count)]
    nsquare = n * n
    return [gmpy2.powmod(random_unit(n), n, nsquare) for _ in range(count)]


def obfuscator_batch(n_bytes: bytes, hs_bytes: bytes, mode: str, count: int, width: int) -> list[bytes]:
    """:func:`obfuscators` of the key given as big-endian bytes (N, h_s), returned as big-endian
    bytes of ``width`` bytes: the entry a worker process runs (nothing pickled but bytes)."""
    n, hs = int.from_bytes(n_bytes, "big"), int.from_bytes(hs_bytes, "big")
    return [int(x).to_bytes(width, "big") for x in obfuscators(n, hs, count, mode)]


class ObfuscatorSource(Protocol):
    """Anything that hands out fresh encryptions of zero for one public key N."""

    n: int

    def take(self, hs: int, count: int) -> list:
        """Return ``count`` fresh obfuscators (gmpy2 mpz) under the key (``n``, ``hs``), each
        never handed out again (``hs``, the key's h_s, is what DJN raises to a power)."""
        ...


class InlineObfuscators:
    """Obfuscators computed on demand in the calling process."""

    def __init__(self, n: int, mode: str = DEFAULT_OBFUSCATOR_MODE) -> None:
        self.n = int(n)
        self.mode = check_mode(mode)

    def take(self, hs: int, count: int) -> list:
        return obfuscators(self.n, hs, count, self.mode)
