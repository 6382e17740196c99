"""Paillier keys on phe + gmpy2 (the packed vectors and matrices are :mod:`cels.crypto.packing`).

Keys: N = pq from phe's prime generator, with p = q = 3 mod 4 and gcd(p - 1, q - 1) = 2 (an
admissible modulus for Damgard-Jurik-Nielsen); g = N + 1, and the public key also carries
h_s = h^N mod N^2 with h = -x^2 mod N, so that Enc(m) = (1 + mN) s mod N^2 with a fresh
encryption of zero s = h_s^a (DJN, the default) or r^N (textbook).  Key sizes: 2048 bits by
default, 3072 allowed; 512 and 1024 (the paper's tables) and smaller test keys only with
``allow_insecure_key_bits=True``.

The DJN obfuscators rest on an assumption beyond DCR (docs/crypto.md, "Obfuscators").
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import gmpy2
import phe
import phe.util

from cels.crypto.key_sizes import DEFAULT_KEY_BITS, MIN_TEST_KEY_BITS, SECURE_KEY_BITS



class KeySizeError(ValueError):
    """A Paillier key size that is not allowed in this setting."""


class CiphertextError(ValueError):
    """Malformed ciphertext bytes, an encrypted matrix inconsistent with its key/packing, or a
    malformed public key (N or h_s)."""


def check_key_bits(key_bits: int, *, allow_insecure_key_bits: bool = False) -> None:
    """Accept 2048 or 3072 bits; anything smaller only with ``allow_insecure_key_bits``."""
    if key_bits in SECURE_KEY_BITS:
        return
    if not allow_insecure_key_bits:
        raise KeySizeError(
            f"Paillier key of {key_bits} bits refused: use 2048 (default) or 3072; 512/1024 only "
            "with the explicit reproduce-the-paper flag"
        )
    if key_bits < MIN_TEST_KEY_BITS or key_bits % 2:
        raise KeySizeError(f"Paillier key of {key_bits} bits: need an even size >= {MIN_TEST_KEY_BITS}")


def check_hs(n, hs) -> None:
    """Refuse an h_s that cannot be DJN's h^N mod N^2 for h = -x^2 mod N and an admissible N.

    Checked: N = 1 mod 4 (p = q = 3 mod 4); 1 < h_s < N^2 and gcd(h_s, N) = 1 (h_s in
    Z*_{N^2}); h_s mod N not +-1 (h_s = +-(1 + kN) would make every h_s^a a plain shift of the
    plaintext, hiding nothing); Jacobi(h_s mod N, N) = +1 (h_s = h^N = h mod N up to an odd
    power, and Jacobi(-x^2, N) = Jacobi(-1, N) = +1 for such N).  That h_s is an N-th residue
    of large order is the key holder's promise: only the factorisation can check it."""
    n, hs = gmpy2.mpz(n), gmpy2.mpz(hs)
    if n % 4 != 1:
        raise CiphertextError("Paillier public key: N is not 1 mod 4 (not a product of primes = 3 mod 4)")
    if not 1 < hs < n * n:
        raise CiphertextError("Paillier public key: h_s must lie in 2..N^2 - 1")
    if gmpy2.gcd(hs, n) != 1:
        raise CiphertextError("Paillier public key: h_s is not invertible mod N^2")
    if hs % n in (1, n - 1):
        raise CiphertextError("Paillier public key: h_s = +-1 mod N (its powers would not hide the plaintext)")
    if gmpy2.jacobi(hs % n, n) != 1:
        raise CiphertextError("Paillier public key: h_s mod N has Jacobi symbol -1 (not DJN's h^N for h = -x^2)")


