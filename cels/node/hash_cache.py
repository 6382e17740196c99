"""A node's cache of its commutative hashes in one session, kept for a re-run
(docs/deployment.md, "Resume after a node restart"): the universe's, and the secure union's
layers on the released records.

The universe phase is most of a session's work: every party hashes its own pair ids and adds
its layer to every other party's (docs/deployment.md, "Resume after a node restart", has its share).
Both are functions of the session's universe key and of the ids, which a re-run's replay takes
again byte for byte (cels.protocol.resume); so a node that keeps a session's keys (cels.node.session_store) also keeps its
hashes, in ``ID.hashes`` beside the session's record (0600): one entry per call, the
HMAC-SHA256 of the call's inputs under a key of the session's draw root, then the outputs.  A
re-run answers each call it finds there instead of computing it: the same bytes, none of the
curve or group operations.  The same holds for the secure union's layers (its Pohlig-Hellman
key is drawn from the kept keys, and its records come again byte for byte).  The calls cached
are those made in the node's process (the in-process engine, the padding's dummies, the
union); a Ray engine's pair tasks hash on their workers, from the raw key, and are not.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import gmpy2

from cels.crypto.commutative_cipher import PohligHellman, PohligHellmanHash, element_to_bytes
from cels.crypto.ec_hash import X25519Hash

CacheKey = bytes
HEADER = struct.Struct(">32sIH")
"""An entry: the inputs' MAC, how many outputs, their width in bytes (then the outputs)."""
FIXED = struct.Struct(">cII")
"""A call's inputs of one width, as MACed: a tag, the width, how many."""


class HashCache:
    """The hashes of one session on one node, in the file ``path`` (appended to; read back
    whole when a re-run opens it), keyed by HMAC-SHA256 under ``key``."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.path, self.key = path, key
        self.known: dict[CacheKey, tuple[int, int, bytes]] = {}
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        at = 0
        while at + HEADER.size <= len(data):  # an entry cut by the node's death ends the file
            mac, count, width = HEADER.unpack_from(data, at)
            end = at + HEADER.size + count * width
            if end > len(data):
                break
            self.known[mac] = (count, width, data[at + HEADER.size : end])
            at = end

    def _mac(self, kind: str, inputs: Sequence[bytes]) -> CacheKey:
        """HMAC-SHA256 of the call, injective in (kind, inputs): the kind, then inputs of one
        width as that width, their number and their bytes, or else each input after its length."""
        mac = hmac.new(self.key, bytes([len(kind)]) + kind.encode(), hashlib.sha256)
        width = len(inputs[0]) if inputs else 0
        if all(len(item) == width for item in inputs):
            mac.update(FIXED.pack(b"F", width, len(inputs)))
            mac.update(b"".join(inputs))
            return mac.digest()
        mac.update(b"V")
        for item in inputs:
            mac.update(len(item).to_bytes(4, "big"))
            mac.update(item)
        return mac.digest()

    def answer(self, kind: str, inputs: Sequence[bytes], compute: Callable[[Sequence[bytes]], list[bytes]]) -> list[bytes]:
        """``compute(inputs)``, or the first run's answer to the same call."""
        digest = self._mac(kind, inputs)
        kept = self.known.get(digest)
        if kept is not None:
            self.hits += 1
            count, width, data = kept
            return [data[i * width : (i + 1) * width] for i in range(count)]
        self.misses += 1
        out = compute(inputs)
        width = len(out[0]) if out else 0
        if all(len(o) == width for o in out) and width < 1 << 16:
            with self._lock, open(self.path, "ab", opener=_private) as fh:
                fh.write(HEADER.pack(digest, len(out), width) + b"".join(out))
        return out


class _Cached:
    """The hash and apply calls of a commutative hash answered by a :class:`HashCache`."""

    _cache: HashCache
    _plain: X25519Hash | PohligHellmanHash

    def hash(self, ids: Sequence[bytes]) -> list[bytes]:
        return self._cache.answer("hash", ids, lambda items: self._plain.hash(items))

    def apply(self, elements: Sequence[bytes]) -> list[bytes]:
        return self._cache.answer("apply", elements, lambda items: self._plain.apply(items))


class CachedX25519Hash(_Cached, X25519Hash):
    """An X25519 universe key whose hashes a :class:`HashCache` keeps."""


class CachedPohligHellmanHash(_Cached, PohligHellmanHash):
    """A Pohlig-Hellman universe key whose hashes a :class:`HashCache` keeps."""


class CachedPohligHellman(PohligHellman):
    """The secure union's Pohlig-Hellman key, its records' layers kept by a :class:`HashCache`."""

    _cache: HashCache
    _plain: PohligHellman

    def encrypt_record(self, chunks: Sequence[int]) -> list[gmpy2.mpz]:
        return self._kept("encrypt", chunks, lambda c: self._plain.encrypt_record(c))

    def decrypt_record(self, chunks: Sequence[int]) -> list[gmpy2.mpz]:
        return self._kept("decrypt", chunks, lambda c: self._plain.decrypt_record(c))

    def _kept(self, kind: str, chunks: Sequence[int], compute: Callable[[Sequence[int]], list]) -> list[gmpy2.mpz]:
        group = self.group
        out = self._cache.answer(kind, [element_to_bytes(group, c) for c in chunks], lambda _: [element_to_bytes(group, y) for y in compute(chunks)])
        return [gmpy2.mpz(int.from_bytes(o, "big")) for o in out]


SessionKey = X25519Hash | PohligHellmanHash | PohligHellman
"""A party's session key whose results a re-run repeats: the universe's, the union's."""


def cached(key: SessionKey, cache: HashCache) -> SessionKey:
    """The same key, its calls answered by ``cache`` (an instance of the key's own class, so
    whatever reads the key -- a Ray task's raw key, the id width -- reads it as before)."""
    if isinstance(key, X25519Hash):
        out: SessionKey = CachedX25519Hash(key.scalar_bytes())
    elif isinstance(key, PohligHellmanHash):
        out = CachedPohligHellmanHash.from_exponent(key.group, key.exponent_bytes())
    else:
        out = CachedPohligHellman.from_exponent(key.group, key.exponent_bytes())
    out._cache, out._plain = cache, key
    return out


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
