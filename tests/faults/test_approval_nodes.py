"""Approval by a person on real node processes (docs/site-rules.md, "Approval by a person"):
party-2's policy has ``approve = "manual"`` and a ledger.  A session waits on party-2 with
nothing reserved and no row read, visible in ``cels status`` with its parameters, until
``cels approve`` (the session then runs to its release), ``cels reject`` (aborted, blamed on
party-2, nothing spent) or its approval_wait (aborted at its deadline).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cels.node.client import SessionAborted
from cels.node.ledger_file import read_entries, read_reservations
from cels.protocol.aborts import DEADLINE, REFUSED
from fault_harness import BIN, PARTIES, FaultCluster

APPROVER = PARTIES[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import stop_and_count

    root = tmp_path_factory.mktemp("approval")
    extra = {APPROVER: ["--policy-approve", "manual", "--ledger", str(root / "party-2.ledger.json"), "--budget-delta", "5"]}
    nodes = FaultCluster(root, users=300, pairs=250, extra=extra)
    try:
        nodes.start()
        yield nodes
    finally:
        stop_and_count(nodes)


def node_toml(cluster: FaultCluster) -> Path:
    """party-2's TOML as its operator keeps it (``cels status`` / ``cels approve`` read it)."""
    certs, path = cluster.certs, cluster.root / "party-2.toml"
    path.write_text(
        f'[node]\nname = "{APPROVER}"\nlisten = "{cluster.listen[APPROVER]}"\n'
        f'[tls]\nca = "{certs / "ca.pem"}"\ncert = "{certs / f"{APPROVER}.pem"}"\nkey = "{certs / f"{APPROVER}.key"}"\n'
        f'[data]\npath = "{cluster.data[APPROVER]}"\nformat = "aol"\n'
    )
    return path


def cels(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cels"), *argv], capture_output=True, text=True, timeout=60)


def awaiting(toml: Path, session_id: str, timeout: float = 30.0) -> dict:
    """party-2's ``cels status --json`` once the session waits there."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        status = json.loads(cels("status", "--config", str(toml), "--json").stdout)
        if any(s["session_id"] == session_id and s["outcome"] == "awaiting_approval" for s in status["status"]["sessions"]):
            return status
        time.sleep(0.2)
    raise AssertionError(f"session {session_id} never awaited approval on {APPROVER}")


def start_run(cluster: FaultCluster, out: Path, **options) -> tuple[threading.Thread, list, list]:
    options_ = cluster.options(**options)
    outcome: list = []
    approvals: list = []

    def run() -> None:
        try:
            outcome.append(cluster.run(options_, out, timeout=120, on_approval=lambda party, ok: approvals.append((party, ok))))
        except SessionAborted as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    return runner, outcome, approvals


def ledger(cluster: FaultCluster) -> Path:
    return cluster.root / "party-2.ledger.json"


def test_a_session_waits_for_its_operator_with_nothing_reserved_then_runs_once_approved(cluster: FaultCluster, tmp_path: Path) -> None:
    toml = node_toml(cluster)
    runner, outcome, approvals = start_run(cluster, tmp_path / "approved", session_id="ask-1", approval_wait=60.0)
    status = awaiting(toml, "ask-1")
    assert read_reservations(ledger(cluster))[0] == {} and status["status"]["ledger"]["reserved_sessions"] == 0
    shown = next(s for s in status["status"]["sessions"] if s["session_id"] == "ask-1")
    assert "initiator party-1; parties party-1,party-2,party-3; release sampled; solve private; epsilon 1.0; delta 0.4" in shown["parameters"]
    assert re.search(r"session ask-1: .*, now load", cluster.log_text(APPROVER)) is None  # no row read: the role was never begun
    assert re.search(r"session ask-1 awaits its operator's approval", cluster.log_text(APPROVER))
    table = cels("status", "--config", str(toml)).stdout
    assert "session ask-1 waits for your approval" in table and f"cels approve --config {toml} ask-1" in table
    approved = cels("approve", "--config", str(toml), "ask-1")
    assert approved.returncode == 0 and "session ask-1 on party-2 is now prepared (initiator party-1;" in approved.stdout, approved
    runner.join(120)
    assert outcome and isinstance(outcome[0], dict), outcome
    assert approvals == [(APPROVER, False), (APPROVER, True)]
    assert [e["session_id"] for e in read_entries(ledger(cluster))] == ["ask-1"]  # charged once, as any session
    again = cels("approve", "--config", str(toml), "ask-1")
    assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stdout and "decide refused" in again.stdout


def test_a_rejected_or_unanswered_session_aborts_blaming_the_party_and_spends_nothing(cluster: FaultCluster, tmp_path: Path) -> None:
    toml = node_toml(cluster)
    spent = len(read_entries(ledger(cluster)))
    runner, outcome, _ = start_run(cluster, tmp_path / "rejected", session_id="ask-2", approval_wait=60.0)
    awaiting(toml, "ask-2")
    rejected = cels("reject", "--config", str(toml), "ask-2")
    assert rejected.returncode == 0 and "is now aborted" in rejected.stdout, rejected
    runner.join(60)
    aborted = outcome[0]
    assert isinstance(aborted, SessionAborted) and (aborted.origin, aborted.abort.kind) == (APPROVER, REFUSED), outcome
    assert aborted.reason == "its operator rejected the session"

    runner, outcome, _ = start_run(cluster, tmp_path / "unanswered", session_id="ask-3", approval_wait=2.0)
    runner.join(60)
    aborted = outcome[0]
    assert isinstance(aborted, SessionAborted) and (aborted.origin, aborted.abort.kind) == (APPROVER, DEADLINE), outcome
    assert aborted.reason == "session was not approved in time"
    assert len(read_entries(ledger(cluster))) == spent and read_reservations(ledger(cluster))[0] == {}
    assert not (tmp_path / "rejected" / "sanitized.tsv").exists() and not (tmp_path / "unanswered" / "sanitized.tsv").exists()
