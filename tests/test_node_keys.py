"""The offline phase: node keys, the obfuscator stock, and how nodes learn each other's keys.

Small keys (512 bits) through the explicit test-only setting; the 2048-bit path runs end to
end in tests/test_nodes_simulate.py.
"""

from __future__ import annotations

import argparse
import os
import time

import gmpy2
import grpc
import pytest

from cels.crypto.paillier import checked_keypair, generate_keypair
from cels.node.config import add_node_arguments, node_config
from cels.node.keys import NodeKeys
from cels.node.settings import DEFAULT_NICE, DEFAULT_STOCK, KeyPolicy
from cels.node.obfuscator_stock import ObfuscatorPool, ObfuscatorStock
from cels.protocol.wire import cels_pb2, codec

SMALL = dict(allow_insecure_key_bits=True)


@pytest.fixture(scope="module")
def two_keys():
    return generate_keypair(512, **SMALL), generate_keypair(512, **SMALL)


def is_obfuscator(value, private_key) -> bool:
    """An obfuscator encrypts 0 and is an N-th residue: s^lambda = 1 mod N^2 (the group's exponent divides N lambda)."""
    p, q = private_key.p, private_key.q
    n = p * q
    lam = gmpy2.lcm(p - 1, q - 1)
    return private_key.decrypt_raw(value) == 0 and gmpy2.powmod(value, lam, n * n) == 1


def wait_until(condition, timeout: float = 60.0) -> None:
    limit = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < limit, "timed out"
        time.sleep(0.05)


def test_stock_fills_each_key_to_its_target_only_while_idle(two_keys) -> None:
    (pk_a, sk_a), (pk_b, sk_b) = two_keys
    with ObfuscatorStock({"a": 12, "b": 5}, workers=2, batch=4) as stock:
        stock.pause()  # a session runs: nothing is queued
        stock.add_key(pk_a, "a")
        stock.add_key(pk_b, "b")
        time.sleep(1.0)
        assert [(lv.owner, lv.ready) for lv in stock.levels()] == [("a", 0), ("b", 0)]
        assert not stock.full()
        stock.resume()
        wait_until(stock.full)
        levels = {lv.owner: lv for lv in stock.levels()}
        assert (levels["a"].ready, levels["b"].ready) == (12, 5)  # exactly the targets, no more
        got = stock.source(int(pk_a.n)).take(pk_a.hs, 15)  # 12 from the stock, 3 computed on the workers
        assert len(set(got)) == 15 and all(is_obfuscator(v, sk_a) for v in got)
        assert stock.levels()[0].handed_out == 15
        wait_until(lambda: stock.levels()[0].ready == 12)  # refilled once idle
        assert all(is_obfuscator(v, sk_b) for v in stock.source(int(pk_b.n)).take(pk_b.hs, 5))


def test_stock_serves_unknown_keys_from_its_workers_and_replaces_changed_keys(two_keys) -> None:
    (pk_a, sk_a), (pk_b, sk_b) = two_keys
    with ObfuscatorStock({"a": 3}, workers=1, batch=2) as stock:
        source = stock.source(int(pk_b.n))  # a fresh session key: a pool on the same workers
        assert isinstance(source, ObfuscatorPool) and all(is_obfuscator(v, sk_b) for v in source.take(pk_b.hs, 3))
        assert stock.levels() == []
        stock.add_key(pk_a, "a")
        stock.add_key(pk_b, "a")  # the owner restarted with a new key
        assert [lv.n for lv in stock.levels()] == [int(pk_b.n)]
        with pytest.raises(ValueError, match="no stock target"):
            stock.add_key(pk_a, "mallory")
    with pytest.raises(ValueError, match=">= 0"):
        ObfuscatorStock({"a": -1})


def test_checked_keypair_matches_the_session_key_size(two_keys) -> None:
    keypair = two_keys[0]
    assert checked_keypair(keypair, 512) is keypair and checked_keypair(None, 2048) is None
    with pytest.raises(ValueError, match="512 bits, the session asks for 2048"):
        checked_keypair(keypair, 2048)


class FakePeers:
    """Peers' Status replies without gRPC: party-2 is not up yet until ``up`` is set."""

    def __init__(self, keys: dict[str, object]) -> None:
        self.keys, self.up = keys, False

    def status(self, peer: str) -> cels_pb2.NodeStatus:
        if peer == "party-2" and not self.up:
            raise FakeUnavailable()
        return cels_pb2.NodeStatus(node=peer, key=codec.public_key_message(self.keys[peer]))


class FakeUnavailable(grpc.RpcError):
    pass


