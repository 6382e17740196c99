"""Resume after a node restart (docs/deployment.md, "Resume after a node restart").

Real node processes that keep their sessions' keys (``--state-dir``), no seed: party-2 is
SIGKILLed when its log says it entered the phase, restarted, and the session is run again with
``resume``: every node replays what it took and is sent only what it never took
(cels.protocol.resume; tests/test_resume_replay.py checks that exactly, link by link, in
memory).  Then: the survivors' and party-2's records are gone; party-1's ledger holds the session once; and the session could not be resumed a
second time, nor a different one under its id.  ``make test`` runs the DP release killed in its
counts; ``make faults`` every phase of both releases, ``cels run`` with ``[run] resume = true``
running the session again on its own, and party-2 on its own Ray instance killed in the
sampling, resumed to the uninterrupted session's release.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from cels.bench.resume import run_resumed
from cels.node.client import SessionAborted
from cels.node.ledger_file import read_entries
from cels.protocol.aborts import DIED
from cels.protocol.phases import SessionState
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import state_from_wire
from fault_harness import BIN, CONTROLLER, FAULTS, NODES, PARTIES, FaultCluster

DEADLINE = 8.0
LEDGER = "party-1.ledger.json"
CLUSTER = {"users": 600, "pairs": 500, "deadline": DEADLINE, "keep_state": True}
VICTIM = PARTIES[1]
RELEASES = {
    "dp": ({"release": "dp", "delta": 1e-6}, ("universe", "counts")),
    "sampled": ({}, ("universe", "counts", "solve", "sampling", "union")),
}
BOUNDED = {("dp", "counts")}


def cases():
    for release, (_, phases) in RELEASES.items():
        for phase in phases:
            marks = [] if (release, phase) in BOUNDED else [pytest.mark.faults_long]
            yield pytest.param(release, phase, marks=marks, id=f"{release}-{phase}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """As the suite's cluster (conftest), with party-1's ledger."""
    from conftest import stop_and_count

    root = tmp_path_factory.mktemp("test_resume")
    nodes = FaultCluster(root, **{**CLUSTER, "extra": {PARTIES[0]: ["--ledger", str(root / LEDGER)]}})
    try:
        nodes.start()
        yield nodes
    finally:
        stop_and_count(nodes)


def ended_everywhere(cluster: FaultCluster, nodes: list[str], session_id: str, timeout: float) -> dict[str, SessionState]:
    """Each node's state of the session once none runs it (a PROBE, as a peer asks)."""
    limit, states = time.monotonic() + timeout, {}
    while time.monotonic() < limit:
        try:
            states = {n: state_from_wire(cluster.state(n, session_id, timeout=2).state) for n in nodes}
        except grpc.RpcError:
            states = {}
        if states and all(s not in (SessionState.RUNNING, SessionState.PREPARED) for s in states.values()):
            return states
        time.sleep(0.1)
    raise TimeoutError(f"session {session_id} still runs somewhere after {timeout:g} s: {states}")


def resume(cluster: FaultCluster, options, out: Path) -> dict:
    """``cels run --resume`` until it completes (cels.bench.resume.run_resumed: a first try may
    find a peer's channel to the restarted node still backing off, and abort as DIED)."""
    out.mkdir(parents=True, exist_ok=True)
    return run_resumed(cluster.controller(), options, out / "sanitized.tsv", out / "report.json", 180)[0]


