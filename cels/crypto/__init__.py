"""Cryptographic primitives of CELS (section 4.2): Paillier keys (:mod:`.paillier`) and packed
Paillier vectors and matrices (:mod:`.packing`, with the obfuscator formulas in
:mod:`.obfuscators`), the Pohlig-Hellman commutative cipher
(:mod:`.commutative_cipher` over the RFC groups of :mod:`.groups`), the X25519 commutative
hash (:mod:`.ec_hash`) and pairwise masks (:mod:`.secure_aggregation`).  Keys, integers and
bytes in and out: no party names, sessions, threads or pools (those are the protocol's and
the node's).  See docs/crypto.md."""
