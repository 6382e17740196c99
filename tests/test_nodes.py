"""The node adapters over gRPC with mutual TLS, with a toy protocol (tests/nodes_toy.py).

Nodes run as separate OS processes on 127.0.0.1; every fixture stops them.  Known answers:
the toy session's output is the sum of the parties' log sizes.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from functools import partial
import time
from pathlib import Path

import grpc
import pytest

from cels.certs import make_dev_certs, node_names
from cels.logs import SearchLog, write_log
from cels.logs.records import LogRecord
from cels.node.client import Controller, SessionAborted, node_statuses, run_on_nodes, wait_reachable
from cels.node.health import node_health
from cels.node.cluster import LOOPBACK, LocalCluster, free_port, peer_args, tls_args
from cels.node.config import add_data_arguments, add_node_arguments, node_config
from cels.node.service import Node
from cels.node.framing import from_frames, to_frames
from cels.node.initiator import follow
from cels.node.link import PROBE_TIMEOUT_MAX
from cels.node.tls import CHANNEL_OPTIONS, open_channel
from cels.protocol.aborts import LOCAL_FAILURE
from cels.protocol.options import SessionOptions
from cels.protocol.roles import ProtocolError
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from cels.protocol.wire.codec import state_from_wire
from cels.protocol.phases import SessionState

TOY = Path(__file__).resolve().parent / "nodes_toy.py"
PARTIES = 3
SIZES = {"party-1": 5, "party-2": 7, "party-3": 11}


def write_party_log(path: Path, events: int) -> None:
    records = [LogRecord(user=f"u{k % 2}", query=f"q{k % 3}", url=f"http://x/{k % 3}") for k in range(events)]
    write_log(SearchLog.from_records(records, {"format": "histogram"}), path)


class ToyCluster:
    """3 toy parties and a toy solver with a dev CA (plus an 'intruder' cert from the same CA)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.certs = make_dev_certs(root / "certs", [*node_names(PARTIES), "intruder"])
        self.addresses = {name: f"{LOOPBACK}:{free_port()}" for name in node_names(PARTIES) if not name.startswith("controller-")}
        self.cluster = LocalCluster(root / "logs")
        self.data = {}
        try:
            self._start()
        except BaseException:
            self.cluster.stop()
            raise

    def _start(self) -> None:
        root = self.root
        for name, address in self.addresses.items():
            argv = [sys.executable, str(TOY), "--name", name, "--listen", address, *tls_args(self.certs[name])]
            argv += peer_args(self.addresses, name) + ["--max-message-mib", "16"]  # as a site that runs streamed sessions only
            if name.startswith("party"):
                self.data[name] = root / f"{name}.tsv"
                write_party_log(self.data[name], SIZES[name])
                argv += ["--data", str(self.data[name]), "--format", "histogram"]
            self.cluster.start(name, address, argv)
        self.cluster.wait_ready()

    def config(self, session_id: str, delay: float = 0.0, payload: int = 0, deadline: float = 10.0) -> cels_pb2.SessionConfig:
        parties = [cels_pb2.NodeAddress(name=n, address=a) for n, a in self.addresses.items() if n.startswith("party")]
        return cels_pb2.SessionConfig(
            session_id=session_id,
            parties=parties,
            solver=cels_pb2.NodeAddress(name="solver", address=self.addresses["solver"]),
            epsilon=1.0,
            delta=0.4,
            cap=int(delay * 1000),  # the toy's hop delay (tests/nodes_toy.py)
            min_count=payload,  # the toy's padding values per hop
            deadline_ms=int(deadline * 1000),
        )

    def controller(self, expect: str = "party-1") -> Controller:
        cert = self.certs["controller-party-1"]
        return Controller(initiator=expect, address=self.addresses["party-1"], ca=cert.ca, cert=cert.cert, key=cert.key)

    def run(self, config: cels_pb2.SessionConfig, out: Path, **kw) -> dict:
        out.mkdir(parents=True, exist_ok=True)
        controller, timeout = kw.pop("controller", self.controller()), kw.pop("timeout", 60)
        return run_on_nodes(controller, config, out / "out.tsv", out / "report.json", timeout=timeout, **kw)

    def stub(self, target: str, as_name: str) -> cels_pb2_grpc.CelsNodeStub:
        cert = self.certs[as_name]
        channel = open_channel(self.addresses[target], target, cert.ca, cert.cert, cert.key)
        return cels_pb2_grpc.CelsNodeStub(channel)

    def state(self, node: str, session_id: str) -> SessionState:
        probe = cels_pb2.SessionSignal(session_id=session_id, kind=cels_pb2.SessionSignal.PROBE)
        return state_from_wire(self.stub(node, "party-1" if node != "party-1" else "party-2").Signal(probe, timeout=5).state)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    cluster = ToyCluster(tmp_path_factory.mktemp("toy"))
    try:
        yield cluster
    finally:
        cluster.cluster.stop()


