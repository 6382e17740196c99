"""A local cluster's node processes stop by themselves when the command that started them is
SIGKILLed (``cels simulate``, ``cels bench``: nothing outlives its controller)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def node_children(parent: int) -> list[int]:
    """Node processes (party_node / solver_node) that ``parent`` started."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = stat(int(entry))
        if fields is not None and fields[1] == str(parent):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"_node" in cmdline:
                pids.append(int(entry))
    return pids


def alive(pid: int) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def test_nodes_stop_when_their_controller_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    controller = subprocess.Popen(
        [str(Path(sys.executable).parent / "cels"), "simulate", "--parties", "2", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        limit = time.monotonic() + 60
        while len(nodes := node_children(controller.pid)) < 3 and time.monotonic() < limit:
            time.sleep(0.05)
        assert len(nodes) == 3, "the simulation did not start its 3 nodes"
        time.sleep(1.5)  # the nodes are up; the session (2048-bit keys) takes several seconds more
        assert controller.poll() is None, "the simulation ended before the kill"
    finally:
        controller.kill()
        controller.wait(10)
    limit = time.monotonic() + 30
    while (left := [p for p in nodes if alive(p)]) and time.monotonic() < limit:
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of 3 nodes outlived their SIGKILLed controller"
