"""Stopping (issue 13): a node stopped by SIGTERM after serving sessions of both solve modes
leaves no process behind (the party nodes' obfuscator workers, the solver's decryption pool)."""

from __future__ import annotations

import signal

import pytest

from fault_harness import FAULTS, PARTIES, SOLVER, FaultCluster, reap, session_members

pytestmark = pytest.mark.faults_long
CLUSTER = {"users": 120, "pairs": 100, "deadline": 8.0}


@pytest.fixture(scope="module")
def served(cluster: FaultCluster, tmp_path_factory) -> FaultCluster:
    out = tmp_path_factory.mktemp("stop-sessions")
    cluster.run(cluster.options(), out / "private")
    cluster.run(cluster.options(solve="transformed"), out / "transformed")  # the solver's decryption pool
    return cluster


@pytest.mark.parametrize(
    "node",
    [*PARTIES, SOLVER],
)
def test_sigterm_leaves_no_process(served: FaultCluster, node: str) -> None:
    run = served.runs[node]
    members = len(session_members(run.process.pid))
    served.signal(node, signal.SIGTERM)
    served.wait_exit(node)
    left = served.orphans(run)
    FAULTS.add("orphans", len(left))
    reap(left)
    assert members >= 1 and not left, f"{len(left)} of {node}'s {members} processes outlived it"
