"""Faults of a party's Ray engine (issue 25, "Faults"; docs/ray.md, "Faults of the
engine"), each caused for real: Ray's worker processes killed by SIGKILL (found by their process
title, ``ray::<task>`` / ``ray::UserShard...``, or the actor table's pid), a joined cluster's
processes ended, a party node killed by SIGKILL.

- a pair-work task whose worker dies runs again and the ids are the in-process ones;
- a user-shard actor that dies is re-created and the round walked again (the in-process
  verdicts); one lost in the sampling is re-created and replayed (the in-process draws); past :data:`SHARD_RESTARTS` the session aborts: LOCAL_FAILURE in phase solve,
  blaming the party, "engine worker lost", nothing more;
- a joined cluster that stopped answering refuses a StartSession with its address;
- a SIGKILLed party node that started its own Ray instance leaves no Ray process behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cels[ray]'; CI installs it)")

from ray._private import state as ray_state  # noqa: E402  (the GCS's actor table: no dashboard needed)

from cels.crypto.ec_hash import X25519Hash  # noqa: E402
from cels.crypto.streams import DrawKeys  # noqa: E402
from cels.engine.ray.work import RayWork  # noqa: E402
from cels.engine.work import SHARD_RESTARTS  # noqa: E402
from cels.engine.interface import WORKER_LOST  # noqa: E402
from cels.inprocess import InMemoryNetwork, MemoryNode, session_hosts, start_session  # noqa: E402
from cels.logs import synthetic_log  # noqa: E402
from cels.mechanism.greedy import verdicts  # noqa: E402
from cels.node.client import Controller, SessionAborted, run_on_nodes  # noqa: E402
from cels.node.cluster import LOOPBACK, free_port  # noqa: E402
from cels.protocol.aborts import LOCAL_FAILURE, REFUSED, describe  # noqa: E402
from cels.protocol.host import SessionHost  # noqa: E402
from cels.protocol.options import SessionOptions  # noqa: E402
from cels.protocol.party import PartyRole  # noqa: E402
from cels.protocol.phases import Phase  # noqa: E402
from cels.engine.interface import WorkFailure  # noqa: E402
from cels.protocol.wire.codec import phase_from_wire  # noqa: E402
from cels.session_report import session_report  # noqa: E402
from cels.engine.routines import id_array, id_list
from fault_harness import CONTROLLER, PARTIES, FaultCluster, session_members  # noqa: E402
from test_engine_ray import column_totals, engine, loaded_pair  # noqa: E402,F401 (engine: the module's Ray instance, a fixture)
from test_engine_raylets import RAY_CLI, cluster_processes, descendants, end_processes, ray_cli, zombie  # noqa: E402
from test_private_solve import TEST_KEYS, audit  # noqa: E402

GONE_SECONDS = 15.0
"""How long a killed process (and what it leaves) may take to be gone."""

pytestmark = pytest.mark.usefixtures("rounds_on_the_user_shards")


def title(pid: int) -> bytes:
    """A process's title (Ray rewrites its workers' argv to ``ray::<what it runs>``)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not zombie(pid)


def sigkill(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    limit = time.monotonic() + GONE_SECONDS
    while alive(pid) and time.monotonic() < limit:
        time.sleep(0.05)
    assert not alive(pid), f"process {pid} outlived SIGKILL"


class Killer(threading.Thread):
    """Kills, once, the first process below this test process whose title ``wanted`` accepts
    (polling /proc): a Ray worker in the middle of its work."""

    def __init__(self, wanted) -> None:
        super().__init__(daemon=True)
        self.wanted, self.killed, self.title = wanted, None, b""
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in descendants({os.getpid()}) - {os.getpid()}:
                if self.wanted(pid, title(pid)):
                    self.title = title(pid)
                    os.kill(pid, signal.SIGKILL)
                    self.killed = pid
                    return
            time.sleep(0.005)

    def stop(self) -> None:
        self.done.set()
        self.join(5)


def peer_ids(n: int) -> np.ndarray:
    """``n`` distinct 32-byte curve points, as a peer's layer would send them (an id array)."""
    return id_array([hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)], 32)


# -- 1. pair-work tasks -------------------------------------------------------------------


