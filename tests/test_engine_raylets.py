"""A party on a real multi-node Ray cluster (issue 25; docs/ray.md, "A party on a Ray
cluster"): a head and a second ``ray start --address`` node on 127.0.0.1 -- two raylets --
joined by ``engine.address = "host:port"``.

The cluster is started and ended by this test alone: ``ray stop`` ends every Ray process on
the machine (anyone's), so the teardown ends only the processes of this cluster, by pid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cels[ray]'; CI installs it)")
RAY_CLI = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
if RAY_CLI is None:
    pytest.skip("the ray command line is not installed", allow_module_level=True)

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from ray._private import state as ray_state  # noqa: E402  (the GCS's actor table and task events: no dashboard needed)

from cels.crypto.ec_hash import X25519Hash  # noqa: E402
from cels.engine import EngineOptions, open_engine  # noqa: E402
from cels.logs import LoadOptions, load_log, synthetic_log  # noqa: E402
from cels.mechanism.greedy import verdicts  # noqa: E402
from cels.node.cluster import LOOPBACK, free_port  # noqa: E402
from cels.engine.routines import id_list
from test_engine_ray import column_totals, loaded_pair, pids_whose_argv, ray_processes  # noqa: E402
from test_private_solve import audit  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rounds_on_the_user_shards")]


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (workers are the raylet's children)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, grown = set(roots), True
    while grown:
        below = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= below
        grown = bool(below)
    return found & set(parent)


def cluster_processes(temp_dir: str) -> set[int]:
    """The processes of the cluster whose session lives in ``temp_dir`` (GCS, raylets, agents,
    monitors, and the workers below them)."""
    return descendants(pids_whose_argv(lambda argv: any(temp_dir.encode() in a for a in argv)))


def end_processes(pids: set[int], grace: float = 5.0) -> set[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the pids still there at the end."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        limit = time.monotonic() + wait
        while (pids := {p for p in pids if Path(f"/proc/{p}").exists() and not zombie(p)}) and time.monotonic() < limit:
            time.sleep(0.2)
    return pids


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def ray_cli(*argv: str) -> None:
    done = subprocess.run([RAY_CLI, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"ray {' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


@pytest.fixture
def two_raylets(monkeypatch, ray_token):
    """A Ray head and a second node on 127.0.0.1 (one CPU each); yields the head's ``host:port``.

    The cluster's token authentication follows this process's: Ray reads RAY_AUTH_MODE once
    (a ``ray.init()`` of a new local instance, as in test_engine_ray, turns it on for the
    process with ``~/.ray/auth_token``), and a head would turn tokens on whenever that file
    exists; so the mode is set explicitly for the ray CLI and the party nodes
    (a deployment sets RAY_AUTH_MODE=token everywhere, docs/ray.md)."""
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # token authentication on (the ray_token fixture): a party's Ray cluster requires it; inherited by the CLI and the nodes
    temp_dir = tempfile.mkdtemp(prefix="cels-ray-")  # short: Ray's socket paths must fit 107 bytes
    address = f"{LOOPBACK}:{free_port()}"
    common = ["--node-ip-address", LOOPBACK, "--num-cpus", "1", "--temp-dir", temp_dir, "--disable-usage-stats",
              "--dashboard-agent-listen-port", str(free_port())]  # fmt: skip
    before = ray_processes()
    try:
        ray_cli("start", "--head", "--port", address.rpartition(":")[2], "--include-dashboard=false",
                "--ray-client-server-port", str(free_port()), *common)  # fmt: skip
        ray_cli("start", "--address", address, *common[:-2], "--dashboard-agent-listen-port", str(free_port()))
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        mine = cluster_processes(temp_dir)
        assert mine, "no process of the cluster was found to end"
        left = end_processes(mine)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes of the test's cluster still running: {sorted(left)}"
        assert not cluster_processes(temp_dir)
        limit = time.monotonic() + 20
        while (new := (ray_processes() - before) & mine) and time.monotonic() < limit:
            time.sleep(0.5)
        assert not new, sorted(new)


def work_nodes(job: str, this_job: bool = True, wait: float = 15.0) -> set[str]:
    """The node ids on which RayWork's pair-work tasks and user-shard actors ran, for ``job``
    (or every job but ``job``), from the GCS's task events and actor table (no dashboard
    needed; a worker sends its task events about once a second, so wait for both nodes)."""

    def ours(job_id: str) -> bool:
        return (job_id == job) == this_job

    limit = time.monotonic() + wait
    while True:
        nodes = {a["Address"]["NodeID"] for a in ray_state.actors().values() if a["ActorClassName"] == "UserShard" and ours(a["JobID"])}
        nodes |= {e.state_updates.node_id.hex() for e in ray_state.state._get_all_task_events()
                  if e.task_info.name == "pair_chunk" and ours(e.job_id.hex()) and e.state_updates.node_id}  # fmt: skip
        if len(nodes) > 1 or time.monotonic() > limit:
            return nodes
        time.sleep(0.5)


@ray.remote(num_cpus=1)
class CpuHolder:
    """Holds its node's one CPU while it lives."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def same_as_in_process(local, remote) -> None:
    """RayWork's universe pair work and private-solve verdicts equal the in-process ones."""
    cipher = X25519Hash(bytes(range(32)))
    assert [id_list(c) for c in remote.hashed_ids(cipher, 64)] == [id_list(c) for c in local.hashed_ids(cipher, 64)]  # the same order
    totals = column_totals(local) * 3  # a peer's counts: no pair is unique
    active = np.flatnonzero(totals)
    rows = local.constraint_rows(active, totals).tocsc()
    assert (remote.constraint_rows(active, totals) != rows).nnz == 0
    rng = np.random.default_rng(1)
    loads = rows @ rng.integers(0, 3, rows.shape[1]).astype(np.float64)
    b = float(np.quantile(loads, 0.8)) + 0.5
    proposals = rng.permutation(rows.shape[1])[:60]
    expected = verdicts(rows, loads, proposals, b)
    assert 0 < expected.sum() < len(proposals)
    assert np.array_equal(remote.verdicts(rows, loads, proposals, b), expected)


