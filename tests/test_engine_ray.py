"""A party's local work on its own Ray cluster (cels.engine; docs/ray.md, "A party on a
Ray cluster"): the same results as in one process for any number of user shards, a whole
session on Ray, and the ``[engine]`` options' checks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
import time

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cels[ray]'; CI installs it)")

from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash  # noqa: E402
from cels.crypto.groups import group_for_bits  # noqa: E402
from cels.crypto.ec_hash import X25519Hash  # noqa: E402
from cels.crypto.streams import DrawKeys  # noqa: E402
from cels.engine import EngineOptions, InProcessEngine, open_engine  # noqa: E402
from cels.engine.log_pieces import merge_pieces, read_batches, split_by_shard  # noqa: E402
from cels.engine.user_draws import user_digests  # noqa: E402
from cels.engine.shards import LogShard  # noqa: E402
from cels.engine.ray.work import RayWork  # noqa: E402
from cels.engine.work import CHUNK_IDS  # noqa: E402
from cels.engine.ray.cluster import RayEngine  # noqa: E402
from cels.engine.ray.actors import ShardPool, in_bundle  # noqa: E402
from cels.inprocess import InMemoryNetwork, MemoryNode, session_hosts, start_session  # noqa: E402
from cels.logs import LoadOptions, LogFile, split_records_by_user, synthetic_log, write_records  # noqa: E402
from cels.logs.model import SearchLog  # noqa: E402
from cels.logs.records import LogError, LogRecord  # noqa: E402
from cels.logs.parquet import ParquetLog, write_parquet  # noqa: E402
from cels.mechanism.greedy import verdicts  # noqa: E402
from cels.protocol.host import SessionHost  # noqa: E402
from cels.protocol.options import SessionOptions  # noqa: E402
from cels.protocol.party import PartyRole  # noqa: E402
from cels.engine.inprocess import in_process_work
from cels.engine.runtime import InProcessRuntime
from cels.engine.work import ShardedWork
from cels.engine.routines import PAIR_ORDER, ItemBound, encode_item, id_array, id_list, pair_digests
from cels.session_report import session_report  # noqa: E402
from test_private_solve import TEST_KEYS, audit  # noqa: E402

pytestmark = pytest.mark.usefixtures("rounds_on_the_user_shards")


@pytest.fixture(scope="module")
def engine():
    """One local Ray instance for the module (a node starts or joins its cluster once)."""
    started = open_engine(EngineOptions(kind="ray", shards=2, max_in_flight=2))
    yield started
    started.close()


INDEX_KEY = X25519Hash(bytes(range(32)))


def loaded_pair(shards: int, log, max_in_flight: int = 2) -> tuple[ShardedWork, RayWork]:
    """The same log loaded and indexed in one process and on Ray: the index's columns are the
    ranks of the pairs' hashed ids, as the universe makes them (each work numbers its own
    pairs its own way)."""
    draws = DrawKeys.replay(1, "party-1")  # the same keys: the same draw order of the rows
    works = in_process_work(log, 4, draws), RayWork(log, 4, draws, shards, max_in_flight)
    for work in works:
        n = work.load().own_pairs
        ids = hashed(work, INDEX_KEY)
        for first in range(0, n, 100):  # back in chunks, as the ring returns them
            work.keep_returned(first, ids[first : first + 100])
        keys = np.concatenate(list(work.sorted_returned(64)))
        assert id_list(keys) == sorted(id_list(ids))
        for first in range(0, n, 50):  # the index: the party's sorted ids alone
            work.place_columns(n, first, np.arange(first, min(first + 50, n)))
        work.index(n)
    return works


def column_totals(work) -> np.ndarray:
    """A work's counts c^k over the index :func:`loaded_pair` made (its own pairs alone)."""
    return np.asarray(work.log.counts_over(np.arange(work.log.own_pairs)).sum(axis=0)).ravel()


def hashed(work, cipher, size: int = 200) -> np.ndarray:
    """All of a work's own ids with ``cipher``'s layer, as its first hop sends them."""
    chunks = list(work.hashed_ids(cipher, size))
    assert all(len(c) == size for c in chunks[:-1])
    return np.concatenate(chunks)