def deliver(stub: cels_pb2_grpc.CelsNodeStub, envelope: cels_pb2.Envelope) -> None:
    stub.Deliver(iter(to_frames(envelope, 1)), timeout=5)


def toy_hop(session_id: str, sender: str, sum_id: str = "toy-ring", values=(1,)) -> cels_pb2.Envelope:
    msg = cels_pb2.SumResult(session_id=session_id, sum_id=sum_id, values=list(values))
    return cels_pb2.Envelope(session_id=session_id, sender=sender, sum_result=msg)


def wait_for(predicate, timeout: float) -> float:
    """Seconds until ``predicate()`` holds; fails after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - start


def test_session_runs_over_mutual_tls(toy, tmp_path) -> None:
    progress = []
    report = toy.run(toy.config("ok-1"), tmp_path, on_progress=progress.append)
    assert (tmp_path / "out.tsv").read_text() == f"total\t{sum(SIZES.values())}\n"
    assert report["total"] == sum(SIZES.values())
    # every node's phases stream while they happen, the initiator's own included
    assert {r.node for r in progress} == {"party-1", "party-2", "party-3", "solver"}
    wire = report["wire"]["nodes"]
    assert set(wire) == set(toy.addresses)
    assert wire["party-1"]["messages_sent"] == {"start_session": 3, "sum_result": 1}
    assert wire["solver"]["messages_sent"]["sum_result"] == 3 and wire["solver"]["messages_sent"]["step_report"] >= 1
    assert report["wire"]["bytes_total"] == sum(n["bytes_total"] for n in wire.values())
    for node in toy.addresses:
        assert toy.state(node, "ok-1") == "done"


def test_large_messages_travel_in_frames_under_4mb(toy, tmp_path) -> None:
    payload = 5_000_000  # 5 MB of sint64 padding per hop: one gRPC message would exceed 4 MB
    report = toy.run(toy.config("big-1", payload=payload), tmp_path)
    assert report["total"] == sum(SIZES.values())
    sent = report["wire"]["nodes"]["party-2"]["bytes_sent"]["sum_result"]
    assert sent > 4 * 1024 * 1024
    assert max(f.ByteSize() for f in to_frames(toy_hop("s", "p", values=[7] * payload), 0)) < 1.1 * 2**20
    largest = report["wire"]["nodes"]["party-2"]["largest_message_bytes"]["sum_result"]
    assert sent / 2 < largest <= sent and report["wire"]["largest_message_bytes"] >= largest  # one hop of the two it sent


def test_a_message_past_the_nodes_cap_is_refused_at_the_frame_that_passes_it(toy) -> None:
    """Issue 40: a peer could make a node buffer 2 GiB for one message.  Now the cap is
    ``[node] max_message_mib`` (256 MiB by default, 16 here); nothing past it is read."""
    frames = to_frames(toy_hop("s", "party-2", values=[7] * 3_000_000), 1)  # about 3.4 MB in 4 frames
    taken = []

    def counted():
        for frame in frames:
            taken.append(frame.index)
            yield frame

    with pytest.raises(ProtocolError, match="larger than this node's 2 MiB") as err:
        from_frames(counted(), 2 << 20)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT and taken == [0, 1, 2]
    assert from_frames(iter(frames), 4 << 20)[0] == toy_hop("s", "party-2", values=[7] * 3_000_000)
    with pytest.raises(grpc.RpcError) as refused:
        deliver(toy.stub("party-1", "party-2"), toy_hop("no-such-session", "party-2", values=[1 << 60] * (2 << 20)))  # 19 MB
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "larger than this node's 16 MiB" in refused.value.details()


def test_a_peer_restarted_at_a_new_address_is_dialled_there_before_it_is_declared_gone() -> None:
    """A recreated container or a rescheduled pod keeps its name but not its address: every
    channel looks the name up again, and backs off, for less than the watchdog lets a peer stay
    unreachable (make compose-test's transformed step recreates the parties under a solver that
    keeps its channels, and failed with gRPC's default 30 s between lookups)."""
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.dns_min_time_between_resolutions_ms"] / 1000 < PROBE_TIMEOUT_MAX
    assert options["grpc.max_reconnect_backoff_ms"] / 1000 < PROBE_TIMEOUT_MAX


def test_unknown_session_is_failed_precondition(toy) -> None:
    with pytest.raises(grpc.RpcError) as err:
        deliver(toy.stub("party-1", "party-2"), toy_hop("no-such-session", "party-2"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown session 'no-such-session'" in err.value.details()


def test_an_unknown_signal_kind_is_invalid_argument_and_ends_nothing(toy, tmp_path) -> None:
    """Issue 13 item 2: Signal(kind=77) used to be taken as FINISH."""
    toy.run(toy.config("sig-1"), tmp_path)
    stub = toy.stub("party-2", "party-1")
    for session_id in ("sig-1", "no-such-session"):
        with pytest.raises(grpc.RpcError) as err:
            stub.Signal(cels_pb2.SessionSignal(session_id=session_id, kind=77), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown signal kind 77" in err.value.details()
    assert toy.state("party-2", "sig-1") == "done"


def test_out_of_order_and_malformed_messages_are_refused(toy, tmp_path) -> None:
    config = toy.config("order-1", delay=0.8, deadline=4.0)  # ~6 s session; stray messages held back 1 s
    result = {}
    runner = threading.Thread(target=lambda: result.update(toy.run(config, tmp_path)))
    runner.start()
    try:
        wait_for(lambda: toy.state("party-3", "order-1") == "running", 10)
        # party-1 starts the ring: a ring message *to* it is out of protocol order
        with pytest.raises(grpc.RpcError) as err:
            deliver(toy.stub("party-1", "party-3"), toy_hop("order-1", "party-3"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "out of order" in err.value.details()
        # a step message without values is malformed
        with pytest.raises(grpc.RpcError) as err:
            deliver(toy.stub("party-3", "party-2"), toy_hop("order-1", "party-2", values=()))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # bytes that are not an Envelope, and frames out of order
        frames = [cels_pb2.Frame(session_id="order-1", message_id=1, index=0, last=True, data=b"\xff\xff\xff")]
        with pytest.raises(grpc.RpcError) as err:
            toy.stub("party-2", "party-1").Deliver(iter(frames), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        frames = to_frames(toy_hop("order-1", "party-1", values=[7] * 3_000_000), 1)
        with pytest.raises(grpc.RpcError) as err:
            toy.stub("party-2", "party-1").Deliver(iter(frames[1:]), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        runner.join(60)
    # refused stray messages do not end the session
    assert result["total"] == sum(SIZES.values())


def test_bytes_that_are_no_request_get_invalid_argument(toy) -> None:
    """Issue 13 item 11: bytes that do not parse as the RPC's request message used to get gRPC's
    INTERNAL "Exception deserializing request!"; every RPC parses its request itself."""
    channels = {as_name: open_channel(toy.addresses["party-1"], "party-1", toy.certs[as_name].ca, toy.certs[as_name].cert, toy.certs[as_name].key)
                for as_name in ("party-2", "controller-party-1")}  # a Run is a controller's call
    garbage = [b"\xff\xff\xff", b"\x2a\xff\xff\xff\x0fabc", b"\x0a\x05ab"]  # a bad tag, a length of 4 GB, a cut string
    for method in ("Deliver", "Signal", "Status", "Run"):
        path = f"/cels.v1.CelsNode/{method}"
        channel = channels["controller-party-1" if method == "Run" else "party-2"]
        for data in garbage:
            if method == "Deliver":
                call = lambda: channel.stream_unary(path)(iter([data]), timeout=5)  # noqa: E731
            elif method == "Run":
                call = lambda: list(channel.unary_stream(path)(data, timeout=5))  # noqa: E731
            else:
                call = lambda: channel.unary_unary(path)(data, timeout=5)  # noqa: E731
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, data, err.value.details())
            assert "bytes that are not a " in err.value.details(), (method, err.value.details())
    assert toy.state("party-1", "no-such-session") == "unknown"  # the node still serves


def test_an_overlong_session_id_is_invalid_argument_and_not_echoed(toy) -> None:
    """Issue 13 item 11's kin: a refusal quoted the peer's session id unbounded (50 KB of details
    overflowed gRPC's metadata limit: RESOURCE_EXHAUSTED).  Ids over MAX_SESSION_ID characters
    are refused at parse time, quoting none of them; other peer strings are quoted cut short."""
    from cels.protocol.roles import MAX_SESSION_ID

    stub = toy.stub("party-1", "party-2")
    for length in (MAX_SESSION_ID + 1, 50_000):
        long_id = "s" * length
        calls = {
            "Deliver": lambda: deliver(stub, toy_hop(long_id, "party-2")),
            "Signal": lambda: stub.Signal(cels_pb2.SessionSignal(session_id=long_id, kind=cels_pb2.SessionSignal.BEGIN), timeout=5),
            "Run": lambda: list(toy.stub("party-1", "controller-party-1").Run(cels_pb2.RunRequest(config=toy.config(long_id)), timeout=5)),
        }
        for method, call in calls.items():
            with pytest.raises(grpc.RpcError) as err:
                call()
            details = err.value.details()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, length, details[:200])
            assert f"a session id is 1 to {MAX_SESSION_ID} printable characters" in details and "sss" not in details, (method, details[:300])
    # a sender name of 50,000 characters is quoted cut short too
    with pytest.raises(grpc.RpcError) as err:
        deliver(stub, toy_hop("no-such-session", "p" * 50_000))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and len(err.value.details()) < 300, err.value.details()[:300]
    hop = toy_hop("ok-id", "party-2")
    hop.session_id = "e" * 50_000  # an envelope whose id differs from its frames'
    with pytest.raises(grpc.RpcError) as err:
        stub.Deliver(iter([cels_pb2.Frame(session_id="ok-id", message_id=1, index=0, last=True, data=hop.SerializeToString())]), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.value.details()) < 300, err.value.details()[:300]


def test_a_refused_tls_handshake_ends_the_wait_at_once_in_one_line(toy, tmp_path) -> None:
    """Issue 41 finding 4: a certificate from another CA cost `cels run` its whole wait and
    printed the C core's raw lines; now each refusal is named in one line, at the first try."""
    other = make_dev_certs(tmp_path / "other-ca", ["controller-party-1"])["controller-party-1"]
    ours = toy.certs["controller-party-1"]
    cases = {
        "another CA trusted": (Controller("party-1", toy.addresses["party-1"], ca=other.ca, cert=other.cert, key=other.key),
                               "its certificate is signed by another CA than this side's ca.pem"),
        "our certificate from another CA": (Controller("party-1", toy.addresses["party-1"], ca=ours.ca, cert=other.cert, key=other.key),
                                            "it closed the TLS handshake: it refuses this side's certificate"),
        "another node at the address": (Controller("party-2", toy.addresses["party-1"], ca=ours.ca, cert=ours.cert, key=ours.key),
                                        "its certificate names another node"),
    }  # fmt: skip
    for what, (controller, said) in cases.items():
        started = time.monotonic()
        with pytest.raises(SessionAborted) as aborted:
            wait_reachable(controller, {controller.initiator: controller.address}, timeout=60)
        assert time.monotonic() - started < 10, what  # not the 60 s of waiting
        assert aborted.value.kind == "UNREACHABLE" and f"TLS handshake refused: {said}" in str(aborted.value), (what, str(aborted.value))
        assert "\n" not in str(aborted.value) and "ssl_transport_security" not in str(aborted.value)


def test_the_wait_counts_a_node_that_refuses_this_controller_its_status_as_running(toy) -> None:
    """deploy/local's session.toml waits for party-2, party-3 and the solver with party-1's
    controller, whose status they refuse (one controller per organisation): that refusal is an
    answer, so the wait ends at once; a node at a dead address is still waited for."""
    controller = toy.controller()
    others = {name: address for name, address in toy.addresses.items() if name != controller.initiator}
    started = time.monotonic()
    wait_reachable(controller, others, timeout=30)
    assert time.monotonic() - started < 10
    with pytest.raises(SessionAborted) as aborted:
        wait_reachable(controller, {"party-2": f"{LOOPBACK}:{free_port()}"}, timeout=1, poll=0.2)
    assert aborted.value.kind == "UNREACHABLE" and "party-2" in str(aborted.value)


def test_unknown_or_wrong_certificates_are_refused(toy, tmp_path) -> None:
    envelope = toy_hop("no-such-session", "intruder")
    with pytest.raises(grpc.RpcError) as err:  # same CA, but not a node party-1 expects
        deliver(toy.stub("party-1", "intruder"), envelope)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:  # a valid certificate claiming another sender
        deliver(toy.stub("party-1", "party-2"), toy_hop("no-such-session", "party-3"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    other = make_dev_certs(tmp_path / "other-ca", ["party-2"])["party-2"]  # another CA
    channel = open_channel(toy.addresses["party-1"], "party-1", other.ca, other.cert, other.key)
    with pytest.raises(grpc.RpcError) as err:
        deliver(cels_pb2_grpc.CelsNodeStub(channel), toy_hop("no-such-session", "party-2"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # the controller pins the initiator's name: a server whose certificate names another node is refused
    with pytest.raises(SessionAborted) as aborted:
        toy.run(toy.config("pin-1"), tmp_path, controller=toy.controller(expect="party-2"), timeout=2)
    assert aborted.value.kind == "UNREACHABLE" and aborted.value.origin == "party-2" and "cannot connect to party-2" in str(aborted.value)
    # a party may not act as the controller
    cert = toy.certs["party-2"]
    impostor = Controller("party-1", toy.addresses["party-1"], cert.ca, cert.cert, cert.key)
    with pytest.raises(SessionAborted) as aborted:
        toy.run(toy.config("pin-2"), tmp_path, controller=impostor)
    assert aborted.value.kind == "REFUSED" and str(aborted.value).startswith("no session ran: refused by party-1 (Run: refused the caller): PERMISSION_DENIED: ")
    # nor may another organisation's controller (one controller identity per organisation, cels certs)
    other_org = toy.certs["controller-party-2"]
    with pytest.raises(SessionAborted) as aborted:
        toy.run(toy.config("pin-3"), tmp_path, controller=Controller("party-1", toy.addresses["party-1"], other_org.ca, other_org.cert, other_org.key))
    assert aborted.value.kind == "REFUSED" and "refused by party-1 (Status: refused the caller): PERMISSION_DENIED" in str(aborted.value)
    assert not (tmp_path / "out.tsv").exists()


def test_health_answers_the_nodes_peers_controllers_and_itself_only(toy) -> None:
    """Any certificate of the CA could read a node's health (issue 40, finding 6): now only the
    certificates the node knows."""
    def probe(as_name: str) -> str:
        cert = toy.certs[as_name]
        return node_health(toy.addresses["party-1"], "party-1", cert.ca, cert.cert, cert.key, timeout=10)

    wait_for(lambda: probe("party-2") == "SERVING", 60)  # once its node key exists
    assert [probe(n) for n in ("party-2", "solver", "controller-party-1", "party-1")] == ["SERVING"] * 4
    for stranger in ("intruder", "controller-party-2"):
        assert probe(stranger).startswith("PERMISSION_DENIED: health: only this node's peers"), stranger


def test_status_gives_the_node_key_to_peers_and_the_stock_to_controllers(toy) -> None:
    request = cels_pb2.NodeStatusRequest()
    peer = toy.stub("party-1", "party-2").Status(request, timeout=10)
    assert peer.node == "party-1" and int.from_bytes(peer.key.n, "big").bit_length() == 2048  # the node key
    ctrl = toy.controller()
    control = node_statuses(ctrl, {"party-1": toy.addresses["party-1"]})["party-1"]
    assert control.key.n == peer.key.n  # one long-lived key, whoever asks
    for stranger in ("intruder", "controller-party-2"):  # same CA, but not a node party-1 expects, nor its organisation's controller
        with pytest.raises(grpc.RpcError) as err:
            toy.stub("party-1", stranger).Status(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, stranger


def test_deadline_aborts_and_the_nodes_serve_the_next_session(toy, tmp_path) -> None:
    # every hop takes 1.5 s but the session allows 1 s per call: the delivery to party-2 times out
    with pytest.raises(SessionAborted) as aborted:
        toy.run(toy.config("slow-1", delay=1.5, deadline=1.0), tmp_path / "slow")
    assert aborted.value.kind == "DEADLINE" and aborted.value.origin == "party-2", aborted.value
    assert not (tmp_path / "slow").exists() or not any((tmp_path / "slow").iterdir())
    wait_for(lambda: all(toy.state(n, "slow-1") == "aborted" for n in toy.addresses), 10)
    report = toy.run(toy.config("after-slow"), tmp_path / "next")
    assert report["total"] == sum(SIZES.values())


def test_malformed_log_on_one_party_aborts_with_its_error(toy, tmp_path) -> None:
    path = toy.data["party-2"]
    good = path.read_bytes()
    path.write_text("user\tquery\turl\tcount\nu1\tq\thttp://x\tmany\n")
    try:
        with pytest.raises(SessionAborted) as aborted:
            toy.run(toy.config("badlog-1"), tmp_path / "bad")
    finally:
        path.write_bytes(good)
    # the initiator is told who refused, not party-2's file, line or field: those stay in party-2's log
    assert (aborted.value.origin, aborted.value.kind, aborted.value.phase) == ("party-2", "REFUSED", "start")
    assert str(aborted.value) == "no session ran: refused by party-2 (cannot take the session)"
    assert f"{path}, line 2, field 'count'" in toy.cluster.nodes["party-2"].log_text()
    initiator_log = toy.cluster.nodes["party-1"].log_text()
    assert "party-1: session badlog-1 aborted: no session ran: refused by party-2 (cannot take the session); start_session to party-2 at " in initiator_log
    assert "party-2: session 'badlog-1' refused: cannot take the session (" in toy.cluster.nodes["party-2"].log_text()
    assert str(path) not in initiator_log and "_InactiveRpcError" not in initiator_log
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    assert toy.run(toy.config("badlog-2"), tmp_path / "good")["total"] == sum(SIZES.values())


@pytest.mark.parametrize("victim", ["party-1", "party-2", "solver"])
def test_killed_node_aborts_the_session_everywhere(tmp_path, victim) -> None:
    toy = ToyCluster(tmp_path / "cluster")
    try:
        outcome: dict = {}

        def run() -> None:
            try:
                toy.run(toy.config("kill-1", delay=1.0, deadline=3.0), tmp_path / "out")
            except SessionAborted as exc:
                outcome["aborted"] = exc

        runner = threading.Thread(target=run)
        runner.start()
        wait_for(lambda: toy.state("party-3", "kill-1") == "running", 10)
        toy.cluster.kill(victim)
        killed = time.monotonic()
        runner.join(20)
        assert outcome["aborted"].origin == victim and outcome["aborted"].kind == "DIED", outcome["aborted"]
        assert str(outcome["aborted"]).startswith(f"{victim} died"), outcome["aborted"]
        survivors = [n for n in toy.addresses if n != victim]
        wait_for(lambda: all(toy.state(n, "kill-1") == "aborted" for n in survivors), 10)
        assert time.monotonic() - killed < 3.0 + 1.0  # within the deadline (+1 s for polling here)
        def aborted_lines(node: str) -> list[str]:
            return [line for line in toy.cluster.nodes[node].log_text().splitlines() if "session kill-1 aborted: " in line]

        for node in survivors:  # one line per abort, and no multi-line gRPC error dumps (issue 23 item 10)
            wait_for(partial(aborted_lines, node), 5)  # a probe may see the state before the node has logged the line
            text = toy.cluster.nodes[node].log_text()
            assert "_InactiveRpcError" not in text and "\tstatus = " not in text, text
            assert len(aborted_lines(node)) == 1, text
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    finally:
        toy.cluster.stop()


def test_sigterm_stops_a_busy_node_within_its_stop_bound(tmp_path) -> None:
    """Issue 13 item 8: a node inside a long step, with Status calls in flight, exits on SIGTERM."""
    from cels.node.process import STOP_SECONDS

    toy = ToyCluster(tmp_path / "cluster")
    try:
        runner = threading.Thread(target=lambda: _quietly(lambda: toy.run(toy.config("busy-1", delay=30.0, deadline=120.0), tmp_path / "out")))
        runner.start()
        wait_for(lambda: toy.state("party-2", "busy-1") == "running", 10)
        stub = toy.stub("party-1", "party-2")  # party-1 sleeps 30 s in its first step, holding its host
        hammer = threading.Event()

        def status_calls() -> None:
            while not hammer.is_set():
                _quietly(lambda: stub.Status(cels_pb2.NodeStatusRequest(), timeout=1))

        callers = [threading.Thread(target=status_calls, daemon=True) for _ in range(4)]
        for t in callers:
            t.start()
        process = toy.cluster.nodes["party-1"].process
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.wait(timeout=STOP_SECONDS + 5)
        hammer.set()
        assert time.monotonic() - sent < STOP_SECONDS + 3
        runner.join(60)
    finally:
        toy.cluster.stop()


def _quietly(call) -> None:
    try:
        call()
    except (grpc.RpcError, SessionAborted):
        pass


def test_a_peer_abort_before_begin_ends_the_run_stream_naming_that_peer() -> None:
    """party-2 aborts (its log failed to load) while the initiator is still signalling BEGIN, so
    the initiator's host makes no further call and never begins: the Run stream still ends with
    party-2's abort, not with an UNKNOWN error that ``cels run`` would blame on party-1 (a CI
    failure, issue 13)."""
    sys.path.insert(0, str(TOY.parent))
    from nodes_toy import ToyRole

    names = [name for name in node_names(PARTIES) if not name.startswith("controller-")]
    addresses = {name: f"{LOOPBACK}:{free_port()}" for name in names}
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    add_data_arguments(parser)
    argv = ["--name", "party-1", "--listen", addresses["party-1"], "--insecure", *peer_args(addresses, "party-1")]
    node = Node(node_config(parser.parse_args(argv), "data"), lambda options, _keys: ToyRole("party-1", options, 5))
    sent: list[tuple[str, str]] = []

    class Peers:  # party-2's abort notice lands while party-1 signals BEGIN
        def deliver(self, target, frames, deadline) -> cels_pb2.Ack:
            sent.append((target, "start_session"))
            return cels_pb2.Ack(session_id=frames[0].session_id)

        def signal(self, target, session_id, kind, deadline) -> None:
            if target == "party-2":
                node.abort(session_id, "party-2", LOCAL_FAILURE, "cannot load its log", "cannot load the log: party-2.tsv is a directory")

        def try_deliver(self, target, envelope, seconds) -> None:
            sent.append((target, envelope.WhichOneof("step")))

    node.peers = Peers()
    parties = [cels_pb2.NodeAddress(name=n, address=addresses[n]) for n in names if n.startswith("party")]
    config = cels_pb2.SessionConfig(
        session_id="early-abort", parties=parties, solver=cels_pb2.NodeAddress(name="solver", address=addresses["solver"]),
        epsilon=1.0, delta=0.4, deadline_ms=5000,
    )
    options = SessionOptions.from_config(config)
    node.call(lambda now: node.host.initiate(options, now), options.session_id)
    events = list(follow(node, node.link(options.session_id), node.output_writer, "out.tsv"))
    assert events[-1].WhichOneof("event") == "aborted"
    assert events[-1].aborted.origin == "party-2" and events[-1].aborted.kind == LOCAL_FAILURE
    assert events[-1].aborted.reason == "cannot load its log"
    assert node.host.state(options.session_id)[0] == "aborted"


def test_a_link_asks_for_the_next_window_before_its_outbox_counts_as_drained() -> None:
    """Issue 25: once a session's outbox is empty the link asks its node for the role's next
    window of a Stream (``drained``), before the last message counts as done: every message
    goes out in order, and a call waiting on ``outbox.join()`` (the initiator's BEGIN or
    FINISH) follows the whole Stream, not its first window."""
    from types import SimpleNamespace

    from cels.node.link import SessionLink

    options = SessionOptions.create(["party-1", "party-2"], session_id="windows", epsilon=1.0, delta=0.4, deadline=30.0)
    windows = [[("party-2", cels_pb2.Envelope(session_id="windows", sender="party-1", mask_key=cels_pb2.MaskKey(public_key=bytes([k]))))] for k in range(6)]
    delivered: list[bytes] = []
    asked: list[int] = []

    class Owner:  # the node around the link: its host reports the session done (the watchdog idles)
        config = SimpleNamespace(name="party-1", peers={"party-2": "127.0.0.1:1"})
        host = SimpleNamespace(state=lambda sid: (SessionState.DONE, None))
        peers = SimpleNamespace(deliver=lambda peer, frames, timeout: delivered.append(frames[0].data))

        def drained(self, session_id: str) -> None:
            asked.append(len(delivered))
            if windows:
                for item in windows.pop(0):
                    link.outbox.put(item)

        def expire(self) -> None:
            pass

    link = SessionLink(Owner(), options)
    Owner.drained(Owner, "windows")  # the first window
    link.outbox.join()
    link.stopped.set()
    link.outbox.put(None)
    assert [cels_pb2.Envelope.FromString(d).mask_key.public_key for d in delivered] == [bytes([k]) for k in range(6)]
    assert asked == [0, 1, 2, 3, 4, 5, 6]  # once per emptied outbox; the last finds the Stream over


def test_the_outbox_gauge_counts_what_waits_behind_a_delivery() -> None:
    """``cels_outbox_bytes``: while a delivery hangs (a successor that does not keep up), the
    messages queued behind it are counted at the scrape, the one in delivery is not; once the
    link has sent them all the gauge is 0."""
    from types import SimpleNamespace

    from cels.node.link import SessionLink
    from cels.node.sessions import SessionDriver
    from cels.node.telemetry import NodeTelemetry

    options = SessionOptions.create(["party-1", "party-2"], session_id="gauge", epsilon=1.0, delta=0.4, deadline=30.0)
    hops = [cels_pb2.Envelope(session_id="gauge", sender="party-1", universe_hop=cels_pb2.UniverseHop(owner="party-1", ids=bytes(32 * n))) for n in (10, 20, 40)]
    in_delivery, release = threading.Event(), threading.Event()

    def deliver(peer, frames, timeout) -> None:
        in_delivery.set()
        assert release.wait(10)

    telemetry = NodeTelemetry("party-1", "party")
    owner = SimpleNamespace(
        config=SimpleNamespace(name="party-1", peers={"party-2": "127.0.0.1:1"}), host=SimpleNamespace(state=lambda sid: (SessionState.DONE, None)),
        peers=SimpleNamespace(deliver=deliver), drained=lambda sid: None, expire=lambda: None,
    )  # fmt: skip
    link = SessionLink(owner, options)
    driver = SessionDriver(owner.config, owner.host, owner.peers, None, telemetry)  # the gauge reads the driver's links
    driver.links["gauge"] = link
    for hop in hops:
        link.outbox.put(("party-2", hop))
    assert in_delivery.wait(10)
    assert telemetry.registry.get_sample_value("cels_outbox_bytes") == hops[1].ByteSize() + hops[2].ByteSize() > 60 * 32
    release.set()
    link.outbox.join()
    assert telemetry.registry.get_sample_value("cels_outbox_bytes") == 0
    link.stopped.set()
    link.outbox.put(None)