@pytest.mark.cluster_long  # about 2 min: `make cluster`; make test runs the Ray engine on one raylet (tests/test_engine_ray.py)
def test_a_party_on_two_raylets_releases_an_audited_log(two_raylets, tmp_path, monkeypatch) -> None:
    """Both raylets serve a party's work (pair-work tasks and user-shard actors on each) with
    the in-process results, its two shards go to the two raylets (the session's SPREAD
    placement group) and their group is removed when the session's work is released, and a ``cels simulate`` session whose party nodes join the cluster
    writes a release that audits clean."""
    t0 = time.monotonic()
    open_engine(EngineOptions(kind="ray", address=two_raylets, shards=2, max_in_flight=2))  # joins, as a party node does
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and all(n["Resources"].get("CPU") == 1.0 for n in nodes), nodes
    node_ids = {n["NodeID"] for n in nodes}

    # RayWork joined to the cluster from this process, once with each node's CPU held: every
    # task and actor (1 CPU to be placed) must go to the other raylet; the in-process results
    monkeypatch.setattr("cels.engine.work.CHUNK_IDS", 50)
    log = synthetic_log(seed=3, users=200, pairs=450)
    for held in sorted(node_ids):
        holder = CpuHolder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(held, soft=False)).remote()
        assert ray.get(holder.node.remote()) == held
        local, remote = loaded_pair(2, log)
        same_as_in_process(local, remote)
        remote.release()  # its shards and their placement group go
        ray.kill(holder)
    this_job = ray.get_runtime_context().get_job_id()
    assert work_nodes(this_job) == node_ids, "RayWork's tasks and actors did not run on both raylets"

    # nothing held: the session's placement group (SPREAD) puts its two shards on two raylets
    local, remote = loaded_pair(2, log)
    same_as_in_process(local, remote)
    table = ray_state.actors()
    shard_nodes = [table[a._actor_id.hex()]["Address"]["NodeID"] for a in remote._actors]
    assert sorted(shard_nodes) == sorted(node_ids), shard_nodes
    group = remote._group
    remote.release()
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"

    # cels simulate: both party nodes join the cluster (the test's way to give a party two raylets)
    from cels.cli import main

    out, report = tmp_path / "out", tmp_path / "report.json"
    argv = ["simulate", "--parties", "2", "--synthetic-users", "40", "--synthetic-pairs", "40", "--key-bits", "512",
            "--engine", "ray", "--engine-address", two_raylets, "--shards", "2",
            "--out", str(out), "--report", str(report)]  # fmt: skip
    assert main(argv) in (0, 3)
    release = load_log(out / "sanitized.tsv", LoadOptions(format="aol"))  # the input's format
    session = json.loads(report.read_text())
    x = audit(synthetic_log(users=40, pairs=40), release, session["privacy"]["b"])  # the input simulate made
    assert x.sum() == release.size == session["solver"]["integer_total"] > 0
    party_nodes = work_nodes(this_job, this_job=False, wait=3.0)  # where Ray's default policy put it: one raylet or both
    assert party_nodes and party_nodes <= node_ids
    assert time.monotonic() - t0 < 400  # a hang bound, not a speed target (about 40 s quiet, 108 s beside a benchmark): the
    # deadlock this test found (shard actors holding CPU slivers) never ended
