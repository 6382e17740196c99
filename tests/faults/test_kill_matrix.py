"""Kill matrix (issue 13): every role x every phase x SIGKILL and SIGTERM on real node processes.

A trial runs a session (the embedded synthetic log, seed 7, 600 users over 3 parties; 512-bit
test keys; every node behind a pass-through proxy) and signals the victim when the session
reaches the phase:

- a party victim when its own log says "now PHASE"; the solver (which has one phase of its
  own) when the initiator's log says so;
- "prepared": when a PROBE finds the session prepared on the victim (on party-2 for the
  initiator), with the solver's proxy slowed to 1 s each way so that StartSession / BEGIN take
  seconds;
- "finish": when the initiator's role is over ("now over") and so is the victim's (PROBE
  phase), before FINISH reaches it (from the initiator's union on, the victim's proxy adds
  FINISH_DELAY each way).

After the signal the parties' proxies add DRAG each way, so that the rest of the session
outlasts the watchdog's detection of a dead peer (a real WAN is that slow; without it a solver
killed after its part could go unnoticed until FINISH, which the "finish" cases cover).  Then:

- the victim exits (SIGTERM: within the node's stop bound);
- ``cels run``'s client gets an abort naming the victim;
- every survivor that knew the session ends it within ABORT_BOUND seconds of the signal,
  naming the victim (before BEGIN, a survivor cannot know that the initiator died: the expiry
  "was never begun" of any survivor is accepted when the initiator is the victim);
- no process of the victim's outlives it; no file is left in the output directory nor in any
  node's TMPDIR;
- the victim restarted, the nodes serve a fresh session (N seconds from restart, measured).

A "finish" trial may complete: the victim's part was over, its last report in, so the release
stands and report.json names the node under ``unreachable_at_finish``.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from cels.node.client import SessionAborted
from cels.protocol.aborts import describe
from cels.protocol.wire import cels_pb2
from cels.protocol.phases import Phase, SessionState
from cels.protocol.wire.codec import phase_from_wire, state_from_wire
from fault_harness import FAULTS, PARTIES, SOLVER, FaultCluster, reap

DEADLINE = 8.0
CLUSTER = {"users": 600, "pairs": 500, "deadline": DEADLINE, "proxies": True}
ABORT_BOUND = DEADLINE + 2.0
"""Seconds from the signal until every survivor has aborted: a session never begun expires one
deadline after it was prepared, a running one sees a dead peer within 2 probe intervals + one
probe timeout (cels.node.link); +1 s for this suite's polling."""
RESTART_BOUND = 60.0
"""Seconds from the restart within which the nodes must have served a fresh session."""
PHASES = ("prepared", "universe", "counts", "solve", "sampling", "union", "finish")
ROLES = {"initiator": PARTIES[0], "party": PARTIES[1], "solver": SOLVER}
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
FINISH_DELAY = 0.3
DRAG = 0.3
BOUNDED = {("solver", "counts", "SIGKILL")}
"""The trial ``make test`` runs (its fault-suite part stays near a minute); ``make faults`` runs all 42."""


def trials():
    for role in ROLES:
        for phase in PHASES:
            for sig in SIGNALS:
                marks = [] if (role, phase, sig) in BOUNDED else [pytest.mark.faults_long]
                yield pytest.param(role, phase, sig, marks=marks, id=f"{role}-{phase}-{sig}")


def ensure_running(cluster: FaultCluster) -> None:
    """A trial that failed half-way may have left a node down or a proxy slow: undo that."""
    for proxy in cluster.proxy.values():
        proxy.delay = 0.0
    for name, run in cluster.runs.items():
        if run.process.poll() is not None:
            if run not in cluster.ended:
                cluster.ended.append(run)
            cluster.start_node(name)
            cluster.forget_channels(name)
            cluster.wait_serving(name)


def hit_phase(cluster: FaultCluster, victim: str, phase: str, session_id: str, start, done) -> bool:
    """Start the session (``start()``) and return once it is in ``phase`` (module doc)."""
    if phase == "prepared":
        watched = PARTIES[1] if victim == PARTIES[0] else victim
        start()
        return poll(lambda: state_from_wire(cluster.state(watched, session_id, timeout=1).state) is SessionState.PREPARED, 20, done)
    node = victim if victim != SOLVER and phase != "finish" else PARTIES[0]
    follower = cluster.follow(node)
    start()
    if phase != "finish":
        return follower.wait(rf"session {session_id}: .* now {phase}$", timeout=60, stop=done)
    if not follower.wait(rf"session {session_id}: .* now union$", timeout=60, stop=done):
        return False
    if victim != PARTIES[0]:
        cluster.proxy[victim].delay = FINISH_DELAY
    return follower.wait(rf"session {session_id}: .* now over$", timeout=60, stop=done) and (
        victim == PARTIES[0] or poll(lambda: phase_from_wire(cluster.state(victim, session_id, timeout=1).phase) is Phase.OVER, 20, done)
    )


