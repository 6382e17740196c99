"""The fault suite's harness: real node processes, a live mutual-TLS client, /proc readings
and a TCP delay proxy (issue 13, docs/faults.md "Under faults").

:class:`FaultCluster` starts ``cels-party`` x 3 and ``cels-solver`` as OS processes on
127.0.0.1 free ports with certificates from ``cels certs`` and 512-bit test keys (the nodes'
explicit test-only flags ``--node-key-bits`` / ``--min-key-bits``).  Every node runs in its own
process session (``start_new_session``), so the processes it starts share its session id and
can be found in /proc after it died (orphans); every node gets its own ``TMPDIR`` so that the
suite sees every temporary file it leaves.  With ``proxies=True`` every node sits behind a
:class:`DelayProxy` and its peers reach it only through that proxy.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cels.logs import synthetic_log, write_log
from cels.node.client import Controller, run_on_nodes
from cels.node.cluster import LOOPBACK, free_port
from cels.node.process import STOP_SECONDS
from cels.node.tls import open_channel
from cels.protocol.options import SessionOptions
from cels.protocol.wire import cels_pb2, cels_pb2_grpc

BIN = Path(sys.executable).parent
KEY_BITS = 512
"""Test-only Paillier key size: a session takes seconds (the nodes' --min-key-bits flag)."""
PARTIES = ("party-1", "party-2", "party-3")
SOLVER = "solver"
NODES = (*PARTIES, SOLVER)
CONTROLLER = "controller-party-1"  # cels certs issues it; the harness's one operator controls every node with it (--controller)
PAGE = os.sysconf("SC_PAGE_SIZE")
FUZZ_MESSAGES = int(os.environ.get("CELS_FAULTS_FUZZ", "1000"))
"""Fuzzed messages per run: 1,000 in ``make test``, 10,000 in ``make faults``."""


# -- what the suite saw (printed by conftest.py as a table and a JSON summary) ---------------

SUMMARY_COUNTS = (
    "kills", "tls_cases", "fuzzed_messages", "load_sessions", "slow_network_sessions",
    "crashes", "hangs", "orphans", "leftovers",
)  # fmt: skip
"""The JSON summary's counts; the last four must be 0 once issue 13 is fixed."""


@dataclass
class FaultRecord:
    """Counts, kill-matrix rows, restart times and fuzz replies, filled by the tests."""

    counts: Counter = field(default_factory=Counter)
    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    replies: Counter = field(default_factory=Counter)
    resources: list[dict[str, Any]] = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n


FAULTS = FaultRecord()


# -- /proc ---------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``: a node and every process it
    started, also those reparented to init after the node died."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z" and int(stat[3]) == sid:
                members.append(int(entry))
    return sorted(members)


def reap(pids: Iterable[int]) -> None:
    """SIGKILL leftover processes (orphans the suite counted): nothing outlives the suite."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return 0


@dataclass(frozen=True)
class Usage:
    """A node's resources, summed over its process session: resident bytes, threads, open
    file descriptors, processes."""

    rss: int
    threads: int
    fds: int
    processes: int


def usage(sid: int) -> Usage:
    rss = threads = fds = 0
    members = session_members(sid)
    for pid in members:
        stat = _stat(pid)
        if stat is None:
            continue
        threads += int(stat[17])
        rss += int(stat[21]) * PAGE
        fds += fd_count(pid)
    return Usage(rss, threads, fds, len(members))


def files_under(*roots: Path) -> list[Path]:
    """Every file and directory below ``roots`` (not the roots themselves)."""
    return sorted(p for root in roots if root.exists() for p in root.rglob("*"))


# -- a TCP delay proxy ---------------------------------------------------------------------


class DelayProxy:
    """Forwards TCP connections from a port on 127.0.0.1 to ``target``, every chunk delayed
    by ``delay`` seconds in each direction and paced to ``bandwidth`` bytes per second (None:
    no cap).  TLS passes through untouched.  Both knobs may change while it runs."""

    CHUNK = 16384

    def __init__(self, target: str, delay: float = 0.0, bandwidth: float | None = None) -> None:
        self.target = target
        self.delay, self.bandwidth = delay, bandwidth
        self.port = 0
        self.bytes = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._serve, name=f"proxy-{target}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay proxy did not start")

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._connection, LOOPBACK, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        host, port = self.target.rsplit(":", 1)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            try:
                while data := await reader.read(self.CHUNK):
                    await queue.put((self._loop.time() + self.delay, data))
            except (ConnectionError, OSError):
                pass
            await queue.put((self._loop.time() + self.delay, b""))

        reading = self._loop.create_task(read())
        free_at = 0.0  # when the capped link has sent the previous chunk
        try:
            while True:
                due, data = await queue.get()
                if self.bandwidth:
                    due = max(due, free_at) + len(data) / self.bandwidth
                    free_at = due
                await asyncio.sleep(max(0.0, due - self._loop.time()))
                if not data:
                    break
                writer.write(data)
                self.bytes += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            reading.cancel()
            writer.close()

    def close(self) -> None:
        def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)


# -- node logs -----------------------------------------------------------------------------


class LogFollower:
    """Lines appended to a node's log after this object was made (the nodes log every phase
    change: "session S: OLD done in T s, now PHASE")."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def wait(self, pattern: str, timeout: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Poll every 5 ms until a new line matches ``pattern``; False after ``timeout`` or
        once ``stop()`` holds."""
        regex, limit, buffer = re.compile(pattern), time.monotonic() + timeout, b""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while time.monotonic() < limit and not stop():
                buffer += fh.read()
                *lines, buffer = buffer.split(b"\n")
                if any(regex.search(line.decode(errors="replace")) for line in lines):
                    self.offset = fh.tell() - len(buffer)
                    return True
                time.sleep(0.005)
        return False


# -- node processes ------------------------------------------------------------------------


@dataclass
class NodeRun:
    """One incarnation of a node process."""

    name: str
    process: subprocess.Popen
    started: float
    signalled: int | None = None  # the signal the suite sent, if any


@dataclass
class FaultCluster:
    """Three party nodes and a solver node as processes (module doc); ``stop`` ends them all."""

    root: Path
    users: int = 400
    pairs: int = 300
    seed: int = 7
    deadline: float = 10.0
    proxies: bool = False
    fmt: str = "aol"
    obfuscators: int = 64
    record_view: bool = False
    """Every node records its view of every session under ``root/views`` (cels.views)."""
    keep_state: bool = False
    """Every node keeps its unfinished sessions' keys under ``root/state/NAME`` (cels.node.session_store)."""
    extra: dict[str, list[str]] = field(default_factory=dict)
    listen: dict[str, str] = field(init=False)
    advertised: dict[str, str] = field(init=False)
    runs: dict[str, NodeRun] = field(init=False, default_factory=dict)
    ended: list[NodeRun] = field(init=False, default_factory=list)
    proxy: dict[str, DelayProxy] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(BIN / "cels"), "certs", "--out", str(self.certs), "--parties", str(len(PARTIES))], check=True, capture_output=True)
        self.listen = {name: f"{LOOPBACK}:{free_port()}" for name in NODES}
        if self.proxies:
            self.proxy = {name: DelayProxy(self.listen[name]) for name in NODES}
        self.advertised = {name: (self.proxy[name].address if self.proxies else self.listen[name]) for name in NODES}
        self.data: dict[str, Path] = {}
        log = synthetic_log(seed=self.seed, users=self.users, pairs=self.pairs)
        for name, share in zip(PARTIES, log.split_by_user(len(PARTIES))):
            self.data[name] = self.root / "data" / f"{name}.tsv"
            self.data[name].parent.mkdir(parents=True, exist_ok=True)
            write_log(share, self.data[name], {"format": self.fmt})
        self._channels: dict[tuple[str, str], grpc.Channel] = {}

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    def tmpdir(self, name: str) -> Path:
        return self.root / "tmp" / name

    def state_dir(self, name: str) -> Path:
        return self.root / "state" / name

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def argv(self, name: str) -> list[str]:
        peers = [a for peer in NODES if peer != name for a in ("--peer", f"{peer}={self.advertised[peer]}")]
        argv = [
            str(BIN / ("cels-solver" if name == SOLVER else "cels-party")), "--name", name, "--listen", self.listen[name],
            "--ca", str(self.certs / "ca.pem"), "--cert", str(self.certs / f"{name}.pem"), "--key", str(self.certs / f"{name}.key"),
            *peers, "--deadline", str(self.deadline), "--node-key-bits", str(KEY_BITS), "--min-key-bits", str(KEY_BITS),
            "--obfuscator-workers", "1", "--controller", CONTROLLER,  # the harness's one operator controls every node
        ]  # fmt: skip
        if name != SOLVER:
            argv += ["--data", str(self.data[name]), "--format", self.fmt, "--obfuscators", str(self.obfuscators)]
            argv += ["--policy-solves", "private,transformed"]  # the harness runs both solves (cels.node.policy)
        if self.record_view:
            argv += ["--record-view", str(self.root / "views")]
        if self.keep_state:
            argv += ["--state-dir", str(self.state_dir(name))]
        return argv + self.extra.get(name, [])

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, names: Iterable[str] = NODES, timeout: float = 60.0) -> None:
        names = list(names)
        for name in names:
            self.start_node(name)
        for name in names:
            self.wait_serving(name, timeout)
        self.wait_peers_known(timeout)

    def wait_peers_known(self, timeout: float = 60.0) -> None:
        """Until every party node has read every peer's node key through its own channels
        (its stock lists a key for each): the parties' channels to their peers work."""
        limit = time.monotonic() + timeout
        for name in PARTIES:
            while True:
                status = self.stub(name, CONTROLLER).Status(cels_pb2.NodeStatusRequest(), timeout=5)
                if status.stock and all(entry.n for entry in status.stock):
                    break
                if time.monotonic() > limit:
                    raise TimeoutError(f"{name} has not learned its peers' keys after {timeout:g} s: {status}")
                time.sleep(0.1)

    def start_node(self, name: str) -> NodeRun:
        self.tmpdir(name).mkdir(parents=True, exist_ok=True)
        path = self.log_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            process = subprocess.Popen(
                self.argv(name), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "TMPDIR": str(self.tmpdir(name))}, start_new_session=True,
            )  # fmt: skip
        self.runs[name] = NodeRun(name, process, time.monotonic())
        return self.runs[name]

    def wait_serving(self, name: str, timeout: float = 60.0) -> float:
        """Seconds until ``name`` answers Status with its node key (raises if it exited)."""
        run, start = self.runs[name], time.monotonic()
        while True:
            if run.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {run.process.returncode}:\n{self.log_text(name)[-3000:]}")
            try:
                status = self.stub(name, CONTROLLER).Status(cels_pb2.NodeStatusRequest(), timeout=2)
                if status.key.n:
                    return time.monotonic() - start
            except grpc.RpcError:
                pass
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{name} not serving after {timeout:g} s:\n{self.log_text(name)[-3000:]}")
            time.sleep(0.05)

    def signal(self, name: str, sig: int) -> None:
        run = self.runs[name]
        run.signalled = sig
        run.process.send_signal(sig)

    def restart(self, name: str) -> float:
        """Start a node again after it exited; seconds until it serves."""
        self.start_node(name)
        self.forget_channels(name)
        return self.wait_serving(name)

    def wait_exit(self, name: str, timeout: float = STOP_SECONDS + 5) -> float:
        """Seconds until the signalled node exits (TimeoutExpired if it does not)."""
        run, start = self.runs[name], time.monotonic()
        run.process.wait(timeout)
        self.ended.append(run)
        return time.monotonic() - start

    def orphans(self, run: NodeRun, settle: float = 3.0) -> list[int]:
        """Processes of a dead node's session still alive after ``settle`` seconds."""
        limit = time.monotonic() + settle
        while (left := session_members(run.process.pid)) and time.monotonic() < limit:
            time.sleep(0.1)
        return left

    def crashed(self) -> dict[str, int]:
        """Nodes that exited although the suite sent them no signal: name -> exit code."""
        return {n: r.process.returncode for n, r in self.runs.items() if r.signalled is None and r.process.poll() is not None}

    def stop(self) -> list[int]:
        """SIGTERM every node, SIGKILL what outlives the stop bound; returns orphan pids
        (which it then kills: the suite leaves nothing running)."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        live = [r for r in self.runs.values() if r.process.poll() is None]
        for run in live:
            run.signalled = signal.SIGTERM
            run.process.terminate()
        for run in live:
            try:
                run.process.wait(STOP_SECONDS + 5)
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait(10)
        every = {id(run): run for run in [*self.ended, *self.runs.values()]}.values()
        left = sorted({pid for run in every for pid in self.orphans(run, settle=2.0)})
        reap(left)
        for proxy in self.proxy.values():
            proxy.close()
        return left

    # -- a live mutual-TLS client ----------------------------------------------------------
    def stub(self, target: str, as_name: str, via_proxy: bool = False) -> cels_pb2_grpc.CelsNodeStub:
        """A stub to node ``target`` presenting ``as_name``'s certificate (direct unless
        ``via_proxy``); channels are kept per (target, identity)."""
        return cels_pb2_grpc.CelsNodeStub(self.channel(target, as_name, via_proxy))

    def channel(self, target: str, as_name: str, via_proxy: bool = False) -> grpc.Channel:
        key = (target, as_name + ("@proxy" if via_proxy else ""))
        if key not in self._channels:
            address = self.advertised[target] if via_proxy else self.listen[target]
            self._channels[key] = open_channel(address, target, self.certs / "ca.pem", self.certs / f"{as_name}.pem", self.certs / f"{as_name}.key")
        return self._channels[key]

    def forget_channels(self, target: str) -> None:
        """Drop the suite's channels to a node (it restarted: no stale reconnect backoff here)."""
        for key in [k for k in self._channels if k[0] == target]:
            self._channels.pop(key).close()

    def state(self, node: str, session_id: str, timeout: float = 3.0) -> cels_pb2.SessionState:
        """PROBE a node about a session, as one of its peers."""
        asker = PARTIES[1] if node == PARTIES[0] else PARTIES[0]
        probe = cels_pb2.SessionSignal(session_id=session_id, kind=cels_pb2.SessionSignal.PROBE)
        return self.stub(node, asker).Signal(probe, timeout=timeout)

    def controller(self) -> Controller:
        return Controller(PARTIES[0], self.listen[PARTIES[0]], self.certs / "ca.pem", self.certs / f"{CONTROLLER}.pem", self.certs / f"{CONTROLLER}.key")

    def run_config(self, directory: Path) -> Path:
        """A session TOML for ``cels run`` (output and report under ``directory/out``)."""
        certs, path = self.certs, directory / "session.toml"
        path.write_text(
            "[run]\n"
            f'initiator = "{PARTIES[0]}"\naddress = "{self.listen[PARTIES[0]]}"\n'
            f'ca = "{certs / "ca.pem"}"\ncert = "{certs / f"{CONTROLLER}.pem"}"\nkey = "{certs / f"{CONTROLLER}.key"}"\n'
            'output = "out/sanitized.tsv"\nreport = "out/report.json"\ntimeout = 60\n'
            "[session]\n"
            f"parties = {list(PARTIES)!r}\nepsilon = 1.0\ndelta = 0.4\nkey_bits = {KEY_BITS}\ndeadline = {self.deadline}\n".replace("'", '"')
        )
        (directory / "out").mkdir(exist_ok=True)
        return path

    def options(self, **kw: Any) -> SessionOptions:
        kw = {"deadline": self.deadline, "epsilon": 1.0, "delta": 0.4, **kw}
        return SessionOptions.create(list(PARTIES), key_bits=KEY_BITS, **kw).with_addresses(self.advertised)

    def run(self, options: SessionOptions, out: Path, timeout: float = 300.0, **kw: Any) -> dict[str, Any]:
        """One session through ``cels run``'s client; writes out/sanitized.tsv and out/report.json."""
        out.mkdir(parents=True, exist_ok=True)
        return run_on_nodes(self.controller(), options.to_config(), out / "sanitized.tsv", out / "report.json", timeout, **kw)

    # -- node logs -------------------------------------------------------------------------
    def log_text(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def follow(self, name: str) -> LogFollower:
        """Read ``name``'s log from its current end on (start following before the event)."""
        return LogFollower(self.log_path(name))

    def leftovers(self, *extra: Path) -> list[Path]:
        """Temporary or partial files: anything in the nodes' TMPDIRs and ``extra`` dirs."""
        return files_under(*(self.tmpdir(n) for n in NODES), *extra)