@pytest.mark.parametrize("shards", [1, 2])
def test_pair_work_on_tasks_is_the_in_process_work(engine, shards, monkeypatch) -> None:
    """Tasks of 100 ids, 2 in flight: the same ids, in the same order (the pairs' keyed digests),
    for both hops of the universe."""
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 100)
    local, remote = loaded_pair(shards, synthetic_log(seed=3, users=200, pairs=450))
    cipher = X25519Hash(bytes(range(1, 33)))
    first = hashed(local, cipher)
    assert len(first) > 300 and first.dtype == np.dtype("V32")
    tasks = remote.pair_tasks.tasks
    assert id_list(hashed(remote, cipher)) == id_list(first)
    assert remote.pair_tasks.tasks - tasks == -(-len(first) // 100)
    peer = X25519Hash(bytes(range(2, 34)))
    layered = remote.apply_layer(peer, first)
    assert layered.dtype == np.dtype("V32") and id_list(layered) == id_list(local.apply_layer(peer, first)) == peer.apply(id_list(first))


def test_a_forwarded_chunk_is_split_over_the_cluster_cores(engine, monkeypatch) -> None:
    """A party layers one forwarded chunk at a time: on 2 CPUs a chunk of 16,384 ids is two tasks
    of 8192, on 128 CPUs (and a window of as many) sixteen of 1024; on a larger cluster the
    tasks are smaller and the ids the same, in order."""
    from cels.engine.work import layer_task_ids

    assert [layer_task_ids(16384, p) for p in (1, 2, 4, 128, 1024)] == [8192, 8192, 4096, 1024, 1024]
    assert layer_task_ids(100, 2) == 1024  # a short chunk: one task
    monkeypatch.setattr("cels.engine.work.STREAM_IDS", 256)
    monkeypatch.setattr("cels.engine.work.MIN_TASK_IDS", 16)
    log = synthetic_log(seed=3, users=200, pairs=450)
    local = in_process_work(log, 4, DrawKeys.replay(1, "party-1"))
    local.load()
    first = hashed(local, X25519Hash(bytes(range(1, 33))))
    remote = RayWork(log, 4, DrawKeys.replay(1, "party-1"), 2, 8, cpus=8)
    assert remote.layer_ids == 32
    peer = X25519Hash(bytes(range(2, 34)))
    assert id_list(remote.apply_layer(peer, first)) == id_list(local.apply_layer(peer, first))
    assert remote.pair_tasks.tasks == -(-len(first) // 32)
    remote.release()


def test_pohlig_hellman_pair_work_on_tasks_is_the_in_process_work(engine, monkeypatch) -> None:
    """The Pohlig-Hellman universe cipher on tasks too: the exponent travels as raw bytes and
    the ids are those of the key in process (chunks of 40, 2 in flight)."""
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 40)
    local, remote = loaded_pair(2, synthetic_log(seed=3, users=40, pairs=60))
    group = group_for_bits(1024, allow_paper_bits=True)
    cipher = PohligHellmanHash(group)
    assert PohligHellmanHash.from_exponent(group, cipher.exponent_bytes()).exponent_bytes() == cipher.exponent_bytes()
    first = hashed(local, cipher, 40)
    assert len(first) == local.load().own_pairs > 80 and id_list(hashed(remote, cipher, 40)) == id_list(first)
    peer = PohligHellmanHash(group)
    assert id_list(remote.apply_layer(peer, first)) == peer.apply(id_list(first))
    with pytest.raises(ValueError, match="not a Pohlig-Hellman exponent"):
        PohligHellmanHash.from_exponent(group, (2).to_bytes(128, "big"))


def test_a_bad_peer_id_is_a_cipher_error_naming_its_chunk(engine, monkeypatch) -> None:
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 4)
    _, remote = loaded_pair(2, synthetic_log(seed=3, users=20, pairs=30))
    ids = id_array([bytes([9]) * 32] * 9 + [bytes(32)], 32)  # u = 0: a point of small order
    with pytest.raises(CommutativeCipherError, match=r"ids from 8 on: x25519 element 1: "):
        remote.apply_layer(X25519Hash(), ids)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_verdicts_are_the_party_verdicts(engine, shards) -> None:
    """Tight b, many proposals per round and proposals that share users: the shards' passes
    give the in-process bitmap (a plain OR of the shards' own walks would not, see below)."""
    local, remote = loaded_pair(shards, synthetic_log(seed=5, users=120, pairs=80))
    totals = column_totals(local) * 3  # a peer's counts: no pair is unique
    active = np.flatnonzero(totals)
    rows = local.constraint_rows(active, totals)
    assert (remote.constraint_rows(active, totals) != rows).nnz == 0
    rng = np.random.default_rng(1)
    loads = rows @ rng.integers(0, 3, rows.shape[1]).astype(np.float64)
    b = float(np.quantile(loads, 0.8)) + 0.5
    proposals = rng.permutation(rows.shape[1])[:60]
    expected = verdicts(rows.tocsc(), loads, proposals, b)
    assert 0 < expected.sum() < len(proposals)
    assert np.array_equal(remote.verdicts(rows.tocsc(), loads, proposals, b), expected)
    assert np.array_equal(remote.verdicts(rows.tocsc(), loads, proposals[::-1].copy(), b), verdicts(rows.tocsc(), loads, proposals[::-1].copy(), b))
    if shards > 1:  # the shortcut the walk avoids: each shard's own verdicts, OR-ed
        ored = np.zeros_like(expected)
        for m in remote.log.shard_members(remote.row_users):
            ored |= verdicts(rows[m].tocsc(), loads[m], proposals, b)
        assert np.all(ored >= expected)  # a shard alone only rejects more


