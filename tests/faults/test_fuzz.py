"""Protocol fuzzing (issue 13): a client with a valid node certificate sends mutated,
truncated, replayed, out-of-order and oversized Frames / Envelopes to Deliver and Signals of
every kind to Signal, generated with hypothesis; the corpus is every message the nodes received
in two real sessions (the private and the transformed solve), recorded with --record-view.

The answers the suite accepts: INVALID_ARGUMENT or FAILED_PRECONDITION; PERMISSION_DENIED
only for an envelope whose ``sender`` is not the certificate's name (spoofing); OK only for a
PROBE (a read).  Every other code is counted (``fuzz_replies`` in the summary) and fails the
test, a DEADLINE_EXCEEDED (per-call deadline CALL_DEADLINE) is a hang.  Afterwards every node
is alive and serves a real session.  Budget: CELS_FAULTS_FUZZ messages (1,000 in ``make test``,
10,000 in ``make faults``), split 60 % Deliver, 20 % Signal, 20 % raw bytes.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cels.node.framing import CHUNK_BYTES
from cels.protocol.machines import SESSION_CHARGES
from cels.protocol.rolebase import phase_of
from cels.protocol.wire import cels_pb2
from cels.protocol.phases import SessionState
from cels.protocol.wire.codec import state_from_wire
from fault_harness import FAULTS, FUZZ_MESSAGES, NODES, PARTIES, SOLVER, FaultCluster

CLUSTER = {"users": 120, "pairs": 100, "deadline": 8.0, "record_view": True}
CALL_DEADLINE = 10.0
"""Seconds each fuzzed call may take (a held-back out-of-order message waits deadline / 4)."""
ACCEPTED = {"INVALID_ARGUMENT", "FAILED_PRECONDITION"}
SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False)


class Corpus:
    """Received envelopes of the recorded sessions: (recipient, sender, wire bytes)."""

    def __init__(self, views: Path) -> None:
        self.messages: list[tuple[str, str, bytes]] = []
        for path in sorted(views.glob("*/*/messages/*-received-*.pb")):
            data = path.read_bytes()
            envelope = cels_pb2.Envelope.FromString(data)
            if envelope.sender in NODES:
                self.messages.append((path.parent.parent.name, envelope.sender, data))
        self.sessions = sorted({cels_pb2.Envelope.FromString(d).session_id for _, _, d in self.messages})
        self.steps = Counter(cels_pb2.Envelope.FromString(d).WhichOneof("step") for _, _, d in self.messages)


@pytest.fixture(scope="module")
def corpus(cluster: FaultCluster, tmp_path_factory) -> Corpus:
    out = tmp_path_factory.mktemp("fuzz-sessions")
    cluster.run(cluster.options(), out / "private")
    cluster.run(cluster.options(solve="transformed"), out / "transformed")
    found = Corpus(cluster.root / "views")
    assert len(found.sessions) == 2 and len(found.messages) > 50, found.steps
    return found


def frames_of(session_id: str, data: bytes, message_id: int = 1, chunk: int = CHUNK_BYTES) -> list[cels_pb2.Frame]:
    starts = range(0, max(len(data), 1), chunk)
    return [
        cels_pb2.Frame(session_id=session_id, message_id=message_id, index=k, last=k == len(starts) - 1, data=data[s : s + chunk])
        for k, s in enumerate(starts)
    ]


def claimed_sender(data: bytes) -> str | None:
    try:
        return cels_pb2.Envelope.FromString(data).sender
    except DecodeError:
        return None


UNEXPECTED: dict[str, list[str]] = {}
"""rpc -> the first few unexpected answers (code, what was sent, details), for the failure message."""


def classify(rpc: str, call: Callable[[], object], allowed: set[str], what: str = "") -> str:
    """Make one call; count its status code; return it."""
    detail = ""
    try:
        call()
        code = "OK"
    except grpc.RpcError as exc:
        code, detail = exc.code().name, exc.details() or ""
    FAULTS.add("fuzzed_messages")
    FAULTS.replies[f"{rpc}:{code}"] += 1
    if code == "DEADLINE_EXCEEDED":
        FAULTS.add("hangs")
    if code not in ACCEPTED | allowed:
        FAULTS.replies[f"{rpc}:unexpected"] += 1
        seen = UNEXPECTED.setdefault(rpc, [])
        if len(seen) < 5:
            seen.append(f"{code} for {what}: {detail[:200]}")
    return code


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    """Flip (0), insert (1), delete (2) or overwrite with 0xff (3) at positions ``ops``."""
    buf = bytearray(data)
    for op, position, value in ops:
        k = position % (len(buf) + 1)
        if op == 0 and buf:
            buf[min(k, len(buf) - 1)] ^= 1 << (value % 8)
        elif op == 1:
            buf[k:k] = bytes([value % 256]) * (1 + value % 7)
        elif op == 2:
            del buf[k : k + 1 + value % 9]
        elif op == 3:
            buf[k : k + 5] = b"\xff" * 5
    return bytes(buf)


def chunks(data: bytes) -> st.SearchStrategy[int]:
    """Frame sizes that split ``data`` into 2..32 frames."""
    return st.integers(max(1, len(data) // 32), max(1, len(data) // 2))


# one fuzz case: a strategy drawing (target node, identity, frames, allowed extra codes)
def deliver_cases(corpus: Corpus) -> st.SearchStrategy:
    message = st.sampled_from(corpus.messages)
    ops = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)

    def spoofable(sender: str, data: bytes) -> set[str]:
        claimed = claimed_sender(data)
        return {"PERMISSION_DENIED"} if claimed is not None and claimed != sender else set()

    @st.composite
    def mutated(draw):
        target, sender, data = draw(message)
        data = mutate(data, draw(ops))
        sid = draw(st.sampled_from([*corpus.sessions, "fuzz-" + secrets.token_hex(4)]))
        return "mutated", target, sender, frames_of(sid, data), spoofable(sender, data), "bytes"

    @st.composite
    def truncated(draw):
        target, sender, data = draw(message)
        sid = cels_pb2.Envelope.FromString(data).session_id
        how = draw(st.sampled_from(["cut", "no-last", "drop-frame", "empty"]))
        if how == "cut":
            cut = data[: draw(st.integers(0, max(0, len(data) - 1)))]
            return "truncated", target, sender, frames_of(sid, cut), spoofable(sender, cut), how
        frames = frames_of(sid, data, chunk=draw(chunks(data)))
        if how == "no-last":
            frames[-1].last = False
        elif how == "drop-frame" and len(frames) > 1:
            del frames[draw(st.integers(0, len(frames) - 2))]
        else:
            frames = []
        return "truncated", target, sender, frames, set(), how

    @st.composite
    def replayed(draw):
        target, sender, data = draw(message)
        return "replayed", target, sender, frames_of(cels_pb2.Envelope.FromString(data).session_id, data), set(), "as recorded"

    @st.composite
    def out_of_order(draw):
        target, sender, data = draw(message)
        sid = cels_pb2.Envelope.FromString(data).session_id
        frames = frames_of(sid, data, chunk=draw(chunks(data)))
        how = draw(st.sampled_from(["shuffle", "duplicate", "mixed-ids", "after-last", "other-node"]))
        if how == "shuffle" and len(frames) > 1:
            frames = draw(st.permutations(frames))
        elif how == "duplicate":
            frames.insert(0, frames[0])
        elif how == "mixed-ids" and len(frames) > 1:
            frames[-1].message_id += 1
        elif how == "after-last":
            frames.append(cels_pb2.Frame(session_id=sid, message_id=frames[0].message_id, index=len(frames), last=True, data=b"x"))
        else:  # a message meant for another node
            target = draw(st.sampled_from([n for n in NODES if n not in (target, sender)]))
        return "out-of-order", target, sender, frames, set(), how

    @st.composite
    def oversized(draw):
        target, sender, data = draw(message)
        sid = cels_pb2.Envelope.FromString(data).session_id
        how = draw(st.sampled_from(["big-frame", "huge-index", "huge-repeat"]))
        if how == "big-frame":  # one frame larger than a chunk, under gRPC's 4 MB message limit
            size = draw(st.integers(CHUNK_BYTES + 1, 3 * CHUNK_BYTES))
            return "oversized", target, sender, frames_of(sid, data + secrets.token_bytes(size), chunk=1 << 30), spoofable(sender, data), how
        if how == "huge-index":
            frame = cels_pb2.Frame(session_id=sid, message_id=(1 << 64) - 1, index=(1 << 32) - 1, last=True, data=data)
            return "oversized", target, sender, [frame], set(), how
        # a valid envelope of 2-3 MB: a step's vector of huge values
        values = [(1 << 63) - 1] * draw(st.integers(150_000, 300_000))
        envelope = cels_pb2.Envelope(session_id=sid, sender=sender, sum_result=cels_pb2.SumResult(session_id=sid, sum_id="fuzz", values=values))
        return "oversized", target, sender, frames_of(sid, envelope.SerializeToString()), set(), how

    return st.one_of(mutated(), truncated(), replayed(), out_of_order(), oversized())


def test_deliver_fuzz(cluster: FaultCluster, corpus: Corpus) -> None:
    budget = FUZZ_MESSAGES * 6 // 10
    kinds: Counter = Counter()
    before = FAULTS.replies.copy()

    @settings(max_examples=budget, **SETTINGS)
    @given(deliver_cases(corpus))
    def fuzz(case) -> None:
        kind, target, sender, frames, allowed, _how = case
        kinds[kind] += 1
        stub = cluster.stub(target, sender)
        what = f"{kind} {case[5]} to {target} as {sender}"
        classify("Deliver", lambda: stub.Deliver(iter(frames), timeout=CALL_DEADLINE), allowed, what)

    fuzz()
    assert sum(kinds.values()) >= budget and set(kinds) == {"mutated", "truncated", "replayed", "out-of-order", "oversized"}, kinds
    replies = FAULTS.replies - before
    assert not replies["Deliver:unexpected"] and not replies["Deliver:DEADLINE_EXCEEDED"], (dict(replies), UNEXPECTED.get("Deliver"))
    assert not cluster.crashed()


def test_signal_fuzz(cluster: FaultCluster, corpus: Corpus) -> None:
    budget = FUZZ_MESSAGES * 2 // 10
    before = FAULTS.replies.copy()
    sessions = st.one_of(st.sampled_from(corpus.sessions), st.text(max_size=64), st.binary(max_size=32).map(lambda b: b.hex()))
    kinds = st.one_of(st.sampled_from([0, 1, 2]), st.integers(-(1 << 31), (1 << 31) - 1))
    identities = st.sampled_from([(t, s) for t in NODES for s in NODES if s != t])
    count = Counter()

    @settings(max_examples=budget, **SETTINGS)
    @given(identities, sessions, kinds)
    def fuzz(pair, session_id, kind) -> None:
        target, sender = pair
        count["n"] += 1
        request = cels_pb2.SessionSignal(session_id=session_id, kind=kind)
        # a PROBE reads; a FINISH of a session that is done changes nothing (idempotent)
        read_only = kind == cels_pb2.SessionSignal.PROBE or (kind == cels_pb2.SessionSignal.FINISH and session_id in corpus.sessions)
        allowed = {"OK"} if read_only else set()
        what = f"kind {kind} session {session_id[:40]!r} to {target} as {sender}"
        classify("Signal", lambda: cluster.stub(target, sender).Signal(request, timeout=CALL_DEADLINE), allowed, what)

    fuzz()
    assert count["n"] >= budget
    replies = FAULTS.replies - before
    assert not replies["Signal:unexpected"] and not replies["Signal:DEADLINE_EXCEEDED"], (dict(replies), UNEXPECTED.get("Signal"))
    for session_id in corpus.sessions:  # the real sessions stay done
        assert {state_from_wire(cluster.state(node, session_id).state) for node in NODES} == {SessionState.DONE}


def test_raw_bytes_fuzz(cluster: FaultCluster, corpus: Corpus) -> None:
    """Bytes that do not parse as the RPC's request message at all (random bytes, valid
    messages cut or with huge length prefixes) on Deliver and Signal."""
    budget = FUZZ_MESSAGES - FUZZ_MESSAGES * 6 // 10 - FUZZ_MESSAGES * 2 // 10
    before = FAULTS.replies.copy()
    count = Counter()
    raw = st.one_of(
        st.binary(min_size=1, max_size=512),
        st.sampled_from(corpus.messages).map(lambda m: frames_of("x", m[2])[0].SerializeToString()[: len(m[2]) // 2]),
        st.integers(1 << 20, (1 << 32) - 1).map(lambda n: b"\x2a" + _varint(n) + b"abc"),  # field 5 (data) claims n bytes
    )

    @settings(max_examples=budget, **SETTINGS)
    @given(st.sampled_from(["Deliver", "Signal"]), st.sampled_from(NODES), raw)
    def fuzz(method, target, data) -> None:
        count["n"] += 1
        channel = cluster.channel(target, PARTIES[0] if target != PARTIES[0] else PARTIES[1])
        path = f"/cels.v1.CelsNode/{method}"
        if method == "Deliver":
            rpc = channel.stream_unary(path, request_serializer=None, response_deserializer=None)
            call = lambda: rpc(iter([data]), timeout=CALL_DEADLINE)  # noqa: E731
        else:
            rpc = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            call = lambda: rpc(data, timeout=CALL_DEADLINE)  # noqa: E731
        classify(f"{method}(raw)", call, {"OK"} if method == "Signal" and parses_as_probe(data) else set())

    fuzz()
    assert count["n"] >= budget
    replies = FAULTS.replies - before
    assert not cluster.crashed()
    assert not replies["Deliver(raw):unexpected"] and not replies["Signal(raw):unexpected"], dict(replies)


def parses_as_probe(data: bytes) -> bool:
    """Random bytes that happen to be a valid PROBE (a read: OK is its answer)."""
    try:
        return cels_pb2.SessionSignal.FromString(data).kind == cels_pb2.SessionSignal.PROBE
    except DecodeError:
        return False


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def late_phase(envelope: cels_pb2.Envelope) -> bool:
    """Whether a recorded message (of any solve's session) belongs to the sampling or the union."""
    step = envelope.WhichOneof("step")
    charged = next(c for c in SESSION_CHARGES.values() if step in c)
    return phase_of(envelope, charged) in ("sampling", "union")


def test_out_of_order_into_a_live_session(cluster: FaultCluster, corpus: Corpus) -> None:
    """Recorded sampling and union messages re-addressed to a session that is only prepared on
    the target (StartSession from the initiator's certificate, short deadline): each is refused
    (FAILED_PRECONDITION after the reorder window, or INVALID_ARGUMENT)."""
    options = cluster.options(deadline=2.0)
    start = cels_pb2.Envelope(session_id=options.session_id, sender=PARTIES[0], start_session=cels_pb2.StartSession(config=options.to_config()))
    for node in (PARTIES[1], SOLVER):
        cluster.stub(node, PARTIES[0]).Deliver(iter(frames_of(options.session_id, start.SerializeToString())), timeout=CALL_DEADLINE)
    codes = Counter()
    late = [m for m in corpus.messages if m[0] in (PARTIES[1], SOLVER) and late_phase(cels_pb2.Envelope.FromString(m[2]))]
    for target, sender, data in late[:: max(1, len(late) // 12)][:12]:
        envelope = cels_pb2.Envelope.FromString(data)
        envelope.session_id = options.session_id
        for field in envelope.DESCRIPTOR.oneofs_by_name["step"].fields:
            if envelope.HasField(field.name) and "session_id" in getattr(envelope, field.name).DESCRIPTOR.fields_by_name:
                getattr(envelope, field.name).session_id = options.session_id
        stub = cluster.stub(target, sender)
        codes[classify("Deliver(live)", lambda: stub.Deliver(iter(frames_of(options.session_id, envelope.SerializeToString())), timeout=CALL_DEADLINE), set())] += 1
    assert sum(codes.values()) >= 8 and set(codes) <= ACCEPTED, codes


def test_an_impossible_row_count_is_invalid_argument_and_aborts_the_session(cluster: FaultCluster) -> None:
    """Issue 23 item 12 on a node process: in a transformed session P_1 claims 2^32 - 1
    constraint rows and the others 1.  The l they need does not fit NlpKey.ell (the solver
    answered "Exception calling application: Value out of range", and the session stayed
    running); now the shape completing the set is refused with INVALID_ARGUMENT and the
    solver's session is aborted."""
    options = cluster.options(solve="transformed", deadline=30.0)
    sid = options.session_id
    start = cels_pb2.Envelope(session_id=sid, sender=PARTIES[0], start_session=cels_pb2.StartSession(config=options.to_config()))
    cluster.stub(SOLVER, PARTIES[0]).Deliver(iter(frames_of(sid, start.SerializeToString())), timeout=CALL_DEADLINE)
    codes = []
    for party, rows in zip(PARTIES, [(1 << 32) - 1, 1, 1]):
        shape = cels_pb2.ConstraintShape(session_id=sid, party=party, rows=rows)
        data = cels_pb2.Envelope(session_id=sid, sender=party, constraint_shape=shape).SerializeToString()
        stub = cluster.stub(SOLVER, party)
        codes.append(classify("Deliver(rows)", lambda: stub.Deliver(iter(frames_of(sid, data)), timeout=CALL_DEADLINE), {"OK"}, f"{rows} rows"))
    assert codes == ["OK", "OK", "INVALID_ARGUMENT"], (codes, UNEXPECTED.get("Deliver(rows)"))
    state = cluster.state(SOLVER, sid)
    # the solver tells its peers a protocol error with no number (the sizes went to the sender's refusal)
    assert state_from_wire(state.state) is SessionState.ABORTED and state.abort.origin == SOLVER and state.abort.kind == cels_pb2.Abort.PROTOCOL_ERROR, state
    assert not any(ch.isdigit() for ch in state.abort.reason), state
    assert not cluster.crashed()


def test_a_frame_over_the_grpc_limit_is_resource_exhausted(cluster: FaultCluster, corpus: Corpus) -> None:
    """The one stated exception: a single gRPC message over 4 MB (CHANNEL_OPTIONS' limit) is
    refused by gRPC itself with RESOURCE_EXHAUSTED, before any node code runs; the node is
    unaffected.  (Envelopes of any size travel as 1 MiB Frames.)"""
    target, sender, data = corpus.messages[0]
    frame = cels_pb2.Frame(session_id=corpus.sessions[0], message_id=1, index=0, last=True, data=data + bytes(5 << 20))
    code = classify("Deliver(over 4 MB)", lambda: cluster.stub(target, sender).Deliver(iter([frame]), timeout=CALL_DEADLINE), {"RESOURCE_EXHAUSTED"})
    assert code == "RESOURCE_EXHAUSTED"
    assert state_from_wire(cluster.state(target, corpus.sessions[0]).state) is SessionState.DONE


def test_an_overlong_session_id_is_refused_as_invalid(cluster: FaultCluster, corpus: Corpus) -> None:
    long_id = "s" * 50_000
    target, sender, data = corpus.messages[0]
    envelope = cels_pb2.Envelope.FromString(data)
    envelope.session_id = long_id
    deliver = classify("Deliver(long id)", lambda: cluster.stub(target, sender).Deliver(iter(frames_of(long_id, envelope.SerializeToString())), timeout=CALL_DEADLINE), set())
    begin = cels_pb2.SessionSignal(session_id=long_id, kind=cels_pb2.SessionSignal.BEGIN)
    signal = classify("Signal(long id)", lambda: cluster.stub(target, sender).Signal(begin, timeout=CALL_DEADLINE), set())
    assert {deliver, signal} <= ACCEPTED, (deliver, signal)


def test_nodes_serve_a_session_after_fuzzing(cluster: FaultCluster, corpus: Corpus, tmp_path: Path) -> None:
    assert all(run.process.poll() is None for run in cluster.runs.values()), cluster.crashed()
    report = cluster.run(cluster.options(), tmp_path / "after")
    assert report["solver"]["integer_total"] == sum(1 for _ in open(tmp_path / "after" / "sanitized.tsv")) - 1
