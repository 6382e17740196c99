"""``cels bench crypto --values N --parties R --key-bits B --json FILE``: the crypto engine.

Measures, in one run:

* a secure sum (Algorithm 1) of N counts over R parties, (a) naively -- one phe encryption per
  value by every party, ciphertexts multiplied hop by hop, phe decryption of every value, as
  the paper's Algorithm 1 reads; timed on ``--naive-sample`` values and scaled to N -- and
  (b) with the packed engine: the real :class:`~cels.protocol.secure_sum.SecureSum` roles over
  the in-memory network (every message serialised), obfuscators precomputed by an
  :class:`~cels.node.obfuscator_stock.ObfuscatorPool` (offline) before the online run;
* one obfuscator (a fresh encryption of zero) three ways: textbook r^N mod N^2 by powmod,
  DJN h_s^a by powmod, and DJN from the fixed-base table (with the table's build seconds and
  bytes), and their ratios (docs/crypto.md, "Obfuscators");
* the key holder's CRT decryptions of one hop, in its own process and on a process pool
  (``SecureSum(decryption_pool=...)``);
* Pohlig-Hellman encryptions per second (2048-bit group) and X25519 commutative-hash
  operations per second;
* the GMP floor: a raw gmpy2 2048-bit modexp, one obfuscator (DJN, the default) and one CRT
  decryption, and how far the packed engine is from the work it cannot avoid.

Key generation is timed separately and excluded from both sides.  Prints the JSON and writes
it atomically to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time

import gmpy2
import numpy as np
import phe
from tqdm import tqdm

from cels.crypto.commutative_cipher import PohligHellman, encode_record
from cels.crypto.ec_hash import X25519Hash, hash_to_u
from cels.crypto.groups import DEFAULT_GROUP_BITS, group_for_bits
from cels.crypto.key_sizes import PAPER_KEY_BITS
from cels.crypto.obfuscators import FixedBaseTable, djn_exponent_bits, obfuscators
from cels.crypto.paillier import check_key_bits, generate_keypair
from cels.crypto.packing import DECRYPT_CHUNK, EncryptedMatrix, Packing, decrypt_raw_many
from cels.fileio import atomic_write_json
from cels.inprocess import InMemoryNetwork
from cels.node.obfuscator_stock import ObfuscatorPool
from cels.protocol.stages.sums import COUNT_BOUND, COUNTS_SUM
from cels.protocol.secure_sum import SecureSum, Summand
from cels.protocol.wire import cels_pb2, codec
from cels.workers import worker_pool

VALUE_RANGE = 2**20  # benchmark counts are uniform in [0, 2^20)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench crypto`` (cels.cli.bench)."""
    parser.add_argument("--values", type=int, default=20_000, help="N: values in the secure sum (default 20000)")
    parser.add_argument("--parties", type=int, default=3, help="R: parties in the ring (default 3)")
    parser.add_argument("--key-bits", type=int, default=2048, help="Paillier key bits: 2048 (default) or 3072; 512/1024 reproduce the paper (insecure)")
    parser.add_argument("--group-bits", type=int, default=DEFAULT_GROUP_BITS, help="Pohlig-Hellman group bits (2048 or 3072)")
    parser.add_argument("--naive-sample", type=int, default=200, help="values timed on the naive side, scaled to N (default 200)")
    parser.add_argument("--workers", type=int, default=None, help="obfuscator worker processes (default: all cores)")
    parser.add_argument("--json", required=True, help="write the JSON here (atomically)")
    parser.set_defaults(func=run)


