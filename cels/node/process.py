"""Run a node process until SIGTERM / SIGINT (``cels-party``, ``cels-solver``)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from cels.node.service import Node

log = logging.getLogger("cels.node")

STOP_SECONDS = 10.0
"""How long a stopping node may take to tell its peers and close; then it exits regardless."""


def serve(node: Node) -> int:
    """Serve until a termination signal; running sessions are aborted on the way out.

    The signal only sets an event; the main thread stops the node in a helper thread and
    waits at most STOP_SECONDS (a long role step holds the host, and gRPC's own threads are
    not daemons), then ends the process with ``os._exit`` so that a busy node never ignores
    SIGTERM.  A second signal exits at once."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {node.config.name} %(levelname)s %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    node.start()
    print(f"{node.config.name}: listening on {node.config.listen}", file=sys.stderr, flush=True)
    while not stop.wait(1.0):  # a timed wait: the main thread returns to the interpreter every second
        pass
    log.info("%s: stopping", node.config.name)
    stopper = threading.Thread(target=node.stop, name="stop", daemon=True)
    stopper.start()
    stopper.join(STOP_SECONDS)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
