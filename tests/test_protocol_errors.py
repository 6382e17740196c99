"""Protocol errors: unknown session, out of order, unexpected sender -> failed_precondition;
malformed content -> invalid_argument; an Abort stops every role and nothing is output."""

from __future__ import annotations

import contextlib
import time


import secrets

import pytest

from cels.logs import LogError, synthetic_log
from cels.inprocess import InMemoryNetwork
from cels.protocol.roles import ProtocolError
from cels.inprocess import run_session, session_hosts, start_session
from cels.protocol.aborts import DIED, PROTOCOL_ERROR
from cels.protocol.options import DEFAULT_ELL_RATIO, SessionOptions
from cels.protocol.stages import universe
from cels.protocol.transform import agreed_ell
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_from_wire

TEST_KEYS = {"key_bits": 256, "group_bits": 1024, "solve": "transformed"}  # NLP messages to break


@pytest.fixture(scope="module")
def logs():
    log = synthetic_log(seed=11, users=36)
    return log.split_by_user(3)


def config(**options):
    return SessionOptions.create(3, epsilon=8.0, delta=0.9, objective="max-output", **TEST_KEYS, **options)


def prepared(logs, cfg):
    """Hosts with the session created on every node, nothing sent yet."""
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    start = cels_pb2.Envelope(session_id=cfg.session_id, start_session=cels_pb2.StartSession(config=cfg.to_config()))
    for host in hosts.values():
        assert host.receive("party-1", start) == []
    return hosts


def envelope(session_id, sender="party-1", **step):
    return cels_pb2.Envelope(session_id=session_id, sender=sender, **step)


def code_of(call) -> str:
    with pytest.raises(ProtocolError) as err:
        call()
    return err.value.code


class Intercept:
    """Wraps a host: ``action(host, sender, envelope)`` replaces delivery of one step."""

    def __init__(self, host, step, action) -> None:
        self.host, self.step, self.action = host, step, action

    def receive(self, sender, env):
        if env.WhichOneof("step") == self.step:
            return self.action(self.host, sender, env)
        return self.host.receive(sender, env)


def test_unknown_session_is_failed_precondition(logs) -> None:
    hosts = prepared(logs, config())
    msg = envelope("no-such-session", universe_index=cels_pb2.UniverseIndex(session_id="no-such-session"))
    assert code_of(lambda: hosts["party-2"].receive("party-1", msg)) == ProtocolError.FAILED_PRECONDITION


def test_out_of_order_and_unexpected_sender_are_failed_precondition(logs) -> None:
    cfg = config()
    hosts = prepared(logs, cfg)
    sid = cfg.session_id
    solution = envelope(sid, "solver", nlp_solution=cels_pb2.NlpSolution(session_id=sid, x=[1, 2]))
    assert code_of(lambda: hosts["party-3"].receive("solver", solution)) == ProtocolError.FAILED_PRECONDITION
    shape = envelope(sid, constraint_shape=cels_pb2.ConstraintShape(session_id=sid, party="party-1", rows=3))
    assert code_of(lambda: hosts["party-2"].receive("party-1", shape)) == ProtocolError.FAILED_PRECONDITION
    # party-2's predecessor is party-1: a hop from party-3 is refused, so is a stranger
    hop = cels_pb2.UniverseHop(session_id=sid, owner="party-3", applied=["party-3"], ids=bytes(32))
    assert code_of(lambda: hosts["party-2"].receive("party-3", envelope(sid, "party-3", universe_hop=hop))) == (
        ProtocolError.FAILED_PRECONDITION
    )
    assert code_of(lambda: hosts["party-2"].receive("mallory", envelope(sid, "mallory", universe_hop=hop))) == (
        ProtocolError.FAILED_PRECONDITION
    )
    # the same StartSession twice
    start = envelope(sid, start_session=cels_pb2.StartSession(config=cfg.to_config()))
    assert code_of(lambda: hosts["solver"].receive("party-1", start)) == ProtocolError.FAILED_PRECONDITION