@dataclass(frozen=True)
class PublicKey:
    """A Paillier public key: N (g = N + 1) and DJN's h_s = h^N mod N^2 (h = -x^2 mod N)."""

    n: gmpy2.mpz
    hs: gmpy2.mpz
    nsquare: gmpy2.mpz = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", gmpy2.mpz(self.n))
        object.__setattr__(self, "hs", gmpy2.mpz(self.hs))
        object.__setattr__(self, "nsquare", self.n * self.n)

    @property
    def bits(self) -> int:
        return self.n.bit_length()

    @property
    def ciphertext_bytes(self) -> int:
        """Wire length of one ciphertext (big-endian, fixed width)."""
        return (self.nsquare.bit_length() + 7) // 8

    def modulus_bytes(self) -> bytes:
        """N, big-endian (its wire form)."""
        return int(self.n).to_bytes((self.bits + 7) // 8, "big")

    def hs_bytes(self) -> bytes:
        """h_s, big-endian at the ciphertext width (its wire form)."""
        return int(self.hs).to_bytes(self.ciphertext_bytes, "big")

    @classmethod
    def from_bytes(cls, n_bytes: bytes, hs_bytes: bytes, *, allow_insecure_key_bits: bool = False) -> PublicKey:
        """Parse and check a received key: size policy, odd N, and h_s (:func:`check_hs`)."""
        n = int.from_bytes(n_bytes, "big")
        check_key_bits(n.bit_length(), allow_insecure_key_bits=allow_insecure_key_bits)
        if n % 2 == 0:
            raise CiphertextError("Paillier public key: modulus N is even")
        if not hs_bytes:
            raise CiphertextError("Paillier public key: h_s is missing")
        hs = int.from_bytes(hs_bytes, "big")
        check_hs(n, hs)
        return cls(gmpy2.mpz(n), gmpy2.mpz(hs))


@dataclass(frozen=True, repr=False)
class PrivateKey:
    """The factorisation N = pq, with the CRT constants of phe's decryption."""

    public_key: PublicKey
    p: gmpy2.mpz
    q: gmpy2.mpz
    hp: gmpy2.mpz
    hq: gmpy2.mpz
    q_inverse: gmpy2.mpz  # q^-1 mod p, for the CRT recombination

    @classmethod
    def from_phe(cls, public_key: PublicKey, key: phe.PaillierPrivateKey) -> PrivateKey:
        p, q = gmpy2.mpz(key.p), gmpy2.mpz(key.q)
        return cls(public_key, p, q, gmpy2.mpz(key.hp), gmpy2.mpz(key.hq), gmpy2.invert(q, p))

    def decrypt_raw(self, c) -> gmpy2.mpz:
        """Paillier decryption with CRT: m mod p and m mod q from c^(p-1) mod p^2, c^(q-1) mod q^2."""
        return self.decrypt_raw_list([c])[0]

    def decrypt_raw_list(self, ciphertexts: Sequence) -> list:
        """:meth:`decrypt_raw` of many ciphertexts: the two exponentiations of all of them in
        two gmpy2 ``powmod_base_list`` calls, which release the GIL (threads decrypt in parallel)."""
        p, q = self.p, self.q
        cp = gmpy2.powmod_base_list(ciphertexts, p - 1, p * p)
        cq = gmpy2.powmod_base_list(ciphertexts, q - 1, q * q)
        hp, hq, q_inverse = self.hp, self.hq, self.q_inverse
        out = []
        for xp, xq in zip(cp, cq):
            mp = (xp - 1) // p * hp % p
            mq = (xq - 1) // q * hq % q
            out.append(mq + q * ((mp - mq) * q_inverse % p))
        return out


def _prime_3_mod_4(bits: int) -> int:
    while True:
        p = phe.util.getprimeover(bits)
        if p % 4 == 3:
            return p


def admissible_primes(key_bits: int) -> tuple[int, int]:
    """p, q from phe's prime generator (random.SystemRandom + gmpy2.next_prime) with
    p = q = 3 mod 4, gcd(p - 1, q - 1) = 2 and N = pq of exactly ``key_bits`` bits: DJN's
    admissible modulus, as in libdjn and HEU's DJN Paillier."""
    while True:
        p, q = _prime_3_mod_4(key_bits // 2), _prime_3_mod_4(key_bits // 2)
        if p != q and (p * q).bit_length() == key_bits and math.gcd(p - 1, q - 1) == 2:
            return p, q


def generate_keypair(
    key_bits: int = DEFAULT_KEY_BITS, *, allow_insecure_key_bits: bool = False
) -> tuple[PublicKey, PrivateKey]:
    """A fresh key pair: N from :func:`admissible_primes`, h = -x^2 mod N for x uniform in
    Z_N^* (:mod:`secrets`), h_s = h^N mod N^2; phe computes the CRT decryption constants."""
    check_key_bits(key_bits, allow_insecure_key_bits=allow_insecure_key_bits)
    p, q = admissible_primes(key_bits)
    n = gmpy2.mpz(p) * q
    while True:
        x = gmpy2.mpz(secrets.randbelow(int(n) - 2) + 2)
        if gmpy2.gcd(x, n) == 1:
            break
    hs = gmpy2.powmod(-x * x % n, n, n * n)
    public_key = PublicKey(n, hs)
    phe_public = phe.PaillierPublicKey(int(n))
    return public_key, PrivateKey.from_phe(public_key, phe.PaillierPrivateKey(phe_public, p, q))


def checked_keypair(
    keypair: tuple[PublicKey, PrivateKey] | None, key_bits: int
) -> tuple[PublicKey, PrivateKey] | None:
    """A long-lived key pair handed to a session (cels.node.keys) must have the session's size."""
    if keypair is not None and keypair[0].bits != key_bits:
        raise ValueError(f"node key has {keypair[0].bits} bits, the session asks for {key_bits}")
    return keypair
