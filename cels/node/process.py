"""Run a node process (``cels-party``, ``cels-solver``): start-up errors as one line with a
documented exit code, then serve until SIGTERM / SIGINT.

Exit codes (README, "Exit codes"): 0 stopped by SIGTERM / SIGINT after serving; 1 cannot serve
(e.g. the listen address is taken); 2 bad configuration (missing or malformed TOML file,
unknown table or key, missing data or certificates, a corrupted ledger); 130 interrupted
(Ctrl-C) during start-up.  This module imports nothing heavy: the node's own modules are
imported inside :func:`node_main`, so that a Ctrl-C while they load is caught too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from cels.node.service import Node

log = logging.getLogger("cels.node")

EXIT_CANNOT_SERVE = 1
EXIT_BAD_CONFIG = 2
EXIT_INTERRUPTED = 130


MALLOC_THRESHOLDS = {"MALLOC_MMAP_THRESHOLD_": (-3, 131072), "MALLOC_TRIM_THRESHOLD_": (-1, 131072)}
"""glibc malloc's mmap and trim thresholds (environment variable -> mallopt parameter, bytes),
fixed at glibc's initial 128 KiB in a node and in the processes it starts (its Ray instance's):
by default glibc raises the mmap threshold to the largest block freed, so the chunk-sized
buffers of a session then come from heaps that are never given back (docs/ray.md,
"Memory of a node").  A value already in the environment is the operator's and stays."""


def fix_malloc_thresholds() -> None:
    """Fix :data:`MALLOC_THRESHOLDS` for this process (mallopt) and its children (environment),
    where the operator set none; nothing where malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for name, (parameter, value) in MALLOC_THRESHOLDS.items():
        if name not in os.environ and mallopt(parameter, value) == 1:  # mallopt returns 1 on success
            os.environ[name] = str(value)


def node_parser(prog: str, description: str, *tables: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A node command's flags: ``--version``, the ``[node]`` table's, each of ``tables``' (its
    ``add_*_arguments``), then ``--seed``; imported when called (a Ctrl-C while loading is a
    start-up interrupt)."""
    import argparse

    from cels import __version__
    from cels.cli.options import add_seed_argument
    from cels.node.config import add_node_arguments

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    add_node_arguments(parser)
    for add_arguments in tables:
        add_arguments(parser)
    add_seed_argument(parser)
    return parser


def node_main(prog: str, start: Callable[[], Node]) -> int:
    """``start()`` imports, reads the configuration and builds the node; then serve it.  A
    ValueError (bad configuration), an OSError (cannot serve) or a Ctrl-C during start-up is
    one line on stderr and its exit code, never a traceback.  Malloc's thresholds are fixed
    first (:func:`fix_malloc_thresholds`)."""
    fix_malloc_thresholds()
    try:
        node = start()
        return serve(node)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted during start-up", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except OSError as exc:
        print(f"{prog}: cannot serve: {exc}", file=sys.stderr)
        return EXIT_CANNOT_SERVE


STOP_WITH_PARENT = "CELS_STOP_WITH_PARENT"
"""Environment variable: a pid; the node stops when its parent is no longer that process (the
local cluster of ``cels simulate`` / ``cels bench`` sets it, so that its nodes do not outlive a
SIGKILLed controller)."""

STOP_SECONDS = 10.0
"""How long a stopping node may take to tell its peers and close; then it exits regardless."""


def serve(node: Node) -> int:
    """Serve until a termination signal; running sessions are aborted on the way out.

    The signal only sets an event; the main thread stops the node in a helper thread and
    waits at most STOP_SECONDS (a long role step holds the host, and gRPC's own threads are
    not daemons), then ends the process with ``os._exit`` so that a busy node never ignores
    SIGTERM.  A second signal exits at once."""
    from tqdm import tqdm

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {node.config.name} %(levelname)s %(message)s")
    tqdm.monitor_interval = 0  # a node shows no bar, but tqdm starts its monitor thread for disabled bars too, and keeps it
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        node.start()
    except BaseException:
        node.stop()
        raise
    print(f"{node.config.name}: listening on {node.config.listen}", file=sys.stderr, flush=True)
    parent = os.environ.get(STOP_WITH_PARENT)
    while not stop.wait(1.0):  # a timed wait: the main thread returns to the interpreter every second
        if parent is not None and str(os.getppid()) != parent:
            log.warning("%s: the process that started it (pid %s) is gone", node.config.name, parent)
            break
    log.info("%s: stopping", node.config.name)
    stopper = threading.Thread(target=node.stop, name="stop", daemon=True)
    stopper.start()
    stopper.join(STOP_SECONDS)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
