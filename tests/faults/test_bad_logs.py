"""Bad logs on one party (issue 13): each malformed input on party-2 aborts the session, and
the initiator's abort (the Run stream that ``cels run`` prints) names party-2, the file, and --
where the file has lines -- the line and the field.  The logs are histogram TSVs
(user, query, url, count), so that a count can be bad; party-2's file is restored after each case
and the next session succeeds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cels.node.client import SessionAborted
from fault_harness import BIN, FAULTS, NODES, PARTIES, FaultCluster

CLUSTER = {"users": 90, "pairs": 60, "fmt": "histogram", "deadline": 8.0}
VICTIM = PARTIES[1]
HEADER = "user\tquery\turl\tcount\n"

CASES = {
    # case: (file content or how to break it, what the abort must name besides party and file)
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
    reason = aborted.value.reason
    assert aborted.value.origin == VICTIM, f"blames {aborted.value.origin}: {reason}"
    assert str(path) in reason, reason
    for name in names:
        assert name in reason, f"{name!r} not in {reason!r}"
    for node in NODES:  # every node ended the session, blaming party-2
        state = cluster.state(node, options.session_id)
        assert state.state in ("aborted", "unknown") and (state.state == "unknown" or state.reason.startswith(f"{VICTIM}: ")), (node, state)
    left = cluster.leftovers(tmp_path / "out")
    FAULTS.add("leftovers", len(left))
    assert not left
    assert cluster.run(cluster.options(), tmp_path / "next")["solver"]["integer_total"] >= 0


def test_cels_run_prints_the_party_file_line_and_field(cluster: FaultCluster, tmp_path: Path) -> None:
    """The operator's view: ``cels run`` exits 1 and its last line names party-2's file,
    line and field; it writes no output file."""
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
    assert last.startswith(f"cels run: session aborted by {VICTIM}: ") and f"{path}, line 2, field 'count'" in last, done.stderr
    assert not list((tmp_path / "out").iterdir())