def test_a_pair_task_whose_worker_dies_runs_again_with_the_same_ids(engine, monkeypatch) -> None:
    """Three tasks of 6,000 ids (a good fraction of a second each); the worker running one is
    SIGKILLed mid-task; the task runs again and the ids are the in-process ones, in order."""
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 6000)
    _, remote = loaded_pair(2, synthetic_log(seed=3, users=20, pairs=30))
    cipher, ids = X25519Hash(bytes(range(32))), peer_ids(18000)
    expected = id_array(cipher.apply(id_list(ids)), 32)
    killer = Killer(lambda pid, name: name == b"ray::pair_chunk")
    killer.start()
    try:
        assert remote.apply_layer(cipher, ids).tobytes() == expected.tobytes()
    finally:
        killer.stop()
    assert killer.killed is not None, "no worker was seen running pair_chunk"
    assert not alive(killer.killed)


def test_a_pair_task_out_of_retries_is_engine_worker_lost(engine, monkeypatch) -> None:
    """With no retry left, a killed task's worker ends the work with the session's abort
    reason, not a Ray error (the detail names the chunk)."""
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 6000)
    monkeypatch.setattr("cels.engine.ray.runtime.TASK_RETRIES", 0)
    _, remote = loaded_pair(2, synthetic_log(seed=3, users=20, pairs=30))
    killer = Killer(lambda pid, name: name == b"ray::pair_chunk")
    killer.start()
    try:
        with pytest.raises(WorkFailure, match=r"the pair-work task on the ids from \d+ on is lost: a task is lost after 0 retries") as failed:
            remote.apply_layer(X25519Hash(bytes(range(32))), peer_ids(12000))
    finally:
        killer.stop()
    assert failed.value.reason == WORKER_LOST  # the protocol ends the session with it as a local failure (cels.protocol.rolebase)


# -- 2. user-shard actors -----------------------------------------------------------------


def shard_pids(work: RayWork) -> list[int]:
    """The worker process of each of ``work``'s user-shard actors, once alive."""
    return actor_pids(work._actors)


def actor_pids(actors: list) -> list[int]:
    """The worker process of each actor (the GCS's actor table), once alive."""
    ids = [actor._actor_id.hex() for actor in actors]
    limit = time.monotonic() + GONE_SECONDS
    while True:
        table = ray_state.actors()
        entries = [table.get(i, {}) for i in ids]
        if all(e.get("State") == "ALIVE" and e.get("Pid") for e in entries) or time.monotonic() > limit:
            return [e["Pid"] for e in entries]
        time.sleep(0.1)


def a_round(local, remote, seed: int):
    """One round's rows, starting loads, 60 proposals and b (tight: some proposals rejected)."""
    totals = column_totals(local) * 3
    active = np.flatnonzero(totals)
    rows = local.constraint_rows(active, totals).tocsc()
    remote.constraint_rows(active, totals)
    rng = np.random.default_rng(seed)
    loads = rows @ rng.integers(0, 3, rows.shape[1]).astype(np.float64)
    return rows, loads, rng.permutation(rows.shape[1])[:60], float(np.quantile(loads, 0.8)) + 0.5


def test_a_lost_shard_is_recreated_and_its_round_walked_again(engine) -> None:
    """A shard killed between rounds, then one killed while it walks: each round's verdicts are
    the in-process ones, and the session re-created exactly the lost shards."""
    local, remote = loaded_pair(2, synthetic_log(seed=5, users=300, pairs=200))
    rows, loads, proposals, b = a_round(local, remote, seed=1)
    expected = verdicts(rows, loads, proposals, b)
    assert 0 < expected.sum() < len(proposals)
    assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)

    first = shard_pids(remote)
    sigkill(first[0])  # between rounds: the next round finds it dead
    assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)
    assert remote.shard_restarts == 1
    second = shard_pids(remote)
    assert second[0] != first[0] and second[1] == first[1]  # only the lost shard is new

    # while it walks: long walks (every pair proposed many times, a b no proposal breaks),
    # until the killer has caught shard 1 inside a call
    proposals, b = np.tile(np.arange(rows.shape[1]), 40000 // rows.shape[1]), 1e12
    expected = verdicts(rows, loads, proposals, b)
    killer = Killer(lambda pid, name: pid == second[1] and name.startswith(b"ray::UserShard."))
    killer.start()
    try:
        for _ in range(20):
            assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)
            if killer.killed is not None:
                break
    finally:
        killer.stop()
    assert killer.killed == second[1], "shard 1 was never seen inside walk or settle"
    assert remote.shard_restarts == 2 and shard_pids(remote)[1] != second[1]