def killed_in(cluster: FaultCluster, options, phase: str, out: Path, timeout: float = 120) -> dict:
    """The session run on a thread, party-2 SIGKILLed once its log says it entered ``phase``;
    what the run came to (``aborted``: the SessionAborted, or ``report``), once it ended."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["report"] = cluster.run(options, out, timeout=timeout)
        except SessionAborted as exc:
            outcome["aborted"] = exc

    follower = cluster.follow(VICTIM)
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    reached = follower.wait(rf"session {options.session_id}: .* now {phase}$", timeout=timeout, stop=lambda: not runner.is_alive())
    assert reached, f"session {options.session_id} never reached {phase} on {VICTIM}: {outcome}"
    cluster.signal(VICTIM, signal.SIGKILL)
    cluster.wait_exit(VICTIM)
    FAULTS.add("kills")
    runner.join(DEADLINE + 30)
    return outcome


@pytest.mark.parametrize("release, phase", list(cases()))
def test_a_session_killed_in_a_phase_resumes_after_the_restart(cluster: FaultCluster, tmp_path: Path, release: str, phase: str) -> None:
    extra, _ = RELEASES[release]
    options = cluster.options(session_id=f"resume-{release}-{phase}-{time.monotonic_ns()}", **extra)
    sid = options.session_id
    outcome = killed_in(cluster, options, phase, tmp_path / "first")
    aborted = outcome.get("aborted")
    assert aborted is not None and aborted.abort.kind == DIED and aborted.origin == VICTIM, outcome
    survivors = [n for n in NODES if n != VICTIM]
    ended_everywhere(cluster, survivors, sid, DEADLINE + 5)

    cluster.restart(VICTIM)
    kept = cluster.stub(VICTIM, CONTROLLER).Status(cels_pb2.NodeStatusRequest(), timeout=5).sessions
    assert [(s.session_id, s.outcome, s.phase) for s in kept if s.session_id == sid] == [(sid, "resumable", phase)]
    with pytest.raises(SessionAborted, match="the session id is taken"):  # the same id without resume: refused
        cluster.run(options, tmp_path / "again", timeout=60)

    report = resume(cluster, options, tmp_path / "resumed")
    assert report["session_id"] == sid
    assert (tmp_path / "resumed" / "sanitized.tsv").stat().st_size > 0
    for name in NODES:  # done: no node keeps the session's keys any longer
        assert not [f for f in cluster.state_dir(name).glob("*.json") if sid in f.read_text()], name
    charged = [e for e in read_entries(cluster.root / LEDGER) if e["session_id"] == sid]
    assert len(charged) == 1, charged
    with pytest.raises(SessionAborted, match="ended with its output|no state kept"):  # done: no second re-run
        cluster.run(dataclasses.replace(options, resume=True), tmp_path / "twice", timeout=60)


@pytest.mark.faults_long
def test_cels_run_with_run_resume_runs_the_session_again_on_its_own(cluster: FaultCluster, tmp_path: Path) -> None:
    """``[run] resume = true``: party-2 is SIGKILLed in the DP release's counts and restarted
    by its supervisor (here, this test); ``cels run`` itself runs the session again once every
    node answers, and exits 0 with the release."""
    config = cluster.run_config(tmp_path)
    text = config.read_text().replace("timeout = 60\n", "timeout = 60\nresume = true\n")
    config.write_text(text.replace("delta = 0.4", 'delta = 1e-6\nrelease = "dp"'))
    follower = cluster.follow(VICTIM)
    run = subprocess.Popen([str(BIN / "cels"), "run", "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.wait(r"session [0-9a-f]+: .* now counts$", timeout=90, stop=lambda: run.poll() is not None), run.communicate()
        cluster.signal(VICTIM, signal.SIGKILL)
        cluster.wait_exit(VICTIM)
        FAULTS.add("kills")
        cluster.restart(VICTIM)
        out, err = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    assert "party-2 died in phase" in err and "[run] resume: running session" in err, err
    assert (tmp_path / "out" / "sanitized.tsv").stat().st_size > 0


def warm_user_shard(node_pid: int, timeout: float = 60.0) -> int:
    """A warm user-shard actor's worker process of the node ``node_pid`` (its process session)."""
    from fault_harness import session_members
    from test_engine_faults import title

    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        found = [pid for pid in session_members(node_pid) if title(pid).startswith(b"ray::UserShard")]
        if found:
            return found[0]
        time.sleep(0.2)
    raise TimeoutError(f"no user-shard worker of node {node_pid} after {timeout:g} s")


@pytest.mark.faults_long
def test_a_party_on_its_ray_engine_killed_in_the_sampling_resumes_to_the_uninterrupted_release(tmp_path_factory, tmp_path: Path) -> None:
    """Every node seeded; party-2 runs its work on its own Ray instance with two shards.  An
    uninterrupted session, then the same options under another id with party-2 SIGKILLed (its
    Ray instance reaped with it) as it enters the sampling, restarted (a new Ray instance, one
    of whose warm user-shard workers is SIGKILLed too), and resumed: party-2 replays what it
    took on its new shards, and the release is the uninterrupted one, byte for byte."""
    pytest.importorskip("ray")
    from conftest import stop_and_count

    from cels.engine.options import EngineOptions
    from test_engine_faults import sigkill

    extra = {n: ["--seed", "5"] for n in NODES}
    extra[VICTIM] += EngineOptions(kind="ray", shards=2, max_in_flight=2).argv()
    cluster = FaultCluster(tmp_path_factory.mktemp("resume_ray"), **{**CLUSTER, "extra": extra})
    try:
        cluster.start()
        cluster.run(cluster.options(session_id="ray-whole"), tmp_path / "whole", timeout=180)
        options = cluster.options(session_id="ray-cut")
        outcome = killed_in(cluster, options, "sampling", tmp_path / "first", timeout=180)
        assert "aborted" in outcome, outcome
        ended_everywhere(cluster, [n for n in NODES if n != VICTIM], "ray-cut", DEADLINE + 5)
        cluster.restart(VICTIM)
        sigkill(warm_user_shard(cluster.runs[VICTIM].process.pid))  # and one of the new instance's shard workers
        resume(cluster, options, tmp_path / "resumed")
        assert re.search(r"session ray-cut replays [1-9]\d* message", cluster.log_path(VICTIM).read_text())  # it went on from its record
        assert (tmp_path / "resumed" / "sanitized.tsv").read_bytes() == (tmp_path / "whole" / "sanitized.tsv").read_bytes()
    finally:
        stop_and_count(cluster)
