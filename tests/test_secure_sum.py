"""Secure sum (Algorithm 1) run by the in-memory network: correctness, what travels, errors.

Small keys only through the explicit ``allow_insecure_key_bits=True`` test setting.
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from cels.crypto.paillier import generate_keypair
from cels.crypto.packing import DECRYPT_CHUNK, PackingOverflowError, decrypt
from cels.inprocess import InMemoryNetwork
from cels.protocol.roles import ProtocolError
from cels.protocol.secure_sum import SecureSum, Summand
from cels.protocol.wire import cels_pb2, codec

KEYPAIR = generate_keypair(512, allow_insecure_key_bits=True)


def make(ring, values, sum_id="counts", keypair=None, bound=2**32, **kw):
    opts = dict(key_bits=512, allow_insecure_key_bits=True) | kw
    return {
        p: SecureSum(Summand(p, "s1", sum_id, ring, values[p], bound), keypair=keypair if p == ring[0] else None, **opts)
        for p in ring
    }


class Recorder:
    """Wraps a role and keeps every envelope it receives."""

    def __init__(self, role) -> None:
        self.role, self.name, self.received = role, role.name, []

    def receive(self, sender, envelope):
        self.received.append((sender, envelope))
        return self.role.receive(sender, envelope)


def run(roles, ring):
    net = InMemoryNetwork(roles)
    net.run(roles[ring[0]].start(), sender=ring[0])
    return net


@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_every_party_learns_the_integer_sum(r) -> None:
    ring = [f"party-{k}" for k in range(1, r + 1)]
    rng = np.random.default_rng(r)
    values = {p: rng.integers(0, 10**6, size=300) for p in ring}
    roles = make(ring, values)
    net = run(roles, ring)
    total = sum(values.values())
    for p in ring:
        assert roles[p].done and roles[p].result.dtype == np.int64
        np.testing.assert_array_equal(roles[p].result, total)
    if r > 1:
        steps = [(src, dst, step) for src, dst, step, _ in net.log]
        ring_hops = [(src, dst) for src, dst, step in steps if step == "sum_hop"]
        assert ring_hops == [(ring[k], ring[(k + 1) % r]) for k in range(r)]
        assert sum(1 for *_, step in steps if step == "sum_key") == r - 1
        assert sum(1 for *_, step in steps if step == "sum_result") == r - 1


class CountingPool(ProcessPoolExecutor):
    def __init__(self) -> None:
        super().__init__(2, mp_context=multiprocessing.get_context("spawn"))
        self.tasks = 0

    def submit(self, *args, **kwargs):
        self.tasks += 1
        return super().submit(*args, **kwargs)


def test_key_holder_decrypts_on_a_process_pool() -> None:
    ring = ["party-1", "party-2"]
    rng = np.random.default_rng(11)
    values = {p: rng.integers(0, 10**6, size=12 * 2 * DECRYPT_CHUNK) for p in ring}  # 12 slots: 512 ciphertexts
    with CountingPool() as pool:
        roles = make(ring, values, keypair=KEYPAIR, decryption_pool=pool)
        run(roles, ring)
        assert pool.tasks == 2  # the key holder's 512 decryptions went to the pool, in 2 chunks
    for p in ring:
        np.testing.assert_array_equal(roles[p].result, values["party-1"] + values["party-2"])


def test_float_matrix_sum_with_negative_values() -> None:
    ring = ["a", "b", "c"]
    rng = np.random.default_rng(5)
    values = {p: rng.normal(scale=50, size=(6, 4)) for p in ring}
    roles = make(ring, values, sum_id="nlp", bound=1000.0, scale_bits=32, keypair=KEYPAIR)
    run(roles, ring)
    for p in ring:
        np.testing.assert_allclose(roles[p].result, sum(values.values()), rtol=0, atol=3 * 2.0**-33)


def test_only_the_first_hop_encrypts_and_every_hop_rerandomises() -> None:
    ring = ["a", "b", "c"]
    values = {p: np.arange(40) * (k + 1) for k, p in enumerate(ring)}
    roles = {p: Recorder(role) for p, role in make(ring, values, keypair=KEYPAIR).items()}
    net = InMemoryNetwork(roles)
    net.run(roles["a"].role.start(), sender="a")
    hops = [e.sum_hop.partial for p in ("b", "c") for _, e in roles[p].received if e.WhichOneof("step") == "sum_hop"]
    public_key, private_key = KEYPAIR
    first = codec.matrix_of(hops[0], public_key)
    second = codec.matrix_of(hops[1], public_key)
    assert (first.terms, second.terms) == (1, 2)
    deterministic = first.add_plain(values["b"])  # what b would send without re-randomising
    assert all(x != y for x, y in zip(deterministic.ciphertexts, second.ciphertexts))
    np.testing.assert_array_equal(decrypt(private_key, second).ravel(), values["a"] + values["b"])
    assert net.stats.messages[("b", "sum_hop")] == 1


def test_hop_before_key_is_buffered() -> None:
    ring = ["a", "b", "c"]
    values = {p: np.arange(10) for p in ring}
    roles = make(ring, values)
    out = roles["a"].start()
    key_to_b = next(e for dst, e in out if dst == "b" and e.WhichOneof("step") == "sum_key")
    hop = next(e for dst, e in out if e.WhichOneof("step") == "sum_hop")
    assert roles["b"].receive("a", hop) == []
    forwarded = roles["b"].receive("a", key_to_b)
    assert [(dst, e.WhichOneof("step")) for dst, e in forwarded] == [("c", "sum_hop")]


def test_protocol_errors() -> None:
    ring = ["a", "b", "c"]
    values = {p: np.arange(10) for p in ring}
    roles = make(ring, values)
    out = roles["a"].start()
    key = next(e for dst, e in out if dst == "c")
    hop = next(e for _, e in out if e.WhichOneof("step") == "sum_hop")
    with pytest.raises(ProtocolError) as err:
        roles["c"].receive("a", hop)  # c's predecessor is b
    assert err.value.code == "failed_precondition"
    with pytest.raises(ProtocolError) as err:
        roles["b"].receive("c", key)  # only the key holder sends the key
    assert err.value.code == "failed_precondition"
    wrong_session = cels_pb2.Envelope()
    wrong_session.CopyFrom(hop)
    wrong_session.session_id = "other"
    with pytest.raises(ProtocolError, match="unknown session") as err:
        roles["b"].receive("a", wrong_session)
    roles["b"].receive("a", next(e for dst, e in out if dst == "b" and e.WhichOneof("step") == "sum_key"))
    corrupt = cels_pb2.Envelope()
    corrupt.CopyFrom(hop)
    corrupt.sum_hop.partial.ciphertexts[0] = b"\x00" * 3
    with pytest.raises(ProtocolError, match="ciphertext 0: 3 bytes") as err:
        roles["b"].receive("a", corrupt)
    assert err.value.code == "invalid_argument"
    with pytest.raises(PackingOverflowError, match=r"outside \[-4294967296, 4294967296\]"):
        SecureSum(Summand("a", "s1", "x", ring, np.array([2**33]), 2**32))


@pytest.mark.parametrize(("nonnegative", "total", "refused"), [
    (False, -996, True), (False, -995, False), (False, 1005, False), (False, 1006, True),
    (True, 4, True), (True, 5, False), (True, 1006, True), (True, 1 << 62, True),
])
def test_a_sum_result_outside_what_the_shares_can_sum_to_is_refused(nonnegative: bool, total: int, refused: bool) -> None:
    """Issue 13 item 11: SumResult is checked when it arrives.  Receiver b holds 5, the bound is
    1000: the total is 5 plus a's value in [-1000, 1000] ([0, 1000] for a non-negative sum
    such as counts); anything else is forged."""
    ring = ["a", "b"]
    roles = make(ring, {"a": np.array([0]), "b": np.array([5])}, bound=1000, nonnegative=nonnegative)
    result = cels_pb2.Envelope(session_id="s1", sender="a", sum_result=cels_pb2.SumResult(session_id="s1", sum_id="counts", values=[total], rows=1, cols=1))
    if not refused:
        roles["b"].receive("a", result)
        assert roles["b"].done and roles["b"].result.tolist() == [total]
        return
    with pytest.raises(ProtocolError, match=r"sum_result.values\[0\] = ") as err:
        roles["b"].receive("a", result)
    assert err.value.code == "invalid_argument" and not roles["b"].done


@pytest.mark.parametrize("chunk", [{"more": True}, {"first": 1}])
def test_algorithm_1s_sum_result_is_one_message(chunk: dict) -> None:
    """A masked sum's total comes in chunks (cels.protocol.masked_sum); Algorithm 1's is one
    message, so a SumResult that says it is a chunk is malformed, even with the right values."""
    roles = make(["a", "b"], {"a": np.array([0]), "b": np.array([5])}, bound=1000, nonnegative=True)
    msg = cels_pb2.SumResult(session_id="s1", sum_id="counts", values=[7], rows=1, cols=1, **chunk)
    with pytest.raises(ProtocolError) as err:
        roles["b"].receive("a", cels_pb2.Envelope(session_id="s1", sender="a", sum_result=msg))
    assert err.value.code == "invalid_argument" and not roles["b"].done


def test_weak_key_is_refused_by_default() -> None:
    ring = ["a", "b"]
    secure_b = SecureSum(Summand("b", "s1", "counts", ring, np.arange(3), 10))
    weak = cels_pb2.SumKey(session_id="s1", sum_id="counts", key=codec.public_key_message(KEYPAIR[0]))
    with pytest.raises(ProtocolError, match="refused") as err:
        secure_b.receive("a", cels_pb2.Envelope(session_id="s1", sender="a", sum_key=weak))
    assert err.value.code == "invalid_argument"
    assert codec.public_key_of(weak.key, allow_insecure_key_bits=True) == KEYPAIR[0]


def test_bench_crypto_writes_the_issue_json(tmp_path, capsys) -> None:
    from cels.cli import main

    out = tmp_path / "crypto.json"
    assert main(["bench", "crypto", "--values", "120", "--parties", "2", "--key-bits", "512", "--naive-sample", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    paillier = result["paillier"]
    assert (paillier["key_bits"], paillier["values"], paillier["parties"]) == (512, 120, 2)
    assert set(paillier["naive"]) >= {"seconds_per_value", "bytes_per_value"}
    assert set(paillier["packed"]) >= {"seconds_per_value", "bytes_per_value", "offline_seconds"}
    # 512-bit key, bound 2^32, 2 parties: 40-bit slots, 12 per ciphertext -> 10 ciphertexts per hop
    assert (paillier["packed"]["slots"], paillier["packed"]["ciphertexts_per_hop"]) == (12, 10)
    assert paillier["bytes_ratio"] == pytest.approx(paillier["naive"]["bytes_per_value"] / paillier["packed"]["bytes_per_value"])
    assert paillier["bytes_ratio"] > 5
    assert set(result["commutative"]) >= {"group_bits", "encrypt_per_s", "ec_hash_per_s"}
    obf = paillier["obfuscator_modes"]
    assert obf["djn_exponent_bits"] == 256 and obf["table_bytes"] == 32 * 256 * 128  # 32 windows of 256 residues mod N^2
    assert obf["textbook_over_djn_table"] == pytest.approx(obf["textbook_ms"] / obf["djn_table_ms"])
    assert paillier["decryption"]["ciphertexts"] == 4 * DECRYPT_CHUNK
