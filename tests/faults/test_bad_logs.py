"""Bad logs on one party (issue 13): each malformed input on party-2 aborts the session; the
initiator's abort (the Run stream that ``cels run`` prints) names party-2 and that it could not
load its log, and party-2's own log names the file and -- where the file has lines -- the line
and the field (issue 22 finding 4: the details stay with the party).  The logs are histogram TSVs
(user, query, url, count), so that a count can be bad; party-2's file is restored after each case
and the next session succeeds.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cels.node.client import SessionAborted
from cels.protocol.phases import SessionState
from cels.protocol.wire.codec import state_from_wire
from fault_harness import BIN, FAULTS, NODES, PARTIES, FaultCluster

CLUSTER = {"users": 90, "pairs": 60, "fmt": "histogram", "deadline": 8.0}
VICTIM = PARTIES[1]
HEADER = "user\tquery\turl\tcount\n"

CASES = {
    # case: (file content or how to break it, what party-2's log must name besides the file)
    "non-numeric count": (HEADER + "u1\tq\thttp://x/1\t3\nu2\tq\thttp://x/1\tmany\n", ["line 3", "field 'count'", "'many'"]),
    "negative count": (HEADER + "u1\tq\thttp://x/1\t-3\n", ["line 2", "field 'count'", "'-3'"]),
    "wrong column count": (HEADER + "u1\tq\thttp://x/1\n", ["line 2", "field 'count'", "missing"]),
    "bad UTF-8": (HEADER.encode() + b"u1\tcaf\xe9\thttp://x/1\t1\n", ["line 2", "field 'query'", "UTF-8"]),
    "empty file": ("", []),
    "missing file": (None, []),
    "directory": ("dir", []),
}


def break_log(path: Path, content) -> None:
    if content is None:
        path.unlink()
    elif content == "dir":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def restore_log(path: Path, good: bytes) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    path.write_bytes(good)


@pytest.mark.parametrize("case", CASES)
def test_bad_log_on_one_party_aborts_naming_it(cluster: FaultCluster, tmp_path: Path, case: str) -> None:
    path = cluster.data[VICTIM]
    good = path.read_bytes()
    content, names = CASES[case]
    options = cluster.options()
    break_log(path, content)
    try:
        with pytest.raises(SessionAborted) as aborted:
            cluster.run(options, tmp_path / "out", timeout=60)
    finally:
        restore_log(path, good)
    assert str(aborted.value) == f"{VICTIM} failed in phase load (cannot load its log)", aborted.value
    own = [line for line in cluster.log_text(VICTIM).splitlines() if f"session {options.session_id} aborted" in line]
    assert len(own) == 1 and str(path) in own[0] and all(name in own[0] for name in names), own
    failed = [line for line in cluster.log_text(VICTIM).splitlines() if f"session {options.session_id}: load " in line]
    assert failed and all(line.endswith(": the session failed") and "done" not in line for line in failed), failed  # finding 11
    for node in NODES:  # every node ended the session, blaming party-2, told nothing of its file
        limit = time.monotonic() + 10  # the Abort notices travel on their own calls: a peer may take them a moment later
        while (said := state_from_wire((state := cluster.state(node, options.session_id)).state)) not in (SessionState.ABORTED, SessionState.UNKNOWN) and time.monotonic() < limit:
            time.sleep(0.05)
        assert said in (SessionState.ABORTED, SessionState.UNKNOWN) and (said is SessionState.UNKNOWN or state.abort.origin == VICTIM), (node, state)
        assert node == VICTIM or str(path) not in cluster.log_text(node)
    left = cluster.leftovers(tmp_path / "out")
    FAULTS.add("leftovers", len(left))
    assert not left
    assert cluster.run(cluster.options(), tmp_path / "next")["solver"]["integer_total"] >= 0


def test_cels_run_names_the_party_that_could_not_load_its_log(cluster: FaultCluster, tmp_path: Path) -> None:
    """The operator's view: ``cels run`` exits 1 and its last line names party-2 and what
    failed, not party-2's file; it writes no output file."""
    path = cluster.data[VICTIM]
    good = path.read_bytes()
    session = cluster.run_config(tmp_path)
    break_log(path, HEADER + "u1\tq\thttp://x/1\tmany\n")
    try:
        done = subprocess.run([str(BIN / "cels"), "run", "--config", str(session)], capture_output=True, text=True, timeout=120)
    finally:
        restore_log(path, good)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"cels run: {VICTIM} failed in phase load (cannot load its log)", done.stderr
    assert not list((tmp_path / "out").iterdir())