def test_a_shard_lost_too_often_is_engine_worker_lost(engine) -> None:
    """Shards killed before every round: SHARD_RESTARTS rounds recover, the next fails with
    the abort's reason (the detail says how often)."""
    local, remote = loaded_pair(2, synthetic_log(seed=5, users=120, pairs=80))
    rows, loads, proposals, b = a_round(local, remote, seed=1)
    expected = verdicts(rows, loads, proposals, b)
    assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)
    for restart in range(1, SHARD_RESTARTS + 1):
        sigkill(shard_pids(remote)[restart % 2])
        assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)
        assert remote.shard_restarts == restart
    sigkill(shard_pids(remote)[0])
    with pytest.raises(WorkFailure, match=f"lost after {SHARD_RESTARTS} restarts in this session") as failed:
        remote.verdicts(rows, loads, proposals, b)
    assert failed.value.reason == WORKER_LOST  # the protocol ends the session with it as a local failure (cels.protocol.rolebase)


def test_a_lost_sampling_shard_is_recreated_and_replayed_to_the_same_draws(engine) -> None:
    """User shards killed in the sampling between a stage's proposal and its settlement (twice): each is
    re-created, replays the stages so far and the pending proposal, and the sampled x_ij are
    the in-process ones (same draw keys)."""
    local, remote = loaded_pair(2, synthetic_log(seed=5, users=300, pairs=200))
    totals = column_totals(local)
    active = np.flatnonzero(totals)
    x = np.minimum(totals[active], 3)
    samplers = local.sampler(active, totals[active], x, 0.7), remote.sampler(active, totals[active], x, 0.7)
    kills = 0
    while not samplers[0].done:
        proposed = [s.propose()[1] for s in samplers]
        assert np.array_equal(proposed[0], proposed[1])
        if kills < 2:
            sigkill(actor_pids(samplers[1].actors)[kills])
            kills += 1
        for sampler in samplers:  # a party alone: the stage totals are its own
            sampler.settle(proposed[0])
    assert kills == 2 and samplers[1].done and samplers[1].stage == samplers[0].stage
    assert remote.shard_restarts == 2
    assert (samplers[0].result() != samplers[1].result()).nnz == 0 and samplers[0].result().sum() > 0


def test_a_lost_log_shard_is_engine_worker_lost(engine) -> None:
    """A log shard holds the only copy of its users' rows in the session: its loss is not
    repaired but ends the work with the session's abort reason (docs/ray.md)."""
    remote = RayWork(synthetic_log(seed=5, users=60, pairs=40), 4, DrawKeys.fresh(), 2, 2)
    remote.load()
    sigkill(actor_pids(remote.log.actors)[1])
    with pytest.raises(WorkFailure, match="a shard actor is lost") as failed:
        list(remote.hashed_ids(X25519Hash(bytes(range(32))), 64))
    assert failed.value.reason == WORKER_LOST  # the protocol ends the session with it as a local failure (cels.protocol.rolebase)
    remote.release()


class ShardsKilledAfterEachRound(RayWork):
    """The test's party: after every round of verdicts its shard actors' processes are
    SIGKILLed (so the next round finds them dead)."""

    def verdicts(self, *round_) -> np.ndarray:
        out = super().verdicts(*round_)
        for pid in shard_pids(self):
            sigkill(pid)
        return out