def test_node_learns_peer_keys_and_stocks_them(two_keys) -> None:
    (solver_pk, solver_sk), (p2_pk, _) = two_keys
    peers = FakePeers({"solver": solver_pk, "party-2": p2_pk})
    policy = KeyPolicy(key_bits=512, stock=4, stock_for={"party-2": 0}, workers=1)
    keys = NodeKeys("party-1", ["solver", "party-2"], policy, peers.status, allow_insecure_key_bits=True, encrypts=True)
    keys.start()
    try:
        wait_until(lambda: keys.stock.full() and len(keys.stock.levels()) == 2)
        status = keys.status(running_sessions=0)
        assert status.node == "party-1" and status.key.n == codec.public_key_message(keys.keypair[0]).n
        entries = {e.owner: e for e in status.stock}
        assert set(entries) == {"solver", "party-1"}  # party-2's key is not stocked (0)
        assert int.from_bytes(entries["solver"].n, "big") == solver_pk.n and entries["solver"].ready == 4
        assert all(is_obfuscator(v, solver_sk) for v in keys.obfuscators(int(solver_pk.n)).take(solver_pk.hs, 4))
        assert keys.keypair_for(512) is keys.keypair and keys.keypair_for(2048) is None  # other sizes: fresh keys
        peer_view = keys.status(running_sessions=2, with_stock=False)  # what a peer's Status gets
        assert peer_view.key.n == status.key.n and list(peer_view.stock) == [] and peer_view.running_sessions == 0
    finally:
        keys.close()


def test_session_keys_policy_makes_no_node_key(two_keys) -> None:
    peers = FakePeers({"solver": two_keys[0][0]})
    keys = NodeKeys("solver", ["party-1"], KeyPolicy(session_keys=True, key_bits=512), peers.status, encrypts=False)
    keys.start()
    try:
        assert keys.keypair_for(512) is None and keys.stock is None
        status = keys.status(running_sessions=1)
        assert not status.key.n and list(status.stock) == [] and status.running_sessions == 1
    finally:
        keys.close()
    # a party with fresh session keys stocks its peers' node keys, never a node key of its own
    party = NodeKeys("party-1", ["solver"], KeyPolicy(session_keys=True, key_bits=512, stock=2, workers=1), peers.status,
                     allow_insecure_key_bits=True, encrypts=True)  # fmt: skip
    party.start()
    try:
        wait_until(lambda: [e.owner for e in party.status(0).stock if e.ready >= 2] == ["solver"])
        assert [e.owner for e in party.status(0).stock] == ["solver"] and not party.status(0).key.n
    finally:
        party.close()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return parser.parse_args(argv)


def test_key_policy_from_toml_and_flags(tmp_path) -> None:
    base = ["--name", "party-1", "--listen", "127.0.0.1:1", "--insecure"]
    assert node_config(parse(base), "data").keys == KeyPolicy() == KeyPolicy(stock=DEFAULT_STOCK, nice=DEFAULT_NICE)
    toml = tmp_path / "node.toml"
    toml.write_text('[keys]\nkey_bits = 3072\nobfuscators = 10\nstock = { solver = 99 }\nworkers = 1\n')
    policy = node_config(parse(["--config", str(toml), *base, "--stock", "party-2=0", "--obfuscators", "7"]), "data").keys
    assert policy == KeyPolicy(key_bits=3072, stock=7, stock_for={"solver": 99, "party-2": 0}, workers=1, nice=DEFAULT_NICE)
    assert node_config(parse(["--config", str(toml), *base, "--obfuscator-nice", "0"]), "data").keys.nice == 0
    assert (policy.target("solver"), policy.target("party-2"), policy.target("party-3")) == (99, 0, 7)
    assert node_config(parse([*base, "--session-keys"]), "data").keys.session_keys
    with pytest.raises(ValueError, match="expected NAME=N"):
        node_config(parse([*base, "--stock", "solver"]), "data")
    toml.write_text("[keys]\nobfuscator = 3\n")
    with pytest.raises(ValueError, match=r"node.toml: \[keys\] unknown key 'obfuscator'"):
        node_config(parse(["--config", str(toml), *base]), "data")
    with pytest.raises(ValueError, match=">= 0"):
        node_config(parse([*base, "--obfuscators", "-1"]), "data")


def test_idle_stock_workers_run_at_lower_priority_and_bounded() -> None:
    with ObfuscatorStock({"a": 0}, workers=1, nice=7) as stock:
        assert stock._executor.submit(os.nice, 0).result(timeout=60) == min(19, os.nice(0) + 7)
    keys = NodeKeys("party-1", ["solver"], KeyPolicy(stock=1), lambda peer: None)
    try:  # by default half the cores, at least one: idle nodes leave their host usable
        assert keys.stock.workers == max(1, (os.cpu_count() or 1) // 2)
    finally:
        keys.close()
