"""Start nodes as separate OS processes on loopback (``cels simulate``, tests); always stop them."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cels.certs import NodeCert
from cels.node.process import STOP_WITH_PARENT

LOOPBACK = "127.0.0.1"
NODE_PORTS = (20_000, 32_767)
"""Where :func:`free_port` looks first: above Ray's worker ports (10002-19999 by default) and
below Linux's ephemeral range (32768-60999 by default), so a Ray instance or any socket bound
to port 0 that starts before the node binds cannot take the port it was given."""
_handed_out: set[int] = set()


def ephemeral_low() -> int:
    """The lowest port the kernel hands out for port 0 (Linux's ``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, not handed out before by
    this process: from :data:`NODE_PORTS` below the kernel's ephemeral range (a node binds its
    port seconds after it is chosen, once its engine has started: docs/deployment.md,
    "Quick start"), else one the kernel picks."""
    low, high = NODE_PORTS[0], min(NODE_PORTS[1], ephemeral_low() - 1)
    candidates = random.sample(range(low, high + 1), k=min(64, max(0, high + 1 - low)))
    for port in [*candidates, 0]:
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        _handed_out.add(port)
        return port
    raise OSError("no free TCP port on 127.0.0.1")


def tls_args(cert: NodeCert | None) -> list[str]:
    """``--ca/--cert/--key`` for a node, or ``--insecure`` without credentials."""
    if cert is None:
        return ["--insecure"]
    return ["--ca", str(cert.ca), "--cert", str(cert.cert), "--key", str(cert.key)]


def peer_args(addresses: Mapping[str, str], me: str) -> list[str]:
    return [arg for name, address in addresses.items() if name != me for arg in ("--peer", f"{name}={address}")]


@dataclass
class NodeProcess:
    name: str
    address: str
    process: subprocess.Popen
    log_path: Path
    _log: IO[bytes] = field(repr=False, default=None)  # type: ignore[assignment]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class LocalCluster:
    """Node processes started by :meth:`start`; :meth:`stop` (or leaving the ``with``) ends them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.nodes: dict[str, NodeProcess] = {}

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str, address: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> NodeProcess:
        """Launch ``argv`` (a node command) with its output in ``log_dir/NAME.log`` (0600, in a 0700 directory)."""
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # a node's log names its input's sizes: the operator's only
        log_path = self.log_dir / f"{name}.log"
        log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        # a session of its own: a Ctrl-C on the terminal reaches the caller only, which stops the
        # nodes; were the caller SIGKILLed, each node stops by itself (STOP_WITH_PARENT)
        process = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, STOP_WITH_PARENT: str(os.getpid()), **(env or {})},
            start_new_session=True,
        )  # fmt: skip
        node = NodeProcess(name, address, process, log_path, log)
        self.nodes[name] = node
        return node

    def check_alive(self) -> None:
        """RuntimeError with its exit code and log if a node has exited."""
        for node in self.nodes.values():
            if node.process.poll() is not None:
                raise RuntimeError(f"node {node.name} exited with {node.process.returncode}:\n{node.log_text()}")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every node accepts TCP connections (bounded); raise if one died."""
        limit = time.monotonic() + timeout
        for node in self.nodes.values():
            host, port = node.address.rsplit(":", 1)
            while True:
                self.check_alive()
                try:
                    with socket.create_connection((host, int(port)), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > limit:
                        raise TimeoutError(f"node {node.name} not listening on {node.address} after {timeout:g}s") from None
                    time.sleep(0.05)

    def process_trees(self) -> dict[str, list[int]]:
        """Per node: its pid, then its descendants' (the obfuscator / decryption workers, and a
        node's own Ray instance: raylet, GCS, workers), from /proc (the pid alone where /proc is
        not there, and every figure read from it is missing)."""
        children: dict[int, list[int]] = {}
        for entry in filter(str.isdigit, os.listdir("/proc")) if os.path.isdir("/proc") else ():
            ppid = _proc_ppid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
        out = {}
        for name, node in self.nodes.items():
            tree, todo = [node.process.pid], list(children.get(node.process.pid, []))
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(children.get(pid, []))
            out[name] = tree
        return out

    def peak_rss_bytes(self) -> dict[str, dict[str, int]]:
        """Per running node: the high-water mark of its resident memory (``VmHWM``) and the sum
        of its descendants' (:meth:`process_trees`).  Read it before :meth:`stop`."""
        out = {}
        for name, (pid, *below) in ((n, t) for n, t in self.process_trees().items() if t):
            own = _proc_peak_rss(pid)
            if own is not None:
                out[name] = {"process": own, "workers": sum(_proc_peak_rss(p) or 0 for p in below), "worker_processes": len(below)}
        return out

    def cpu_seconds(self) -> dict[str, dict[int, float]]:
        """Per node: the CPU seconds (user + system) each process of its tree has used so far."""
        return {name: {pid: cpu for pid in tree if (cpu := _proc_cpu_seconds(pid)) is not None} for name, tree in self.process_trees().items()}

    def kill(self, name: str) -> None:
        """SIGKILL one node (failure tests)."""
        node = self.nodes[name]
        node.process.kill()
        node.process.wait(10)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every node, SIGKILL what is still running after ``grace`` seconds."""
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.terminate()
        limit = time.monotonic() + grace
        for node in self.nodes.values():
            try:
                node.process.wait(max(0.0, limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(10)
            if node._log is not None:
                node._log.close()


class PhaseCpu:
    """CPU seconds of every node's process tree in each phase, from the phase's :meth:`mark` to
    the next one (the last: to :meth:`seconds`); a worker that ended meanwhile is not counted."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.marks: list[tuple[str, dict[str, dict[int, float]]]] = []

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self.cluster.cpu_seconds()))

    def seconds(self) -> dict[str, dict[str, dict[str, float]]]:
        """phase -> node -> ``process`` (the node's own) and ``workers`` (its descendants') CPU seconds."""
        ends = [cpu for _, cpu in self.marks[1:]] + [self.cluster.cpu_seconds()]
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (phase, start), end in zip(self.marks, ends):
            out[phase] = {}
            for name, tree in end.items():
                used = {pid: cpu - start.get(name, {}).get(pid, 0.0) for pid, cpu in tree.items()}
                own = used.pop(self.cluster.nodes[name].process.pid, 0.0)
                out[phase][name] = {"process": own, "workers": sum(used.values())}
        return out


def _proc_ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):  # gone meanwhile
        return None


def _proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of /proc/PID/stat in seconds (None: gone meanwhile)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _proc_peak_rss(pid: int) -> int | None:
    """``VmHWM`` of /proc/PID/status in bytes (None: gone, or a zombie without memory)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError):
        pass
    return None


def python_module(module: str) -> list[str]:
    """``python -m module`` with this interpreter."""
    return [sys.executable, "-m", module]
