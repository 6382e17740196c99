"""Restart (issue 13): a node that is SIGKILLed and restarted serves the next session within N
seconds; the suite measures N (printed under "restart", and in the JSON summary).

A node is killed while idle, stays down for DOWN seconds during which one session is tried
(and fails, naming it: its peers' channels to it see refused connections), then restarts on
the same port.  N is the time from the restart until a session completes; the first session
is started as soon as the restarted node answers Status, and it must complete: a stale channel
still backing off after refused connections must not refuse the next session.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from cels.node.client import SessionAborted
from fault_harness import FAULTS, PARTIES, SOLVER, FaultCluster

CLUSTER = {"users": 150, "pairs": 120, "deadline": 8.0}
RESTART_BOUND = 30.0
"""N must stay below this many seconds (a node's start-up is a few seconds of it)."""


def restart_after_down(cluster: FaultCluster, tmp_path: Path, victim: str, down: float) -> dict:
    cluster.signal(victim, signal.SIGKILL)
    cluster.wait_exit(victim)
    FAULTS.add("kills")
    killed = time.monotonic()
    with pytest.raises(SessionAborted) as aborted:
        cluster.run(cluster.options(), tmp_path / "while-down", timeout=60)
    assert aborted.value.origin == victim, aborted.value
    time.sleep(max(0.0, down - (time.monotonic() - killed)))
    cluster.start_node(victim)
    restarted = time.monotonic()
    cluster.forget_channels(victim)
    serving = cluster.wait_serving(victim)
    attempts, first_error = 0, None
    while True:
        attempts += 1
        try:
            cluster.run(cluster.options(), tmp_path / f"after-{attempts}", timeout=120)
            break
        except SessionAborted as exc:
            first_error = first_error or exc
            assert time.monotonic() - restarted < 120, exc
            time.sleep(0.5)
    seconds = time.monotonic() - restarted
    FAULTS.restarts.append({"node": victim, "how": f"SIGKILL idle, down {down:g} s", "seconds": seconds, "attempts": attempts, "serving": serving})
    return {"seconds": seconds, "attempts": attempts, "first_error": first_error}


@pytest.mark.parametrize(
    "victim, down",
    [
        pytest.param(SOLVER, 2.0, id="solver-down-2s"),
        pytest.param(PARTIES[1], 2.0, id="party-down-2s"),
        pytest.param(
            SOLVER, 20.0, id="solver-down-20s",
            marks=[pytest.mark.faults_long, pytest.mark.xfail(strict=True, reason="issue 13 item 10: after a longer outage the peers' stale channels back off; the first sessions after the restart fail UNAVAILABLE")],
        ),
        pytest.param(
            PARTIES[1], 20.0, id="party-down-20s",
            marks=[pytest.mark.faults_long, pytest.mark.xfail(strict=True, reason="issue 13 item 10: after a longer outage the peers' stale channels back off; the first sessions after the restart fail UNAVAILABLE")],
        ),
    ],
)  # fmt: skip
def test_restarted_node_serves_the_next_session(cluster: FaultCluster, tmp_path: Path, victim: str, down: float) -> None:
    result = restart_after_down(cluster, tmp_path, victim, down)
    assert result["attempts"] == 1, f"first session after the restart failed: {result['first_error']}"
    assert result["seconds"] < RESTART_BOUND, result