def a_session(engine, works: dict[str, type[RayWork]], **options):
    """An in-memory session of two parties on Ray (``works``: each party's RayWork class)."""
    log = synthetic_log(seed=9, users=60)
    config = SessionOptions.create(2, keep_user_ids=True, epsilon=8.0, delta=0.9, round_batch=4, **TEST_KEYS, **options)
    nodes = session_hosts(log.split_by_user(2), config, allow_insecure_key_bits=True)
    made: dict[str, RayWork] = {}

    def party(name: str, part):
        def role(opts: SessionOptions) -> PartyRole:
            draws = DrawKeys.fresh()
            made[name] = works.get(name, RayWork)(part, opts.cap, draws, engine.options.shards, engine.options.max_in_flight)
            return PartyRole(name, opts, part, draws=draws, work=made[name], allow_insecure_key_bits=True, session_report=session_report)

        return MemoryNode(SessionHost(name, role, time.perf_counter))

    nodes.update({name: party(name, part) for name, part in zip(config.parties, log.split_by_user(2))})
    return log, config, start_session(InMemoryNetwork(nodes), config), made


def test_a_session_whose_shards_keep_dying_aborts_naming_the_party(engine) -> None:
    """party-2's shards die after every round: the session recovers SHARD_RESTARTS times, then
    aborts everywhere: LOCAL_FAILURE in phase solve, blaming party-2, "engine worker lost" and
    no digit; party-2 keeps the detail."""
    t0 = time.monotonic()
    _, config, roles, made = a_session(engine, {"party-2": ShardsKilledAfterEachRound})
    assert made["party-2"].shard_restarts == SHARD_RESTARTS + 1
    for name, role in roles.items():
        notice = role.aborted
        assert notice is not None, f"{name} did not abort"
        assert (notice.origin, notice.kind, phase_from_wire(notice.phase), notice.reason) == ("party-2", LOCAL_FAILURE, Phase.SOLVE, WORKER_LOST), name
        assert describe(notice) == "party-2 failed in phase solve (engine worker lost)"
    assert "lost after" in roles["party-2"].failure
    assert time.monotonic() - t0 < config.deadline


def test_a_session_that_loses_a_shard_once_releases_an_audited_log(engine) -> None:
    """Every shard of party-1 dies once, after the first round: the session completes (one
    restart per lost actor)."""

    class ShardsKilledOnce(RayWork):
        def verdicts(self, *round_) -> np.ndarray:
            out = super().verdicts(*round_)
            if self.shard_restarts == 0:
                for pid in shard_pids(self):
                    sigkill(pid)
            return out

    log, config, roles, made = a_session(engine, {"party-1": ShardsKilledOnce})
    assert all(role.aborted is None for role in roles.values()), [describe(r.aborted) for r in roles.values() if r.aborted]
    assert made["party-1"].shard_restarts == engine.options.shards
    x = audit(log, roles[config.initiator].output, config.b)
    assert x.sum() == roles[config.initiator].report["solver"]["integer_total"] > 0


# -- 3 and 4: party node processes ---------------------------------------------------------


@pytest.fixture
def ray_env(monkeypatch, ray_token):
    """Short Ray paths (Ray's socket paths must fit 107 bytes; a node's TMPDIR is long) and no
    usage stats, for the node processes."""
    temp = tempfile.mkdtemp(prefix="cels-rt-")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # token authentication on (the ray_token fixture): a party's Ray cluster requires it; inherited by the CLI and the nodes
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


def session_dir_of(pid: int) -> str:
    """The Ray session directory a driver process has its logs open in."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "/session_" in target:
            return target[: target.index("/", target.index("/session_") + 1)]
    raise AssertionError(f"process {pid} has no Ray session directory open")


def holding(prefix: str) -> set[int]:
    """Live processes with a file open under ``prefix``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                if any(os.readlink(fd).startswith(prefix + "/") for fd in (entry / "fd").iterdir()):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_a_sigkilled_party_node_leaves_no_ray_process(tmp_path, ray_env) -> None:
    """party-1 with --engine ray starts its own Ray instance (GCS, raylet, agents, workers, all
    in its process session); SIGKILL the node: within GONE_SECONDS nothing of its process
    session is left, no process holds a file of its Ray session directory, and the node's own
    Ray directory (session, logs, spilled objects) is removed."""
    nodes = FaultCluster(tmp_path, users=40, pairs=40, extra={PARTIES[0]: ["--engine", "ray", "--shards", "2"]})
    run = nodes.start_node(PARTIES[0])
    try:
        nodes.wait_serving(PARTIES[0], timeout=90)
        pid = run.process.pid
        session_dir = session_dir_of(pid)
        members = session_members(pid)
        names = {title(p).rpartition(b"/")[2].split(b" ")[0] for p in members}
        assert {b"gcs_server", b"raylet"} <= names, names
        assert holding(session_dir) - {pid}, "no Ray process holds the session directory"
        nodes.signal(PARTIES[0], signal.SIGKILL)
        nodes.wait_exit(PARTIES[0], timeout=10)
        limit = time.monotonic() + GONE_SECONDS
        while ((left := set(session_members(pid))) or holding(session_dir)) and time.monotonic() < limit:
            time.sleep(0.2)
        assert not left and not holding(session_dir), {p: title(p) for p in left | holding(session_dir)}
        own = Path(session_dir).parent.parent  # the node's 0700 Ray directory (cels.engine.ray.trust): its spilled rows go too
        assert own.name.startswith(f"cr-{pid}-")
        while own.exists() and time.monotonic() < limit:
            time.sleep(0.2)
        assert not own.exists(), sorted(p.name for p in own.rglob("*"))[:20]
    finally:
        nodes.stop()


