"""The ``cels run`` side: ask the initiating party node to run a session, follow it, write the results."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cels.fileio import atomic_write
from cels.node.peers import call_abort, rpc_text, tls_refusal
from cels.reports import write_reports
from cels.node.tls import open_channel, warn_insecure
from cels.protocol.aborts import BEFORE_START, DIED, PROTOCOL_ERROR, UNREACHABLE, abort_notice, describe
from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from cels.protocol.wire.codec import phase_from_wire, table_of


CONNECT_TIMEOUT = 60.0
"""Seconds ``cels run`` waits for the initiator node to accept the connection (nodes starting up)."""


class SessionAborted(RuntimeError):
    """The session ended without output, or never ran: ``abort`` says who (``origin``), what
    (``kind``, an ``Abort.Kind`` name), in which ``phase`` and why (``reason``, generic);
    ``detail`` is what only this side knows (an address, the initiator's own refusal)."""

    def __init__(self, abort: cels_pb2.Abort, detail: str = "") -> None:
        self.abort, self.detail = abort, detail
        super().__init__(describe(abort) + (f": {detail}" if detail else ""))

    @property
    def origin(self) -> str:
        return self.abort.origin

    @property
    def kind(self) -> str:
        return cels_pb2.Abort.Kind.Name(self.abort.kind)

    @property
    def phase(self) -> Phase | None:
        """None: not known (the Run stream broke)."""
        return phase_from_wire(self.abort.phase)

    @property
    def reason(self) -> str:
        return self.abort.reason


@dataclass
class Controller:
    """Who ``cels run`` is and how it reaches the initiating party node."""

    initiator: str
    address: str
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    insecure: bool = False
    identities: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    """node -> (cert, key) of that node's own organisation's controller, for one user who runs
    several organisations' controllers on one machine (``cels simulate``); other nodes get
    ``cert`` and ``key``."""


def controller_channel(controller: Controller, node: str, address: str) -> grpc.Channel:
    """A channel from the controller to ``node`` (mutual TLS unless the controller is insecure)."""
    if controller.insecure:
        return open_channel(address, node, None, None, None)
    cert, key = controller.identities.get(node, (controller.cert, controller.key))
    return open_channel(address, node, controller.ca, cert, key)


def stock_complete(status: cels_pb2.NodeStatus) -> bool:
    """Every key the node stocks is known and has its target of obfuscators ready."""
    return all(entry.n and entry.ready >= entry.target for entry in status.stock)


def node_statuses(controller: Controller, nodes: dict[str, str], timeout: float = 10.0) -> dict[str, cels_pb2.NodeStatus]:
    """Every node's ``Status`` (node key and obfuscator stock), read once."""
    out = {}
    for name, address in nodes.items():
        with controller_channel(controller, name, address) as channel:
            out[name] = cels_pb2_grpc.CelsNodeStub(channel).Status(cels_pb2.NodeStatusRequest(), timeout=timeout)
    return out


def wait_for_stock(
    controller: Controller,
    nodes: dict[str, str],
    timeout: float,
    on_progress: Callable[[int, int], None] | None = None,
    poll: float = 1.0,
) -> dict[str, cels_pb2.NodeStatus]:
    """The offline phase seen from outside: read every node's ``Status`` until its obfuscator
    stock is complete; ``on_progress(ready, target)`` gets the totals over all nodes.  A node
    that does not answer a poll (UNAVAILABLE, DEADLINE_EXCEEDED: e.g. a handshake dropped
    while it loads a large log) is polled again.  Raises TimeoutError after ``timeout`` seconds."""
    limit = time.monotonic() + timeout
    while True:
        try:
            statuses = node_statuses(controller, nodes)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            if time.monotonic() > limit:
                raise TimeoutError(f"obfuscator stocks not complete after {timeout:g}s (last poll: {exc.code().name}: {exc.details()})") from None
            time.sleep(poll)
            continue
        if on_progress is not None:
            entries = [e for st in statuses.values() for e in st.stock]
            on_progress(sum(min(e.ready, e.target) for e in entries), sum(e.target for e in entries))
        if all(stock_complete(st) for st in statuses.values()):
            return statuses
        if time.monotonic() > limit:
            raise TimeoutError(f"obfuscator stocks not complete after {timeout:g}s")
        time.sleep(poll)


NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""The codes of a call no node answered; any other code is a node's answer."""


def unreachable_nodes(controller: Controller, nodes: dict[str, str], timeout: float = 2.0) -> dict[str, tuple[str, str, bool]]:
    """Node name -> (address, why, refused) for every node whose ``Status`` does not answer;
    ``refused``: the TLS handshake was refused (cels.node.peers.tls_refusal), which waiting does not mend.
    A node that refuses this controller its status (another organisation's node: PERMISSION_DENIED)
    has answered: it runs, and that is all the wait asks."""
    out = {}
    for name, address in nodes.items():
        try:
            with controller_channel(controller, name, address) as channel:
                cels_pb2_grpc.CelsNodeStub(channel).Status(cels_pb2.NodeStatusRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            refused = tls_refusal(exc)
            if refused is None and exc.code() not in NO_ANSWER:
                continue
            out[name] = (address, refused or exc.code().name, refused is not None)
    return out


def wait_reachable(
    controller: Controller,
    nodes: dict[str, str],
    timeout: float,
    on_wait: Callable[[dict[str, str], float], None] | None = None,
    poll: float = 1.0,
) -> None:
    """Wait until every node answers ``Status``; ``on_wait(unreachable, waited_seconds)`` (node
    -> "address (why)") after each round that found one unreachable.  Raises SessionAborted
    (before any session) naming the first unreachable node, with every unreachable address,
    after ``timeout`` seconds; at once, naming the cause in one line, if a node's TLS handshake
    was refused (another CA, an expired certificate, another node's name: waiting mends none)."""
    start = time.monotonic()
    while True:
        missing = unreachable_nodes(controller, nodes)
        if not missing:
            return
        waited = time.monotonic() - start
        refused = {name: (address, why) for name, (address, why, final) in missing.items() if final}
        if refused:
            name, (address, why) = next(iter(refused.items()))
            raise SessionAborted(abort_notice("", name, UNREACHABLE, why, BEFORE_START), f"{name} at {address}")
        if on_wait is not None:
            on_wait({name: f"{address} ({why})" for name, (address, why, _) in missing.items()}, waited)
        if waited >= timeout:
            name = next(iter(missing))
            raise SessionAborted(
                abort_notice("", name, UNREACHABLE, "not running, or at another address", BEFORE_START),
                f"{', '.join(f'{n} at {a} ({why})' for n, (a, why, _) in missing.items())} after {waited:.0f}s",
            )
        time.sleep(poll)


def run_on_nodes(
    controller: Controller,
    config: cels_pb2.SessionConfig,
    output: str | os.PathLike[str],
    report_path: str | os.PathLike[str],
    timeout: float,
    on_progress: Callable[[cels_pb2.StepReport], None] | None = None,
    extra: dict[str, Any] | None = None,
    on_phase_start: Callable[[cels_pb2.PhaseStart], None] | None = None,
    on_approval: Callable[[str, bool], None] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run one session; write the sanitized log, its public release note and the confidential
    operator report at ``report_path`` (cels.reports), each atomically; return the report.

    Nothing is written unless the session completes: the log goes to a temporary file that is
    renamed only after the report arrived.  ``extra`` keys are added to the report.
    ``on_progress`` gets every phase end, ``on_phase_start`` every phase start (RunEvent),
    ``on_approval(party, approved)`` a party whose operator approves the session first, and its approval.
    The release replaces an existing file only with ``force``: another run's release is never
    lost (FileExistsError, nothing written).
    Raises SessionAborted with the failing node.
    """
    if controller.insecure:
        warn_insecure("cels run")
    channel = controller_channel(controller, controller.initiator, controller.address)
    request = cels_pb2.RunRequest(config=config, output_name=Path(output).name)
    report: dict[str, Any] | None = None
    with channel:
        stub = cels_pb2_grpc.CelsNodeStub(channel)
        try:  # a call that waits for the connection: channel_ready_future's watcher thread outlived the closed channel
            stub.Status(cels_pb2.NodeStatusRequest(), timeout=max(0.0, min(timeout, CONNECT_TIMEOUT)), wait_for_ready=True)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # e.g. another organisation's controller: PERMISSION_DENIED
                raise SessionAborted(call_abort(config.session_id, controller.initiator, "Status", exc, BEFORE_START, joined=False), rpc_text(exc)) from None
            raise SessionAborted(
                abort_notice(config.session_id, controller.initiator, UNREACHABLE, "not running, or its certificate does not name it", BEFORE_START),
                f"cannot connect to {controller.initiator} at {controller.address} within {max(0.0, min(timeout, CONNECT_TIMEOUT)):g}s",
            ) from None
        began = False
        try:
            with atomic_write(output, mode="wb", replace=force) as sink:
                for event in stub.Run(request, timeout=timeout):
                    began = True
                    kind = event.WhichOneof("event")
                    if kind == "progress" and on_progress is not None:
                        on_progress(event.progress)
                    elif kind == "phase_start" and on_phase_start is not None:
                        on_phase_start(event.phase_start)
                    elif kind in ("awaiting_approval", "approved") and on_approval is not None:
                        on_approval(getattr(event, kind), kind == "approved")
                    elif kind == "output_chunk":
                        sink.write(event.output_chunk)
                    elif kind == "report":
                        report = table_of(event.report)
                    elif kind == "aborted":
                        raise SessionAborted(event.aborted, event.detail)
                if report is None:
                    raise SessionAborted(abort_notice(config.session_id, controller.initiator, PROTOCOL_ERROR, "the stream ended without a report", None))
        except grpc.RpcError as exc:  # the initiator refused the run, or its stream broke (the details are for its controller)
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):  # it was connected: it went away
                notice = abort_notice(config.session_id, controller.initiator, DIED, "its Run stream broke", None)
            else:
                notice = call_abort(config.session_id, controller.initiator, "Run", exc, None if began else BEFORE_START, joined=False)
            raise SessionAborted(notice, rpc_text(exc)) from None
    report.update(extra or {})
    try:
        write_reports(report, output, report_path)
    except BaseException:
        os.unlink(output)
        raise
    return report