def test_a_small_round_is_walked_on_the_node_and_a_large_one_on_the_user_shards(engine, monkeypatch) -> None:
    """The bound is the nonzeros of the round's proposed columns: a round at the bound is
    walked on the node (no user shard placed), one above it on the shards; both give the
    in-process bitmap and are counted apart in the session summary.  The user shards then
    serve the sampling, which drops their rows: a later round places them again."""
    local, remote = loaded_pair(2, synthetic_log(seed=5, users=120, pairs=80))
    totals = column_totals(local) * 3
    active = np.flatnonzero(totals)
    rows = local.constraint_rows(active, totals).tocsc()
    remote.constraint_rows(active, totals)
    rng = np.random.default_rng(2)
    loads = rows @ rng.integers(0, 3, rows.shape[1]).astype(np.float64)
    b = float(np.quantile(loads, 0.8)) + 0.5
    small, large = rng.permutation(rows.shape[1])[:20], rng.permutation(rows.shape[1])[:60]
    bound = int(np.diff(rows.indptr)[small].sum())
    assert int(np.diff(rows.indptr)[large].sum()) > bound
    monkeypatch.setattr("cels.engine.ray.runtime.RayRuntime.node_walk_nonzeros", bound)
    assert np.array_equal(remote.verdicts(rows, loads, small, b), verdicts(rows, loads, small, b))
    assert (remote.node_rounds, remote.verdict_rounds, remote._actors) == (1, 0, [])
    assert np.array_equal(remote.verdicts(rows, loads, large, b), verdicts(rows, loads, large, b))
    assert (remote.node_rounds, remote.verdict_rounds, len(remote._actors)) == (1, 1, 2)
    assert remote.usage()["node_rounds"] == 1
    # the same actors take the sampling's counts, and drop the rows; a round after it places them again
    shards = list(remote._actors)
    assert remote.sampling_shards(active) == shards
    assert np.array_equal(remote.verdicts(rows, loads, large, b), verdicts(rows, loads, large, b))
    assert remote._actors == shards and remote.verdict_rounds == 2
    remote.release()


def test_a_rejection_in_one_shard_keeps_its_load_off_the_others(engine) -> None:
    """16 gadgets: A holds p0 and p1, B holds p0 (more of it).  B cannot take p0, so the party
    rejects it; A then fits p1 (without p0's cost).  A shard holding A without B would walk p0
    in and reject p1: an OR of the shards' own walks rejects every p1 wherever some gadget is
    split (all but 2^-15 of the keys), the shards' passes to a fixed point none."""
    gadgets = 16
    users = [f"{who}{g}" for g in range(gadgets) for who in "AB"]
    pairs = [(f"q{g}", f"p{t}") for g in range(gadgets) for t in range(2)]
    counts = sp.lil_matrix((len(users), len(pairs)), dtype=np.int64)
    for g in range(gadgets):
        counts[2 * g, 2 * g] = counts[2 * g, 2 * g + 1] = 1  # A
        counts[2 * g + 1, 2 * g] = 2  # B
    log = SearchLog(users, pairs, counts.tocsr())
    totals = np.full(len(pairs), 4)  # ln t: A ln(4/3) on both, B ln 2
    local, remote = loaded_pair(2, log)
    rows = local.constraint_rows(np.arange(len(pairs)), totals)
    assert (remote.constraint_rows(np.arange(len(pairs)), totals) != rows).nnz == 0 and rows.shape[0] == len(users)
    b = 1.0
    is_b = np.array([name.startswith("B") for name in local.log.user_names(local.row_users)])
    assert remote.log.user_names(remote.row_users) == local.log.user_names(local.row_users)
    loads = np.where(is_b, b - np.log(2) + 0.01, b - np.log(4 / 3) - 0.1)
    column = {pair: col for col, pair in local.log.pair_names(np.arange(len(pairs))).items()}
    proposals = np.array([column[pair] for pair in pairs])  # the pairs in gadget order
    expected = verdicts(rows.tocsc(), loads, proposals, b)
    assert expected.tolist() == [1, 0] * gadgets
    assert np.array_equal(remote.verdicts(rows.tocsc(), loads, proposals, b), expected)
    # 16 rejections in one round, yet at most three passes of the shards: one without a veto
    # (it also rejects the p1 of every split gadget), one with it (p1 fits), one that repeats
    # it (one pass if no gadget is split: no vetoed proposal touches another shard)
    assert remote.verdict_rounds == 1 and 1 <= remote.verdict_passes <= 3


