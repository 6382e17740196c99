"""Fixed safe-prime groups for the Pohlig-Hellman commutative cipher (CELS Algorithm 3).

The primes are the published MODP groups of RFC 3526 (group 14: 2048 bits, group 15: 3072
bits), the FFDHE groups of RFC 7919 (ffdhe2048, ffdhe3072), and,
only for reproducing the paper's tables, the 1024-bit group 2 of RFC 2409.  Each p is a safe prime
p = 2q + 1 with q prime, so the quadratic residues mod p form a subgroup of prime order q and
p = 3 (mod 4) (-1 is a non-residue).  Each is built from its RFC formula (:func:`rfc_prime`)
over one constant per family, the leading bits of pi or e; ``tests/test_commutative_cipher.py``
computes pi and e apart (mpmath), checks every prime against the RFC's and that p and q are prime.
"""

from __future__ import annotations

from dataclasses import dataclass

FRACTION_BITS = 3072
"""The largest group below: its constant's digits give every smaller group's."""
PI_DIGITS = int(
    "C90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22"
    "514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245"
    "E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7EDEE386BFB5A899FA5"
    "AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A"
    "69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D"
    "670C354E4ABC9804F1746C08CA18217C32905E462E36CE3BE39E772C180E8603"
    "9B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE5"
    "15D2261898FA051015728E5A8AAAC42DAD33170D04507A33A85521ABDF1CBA64"
    "ECFB850458DBEF0A8AEA71575D060C7DB3970F85A6E1E4C7ABF5AE8CDB0933D7"
    "1E8C94E04A25619DCEE3D2261AD2EE6BF12FFA06D98A0864D87602733EC86A64"
    "521F2B18177B200CBBE117577A615D6C770988C0BAD946E208E24FA074E5AB31"
    "43DB5BFCE0FD108E4B82D120A9210801",
    16,
)
"""floor(2^(3072 - 130) pi), whose leading bits are every MODP prime's middle (RFC 3526 section 1)."""
E_DIGITS = int(
    "ADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695A9E13641146433FB"
    "CC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617AD3DF1ED5D5FD6561"
    "2433F51F5F066ED0856365553DED1AF3B557135E7F57C935984F0C70E0E68B77"
    "E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797ABC0AB182B324FB61"
    "D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4AE56EDE76372BB19"
    "0B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F619172FE9CE98583FF"
    "8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005C58EF1837D1683B2"
    "C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035BBC34F4DEF99C0238"
    "61B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91CAEFE130985139270"
    "B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF5CAE82AB9C9DF69E"
    "E86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E0ABCD06BFA53DDEF"
    "3C1B20EE3FD59D7C25E41D2B669E1EF1",
    16,
)
"""floor(2^(3072 - 130) e), whose leading bits are every FFDHE prime's middle (RFC 7919 appendix A)."""


def rfc_prime(bits: int, digits: int, addend: int) -> int:
    """RFC 2409/3526/7919: p = 2^b - 2^(b-64) - 1 + 2^64 (floor(2^(b-130) c) + addend), c = pi
    or e; floor(2^(b-130) c) is the leading bits of ``digits`` (floor(2^(3072-130) c))."""
    return 2**bits - 2 ** (bits - 64) - 1 + 2**64 * ((digits >> (FRACTION_BITS - bits)) + addend)


@dataclass(frozen=True)
class SafePrimeGroup:
    """A safe-prime group Z_p^*, p = 2q + 1; messages live in its order-q QR subgroup."""

    name: str
    p: int

    @property
    def q(self) -> int:
        """The prime order of the quadratic-residue subgroup, (p - 1) / 2."""
        return (self.p - 1) // 2

    @property
    def bits(self) -> int:
        return self.p.bit_length()

    @property
    def element_bytes(self) -> int:
        """Length of one big-endian group element on the wire."""
        return (self.p.bit_length() + 7) // 8


GROUPS: dict[str, SafePrimeGroup] = {
    "modp1024": SafePrimeGroup("modp1024", rfc_prime(1024, PI_DIGITS, 129093)),  # RFC 2409 group 2: the paper's tables only
    "modp2048": SafePrimeGroup("modp2048", rfc_prime(2048, PI_DIGITS, 124476)),  # RFC 3526 group 14
    "modp3072": SafePrimeGroup("modp3072", rfc_prime(3072, PI_DIGITS, 1690314)),  # RFC 3526 group 15
    "ffdhe2048": SafePrimeGroup("ffdhe2048", rfc_prime(2048, E_DIGITS, 560316)),  # RFC 7919 A.1
    "ffdhe3072": SafePrimeGroup("ffdhe3072", rfc_prime(3072, E_DIGITS, 2625351)),  # RFC 7919 A.2
}
DEFAULT_GROUP_BITS = 2048
PAPER_GROUP_BITS = (1024,)


def group_for_bits(bits: int = DEFAULT_GROUP_BITS, *, allow_paper_bits: bool = False) -> SafePrimeGroup:
    """The MODP group of ``bits`` bits: 2048 (default) or 3072; 1024 only with
    ``allow_paper_bits`` (the paper's setting, below current recommendations)."""
    if bits in PAPER_GROUP_BITS and not allow_paper_bits:
        raise ValueError(
            f"a {bits}-bit Pohlig-Hellman group is insecure; it is only offered to reproduce "
            "the paper's tables (explicit paper-bits flag)"
        )
    name = f"modp{bits}"
    if name not in GROUPS:
        raise ValueError(f"Pohlig-Hellman group of {bits} bits not offered (choose 2048 or 3072)")
    return GROUPS[name]
