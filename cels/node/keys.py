"""A node's offline phase: its long-lived Paillier key and the obfuscator stock for its peers.

Paillier encryption and re-randomisation cost one obfuscator (a fresh encryption of zero,
cels.crypto.obfuscators) per ciphertext, which depends only on the public key (CELS section 4.2).  With fresh keys in every session nothing can be
computed before the session; so by default every node makes one *node key* pair when it
starts (2048 bits; never written anywhere) and uses it whenever a session asks for keys of
that size: the solver for the NLP (Algorithm 2), a party when it is P_1 for the secure sums
(Algorithm 1).  Parties read their peers' public keys through the ``Status`` RPC (mutual TLS
binds each key to the node its certificate names) and keep an :class:`ObfuscatorStock` per
key full while no session runs.  ``--session-keys`` restores a fresh key pair per session.
"""

from __future__ import annotations

import logging
import os
import threading

import grpc

from cels.crypto import paillier
from cels.crypto.packing import int_bytes
from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.node.obfuscator_stock import ObfuscatorStock
from cels.protocol.wire import cels_pb2, codec
from cels.node.settings import KeyPolicy

log = logging.getLogger("cels.node")

KEY_REFRESH_SECONDS = 30.0
"""How often a node re-reads its peers' keys (a restarted peer has a new node key)."""


def default_workers() -> int:
    """Half the cores, at least one: several idle nodes on one host leave it usable."""
    return max(1, (os.cpu_count() or 1) // 2)


class NodeKeys:
    """This node's key pair, its peers' public keys, and the obfuscators for them.

    ``status`` reads a peer's :class:`cels_pb2.NodeStatus` (a callable, so that the gRPC
    adapter stays outside).  Call :meth:`start` once the node serves; :meth:`close` at exit.
    """

    def __init__(
        self,
        name: str,
        peers: list[str],
        policy: KeyPolicy,
        status,
        *,
        allow_insecure_key_bits: bool = False,
        encrypts: bool = True,
    ) -> None:
        self.name = name
        self.policy = policy
        self._status = status
        self._allow_insecure = allow_insecure_key_bits
        owners = [*peers, name] if encrypts else []
        # keys to stock: every owner with a target, this node's own only if it has a node key
        self._owners = [o for o in owners if policy.target(o) > 0 and not (o == name and policy.session_keys)]
        workers = policy.workers or default_workers()
        self.stock = ObfuscatorStock({o: policy.target(o) for o in owners}, workers=workers, nice=policy.nice) if encrypts else None
        self.keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-keys", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def keypair_for(self, bits: int) -> tuple[paillier.PublicKey, paillier.PrivateKey] | None:
        """The node key pair if a session asks for keys of its size, else None (fresh keys)."""
        if self.policy.session_keys or bits != self.policy.key_bits:
            return None
        self._ready.wait()
        return self.keypair

    def obfuscators(self, n: int) -> ObfuscatorSource:
        """A session's obfuscators for key N: the stock (or the stock's workers) or inline."""
        if self.stock is None:
            return InlineObfuscators(n)
        return self.stock.source(n)

    def session_started(self) -> None:
        if self.stock is not None:
            self.stock.pause()

    def session_ended(self) -> None:
        if self.stock is not None:
            self.stock.resume()

    def status(self, running_sessions: int, *, with_stock: bool = True) -> cels_pb2.NodeStatus:
        """The public key; the stock levels and session count only ``with_stock`` (controllers)."""
        msg = cels_pb2.NodeStatus(node=self.name)
        if self.keypair is not None:
            msg.key.CopyFrom(codec.public_key_message(self.keypair[0]))
        if with_stock:
            msg.running_sessions = running_sessions
        if with_stock and self.stock is not None:
            levels = {level.owner: level for level in self.stock.levels()}
            for owner in self._owners:  # an owner whose key is not known yet: no n, nothing ready
                level = levels.get(owner)
                entry = msg.stock.add(owner=owner, target=self.policy.target(owner))
                if level is not None:
                    entry.n = int_bytes(level.n)
                    entry.ready, entry.handed_out = level.ready, level.handed_out
        return msg

    def _run(self) -> None:
        """Make the node key, then learn the peers' keys (and re-read them now and then)."""
        if not self.policy.session_keys:
            self.keypair = paillier.generate_keypair(self.policy.key_bits, allow_insecure_key_bits=self._allow_insecure)
            log.info("%s: node key ready (%d bits)", self.name, self.policy.key_bits)
            if self.stock is not None and self.name in self._owners:
                self.stock.add_key(self.keypair[0], self.name)
        self._ready.set()
        known: dict[str, int] = {}
        while not self._stop.is_set():
            for peer in [o for o in self._owners if o != self.name]:
                try:
                    reply = self._status(peer)
                except grpc.RpcError:
                    continue  # not up yet: try again on the next round
                if not reply.key.n:
                    continue
                try:
                    key = codec.public_key_of(reply.key, allow_insecure_key_bits=self._allow_insecure)
                except ValueError as exc:
                    log.warning("%s: ignoring %s's node key: %s", self.name, peer, exc)
                    continue
                if known.get(peer) != int(key.n):
                    known[peer] = int(key.n)
                    self.stock.add_key(key, peer)
                    log.info("%s: stocking obfuscators for %s's key", self.name, peer)
            pending = any(o not in known for o in self._owners if o != self.name)
            self._stop.wait(1.0 if pending else KEY_REFRESH_SECONDS)

    def close(self) -> None:
        self._stop.set()
        self._ready.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.stock is not None:
            self.stock.close()