def test_the_shards_follow_the_session_bucket_key(engine) -> None:
    """Each session's fresh keys put the users on other shards; replayed keys on the same."""
    log = synthetic_log(seed=5, users=200, pairs=40)

    def shard_by_user(draws: DrawKeys) -> dict[str, int]:
        work = RayWork(log, 4, draws, 4, 2)
        work.load()
        rows = np.arange(log.n_users)
        return dict(zip(work.log.user_names(rows), work.log.shard_of(rows).tolist()))

    fresh = shard_by_user(DrawKeys.fresh())
    assert set(fresh.values()) == {0, 1, 2, 3} and fresh != shard_by_user(DrawKeys.fresh())
    assert shard_by_user(DrawKeys.replay(3, "p")) == shard_by_user(DrawKeys.replay(3, "p"))


def test_a_whole_session_with_ray_work_releases_a_feasible_log(engine) -> None:
    log = synthetic_log(seed=9, users=60)
    config = SessionOptions.create(2, keep_user_ids=True, epsilon=8.0, delta=0.9, round_batch=8, **TEST_KEYS)
    nodes = session_hosts(log.split_by_user(2), config, allow_insecure_key_bits=True)
    works: list[RayWork] = []

    def party(name: str, part):
        def role(opts: SessionOptions) -> PartyRole:
            draws = DrawKeys.fresh()
            works.append(engine.work(part, opts.cap, draws, ItemBound.of(opts)))
            return PartyRole(name, opts, part, draws=draws, work=works[-1], allow_insecure_key_bits=True, session_report=session_report)

        return MemoryNode(SessionHost(name, role, time.perf_counter))

    nodes.update({name: party(name, part) for name, part in zip(config.parties, log.split_by_user(2))})
    roles = start_session(InMemoryNetwork(nodes), config)
    assert all(role.aborted is None for role in roles.values()), [r.aborted for r in roles.values()]
    assert [type(w) for w in works] == [RayWork, RayWork] and all(len(w._actors) == 2 for w in works)
    x = audit(log, roles[config.initiator].output, config.b)
    assert x.sum() == roles[config.initiator].report["solver"]["integer_total"] > 0


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kind": "spark"}, "engine.kind must be one of local, ray, not 'spark'"),
        ({"kind": "ray", "shards": 0}, "engine.shards must be a positive integer, not 0"),
        ({"kind": "ray", "max_in_flight": True}, "engine.max_in_flight must be a positive integer, not True"),
        ({"kind": "ray", "address": " "}, "engine.address must be"),
        ({"shards": 4}, "apply to kind = \"ray\" only"),
    ],
)
def test_engine_options_are_checked(fields, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineOptions(**fields)


def test_the_local_engine_is_the_sharded_work_on_one_shard_in_process() -> None:
    assert isinstance(open_engine(EngineOptions()), InProcessEngine)
    work = InProcessEngine().work(synthetic_log(seed=1, users=5, pairs=5), 4, DrawKeys.fresh())
    assert type(work) is ShardedWork and isinstance(work.runtime, InProcessRuntime) and work.shards == 1


def test_an_unreachable_cluster_refuses_the_node_naming_the_address(monkeypatch) -> None:
    monkeypatch.setattr("cels.engine.ray.cluster.CONNECT_SECONDS", 1.0)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as a fresh node process would be
    with pytest.raises(ValueError, match=r"the Ray cluster at 127\.0\.0\.1:9 is unreachable"):
        open_engine(EngineOptions(kind="ray", address="127.0.0.1:9"))
    with pytest.raises(ValueError, match=r"engine.address 'nowhere' is neither"):
        open_engine(EngineOptions(kind="ray", address="nowhere"))


PARTY_TOML = '[node]\nname = "party-1"\nlisten = "127.0.0.1:7101"\ninsecure = true\n[data]\npath = "log.tsv"\n'


@pytest.mark.parametrize(
    "table, message",
    [
        ('kind = "spark"', '[engine] kind: expected one of "local", "ray", got "spark"'),
        ("shards = 0", "[engine] shards: expected an integer >= 1, got 0"),
        ('max_in_flight = "8"', '[engine] max_in_flight: expected an integer >= 1, got "8"'),
        ("shard = 2", "[engine] unknown key 'shard'"),
        ("shards = 2", '[engine]: engine.address, engine.shards and engine.max_in_flight apply to kind = "ray" only'),
    ],
)
def test_the_engine_table_is_checked_naming_the_file(tmp_path, capsys, table, message) -> None:
    from party_node.__main__ import main as party_main

    (tmp_path / "log.tsv").write_text("")
    config = tmp_path / "party.toml"
    config.write_text(f"{PARTY_TOML}[engine]\n{table}\n")
    assert party_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cels-party: error: {config}") and message in err and len(err.strip().splitlines()) == 1


def test_a_party_node_refuses_an_unreachable_ray_cluster_with_exit_2(tmp_path, capsys, monkeypatch) -> None:
    from party_node.__main__ import main as party_main

    monkeypatch.setattr("cels.engine.ray.cluster.CONNECT_SECONDS", 1.0)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # a fresh node process
    (tmp_path / "log.tsv").write_text("")
    config = tmp_path / "party.toml"
    config.write_text(f'{PARTY_TOML}[engine]\nkind = "local"\n')
    assert party_main(["--config", str(config), "--engine", "ray", "--engine-address", "127.0.0.1:9", "--shards", "2"]) == 2
    assert "cels-party: error: the Ray cluster at 127.0.0.1:9 is unreachable" in capsys.readouterr().err


def test_simulate_passes_the_engine_flags_to_every_party_node() -> None:
    from cels.engine.options import engine_options

    args = argparse.Namespace(engine="ray", engine_address=None, shards=2, max_in_flight=None)
    assert engine_options(args, {}) == EngineOptions(kind="ray", shards=2)
    assert engine_options(args, {}).argv() == ["--engine", "ray", "--shards", "2"]
    with pytest.raises(ValueError, match=r"^the engine flags: engine.shards must be a positive integer, not -1$"):
        engine_options(argparse.Namespace(engine="ray", engine_address=None, shards=-1, max_in_flight=None), {})


@ray.remote
def _ids_of(size: int) -> bytes:
    """A pair-work task's result of ``size`` bytes."""
    return bytes(size)


def test_the_instance_a_node_starts_passes_a_chunk_in_the_call_and_runs_no_log_monitor(engine) -> None:
    """The Ray instance a node starts (address "local") runs with LOCAL_RAY_CONFIG: a result
    of a pair-work task of CHUNK_IDS 2048-bit ids (2 MiB) is held in the caller, not in the
    object store on a node, where one of 8 MiB still goes; and its log monitor is gone
    (stop_log_monitor).  docs/ray.md, "Where Ray's CPU goes"."""
    chunk, large = _ids_of.remote(CHUNK_IDS * 256), _ids_of.remote(8 << 20)
    ray.wait([chunk, large], num_returns=2)
    where = ray.experimental.get_object_locations([chunk, large])
    assert where[chunk]["node_ids"] == [] and len(where[large]["node_ids"]) == 1, where
    session = ray._private.worker._global_node.get_session_dir_path().encode()
    assert pids_whose_argv(lambda argv: any(a.endswith(b"log_monitor.py") for a in argv) and any(session in a for a in argv)) == set()


def pids_whose_argv(match: Callable[[list[bytes]], bool]) -> set[int]:
    """Pids of this machine's processes whose argv (``/proc/PID/cmdline`` split at its NULs)
    ``match`` accepts."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if match(argv):
                found.add(int(entry.name))
    return found


def ray_processes() -> set[int]:
    """Pids of Ray's own processes on this machine (raylet, GCS, workers and agents)."""
    return pids_whose_argv(lambda argv: argv[0].startswith(b"ray::") or any(b"raylet" in a or b"gcs_server" in a or b"ray/dashboard" in a for a in argv[:2]))


def processes_with_env(name: str, value: str) -> set[int]:
    """Pids of this user's processes whose environment has ``name=value`` (a Ray worker's
    argv is its title, ``ray::IDLE``, but it inherits its node's environment)."""
    wanted, found = f"{name}={value}".encode(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_simulated_ray_session_leaves_no_ray_process_behind(tmp_path, monkeypatch) -> None:
    """A party node with --engine ray starts its own Ray instance; when the node stops, the
    instance goes with it (no raylet, GCS or agent left orphaned), and the release is written.
    Issue 41 finding 6: only this test's processes count (their RAY_TMPDIR is the test's own),
    not another Ray on a busy host."""
    import shutil
    import tempfile

    from cels.cli import main

    own = tempfile.mkdtemp(prefix="cr-t")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", own)
    try:
        argv = ["simulate", "--parties", "2", "--synthetic-users", "40", "--synthetic-pairs", "40", "--key-bits", "512",
                "--engine", "ray", "--shards", "2", "--out", str(tmp_path / "out"), "--report", str(tmp_path / "report.json")]  # fmt: skip
        assert main(argv) in (0, 3)
        assert (tmp_path / "out" / "sanitized.tsv").is_file()
        limit = time.monotonic() + 20
        while (left := processes_with_env("RAY_TMPDIR", own)) and time.monotonic() < limit:
            time.sleep(0.5)
        assert not left, sorted(left)
        assert not list(Path(own).iterdir())  # and each node's own Ray directory is gone
    finally:
        shutil.rmtree(own, ignore_errors=True)


def seeded_release(log: SearchLog | list[LogFile], config: SessionOptions, engine=None, seed: int = 11) -> SearchLog:
    """The release of a session whose parties' draws are replayed from ``seed``, their work in
    process or on ``engine``; ``log`` is split over the parties, or is their shares' files."""
    shares = log if isinstance(log, list) else log.split_by_user(len(config.parties))
    nodes = session_hosts(shares, config, seed=seed, allow_insecure_key_bits=True)

    works = []

    def party(name: str, part):
        def role(opts: SessionOptions) -> PartyRole:
            draws = DrawKeys.replay(seed, name)
            works.append(engine.work(part, opts.cap, draws, ItemBound.of(opts)))
            return PartyRole(name, opts, part, draws=draws, work=works[-1], allow_insecure_key_bits=True, session_report=session_report)

        return MemoryNode(SessionHost(name, role, time.perf_counter))

    if engine is not None:
        nodes.update({name: party(name, part) for name, part in zip(config.parties, shares)})
    roles = start_session(InMemoryNetwork(nodes), config)
    for work in works:  # as a party node does at a session's end
        engine.release(work)
    assert all(role.aborted is None for role in roles.values()), [r.aborted for r in roles.values()]
    privacy = roles[config.initiator].report["privacy"]  # a replayed session says it is not private
    assert privacy["reproducible_seed"] is True and privacy["private"] is False
    assert any("--seed" in why for why in privacy["not_private_because"])
    return roles[config.initiator].output


def released(log: SearchLog) -> tuple:
    """A release as what its file holds: users, pairs and counts in order."""
    return tuple(log.users), tuple(log.pairs), tuple(map(tuple, sp.csr_matrix(log.counts).toarray()))


@pytest.mark.parametrize("sampling, shard_counts", [("exact", (3,)), ("paper", (2,))])
def test_a_seeded_release_is_the_same_in_process_and_on_any_number_of_shards(engine, sampling, shard_counts) -> None:
    """Every draw over users comes from its bucket's stream: P shards on Ray release
    exactly the in-process records (exact staged sampling, and the paper's local sampling);
    tests/test_bench_engine.py does P = 2 over node processes."""
    log = synthetic_log(seed=4, users=90)
    config = SessionOptions.create(2, epsilon=8.0, delta=0.9, round_batch=8, sampling=sampling, **TEST_KEYS)
    local = released(seeded_release(log, config))
    assert len(local[0]) > 5
    assert released(seeded_release(log, config)) == local  # replayed
    assert released(seeded_release(log, config, seed=12)) != local  # another seed, other draws
    for shards in shard_counts:
        assert released(seeded_release(log, config, RayEngine(EngineOptions(kind="ray", shards=shards)))) == local, shards


def test_a_seeded_dp_histogram_is_the_same_in_process_and_on_any_number_of_shards(engine) -> None:
    """The DP release's contribution bound runs on the log shards (keyed priorities per
    (user, pair)) and its items are named there: the same bytes as in process for P = 3."""
    log = synthetic_log(seed=4, users=300, pairs=50)
    config = SessionOptions.create(3, epsilon=4.0, delta=1e-3, release="dp", max_items_per_user=2, **TEST_KEYS)
    local = seeded_release(log, config)
    assert len(local) > 3
    assert seeded_release(log, config, RayEngine(EngineOptions(kind="ray", shards=3))) == local


def test_a_dp_histogram_of_queries_and_pairs_is_the_same_in_process_and_on_shards(engine, tmp_path) -> None:
    """Item kinds other than pairs are counted from each party's events in file order (read by
    the node, then split by user over the log shards), bounded per kind there: the same bytes
    as in process."""
    shares = []
    for k, events in enumerate(split_records_by_user(synthetic_log(seed=4, users=300, pairs=50).records(), 3)):
        write_records(events, tmp_path / f"party-{k}.tsv")
        shares.append(LogFile(tmp_path / f"party-{k}.tsv", LoadOptions(format="aol")))
    config = SessionOptions.create(3, epsilon=4.0, delta=1e-3, release="dp", items="pairs:2,queries:1", **TEST_KEYS)
    local = seeded_release(shares, config)
    assert {item.kind for item in local.items} == {"click", "query"}
    assert seeded_release(shares, config, RayEngine(EngineOptions(kind="ray", shards=3))) == local


def test_the_warm_shards_serve_session_after_session_reset(engine, monkeypatch) -> None:
    """The node's warm shard actors (ShardPool: a log shard and a user shard per shard) serve
    a session, are reset and serve the next: the same seeded release as in process each time
    (a log shard that kept the first session's pieces would count every row twice), from the
    same actor processes.  Of the session's two parties on one node's engine, the first takes
    the warm actors and the second, finding them busy, makes its own four; an actor that died
    idle is replaced when it is next asked for.  The node here starts a pool of its own, as a
    node does: what earlier tests' works borrowed from the module's engine, and give back only
    when collected, is not this test's to count (CI once found that pool empty)."""
    log = synthetic_log(seed=4, users=90)
    config = SessionOptions.create(2, epsilon=8.0, delta=0.9, round_batch=8, **TEST_KEYS)
    local = released(seeded_release(log, config))
    pool = ShardPool.start(engine.options.shards)
    node = RayEngine(engine.options, pool=pool)
    try:
        warm = {slot: actor._actor_id for slot, (actor, _) in pool._idle.items()}
        assert len(warm) == 2 * pool.shards == 4
        made = []
        counted = lambda *args: made.append(args) or in_bundle(*args)  # noqa: E731
        monkeypatch.setattr("cels.engine.ray.actors.in_bundle", counted)  # the pool's actors
        monkeypatch.setattr("cels.engine.ray.runtime.in_bundle", counted)  # a session's own
        for session in range(2):
            assert released(seeded_release(log, config, node)) == local, session
            assert len(made) == 4 * (session + 1)  # the second party's; the first's were warm
            assert {slot: actor._actor_id for slot, (actor, _) in pool._idle.items()} == warm
        lost = (LogShard, 1)
        ray.kill(pool._idle[lost][0])
        assert released(seeded_release(log, config, node)) == local
        assert pool._idle[lost][0]._actor_id != warm[lost] and len(made) == 4 * 2 + 1 + 4
    finally:
        pool.close()

def test_an_actor_of_a_cluster_left_is_dropped_when_given_back(engine) -> None:
    """CI saw a session's work, collected after its process had joined another cluster, give
    its warm actors back: Ray refuses their reset ("Can't find actor", a bare Exception).  The
    pool drops such an actor (the next session starts its own) and raises nothing."""

    class Gone:
        class reset:
            @staticmethod
            def remote():
                raise Exception("Failed to submit task to actor: Can't find actor. It might be dead or it's from a different cluster")

    pool = ShardPool(1, group=None)
    pool.give_back(LogShard, 0, Gone())
    assert pool._idle == {}


def test_a_join_that_fails_twice_is_tried_again_and_a_third_failure_refuses(monkeypatch) -> None:
    """A Ray client server that fails once under compose is not a cluster that is gone: the
    join is tried JOIN_ATTEMPTS times, then the node is refused naming the address."""
    import cels.engine.ray.cluster as ray_cluster

    calls: list[str] = []

    def flaky_init(address: str, **_kwargs) -> None:
        calls.append(address)
        if len(calls) < 3:
            raise ConnectionAbortedError("Starting Ray client server failed")

    monkeypatch.setattr(ray_cluster, "JOIN_BACKOFF_SECONDS", 0.0)
    monkeypatch.setattr(ray_cluster.ray, "init", flaky_init)
    monkeypatch.setattr(ray_cluster.ray, "shutdown", lambda: None)
    ray_cluster.join("ray://head:7111")
    assert calls == ["ray://head:7111"] * 3
    calls.clear()
    monkeypatch.setattr(ray_cluster, "JOIN_ATTEMPTS", 2)
    with pytest.raises(ValueError, match=r"cannot join the Ray cluster at ray://head:7111 \(2 attempts\): Starting Ray client server failed"):
        ray_cluster.join("ray://head:7111")
    assert len(calls) == 2


def parquet_shares(log: SearchLog, parties: int, root: Path) -> list[LogFile]:
    """Each party's share as a Parquet dataset of two files in row groups of 40 rows."""
    shares = []
    for k, share in enumerate(log.split_by_user(parties)):
        lake = root / f"party-{k + 1}"
        lake.mkdir()
        for f, part in enumerate(share.split_by_user(2)):
            write_parquet(part, lake / f"part-{f}.parquet", row_group_rows=40)
        shares.append(LogFile(lake, LoadOptions("parquet")))
    return shares


def test_a_parquet_dataset_is_read_by_tasks_onto_the_log_shards_with_the_same_release(engine, tmp_path, monkeypatch) -> None:
    """Reader tasks of at most 100 rows (2 in flight) read each party's row groups and hand
    every user's rows to its log shard: the seeded release is the one of the whole log read
    in process, and the log's source counts every row group once."""
    monkeypatch.setattr("cels.engine.sharded_log.READ_ROWS", 100)
    log = synthetic_log(seed=4, users=90)
    config = SessionOptions.create(2, epsilon=8.0, delta=0.9, round_batch=8, **TEST_KEYS)
    shares = parquet_shares(log, 2, tmp_path)
    local = released(seeded_release(log, config))
    assert released(seeded_release(shares, config, RayEngine(EngineOptions(kind="ray", shards=2, max_in_flight=2)))) == local
    work = RayWork(shares[0], 4, DrawKeys.replay(1, "party-1"), 2, 2)
    loaded = work.load()
    groups = ParquetLog(shares[0].path).row_groups
    assert len(read_batches(groups, 100)) > 2 and loaded.source["row_groups"] == len(groups) > 4
    assert loaded.source["format"] == "parquet" and loaded.source["skipped_lines"] == 0
    whole = shares[0]()
    assert loaded.own_pairs == whole.n_pairs and work.n_users == whole.n_users
    assert sorted(work.log.user_names(np.arange(work.n_users))) == sorted(whole.users)


TEXT = st.text(alphabet=st.sampled_from(['a', 'b', '"', "\\", "\n", "é", "\u2028", "\x00"]), max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(0, 6), TEXT, TEXT, st.integers(1, 5)), min_size=1, max_size=40),
    readers=st.integers(1, 4),
    shards=st.integers(1, 3),
)
def test_pieces_read_apart_and_merged_on_their_shard_are_the_log(entries, readers, shards) -> None:
    """A log cut into reader parts by rows, each split by shard and each shard's pieces merged:
    every shard has its users' rows c_ij of the whole log, each pair once, named by its
    encoded id and its digest, and each user with its own bucket digest, whatever the cut."""
    log = SearchLog.from_records(LogRecord(f"u{u}", q, w or "w", c, k) for k, (u, q, w, c) in enumerate(entries))
    draws = DrawKeys.replay(3, "party-1")
    parts = [SearchLog.from_records(LogRecord(f"u{u}", q, w or "w", c, k) for k, (u, q, w, c) in enumerate(entries) if k % readers == r) for r in range(readers)]
    cut = [split_by_shard(part, draws, shards) for part in parts]
    whole = {(log.users[j], log.pairs[i]): c for j, i, c in zip(*sp.find(log.counts))}
    seen = {}
    for s, piece in enumerate(split_by_shard(log, draws, shards)):
        merged = merge_pieces([pieces[s] for pieces in cut])
        assert sorted(merged.users) == sorted(piece.users)
        assert merged.user_digests.tolist() == user_digests(draws, merged.users).tolist()
        assert merged.digests.tolist() == sorted(set(merged.digests.tolist())) == sorted(piece.digests.tolist())
        pairs = [merged.pairs.pair(t) for t in range(len(merged.pairs))]
        assert merged.pairs.items(np.arange(len(pairs))) == [encode_item(*p) for p in pairs]
        assert merged.digests.tolist() == pair_digests(draws.secret(PAIR_ORDER), [encode_item(*p) for p in pairs]).tolist()
        seen |= {(merged.users[j], pairs[i]): c for j, i, c in zip(*sp.find(merged.counts))}
    assert seen == whole


