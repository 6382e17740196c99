"""make compose-test's probes, run inside a container (``docker exec -i C python3 - MODE ... <
deploy/compose_probe.py``; deploy/compose-test.sh, steps networking, isolation and cluster).
Standard library only, but for ``ray``.  Each mode prints one verdict word and exits 0.

``listen PORT``: accept one connection on every interface, then exit (the networking step's
listener).

``connect HOST PORT [--wait SECONDS]``: REACHED if a TCP connection to HOST:PORT opens within
3 s, else UNREACHABLE and why (a name that does not resolve, a refusal, no route, a timeout);
with ``--wait``, retried until it opens or SECONDS pass.

``ray ADDRESS``: a stranger's join of a Ray cluster, with no token and no TLS certificate
(the review's experiment, issue 40 finding 3): JOINED if ``ray.init(ADDRESS)`` returns, else
REFUSED and the error's type.
"""

from __future__ import annotations

import socket
import sys
import time


def connect(host: str, port: int, wait: float) -> str:
    """One TCP connection to ``host:port``, retried for ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host, port), timeout=3).close()
            return "REACHED"
        except OSError as exc:
            if time.monotonic() >= deadline:
                return f"UNREACHABLE {type(exc).__name__}: {exc}"
            time.sleep(0.2)


def join_ray(address: str) -> str:
    """``ray.init`` as a process with no token and no certificate would call it."""
    import ray

    try:
        ray.init(address=address, log_to_driver=False)
    except Exception as exc:  # any refusal: the verdict names its type
        return f"REFUSED {type(exc).__name__}"
    ray.shutdown()
    return "JOINED"


def main(argv: list[str]) -> str:
    mode, *args = argv
    if mode == "listen":
        with socket.create_server(("0.0.0.0", int(args[0]))) as server:
            server.accept()[0].close()
        return "ACCEPTED"
    if mode == "connect":
        wait = float(args[args.index("--wait") + 1]) if "--wait" in args else 0.0
        return connect(args[0], int(args[1]), wait)
    if mode == "ray":
        return join_ray(args[0])
    raise SystemExit(f"compose_probe.py: unknown mode {mode!r} (listen, connect, ray)")


if __name__ == "__main__":
    print(main(sys.argv[1:]), flush=True)
