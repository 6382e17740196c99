"""Run a node process until SIGTERM / SIGINT (``cels-party``, ``cels-solver``)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from cels.node.service import Node

log = logging.getLogger("cels.node")


def serve(node: Node) -> int:
    """Serve until a termination signal; running sessions are aborted on the way out."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {node.config.name} %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    node.start()
    print(f"{node.config.name}: listening on {node.config.listen}", file=sys.stderr, flush=True)
    stop.wait()
    log.info("%s: stopping", node.config.name)
    node.stop()
    return 0