def test_a_bad_row_read_on_the_cluster_names_its_file_row_and_column(engine, tmp_path, monkeypatch) -> None:
    """A null user in the third row group: the reader task's LogError reaches the node as
    raised (the session's load fails naming the file, the row and its row group); lenient,
    the row is skipped and counted as in process."""
    monkeypatch.setattr("cels.engine.sharded_log.READ_ROWS", 4)
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    users = [f"u{i % 5}" for i in range(12)]
    users[9] = None
    table = pa.table({"user": users, "query": [f"q{i % 3}" for i in range(12)], "url": [f"w{i % 2}" for i in range(12)]})
    pq.write_table(table, path, row_group_size=4)
    with pytest.raises(LogError, match=r"bad\.parquet, row 10 \(row 2 of row group 2\), field 'user': null user id"):
        RayWork(LogFile(path, LoadOptions("parquet")), 4, DrawKeys.fresh(), 2, 2).load()
    lenient = LogFile(path, LoadOptions("parquet", lenient=True))
    loaded = RayWork(lenient, 4, DrawKeys.fresh(), 2, 2).load()
    assert loaded.source["skipped_lines"] == lenient().source["skipped_lines"] == 1
    assert loaded.source["skipped_at"] == lenient().source["skipped_at"]


def test_a_pair_over_the_count_limit_on_no_one_shard_names_the_pair(engine, tmp_path, monkeypatch) -> None:
    """Six users give pair (q, u) 2^29 each, read two rows at a time by reader tasks and
    placed three on each of two shards: no reader and no shard holds a total above 2^31 - 1,
    but the shard numbering the pair's key range adds its totals over the log, and the load
    fails naming the pair and its total (3 x 2^30), as in process."""
    monkeypatch.setattr("cels.engine.sharded_log.READ_ROWS", 2)
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "heavy.parquet"
    table = pa.table({
        "user": [f"u{i}" for i in range(6)] + ["v1", "v2"],
        "query": ["q"] * 6 + ["r", "r"],
        "url": ["u"] * 6 + ["w", "w"],
        "count": [2**29] * 6 + [5, 6],
    })  # fmt: skip
    pq.write_table(table, path, row_group_size=2)
    expected = r"heavy\.parquet: pair \(query 'q', url 'u'\) totals 3221225472 over the log, above the 2147483647"
    with pytest.raises(LogError, match=expected):
        LogFile(path, LoadOptions("parquet"))()
    work = RayWork(LogFile(path, LoadOptions("parquet")), 4, DrawKeys.replay(13, "party-1"), 2, 2)
    with pytest.raises(LogError, match=expected):
        work.load()
    heavy = [sum(name.startswith("u") for name in work.log.user_names(rows)) for rows in work.log.rows]
    assert heavy == [3, 3] and work.log.held_pairs == [2, 2]  # both shards hold both pairs
    work.release()