def test_malformed_messages_are_invalid_argument(logs) -> None:
    cfg = config()
    hosts = prepared(logs, cfg)
    sid = cfg.session_id
    bad = cfg.to_config()
    bad.session_id, bad.sampling = "other", "bogus"
    start = envelope("other", start_session=cels_pb2.StartSession(config=bad))
    assert code_of(lambda: hosts["party-1"].receive("party-1", start)) == ProtocolError.INVALID_ARGUMENT
    # ids that are not a whole number of x25519 elements in a universe hop from the right sender
    hop = cels_pb2.UniverseHop(session_id=sid, owner="party-1", applied=["party-1"], ids=b"short")
    assert code_of(lambda: hosts["party-2"].receive("party-1", envelope(sid, universe_hop=hop))) == (
        ProtocolError.INVALID_ARGUMENT
    )


def intercepted_error(logs, node: str, step: str, tamper) -> ProtocolError:
    """Run a session in which ``tamper(envelope)`` changes every ``step`` message ``node``
    receives; return the ProtocolError it raises."""

    def deliver(host, sender, env):
        tamper(sender, env)
        return host.receive(sender, env)

    return refused(logs, node, step, deliver)


def refused(logs, node: str, step: str, action) -> ProtocolError:
    """Run a session in which ``action(host, sender, envelope)`` replaces the delivery of every
    ``step`` message to ``node``; return the ProtocolError it raises."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    hosts[node] = Intercept(hosts[node], step, action)
    with pytest.raises(ProtocolError) as err:
        start_session(InMemoryNetwork(hosts), cfg)
    return err.value


def test_malformed_encrypted_matrix_is_invalid_argument(logs) -> None:
    def truncate(_sender, env):
        env.nlp_sum_hop.at.ciphertexts[0] = env.nlp_sum_hop.at.ciphertexts[0][:-1]

    err = intercepted_error(logs, "party-2", "nlp_sum_hop", truncate)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "nlp_sum_hop.at" in str(err)


def test_abort_mid_session_stops_every_role_and_nothing_is_output(logs) -> None:
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    inner = hosts["party-3"]
    hosts["party-3"] = Intercept(
        inner, "nlp_key", lambda node, _s, env: node.host.abort(env.session_id, "party-3", DIED, "simulated crash", 0.0).messages
    )
    roles = start_session(InMemoryNetwork(hosts), cfg)
    for name, role in roles.items():
        assert role.aborted is not None, name
        assert (role.aborted.origin, role.aborted.kind, phase_from_wire(role.aborted.phase), role.aborted.reason) == ("party-3", DIED, "nlp", "simulated crash")
    lead = roles["party-1"]
    assert lead.output is None and lead.report is None and not lead.finished
    late = envelope(cfg.session_id, "solver", nlp_key=cels_pb2.NlpKey(session_id=cfg.session_id))
    assert code_of(lambda: lead.receive("solver", late)) == ProtocolError.FAILED_PRECONDITION


def test_a_malformed_log_aborts_and_the_initiator_names_the_party(logs) -> None:
    def broken():
        raise LogError("party-2.tsv", 17, "query", "empty query")

    with pytest.raises(RuntimeError) as err:
        run_session([logs[0], broken, logs[2]], config(), allow_insecure_key_bits=True)
    message = str(err.value)
    assert "party-2" in message and "party-2.tsv, line 17, field 'query': empty query" in message


def test_a_truncated_gzip_log_aborts_naming_the_party_the_file_and_the_last_line(logs, tmp_path) -> None:
    """Issue 23 item 13: ``cels run`` said "cannot load the log: Compressed file ended before the
    end-of-stream marker was reached", without the file."""
    import gzip

    from cels.logs import LoadOptions, load_log, write_log

    whole = tmp_path / "party-2.tsv"
    write_log(logs[1], whole)
    data = gzip.compress(whole.read_bytes())
    truncated = tmp_path / "party-2.tsv.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError) as err:
        run_session([logs[0], lambda: load_log(truncated, LoadOptions("aol")), logs[2]], config(), allow_insecure_key_bits=True)
    message = str(err.value)
    assert "party-2" in message and f"cannot load the log: {truncated}: the compressed data ends after line " in message


# ---------------------------------------------------------------- mutated inputs (issue 13 item 11)


