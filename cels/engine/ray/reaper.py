"""Ends what is left of a node's own Ray instance once the node is gone, however it ended
(docs/ray.md, "Faults of the engine").

``ray.init()`` starts the GCS and a raylet that end with the node that started them, but the
raylet's agents (the dashboard and runtime-env agents) give up only after they fail to reach
the GCS, about a minute later; and a node killed by SIGKILL runs no cleanup.  So a node that
starts its own Ray instance also starts this watcher (:func:`watch`).  It reads its stdin, a
pipe whose other end only the node holds; when the pipe ends (the node exited, whichever way)
it kills every process with a file open under the instance's session directory: Ray's
processes of that instance keep their logs there, and no other instance's do.  Then it
removes the node's own Ray directory (its session, logs and spilled objects:
cels.engine.ray.trust), if given.

Run as ``python -m cels.engine.ray.reaper NODE_PID SESSION_DIR [OWN_DIR]`` (exit 0: nothing left).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

SETTLE_SECONDS = 10.0
"""How long the reaper keeps killing what it finds before it gives up."""


def session_processes(session_dir: str, spare: set[int]) -> set[int]:
    """The pids, except ``spare``, with an open file under ``session_dir``."""
    prefix = session_dir.rstrip("/") + "/"
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            targets = (os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd"))
            if any(target.startswith(prefix) for target in targets):
                found.add(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def reap(session_dir: str, spare: set[int]) -> set[int]:
    """SIGKILL the session's processes until none is left (or :data:`SETTLE_SECONDS` pass);
    the pids still there."""
    limit = time.monotonic() + SETTLE_SECONDS
    while (left := session_processes(session_dir, spare)) and time.monotonic() < limit:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    return left


def watch(session_dir: str, own_dir: os.PathLike[str] | None = None) -> subprocess.Popen:
    """Start the reaper of this process's Ray instance; closing its stdin (or this process
    ending) sets it off."""
    argv = [sys.executable, "-m", "cels.engine.ray.reaper", str(os.getpid()), session_dir, *([str(own_dir)] if own_dir else [])]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def main(argv: Sequence[str]) -> int:
    node, session_dir, own_dir = int(argv[0]), argv[1], (argv[2] if len(argv) > 2 else None)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C or a stop of the node's group: the node's to handle
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read()  # until the node's end of the pipe closes
    left = reap(session_dir, {node, os.getpid()})
    if own_dir is not None and not left:
        shutil.rmtree(own_dir, ignore_errors=True)
    if left:
        print(f"cels reaper: Ray processes of {session_dir} still running: {sorted(left)}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
