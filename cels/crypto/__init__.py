"""Cryptographic primitives of CELS (section 4.2): packed Paillier (:mod:`.paillier`, with
precomputed obfuscators in :mod:`.obfuscators`), the Pohlig-Hellman commutative cipher
(:mod:`.commutative_cipher` over the RFC groups of :mod:`.groups`) and the X25519 commutative
hash (:mod:`.ec_hash`).  See docs/crypto.md."""