def raw_ciphertext(host, plaintext, width: int) -> bytes:
    """An encryption of ``plaintext`` (an int < N, or "max": N - 1) under the receiving role's key."""
    role = host.role(host.sessions and next(iter(host.sessions)))
    key = role.public_key if not hasattr(role, "sums") else next(iter(role.sums.running.values())).public_key
    n, nsq = int(key.n), int(key.nsquare)
    m = n - 1 if plaintext == "max" else plaintext
    r = 2 + secrets.randbelow(n - 3)
    return ((1 + m * n) * pow(r, n, nsq) % nsq).to_bytes(width, "big")


def double_offset(matrix: cels_pb2.EncryptedMatrix) -> None:
    offset = 2 * int.from_bytes(matrix.packing.offset, "big")
    matrix.packing.offset = offset.to_bytes((offset.bit_length() + 7) // 8, "big")


def other_scale(step: int):
    def mutate(matrix: cels_pb2.EncryptedMatrix) -> None:
        matrix.packing.scale_bits += step

    return mutate


def plaintext(value):
    def forge(matrix, host) -> None:
        width = len(matrix.ciphertexts[0])
        for k in range(len(matrix.ciphertexts)):
            matrix.ciphertexts[k] = raw_ciphertext(host, value, width)

    forge.needs_host = True
    return forge


MUTATIONS = {
    "doubled offset": (double_offset, "packing."),
    "scale + 1": (other_scale(1), "packing.scale_bits"),
    "scale - 1": (other_scale(-1), "packing."),
    "zero plaintext": (plaintext(0), "limit"),
    "oversized plaintext": (plaintext("max"), "wider than its packing"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize(("step", "field"), [("nlp_slack_block", "af"), ("nlp_sum_hop", "ab"), ("nlp_permute_hop", "at")])
def test_mutated_solver_inputs_are_refused_at_their_step(logs, step: str, field: str, mutation: str) -> None:
    """Issue 13 item 11: a solver input with a doubled packing offset, a wrong scale, or a forged
    plaintext is refused by the solver when it arrives, INVALID_ARGUMENT naming the field --
    not taken with OK only for the session to abort later, blaming the solver."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    mutate, named = MUTATIONS[mutation]
    seen = []

    def tamper(node, sender, env):
        matrix = getattr(getattr(env, step), field)
        if seen:  # one slack block is enough
            return node.receive(sender, env)
        seen.append(sender)
        mutate(matrix, node.host) if getattr(mutate, "needs_host", False) else mutate(matrix)
        return node.receive(sender, env)

    hosts["solver"] = Intercept(hosts["solver"], step, tamper)
    with pytest.raises(ProtocolError) as err:
        start_session(InMemoryNetwork(hosts), cfg)
    assert seen and err.value.code == ProtocolError.INVALID_ARGUMENT, err.value
    assert f"{field}: " in str(err.value) and named in str(err.value), str(err.value)


@pytest.mark.parametrize("mutation", ["oversized", "below own"])
def test_a_forged_sum_result_is_refused_by_the_receiving_party(logs, mutation: str) -> None:
    """A SumResult value outside what the parties' bounded shares can sum to (or, for counts,
    below the receiver's own count) is INVALID_ARGUMENT at the receiver."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)

    def tamper(node, sender, env):
        values = env.sum_result.values
        values[0] = (1 << 62) if mutation == "oversized" else -1
        return node.receive(sender, env)

    hosts["party-2"] = Intercept(hosts["party-2"], "sum_result", tamper)
    with pytest.raises(ProtocolError) as err:
        start_session(InMemoryNetwork(hosts), cfg)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT and "sum_result" in str(err.value), err.value


def test_a_zero_plaintext_in_the_last_sum_hop_is_refused_by_the_key_holder(logs) -> None:
    """Counts are non-negative: a last hop that decrypts below the key holder's own counts
    (here an encryption of 0: every slot at -bound) is refused when it arrives."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)

    def tamper(node, sender, env):
        if sender == "party-3":
            plaintext(0)(env.sum_hop.partial, node.host)
        return node.receive(sender, env)

    hosts["party-1"] = Intercept(hosts["party-1"], "sum_hop", tamper)
    with pytest.raises(ProtocolError) as err:
        start_session(InMemoryNetwork(hosts), cfg)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT and "sum_hop" in str(err.value), err.value


@pytest.mark.parametrize(
    "tamper, detail",
    [
        (lambda m: m.columns.reverse(), "not strictly increasing"),
        (lambda m: m.columns.pop(), "columns for"),
        (lambda m: setattr(m, "size", m.columns[-1]), "not strictly increasing below the index size"),
        (lambda m: setattr(m, "size", 2**32 - 1), "more than the"),
    ],
)
def test_bad_universe_index_is_invalid_argument(logs, tamper, detail) -> None:
    """P_1 sends each party only the index size and its own ids' columns: checked on arrival
    (a size above every party's ids together would make the count vectors huge)."""
    err = intercepted_error(logs, "party-2", "universe_index", lambda _sender, env: tamper(env.universe_index))
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert detail in str(err)


def test_unsorted_complete_universe_set_is_invalid_argument(logs) -> None:
    def unsort(sender, env):
        hop = env.universe_hop
        if len(hop.applied) == 3 and hop.owner == sender:  # a complete set on its way to P_1
            hop.ids = b"".join(reversed(hop_ids(hop, UNION_KEY)))

    err = intercepted_error(logs, "party-1", "universe_hop", unsort)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "not sorted and distinct" in str(err)


def test_own_universe_ids_returned_with_a_repeat_are_invalid_argument(logs) -> None:
    """P_1's own ids come back from its predecessor in the order they left, not sorted: two
    equal ones would be two columns of one id in P_1's merged union, so they are refused."""

    def repeat(sender, env):
        hop = env.universe_hop
        if len(hop.applied) == 3 and hop.owner == "party-1":  # P_1's own ids, every layer applied
            ids = hop_ids(hop, X25519_ID)
            hop.ids = b"".join([ids[0], ids[0], *ids[2:]])

    err = intercepted_error(logs, "party-1", "universe_hop", repeat)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "party-1: return of its own universe ids: two of its ids came back equal" in str(err)


# ---------------------------------------------------------------- the universe's chunks (issue 25)

CHUNK = 8  # ids per universe message in these tests: every party's 65..171 pairs span many chunks


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(universe, "STREAM_IDS", CHUNK)


X25519_ID, UNION_KEY = 32, 16  # bytes of an id on a ring hop, of a complete set's id (universe.union_keys)


def hop_ids(hop: cels_pb2.UniverseHop, width: int) -> list[bytes]:
    """A UniverseHop's packed ids, one by one."""
    return [hop.ids[i : i + width] for i in range(0, len(hop.ids), width)]


def complete_set(sender, env) -> bool:
    """A chunk of a party's complete ids on its way to P_1."""
    return len(env.universe_hop.applied) == 3 and env.universe_hop.owner == sender


def test_a_gap_in_a_forwarded_list_is_failed_precondition(logs, small_chunks) -> None:
    """Party-2 forwards party-1's ids chunk by chunk: a lost chunk shows as the next one's first."""

    def drop_second(host, sender, env):
        return [] if env.universe_hop.first == CHUNK and env.universe_hop.owner == "party-1" else host.receive(sender, env)

    err = refused(logs, "party-2", "universe_hop", drop_second)
    assert err.code == ProtocolError.FAILED_PRECONDITION
    assert f"universe_hop of party-1: a chunk from {2 * CHUNK} on, expected the one from {CHUNK} on" in str(err)


def test_a_repeated_chunk_is_failed_precondition(logs, small_chunks) -> None:
    def twice(host, sender, env):
        out = host.receive(sender, env)
        if env.universe_hop.first == CHUNK:
            out += host.receive(sender, env)
        return out

    err = refused(logs, "party-2", "universe_hop", twice)
    assert err.code == ProtocolError.FAILED_PRECONDITION
    assert f"a chunk from {CHUNK} on, expected the one from {2 * CHUNK} on" in str(err)


def test_a_chunk_beyond_the_list_is_failed_precondition(logs, small_chunks) -> None:
    """Party-2's own ids come back with a chunk placed beyond its list (and its first chunk missing)."""

    def beyond(sender, env):
        hop = env.universe_hop
        if hop.owner == "party-2" and len(hop.applied) == 3 and hop.first == 0:
            hop.first = 2**32 - 1

    err = intercepted_error(logs, "party-2", "universe_hop", beyond)
    assert err.code == ProtocolError.FAILED_PRECONDITION
    assert f"return of its own universe ids: a chunk from {2**32 - 1} on, expected the one from 0 on" in str(err)


def test_a_chunk_after_the_last_is_failed_precondition(logs, small_chunks) -> None:
    def again(host, sender, env):
        out = host.receive(sender, env)
        if not env.universe_hop.more:
            out += host.receive(sender, env)
        return out

    err = refused(logs, "party-3", "universe_hop", again)
    assert err.code == ProtocolError.FAILED_PRECONDITION
    assert "a chunk after the last one" in str(err)


@pytest.mark.parametrize(
    "tamper, detail",
    [
        (lambda hop: setattr(hop, "ids", hop.ids + hop.ids[:X25519_ID]), f"a chunk of {CHUNK + 1} items"),
        (lambda hop: setattr(hop, "more", True) or setattr(hop, "ids", b""), "a chunk of 0 items"),
    ],
)
def test_a_chunk_of_a_wrong_size_is_invalid_argument(logs, small_chunks, tamper, detail) -> None:
    err = intercepted_error(logs, "party-2", "universe_hop", lambda _sender, env: tamper(env.universe_hop))
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert detail in str(err)


def test_a_complete_set_unsorted_across_chunks_is_invalid_argument(logs, small_chunks) -> None:
    """Each chunk sorted, but the second repeats the first's ids: not increasing across the boundary."""
    first_chunk = {}

    def repeat_first(sender, env):
        hop = env.universe_hop
        if complete_set(sender, env):
            if hop.first == 0:
                first_chunk[sender] = hop.ids
            elif hop.first == CHUNK:
                hop.ids = first_chunk[sender]

    err = intercepted_error(logs, "party-1", "universe_hop", repeat_first)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "are not sorted and distinct" in str(err)


def test_a_complete_set_longer_than_the_list_that_passed_is_invalid_argument(logs, small_chunks) -> None:
    """P_1 forwarded every other party's ids once: a complete set with one more chunk (its last
    chunk delivered as "more follow", then an extra id after it) is refused."""

    def extra(host, sender, env):
        hop = env.universe_hop
        if not complete_set(sender, env) or hop.more:
            return host.receive(sender, env)
        hop.more = True
        out = host.receive(sender, env)
        hop.first, hop.more = hop.first + len(hop.ids) // UNION_KEY, False
        hop.ids = b"\xff" * UNION_KEY  # a union key (a complete set's ids)
        return out + host.receive(sender, env)

    err = refused(logs, "party-1", "universe_hop", extra)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "ids so far" in str(err) and "passed party-1" in str(err), err


@pytest.mark.parametrize(
    "tamper, detail",
    [
        (lambda m: m.columns.__setitem__(0, 0) if m.first else None, "not strictly increasing"),
        (lambda m: setattr(m, "size", m.size - 1) if m.first else None, "an earlier chunk said"),
    ],
)
def test_index_chunks_not_increasing_across_chunks_are_invalid_argument(logs, small_chunks, tamper, detail) -> None:
    """Party-2's columns come in chunks: each must continue the last (and keep the index size)."""
    err = intercepted_error(logs, "party-2", "universe_index", lambda _sender, env: tamper(env.universe_index))
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert detail in str(err)


def test_every_universe_message_is_within_the_chunk_bound(logs, small_chunks) -> None:
    """Every UniverseHop carries at most STREAM_IDS ids, every UniverseIndex at most STREAM_IDS columns."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    seen = []

    def watch(host, sender, env):
        if env.HasField("universe_hop"):
            seen.append(len(env.universe_hop.ids) // (UNION_KEY if complete_set(sender, env) else X25519_ID))
        else:
            seen.append(len(env.universe_index.columns))
        return host.receive(sender, env)

    for name in cfg.parties:
        hosts[name] = Intercept(Intercept(hosts[name], "universe_hop", watch), "universe_index", watch)
    network = InMemoryNetwork(hosts)
    start_session(network, cfg)
    assert max(seen) == CHUNK and len(seen) > 40
    # on the wire: a chunk of 8 X25519 ids (34 bytes each with its tag) and the envelope's names
    sizes = [n for _src, _dst, step, n in network.log if step in ("universe_hop", "universe_index")]
    assert len(sizes) == len(seen) and max(sizes) <= CHUNK * 34 + 120


# ---------------------------------------------------------------- impossible sizes (issue 23 item 12)


def test_an_impossible_row_count_is_refused_and_aborts_the_solvers_session(logs) -> None:
    """Party-1 claims 2^32 - 1 constraint rows: l would not fit NlpKey's uint32 (the solver
    answered "Value out of range: 6442450946", an INTERNAL, and the session stayed running).
    Now the last shape is refused with INVALID_ARGUMENT, the session is aborted on the solver,
    and its Abort notices go out with the host's next expire."""
    cfg = config()
    hosts = prepared(logs, cfg)
    solver, sid = hosts["solver"].host, cfg.session_id

    def shape(party: str, rows: int):
        return envelope(sid, party, constraint_shape=cels_pb2.ConstraintShape(session_id=sid, party=party, rows=rows))

    assert solver.deliver("party-1", shape("party-1", 2**32 - 1), 0.0).messages == []
    assert solver.deliver("party-2", shape("party-2", 1), 0.0).messages == []
    with pytest.raises(ProtocolError) as err:
        solver.deliver("party-3", shape("party-3", 1), 0.0)
    assert err.value.code == ProtocolError.INVALID_ARGUMENT
    assert "rows {'party-1': 4294967295, 'party-2': 1, 'party-3': 1} need l = 6442450946 rows of A, more than the 4294967295" in str(err.value)
    state, notice = solver.state(sid)
    assert (state, notice.origin, notice.kind) == ("aborted", "solver", PROTOCOL_ERROR)
    assert not any(ch.isdigit() for ch in notice.reason)  # the sizes stay in the refusal to the sender
    assert solver.role(sid).failure == str(err.value)
    effects = solver.expire(1.0)
    assert sorted(dst for dst, env in effects.messages if env.WhichOneof("step") == "abort") == ["party-1", "party-2", "party-3"]
    assert [e.kind for e in effects.events] == ["aborted"] and solver.expire(2.0).messages == []
    assert code_of(lambda: solver.deliver("party-1", shape("party-1", 1), 3.0)) == ProtocolError.FAILED_PRECONDITION


def refused_at(logs, node: str, step: str, tamper) -> tuple[ProtocolError, tuple[str, cels_pb2.Abort | None]]:
    """Run a session in which ``tamper(envelope)`` changes the first ``step`` message ``node``
    receives; return the refusal and that node's session state afterwards."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    host = hosts[node].host
    caught: list[ProtocolError] = []

    def deliver(_node, sender, env):
        tamper(env)
        try:
            return host.deliver(sender, env, 0.0).messages
        except ProtocolError as exc:
            caught.append(exc)
            return []

    hosts[node] = Intercept(hosts[node], step, deliver)
    start_session(InMemoryNetwork(hosts), cfg)
    assert len(caught) == 1, caught
    return caught[0], host.state(cfg.session_id)


def inflate_rows(env) -> None:
    """P_1 claimed a million rows, and l agrees with that sum."""
    env.nlp_key.shape_rows[0] = 10**6
    env.nlp_key.ell = agreed_ell(sum(env.nlp_key.shape_rows), DEFAULT_ELL_RATIO)


@pytest.mark.parametrize(
    "tamper,detail",
    [
        (lambda env: setattr(env.nlp_key, "ell", env.nlp_key.ell + 1), "do not fit this party"),
        (lambda env: setattr(env.nlp_key, "ell", 2**32 - 1), "do not fit this party"),
        (inflate_rows, "constraint rows, more than the"),
    ],
)
def test_an_nlp_key_whose_sizes_do_not_add_up_is_refused_and_aborts(logs, tamper, detail) -> None:
    """A party allocates l x m_k and (l + 1) x n from NlpKey: l must be what the rows give
    (agreed_ell), and the rows no more than the records of the pairs they constrain."""
    error, (state, notice) = refused_at(logs, "party-2", "nlp_key", tamper)
    assert error.code == ProtocolError.INVALID_ARGUMENT and detail in str(error)
    assert (state, notice.origin) == ("aborted", "party-2")


def test_a_solution_count_past_int64_is_refused_and_aborts(logs) -> None:
    """NlpSolution.x is uint64: 2^64 - 1 was an OverflowError (INTERNAL) in the party."""
    error, (state, notice) = refused_at(logs, "party-3", "nlp_solution", lambda env: env.nlp_solution.x.__setitem__(0, 2**64 - 1))
    assert error.code == ProtocolError.INVALID_ARGUMENT and "holds a count 18446744073709551615 above 9007199254740992" in str(error)
    assert (state, notice.origin) == ("aborted", "party-3")


def test_complete_universe_ids_as_union_keys_are_checked(logs) -> None:
    """An owner sends P_1 its complete set as each id's first 16 bytes (union_keys): a repeated
    key (two ids that differ only after them would be one column; for honest X25519 ids this
    happens with probability about n^2 / 2^129) or bytes that are not a whole number of keys
    are refused."""

    def twin(sender, env):
        hop = env.universe_hop
        if hop.owner == "party-2" and sender == "party-2" and len(hop.ids) > UNION_KEY:  # its complete, sorted keys to P_1
            keys = hop_ids(hop, UNION_KEY)
            hop.ids = b"".join([keys[0], keys[0], *keys[2:]])

    def torn(sender, env):
        hop = env.universe_hop
        if hop.owner == "party-2" and sender == "party-2":
            hop.ids += bytes(UNION_KEY // 2)  # half a key more

    err = intercepted_error(logs, "party-1", "universe_hop", torn)
    assert err.code == ProtocolError.INVALID_ARGUMENT and "not a whole number of 16-byte ids" in str(err)
    err = intercepted_error(logs, "party-1", "universe_hop", twin)
    assert err.code == ProtocolError.INVALID_ARGUMENT
    assert "complete universe ids of party-2 are not sorted and distinct" in str(err)


def test_a_universe_index_before_the_complete_set_left_is_refused_and_aborts(logs) -> None:
    """Issue 41 finding 23: on a node, a party's sorted complete ids leave as its link drains,
    and a UniverseIndex that came before the first of them was a numpy shape error (UNKNOWN at
    the node) while the session ran on.  Now it is out of order: FAILED_PRECONDITION.  In
    memory the host hands a Stream over at once, so the test puts party-2 back in the
    node's state (its ids are back, the complete set has not begun to leave) first."""
    cfg = config()
    hosts = session_hosts(logs, cfg, allow_insecure_key_bits=True)
    seen: dict = {}

    def early_index(node, sender, env):
        out = node.receive(sender, env)
        if env.universe_hop.owner == "party-2" and not env.universe_hop.more and "code" not in seen:  # its own ids are all back
            role = node.host.role(cfg.session_id)
            role.stage.complete_sent = False  # as on a node whose link has not drained to the complete set
            n = role.work.log.own_pairs
            forged = envelope(cfg.session_id, universe_index=cels_pb2.UniverseIndex(size=n, first=0, columns=list(range(n)), more=False))
            try:
                node.host.deliver("party-1", forged, time.monotonic())  # the host's answer, as the node would send it
                seen["code"] = "accepted"
            except ProtocolError as exc:
                seen["code"], seen["message"] = exc.code, str(exc)
            except Exception as exc:  # noqa: BLE001 -- what the node would have answered UNKNOWN
                seen["code"] = f"crash: {exc!r}"
        return out

    hosts["party-2"] = Intercept(hosts["party-2"], "universe_hop", early_index)
    with contextlib.suppress(ProtocolError):
        start_session(InMemoryNetwork(hosts), cfg)
    assert seen["code"] == ProtocolError.INVALID_ARGUMENT, seen
    assert "universe_index before its complete ids left for party-1" in seen["message"]
    assert hosts["party-2"].host.host.role(cfg.session_id).aborted is not None  # the session does not run on