def _per_op(fn, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count


def _sum_result_bytes(total: np.ndarray, parties: int) -> int:
    """Bytes of the R - 1 SumResult messages carrying the total (the same on both sides)."""
    result = cels_pb2.SumResult(session_id="bench", sum_id="counts", values=total.tolist(), rows=len(total), cols=1)
    return (parties - 1) * len(cels_pb2.Envelope(session_id="bench", sender="party-1", sum_result=result).SerializeToString())


def naive_sum(public_key, private_key, phe_pair, data: list[np.ndarray], sample: int) -> dict:
    """Algorithm 1 as printed: every party encrypts every value (phe), hops multiply."""
    phe_public, phe_private = phe_pair
    parties = len(data)
    start = time.perf_counter()
    running = None
    for k in tqdm(range(parties), desc="naive (phe, sampled)", unit="party", file=sys.stderr):
        encrypted = [phe_public.encrypt(int(v)) for v in data[k][:sample]]
        running = encrypted if running is None else [a + b for a, b in zip(running, encrypted)]
    sums = [phe_private.decrypt(c) for c in running]
    seconds = time.perf_counter() - start
    assert sums == [int(sum(d[i] for d in data)) for i in range(sample)], "naive secure sum is wrong"
    # wire size: one SumHop per party with one full-width ciphertext per value
    unpacked = Packing(slot_bits=8 * ((public_key.bits - 1) // 8), slots=1, scale_bits=0, offset=COUNT_BOUND, summands=parties)
    hop = EncryptedMatrix(public_key, sample, 1, unpacked, parties, [gmpy2.mpz(c.ciphertext(be_secure=False)) for c in running])
    envelope = cels_pb2.Envelope(session_id="bench", sender="party-1", sum_hop=cels_pb2.SumHop(session_id="bench", sum_id="counts", hops=1, partial=codec.matrix_message(hop)))
    hop_bytes = len(envelope.SerializeToString()) / sample
    values = len(data[0])
    return {
        "seconds_per_value": seconds / sample,
        "bytes_per_value": parties * hop_bytes + _sum_result_bytes(np.sum(data, axis=0), parties) / values,
        "sampled_values": sample,
        "note": f"timed on {sample} values per party and scaled to N; bytes from a serialised SumHop of {sample} ciphertexts",
    }


def packed_sum(public_key, private_key, data: list[np.ndarray], workers: int | None) -> dict:
    """The engine: SecureSum roles over the in-memory network, obfuscators precomputed."""
    parties, values = len(data), len(data[0])
    ring = [f"party-{k + 1}" for k in range(parties)]
    packing = Packing.for_values(public_key, COUNT_BOUND, parties)
    ciphertexts = packing.blocks(values)
    needed = ciphertexts * parties  # one encryption by P_1, one re-randomisation per later hop
    with ObfuscatorPool(int(public_key.n), hs=int(public_key.hs), workers=workers) as pool:
        start = time.perf_counter()
        pool.prefetch(needed)
        with tqdm(total=needed, desc="offline obfuscators", unit="r^N", file=sys.stderr) as bar:
            pool.wait(bar.update)
        offline = time.perf_counter() - start
        roles = {
            p: SecureSum(
                Summand(p, "bench", COUNTS_SUM, ring, data[k], COUNT_BOUND),
                key_bits=public_key.bits, allow_insecure_key_bits=public_key.bits in PAPER_KEY_BITS,
                keypair=(public_key, private_key) if k == 0 else None, obfuscators=lambda _key: pool,
            )  # fmt: skip
            for k, p in enumerate(ring)
        }
        net = InMemoryNetwork(roles)
        start = time.perf_counter()
        stats = net.run(roles[ring[0]].start(), sender=ring[0])
        online = time.perf_counter() - start
        assert pool.handed_out == needed
    total = np.sum(data, axis=0)
    assert all(np.array_equal(role.result, total) for role in roles.values()), "packed secure sum is wrong"
    return {
        "seconds_per_value": online / values,
        "bytes_per_value": stats.bytes_total / values,
        "offline_seconds": offline,
        "online_seconds": online,
        "ciphertexts_per_hop": ciphertexts,
        "slots": packing.slots,
        "slot_bits": packing.slot_bits,
        "obfuscators": needed,
        "workers": pool.workers,
        "seconds_by_party": {p: round(s, 4) for p, s in stats.seconds.items()},
    }


def gmp_floor(public_key, private_key, packed: dict, parties: int, values: int) -> dict:
    """Raw gmpy2 costs on one core, and the engine's distance from the unavoidable work."""
    rnd = secrets.SystemRandom()
    base, exp, mod = (gmpy2.mpz(rnd.getrandbits(2048)) for _ in range(3))
    mod |= 1 | (1 << 2047)
    modexp = _per_op(lambda: gmpy2.powmod(base, exp, mod), 50)
    c = obfuscators(public_key.n, public_key.hs, 1)[0]  # builds the key's fixed-base table (timed apart)
    obfuscator = _per_op(lambda: obfuscators(public_key.n, public_key.hs, 1), 50)
    crt = _per_op(lambda: private_key.decrypt_raw(c), 50)
    n_ct = packed["ciphertexts_per_hop"]
    floor = n_ct * (parties * obfuscator + crt)  # R obfuscators + 1 CRT decryption per ciphertext
    engine_cpu = packed["online_seconds"] + packed["obfuscators"] * obfuscator
    return {
        "modexp_2048_seconds": modexp,
        "obfuscator_seconds": obfuscator,
        "obfuscator_in_modexps": obfuscator / modexp,
        "crt_decrypt_seconds": crt,
        "crt_decrypt_in_modexps": crt / modexp,
        "floor_seconds": floor,
        "engine_cpu_seconds": engine_cpu,
        "engine_over_floor": engine_cpu / floor,
        "floor_seconds_per_value": floor / values,
        "note": "floor = ciphertexts x (R DJN obfuscators + 1 CRT decryption), raw gmpy2 on one core; "
        "engine_cpu = online seconds + obfuscators x one-core obfuscator cost",
    }


def obfuscator_modes(public_key, samples: int = 50) -> dict:
    """Milliseconds per obfuscator on one core, in one run: textbook r^N (powmod), DJN h_s^a
    by powmod, DJN h_s^a from the 8-bit fixed-base table (built here, timed and sized)."""
    n, hs, nsq = public_key.n, public_key.hs, public_key.nsquare
    bits = djn_exponent_bits(n)
    textbook = _per_op(lambda: obfuscators(n, hs, 1, "textbook"), samples)
    djn_powmod = _per_op(lambda: gmpy2.powmod(hs, secrets.randbits(bits), nsq), samples)
    start = time.perf_counter()
    table = FixedBaseTable(hs, nsq, bits)
    table_seconds = time.perf_counter() - start
    djn_table = _per_op(lambda: table.pow(secrets.randbits(bits)), 4 * samples)
    return {
        "key_bits": public_key.bits,
        "djn_exponent_bits": bits,
        "textbook_ms": 1e3 * textbook,
        "djn_powmod_ms": 1e3 * djn_powmod,
        "djn_table_ms": 1e3 * djn_table,
        "table_seconds": table_seconds,
        "table_bytes": table.nbytes,
        "textbook_over_djn_powmod": textbook / djn_powmod,
        "djn_powmod_over_djn_table": djn_powmod / djn_table,
        "textbook_over_djn_table": textbook / djn_table,
        "note": "one core, gmpy2; textbook r^N mod N^2 (r uniform in Z_N^*), DJN h_s^a mod N^2 "
        f"(a of {bits} bits) by powmod and by the fixed-base table of 8-bit windows",
    }


def decryption(private_key, ciphertexts: int, workers: int | None) -> dict:
    """The key holder's CRT decryptions of one hop (at least 4 x DECRYPT_CHUNK, so that the
    pool is used): in its own process, then on a process pool of ``workers`` (warmed up
    first: spawning is a one-off per node)."""
    public_key = private_key.public_key
    values = obfuscators(public_key.n, public_key.hs, max(ciphertexts, 4 * DECRYPT_CHUNK))  # encryptions of 0
    start = time.perf_counter()
    decrypt_raw_many(private_key, values)
    in_process = time.perf_counter() - start
    workers = workers or os.cpu_count() or 1
    with worker_pool(workers) as pool:
        decrypt_raw_many(private_key, values, pool)
        start = time.perf_counter()
        plain = decrypt_raw_many(private_key, values, pool)
        pooled = time.perf_counter() - start
    assert not any(plain), "decryption of encryptions of zero is wrong"
    return {
        "ciphertexts": len(values),
        "in_process_seconds": in_process,
        "pool_seconds": pooled,
        "pool_workers": workers,
        "pool_speedup": in_process / pooled,
        "note": f"at least {4 * DECRYPT_CHUNK} ciphertexts; a hop of fewer than {2 * DECRYPT_CHUNK} stays in process",
    }


def commutative(group_bits: int) -> dict:
    group = group_for_bits(group_bits)
    cipher = PohligHellman(group)
    elements = [encode_record(group, secrets.token_bytes(32))[0] for _ in range(200)]
    start = time.perf_counter()
    for x in elements:
        cipher.encrypt(x)
    ph = len(elements) / (time.perf_counter() - start)
    ec = X25519Hash()
    points = [hash_to_u(secrets.token_bytes(32)) for _ in range(5000)]
    start = time.perf_counter()
    ec.apply(points)
    x25519 = len(points) / (time.perf_counter() - start)
    return {"group_bits": group.bits, "encrypt_per_s": ph, "ec_hash_per_s": x25519, "ec_over_ph": x25519 / ph}


def run(args: argparse.Namespace) -> int:
    if args.values < 1 or args.parties < 1 or args.naive_sample < 1:
        raise ValueError("--values, --parties and --naive-sample must be >= 1")
    paper = args.key_bits in PAPER_KEY_BITS
    check_key_bits(args.key_bits, allow_insecure_key_bits=paper)
    if paper:
        print(f"warning: {args.key_bits}-bit Paillier keys are insecure; used only to reproduce the paper", file=sys.stderr)
    rng = np.random.default_rng(secrets.randbits(64))
    data = [rng.integers(0, VALUE_RANGE, size=args.values, dtype=np.int64) for _ in range(args.parties)]

    start = time.perf_counter()
    phe_public, phe_private = phe.paillier.generate_paillier_keypair(n_length=args.key_bits)
    naive_keygen = time.perf_counter() - start
    start = time.perf_counter()
    public_key, private_key = generate_keypair(args.key_bits, allow_insecure_key_bits=paper)
    keygen = time.perf_counter() - start

    naive = naive_sum(public_key, private_key, (phe_public, phe_private), data, min(args.naive_sample, args.values))
    packed = packed_sum(public_key, private_key, data, args.workers)
    with_offline = packed["seconds_per_value"] + packed["offline_seconds"] / args.values
    gmp = gmp_floor(public_key, private_key, packed, args.parties, args.values)
    with_offline_cpu = gmp["engine_cpu_seconds"] / args.values
    result = {
        "paillier": {
            "key_bits": args.key_bits,
            "values": args.values,
            "parties": args.parties,
            "naive": naive,
            "packed": packed,
            "speedup": naive["seconds_per_value"] / packed["seconds_per_value"],
            "speedup_with_offline": naive["seconds_per_value"] / with_offline,
            "speedup_with_offline_cpu": naive["seconds_per_value"] / with_offline_cpu,
            "bytes_ratio": naive["bytes_per_value"] / packed["bytes_per_value"],
            "key_generation_seconds": {"engine": keygen, "naive": naive_keygen},
            "gmp": gmp,
            "obfuscator_modes": obfuscator_modes(public_key),
            "decryption": decryption(private_key, packed["ciphertexts_per_hop"], args.workers),
        },
        "commutative": commutative(args.group_bits),
        "machine": {"cpu_count": os.cpu_count(), "note": "speedup_with_offline counts the pool's wall time; "
                    "speedup_with_offline_cpu counts every obfuscator at its one-core cost"},
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    atomic_write_json(args.json, result)
    return 0