def poll(condition, timeout: float, done) -> bool:
    """Check ``condition()`` every 10 ms (an RPC error counts as False) until it holds."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit and not done():
        try:
            if condition():
                return True
        except grpc.RpcError:
            pass
        time.sleep(0.01)
    return False


def survivor_states(cluster: FaultCluster, survivors: list[str], session_id: str, signalled: float) -> tuple[dict, float | None]:
    """Each survivor's final state of the session, and the seconds after the signal when the
    last one ended it (None if one is still live at ABORT_BOUND)."""
    final: dict[str, tuple[SessionState, cels_pb2.Abort]] = {}
    last = 0.0
    while time.monotonic() - signalled < ABORT_BOUND + 1:
        for node in survivors:
            if node in final:
                continue
            try:
                state = cluster.state(node, session_id, timeout=2)
            except grpc.RpcError:
                continue
            if state_from_wire(state.state) is not SessionState.RUNNING:
                final[node] = (state_from_wire(state.state), state.abort)
                last = time.monotonic() - signalled
        if len(final) == len(survivors):
            return final, last
        time.sleep(0.05)
    return final, None


def fresh_session(cluster: FaultCluster, out: Path, restarted: float) -> tuple[float, int]:
    """Run sessions until one completes; (seconds since ``restarted``, attempts)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            cluster.run(cluster.options(), out / f"fresh-{attempts}", timeout=120)
            return time.monotonic() - restarted, attempts
        except SessionAborted:
            if time.monotonic() - restarted > RESTART_BOUND:
                raise
            time.sleep(0.5)


@pytest.mark.parametrize("role, phase, signame", list(trials()))
def test_kill(cluster: FaultCluster, tmp_path: Path, role: str, phase: str, signame: str) -> None:
    ensure_running(cluster)
    victim, sig = ROLES[role], SIGNALS[signame]
    survivors = [n for n in cluster.runs if n != victim]
    options = cluster.options()
    sid, out = options.session_id, tmp_path / "out"
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["report"] = cluster.run(options, out, timeout=120)
        except SessionAborted as exc:
            outcome["aborted"] = exc

    runner = threading.Thread(target=run, daemon=True)
    if phase == "prepared":
        cluster.proxy[SOLVER].delay = 1.0
    try:
        reached = hit_phase(cluster, victim, phase, sid, runner.start, lambda: not runner.is_alive())
        if reached:
            cluster.signal(victim, sig)
    finally:
        for name, proxy in cluster.proxy.items():
            proxy.delay = DRAG if name in PARTIES else 0.0
    signalled = time.monotonic()
    assert reached, f"session {sid} never reached {phase} on {victim}: {outcome}"
    victim_run = cluster.runs[victim]
    FAULTS.add("kills")
    problems: list[str] = []
    try:
        cluster.wait_exit(victim)
    except Exception:  # noqa: BLE001 - a node that ignores SIGTERM is a hang; the suite kills it
        FAULTS.add("hangs")
        problems.append(f"{victim} did not exit after {signame}")
        victim_run.process.kill()
        cluster.wait_exit(victim)
    runner.join(ABORT_BOUND + 30)
    if runner.is_alive():
        FAULTS.add("hangs")
        problems.append("cels run did not return")
    final, seconds = survivor_states(cluster, survivors, sid, signalled)
    for proxy in cluster.proxy.values():
        proxy.delay = 0.0
    if seconds is None:
        FAULTS.add("hangs")
        problems.append(f"survivors still in the session {ABORT_BOUND:g} s after the signal: {sorted(set(survivors) - set(final))}")

    # what cels run saw, and whom the survivors blame
    if "aborted" in outcome:
        result, blamed = "aborted", outcome["aborted"].origin
        if blamed != victim:
            problems.append(f"cels run blames {blamed}, not {victim}: {outcome['aborted']}")
    elif "report" in outcome:
        result, blamed = "completed", "-"
        if phase != "finish":
            problems.append(f"the session completed although {victim} was killed in {phase}")
    else:
        result, blamed = "hang", "-"
    for node, (state, notice) in final.items():
        never_begun = phase == "prepared" and victim == PARTIES[0] and notice.origin in survivors and notice.kind == cels_pb2.Abort.DEADLINE
        if state == "aborted" and notice.origin != victim and not never_begun:
            problems.append(f"{node} blames {notice.origin!r}: {describe(notice)}")
        if state == "done" and result != "completed":
            problems.append(f"{node} reports the session done, but cels run got {result}")
    survivors_blame = sorted({notice.origin for s, notice in final.values() if s == "aborted"})

    orphans = cluster.orphans(victim_run)
    if orphans:
        FAULTS.add("orphans", len(orphans))
        problems.append(f"{len(orphans)} process(es) of {victim} outlived it: {orphans}")
        reap(orphans)

    # the killed node restarted: the nodes serve a fresh session
    cluster.start_node(victim)
    restarted = time.monotonic()
    cluster.forget_channels(victim)
    serving = cluster.wait_serving(victim)
    restart_seconds, attempts = fresh_session(cluster, tmp_path, restarted)
    FAULTS.restarts.append({"node": victim, "how": f"{signame} in {phase}", "seconds": restart_seconds, "attempts": attempts, "serving": serving})

    expected_out = {"sanitized.tsv", "sanitized.tsv.release-note.json", "report.json"} if result == "completed" else set()
    left = [p for p in cluster.leftovers(out) if p.name not in expected_out]
    if left:
        FAULTS.add("leftovers", len(left))
        problems.append(f"files left behind: {[str(p) for p in left]}")
    FAULTS.kills.append({
        "role": f"{role}({victim})" if role != "solver" else role, "phase": phase, "signal": signame, "outcome": result,
        "abort_seconds": seconds, "blamed": f"{blamed}/{','.join(survivors_blame) or '-'}", "restart_seconds": restart_seconds,
        "notes": "; ".join(problems)[:300],
    })  # fmt: skip
    assert not problems, "\n".join(problems)