@pytest.fixture
def ray_head(ray_env):
    """A one-node Ray cluster on 127.0.0.1 (one CPU), started by the ray CLI; yields its
    ``host:port`` and the way to end it (by pid: ``ray stop`` would end anyone's)."""
    if RAY_CLI is None:
        pytest.skip("the ray command line is not installed")
    temp_dir = tempfile.mkdtemp(prefix="cels-ray-")
    address = f"{LOOPBACK}:{free_port()}"
    ray_cli("start", "--head", "--port", address.rpartition(":")[2], "--include-dashboard=false",
            "--ray-client-server-port", str(free_port()), "--node-ip-address", LOOPBACK, "--num-cpus", "1",
            "--temp-dir", temp_dir, "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port()))  # fmt: skip

    def end() -> None:
        left = end_processes(cluster_processes(temp_dir))
        assert not left, f"Ray processes of the test's cluster still running: {sorted(left)}"

    try:
        yield address, end
    finally:
        end()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.faults_long
def test_a_stopped_cluster_refuses_the_session_with_its_address(tmp_path, ray_head) -> None:
    """party-1 joins a Ray cluster; the cluster stops; a session party-1 initiates is refused
    before any work, and its controller is told the address; a session party-2 initiates is
    refused by party-1 (REFUSED, before the start, nothing but a generic reason), whose log
    names the address.  (Ray ends a driver whose cluster is gone about a minute later: the
    node is stopped before that.)"""
    address, end_cluster = ray_head
    nodes = FaultCluster(tmp_path, users=40, pairs=40, extra={PARTIES[0]: ["--engine", "ray", "--engine-address", address, "--shards", "2"]})
    try:
        nodes.start(timeout=90)
        end_cluster()
        stopped = time.monotonic()
        follower = nodes.follow(PARTIES[0])
        with pytest.raises(SessionAborted) as refused:
            nodes.run(nodes.options(), tmp_path / "own", timeout=30)
        assert refused.value.abort.origin == PARTIES[0] and refused.value.abort.kind == REFUSED
        assert refused.value.abort.reason == "its Ray cluster does not answer"
        assert f"the Ray cluster at {address} is unreachable" in refused.value.detail  # its own controller

        certs = nodes.certs
        other = Controller(PARTIES[1], nodes.listen[PARTIES[1]], certs / "ca.pem", certs / f"{CONTROLLER}.pem", certs / f"{CONTROLLER}.key")
        with pytest.raises(SessionAborted) as aborted:
            run_on_nodes(other, nodes.options(initiator=PARTIES[1]).to_config(), tmp_path / "o.tsv", tmp_path / "o.json", 30)
        notice = aborted.value.abort
        assert (notice.origin, notice.kind, notice.reason) == (PARTIES[0], REFUSED, "its Ray cluster does not answer")
        assert describe(notice) == f"no session ran: refused by {PARTIES[0]} (its Ray cluster does not answer)"
        assert address not in str(aborted.value)
        assert follower.wait(rf"the Ray cluster at {address} is unreachable", timeout=10)
        assert time.monotonic() - stopped < 45
    finally:
        nodes.stop()
