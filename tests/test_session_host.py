"""SessionOptions (one conversion, resolved once) and the sans-I/O SessionHost lifecycle."""

from __future__ import annotations

import dataclasses

import pytest

from cels.protocol.phases import Phase, SessionState
from cels.inprocess import InMemoryNetwork, MemoryNode, session_hosts, start_session
from cels.logs import synthetic_log
from cels.mechanism.conditions import privacy_bound
from cels.protocol.aborts import DEADLINE, DIED, PROTOCOL_ERROR, abort_notice
from cels.protocol.hosted import ABORTED, DONE, HOST_STEPS, PREPARED, RUNNING, Step
from cels.protocol import masked_sum
from cels.protocol.options import DEFAULT_DEADLINE, SessionOptions
from cels.protocol.machines import PARTY, SOLVER
from cels.protocol.rolebase import RoleFailure
from cels.protocol.roles import ProtocolError, step_name
from cels.protocol.stages import universe
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import WIRE_PHASES, WIRE_STATES, phase_from_wire, phase_to_wire, state_from_wire, state_to_wire

TEST_KEYS = {"key_bits": 256, "group_bits": 1024}


def test_options_round_trip_through_the_wire() -> None:
    options = SessionOptions.create(
        ["a", "b", "c"], epsilon=2.0, delta=0.3, objective="max-output", cap=4, min_count=3, noise_epsilon=0.5,
        sensitivity=2.0, deadline=12.5, solve="transformed", addresses={"a": "h:1", "solver": "h:9"}, initiator="b",
    )  # fmt: skip
    assert SessionOptions.from_config(options.to_config()) == options
    assert options.b == pytest.approx(privacy_bound(2.0, 0.3, "cels"))
    assert options.to_config().deadline_ms == 12_500 and options.address("solver") == "h:9"


def test_a_sparse_config_takes_every_default_once() -> None:
    sparse = cels_pb2.SessionConfig(
        session_id="s1", epsilon=1.0, delta=0.4, parties=[cels_pb2.NodeAddress(name=n) for n in ("p", "q")]
    )
    options = SessionOptions.from_config(sparse)
    defaults = SessionOptions.create(["p", "q"], session_id="s1", epsilon=1.0, delta=0.4)
    assert options == defaults
    assert (options.solver, options.initiator, options.key_bits, options.deadline) == ("solver", "p", 2048, DEFAULT_DEADLINE)
    assert options.cap is None and options.output_size is None and options.noise_epsilon is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"objective": "nope"}, "objective must be one of"),
        ({"sampling": "bogus"}, "sampling must be one of"),
        ({"key_bits": 255}, "key_bits must be even"),
        ({"sampling_theta": 1.5}, "sampling_theta"),
        ({"initiator": "solver"}, "initiator 'solver' is not a party"),
        ({"noise_epsilon": 1.0, "solve": "transformed"}, "--noise-epsilon and --sensitivity go together"),
        ({"output_size": 0.5}, "share of the LP bound"),
        ({"solve": "central"}, "solve must be one of"),
        ({"colour": "red"}, "unknown session option"),
    ],
)
def test_bad_options_are_refused_naming_the_field(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        SessionOptions.create(3, epsilon=1.0, delta=0.4, **change)


def test_options_are_immutable() -> None:
    options = SessionOptions.create(2, epsilon=1.0, delta=0.4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.epsilon = 5.0  # type: ignore[misc]


def _hosts():
    options = SessionOptions.create(3, epsilon=8.0, delta=0.9, deadline=30.0, solve="transformed", **TEST_KEYS)
    logs = synthetic_log(seed=3, users=24).split_by_user(3)
    return options, {n: node.host for n, node in session_hosts(logs, options, allow_insecure_key_bits=True).items()}


def test_a_session_that_is_never_begun_expires_at_its_deadline() -> None:
    options, hosts = _hosts()
    host = hosts["party-2"]
    created = host.create(options, now=100.0)
    assert created.wake_at == 130.0 and host.state(options.session_id)[0] == PREPARED
    assert host.expire(now=129.9).messages == []
    ended = host.expire(now=130.0)
    state, notice = host.state(options.session_id)
    assert state == ABORTED and (notice.origin, notice.kind, phase_from_wire(notice.phase), notice.reason) == ("party-2", DEADLINE, Phase.READY, "session was never begun")
    assert sorted(dst for dst, _ in ended.messages) == ["party-1", "party-3", "solver"]
    assert all(env.abort == notice for _, env in ended.messages)
    assert [e.kind for e in ended.events] == [ABORTED]
    assert ended.events[0].detail == "session was never begun within its deadline of 30s"  # the seconds: this node's log only


def test_a_refusal_after_abort_names_who_aborted() -> None:
    options, hosts = _hosts()
    host = hosts["party-3"]
    host.create(options, now=0.0)
    host.abort(options.session_id, "party-2", DIED, "stopped answering", now=1.0)
    late = cels_pb2.Envelope(session_id=options.session_id, sender="party-1", universe_index=cels_pb2.UniverseIndex())
    with pytest.raises(ProtocolError) as err:
        host.deliver("party-1", late, now=2.0)
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    assert err.value.abort.origin == "party-2" and err.value.abort.kind == DIED  # the sender blames party-2, not party-3
    sid = options.session_id
    assert str(err.value) == f"party-3: session {sid!r} is aborted: party-2 died in phase ready (stopped answering); step refused"


def test_an_abort_that_overtakes_start_session_ends_the_session_when_it_arrives() -> None:
    """party-2 stops and aborts while the initiator's StartSession to the solver is still on
    its way: the solver is born aborted, naming party-2, instead of waiting a deadline and
    blaming itself ("never begun").  A stranger's early abort changes nothing."""
    options, hosts = _hosts()
    host, sid = hosts["solver"], options.session_id
    early = cels_pb2.Envelope(session_id=sid, sender="party-2", abort=cels_pb2.Abort(session_id=sid, origin="party-2", kind=DIED, reason="node shutting down", phase=cels_pb2.PHASE_UNIVERSE))
    assert host.deliver("party-2", early, now=0.0).messages == [] and host.state(sid)[0] == "unknown"
    start = cels_pb2.Envelope(session_id=sid, sender="party-1", start_session=cels_pb2.StartSession(config=options.to_config()))
    effects = host.deliver("party-1", start, now=0.5)
    assert [e.kind for e in effects.events] == ["created", "phase", ABORTED] and effects.messages == []
    assert host.state(sid) == (ABORTED, early.abort)
    other = _hosts()[0]
    stranger = cels_pb2.Envelope(session_id=other.session_id, sender="mallory", abort=cels_pb2.Abort(session_id=other.session_id))
    host.deliver("mallory", stranger, now=1.0)
    start = cels_pb2.Envelope(session_id=other.session_id, sender="party-1", start_session=cels_pb2.StartSession(config=other.to_config()))
    host.deliver("party-1", start, now=1.5)
    assert host.state(other.session_id)[0] == PREPARED


def test_a_first_step_message_begins_a_prepared_session_and_finish_needs_the_role_done() -> None:
    options, hosts = _hosts()
    host = hosts["solver"]
    host.create(options, now=0.0)
    shape = cels_pb2.Envelope(
        session_id=options.session_id, sender="party-1", constraint_shape=cels_pb2.ConstraintShape(session_id=options.session_id, party="party-1", rows=2)
    )
    host.deliver("party-1", shape, now=1.0)
    assert host.state(options.session_id)[0] == RUNNING and host.role(options.session_id).phase == "nlp"
    with pytest.raises(ProtocolError, match="cannot finish"):
        host.finish(options.session_id, now=2.0)


def test_a_first_step_message_to_a_node_whose_begin_fails_leaves_its_abort_to_act_on(monkeypatch) -> None:
    """A peer's message overtakes this node's own BEGIN, and its begin fails (its log cannot be
    loaded): the host returns the abort (the event, the notices) instead of refusing the message
    and losing them, so the node's Run stream and log hear of it (found by the compose test)."""
    options, hosts = _hosts()
    host, sid = hosts["solver"], options.session_id
    host.create(options, now=0.0)

    def fails() -> list:
        raise RoleFailure("cannot load its log", "cannot load the log: line 2")

    monkeypatch.setattr(host.role(sid), "_begin", fails)
    shape = cels_pb2.Envelope(session_id=sid, sender="party-1", constraint_shape=cels_pb2.ConstraintShape(session_id=sid, party="party-1", rows=2))
    effects = host.deliver("party-1", shape, now=1.0)
    assert [e.kind for e in effects.events][-1] == ABORTED and effects.events[-1].detail == "cannot load the log: line 2"
    assert sorted(dst for dst, _ in effects.messages) == ["party-1", "party-2", "party-3"]
    assert all(env.abort.reason == "cannot load its log" and env.abort.origin == "solver" for _, env in effects.messages)
    assert host.state(sid)[0] == ABORTED


def test_every_step_message_has_a_taker() -> None:
    """The transition tables and the host together take every step of the one proto."""
    steps = {f.name for f in cels_pb2.Envelope.DESCRIPTOR.oneofs_by_name["step"].fields}
    taken = {step for machine in [*PARTY.values(), *SOLVER.values()] for row in machine.rows.values() for step in row.takes} | HOST_STEPS
    assert steps <= taken, steps - taken


def test_a_role_refuses_a_step_it_does_not_take_and_stays_unchanged() -> None:
    options, hosts = _hosts()
    host = hosts["party-2"]
    host.create(options, now=0.0)
    host.begin(options.session_id, now=0.0)
    role = host.role(options.session_id)
    before = role.phase
    shape = cels_pb2.Envelope(session_id=options.session_id, sender="party-1", constraint_shape=cels_pb2.ConstraintShape())
    with pytest.raises(ProtocolError, match="does not take constraint_shape"):
        host.deliver("party-1", shape, now=1.0)
    assert role.phase == before and role.aborted is None and step_name(shape) == "constraint_shape"


def test_mechanism_options_invert_params() -> None:
    from cels.protocol.options import mechanism_options

    options = SessionOptions.create(3, epsilon=2.0, delta=0.3, objective="frequent", cap=4, min_count=2, support=0.01, solve="transformed",
                                    noise_epsilon=0.5, sensitivity=3.0)  # fmt: skip
    again = SessionOptions.create(3, session_id=options.session_id, solve="transformed", **mechanism_options(options.params))
    assert again == options


def test_the_initiator_host_calls_start_then_begin_one_at_a_time_then_begins_itself() -> None:
    """Issue 24: the initiator's steps are the host's; the driver only makes each due call."""
    options, hosts = _hosts()
    host, sid, others = hosts["party-1"], options.session_id, ["party-2", "party-3", "solver"]
    effects = host.initiate(options, now=0.0)
    assert host.state(sid)[0] == PREPARED and [e.kind for e in effects.events] == ["created"]
    made = []
    while (call := host.next_call(sid)) is not None:
        assert effects.calls == [call]  # what became due is in the effects too
        made.append((call.step, call.node))
        if call.step is Step.START:
            assert call.phase is Phase.START and SessionOptions.from_config(call.envelope.start_session.config) == options
        effects = host.answered(sid, call.node, now=1.0)
    assert made == [(Step.START, n) for n in others] + [(Step.BEGIN, n) for n in others]
    assert host.state(sid)[0] == RUNNING and effects.messages  # its own begin: its first step messages
    with pytest.raises(ValueError, match="no call to 'party-2' is due"):
        host.answered(sid, "party-2", now=2.0)


def test_a_refused_start_session_aborts_naming_the_refusing_node_before_any_role_ran() -> None:
    options, hosts = _hosts()
    host, sid = hosts["party-1"], options.session_id
    host.initiate(options, now=0.0)
    host.answered(sid, "party-2", now=0.1)
    effects = host.unanswered(sid, "party-3", None, now=0.2, detail="party-3 said no")
    state, notice = host.state(sid)
    assert state == ABORTED and (notice.origin, notice.kind, phase_from_wire(notice.phase)) == ("party-3", PROTOCOL_ERROR, Phase.START)
    assert notice.reason == "start_session: refused it" and host.next_call(sid) is None
    assert sorted(dst for dst, _ in effects.messages) == ["party-2", "party-3", "solver"]
    assert [e.detail for e in effects.events] == ["party-3 said no"]


def test_finish_round_a_node_gone_keeps_the_release_a_refusal_aborts() -> None:
    """Once the initiator's role is finished the host calls FINISH everywhere, then finishes
    itself; a node that does not answer is noted, one that refuses aborts the session."""
    for refused in (False, True):
        options, hosts = _hosts()
        sid = options.session_id
        network = InMemoryNetwork({name: MemoryNode(host) for name, host in hosts.items()})
        lead = hosts["party-1"]
        lead.initiate(options, now=0.0)
        while (call := lead.next_call(sid)) is not None and call.step is not Step.FINISH:
            if call.step is Step.START:
                network.run([(call.node, call.envelope)], sender="party-1")
            else:
                network.run(hosts[call.node].begin(sid, 0.0).messages, sender=call.node)
            network.run(lead.answered(sid, call.node, now=0.0).messages, sender="party-1")
        assert lead.role(sid).finished and (call.step, call.node) == (Step.FINISH, "party-2")
        lead.answered(sid, "party-2", now=1.0)
        notice = abort_notice(sid, "party-3", DIED, "FINISH: stopped answering", Phase.OVER)
        effects = lead.unanswered(sid, "party-3", notice, now=1.0, detail="UNAVAILABLE", refused=refused)
        if refused:
            assert lead.state(sid) == (ABORTED, notice) and [e.kind for e in effects.events] == [ABORTED]
            continue
        assert lead.next_call(sid).node == "solver" and lead.gone_at_finish(sid) == {"party-3": "UNAVAILABLE"}
        assert [e.kind for e in lead.answered(sid, "solver", now=1.0).events] == [DONE]
        assert lead.state(sid)[0] == DONE and lead.gone_at_finish(sid) == {"party-3": "UNAVAILABLE"}


def test_the_wire_enums_mirror_the_phases_and_states() -> None:
    """Every Phase and SessionState has its proto value and back; nothing else on the wire."""
    assert {phase_from_wire(phase_to_wire(p)) for p in Phase} == set(Phase)
    assert set(WIRE_PHASES.values()) == set(cels_pb2.Phase.values()) - {cels_pb2.PHASE_UNSPECIFIED}
    assert phase_from_wire(cels_pb2.PHASE_UNSPECIFIED) is None and phase_from_wire(99) is None and phase_to_wire(None) == 0
    assert {state_from_wire(state_to_wire(s)) for s in SessionState} == set(SessionState)
    assert set(WIRE_STATES.values()) == set(cels_pb2.SessionState.State.values()) and state_from_wire(99) is SessionState.UNKNOWN


def _seeded_session(send_window: int | None) -> tuple[dict, InMemoryNetwork, list[int]]:
    """A seeded private-mode session in memory; with ``send_window`` every party host hands its
    Streams over a window at a time; also the number of messages of each drained call."""
    options = SessionOptions.create(3, epsilon=8.0, delta=0.9, session_id="streams", **TEST_KEYS)
    logs = synthetic_log(seed=5, users=60, pairs=400).split_by_user(3)
    nodes = session_hosts(logs, options, seed=11, allow_insecure_key_bits=True)
    per_call: list[int] = []
    for name in options.parties:
        host = nodes[name].host
        host.send_window = send_window
        drained = host.drained

        def counted(sid, now, drained=drained):
            effects = drained(sid, now)
            per_call.append(len(effects.messages))
            return effects

        host.drained = counted
    network = InMemoryNetwork(nodes)
    return start_session(network, options), network, per_call


def test_streams_handed_over_a_window_at_a_time_give_the_same_session(monkeypatch) -> None:
    """Issue 25: a party's own universe ids and its masked shares are Streams (made as the
    link drains them).  With a one-byte window a Stream goes a message per host call, the
    rest following on ``drained``; the session sends the same messages on every link, counts
    the same bytes per phase and releases the same log as without a window (seeded draws)."""
    monkeypatch.setattr(universe, "STREAM_IDS", 32)
    monkeypatch.setattr(masked_sum, "SUM_CHUNK", 64)
    whole, whole_net, whole_calls = _seeded_session(None)
    windowed, windowed_net, windowed_calls = _seeded_session(1)
    assert not any(whole_calls)  # no window: nothing is ever pending
    assert sum(1 for n in windowed_calls if n) >= 3 * 10  # a drained call per chunk: each party's own ids alone are more than ten

    def per_link(net):  # a Stream interleaves with what its sender forwards meanwhile: compared as sets
        links: dict = {}
        for src, dst, step, size in net.log:
            links.setdefault((src, dst), []).append((step, size))
        return {link: sorted(sent) for link, sent in links.items()}

    assert per_link(windowed_net) == per_link(whole_net)
    for name, role in windowed.items():
        assert dict(role.bytes_sent) == dict(whole[name].bytes_sent), name
    released = [sorted(zip(c.row.tolist(), c.col.tolist(), c.data.tolist())) for c in (roles["party-1"].output.counts.tocoo() for roles in (whole, windowed))]
    assert released[0] and released[0] == released[1]
    assert windowed["party-1"].output.users == whole["party-1"].output.users and windowed["party-1"].output.pairs == whole["party-1"].output.pairs


def test_a_session_aborted_here_may_be_created_again_only_to_resume_it() -> None:
    """An aborted session's id is taken for a new session but may be resumed (``resume``:
    the same id, the nodes' kept keys); one running here or done may not be resumed.  In the
    re-run, the first run's late notice that this node died is moot."""
    options, hosts = _hosts()
    options = dataclasses.replace(options, solve="private")
    host, sid = hosts["party-2"], options.session_id
    host.create(options, now=0.0)
    again = dataclasses.replace(options, resume=True)
    with pytest.raises(ProtocolError, match="the session to resume is still running"):
        host.create(again, now=1.0)
    host.abort(sid, "party-2", DIED, "node shutting down", now=2.0)
    with pytest.raises(ProtocolError, match="the session id is taken"):
        host.create(options, now=3.0)
    host.create(again, now=4.0)
    assert host.state(sid)[0] == PREPARED
    late = cels_pb2.Envelope(session_id=sid, sender="party-1", abort=abort_notice(sid, "party-2", DIED, "stopped answering", Phase.COUNTS))
    assert host.deliver("party-1", late, now=5.0).events == [] and host.state(sid)[0] == PREPARED
    other = cels_pb2.Envelope(session_id=sid, sender="party-1", abort=abort_notice(sid, "party-3", DIED, "stopped answering", Phase.COUNTS))
    host.deliver("party-1", other, now=6.0)
    assert host.state(sid)[0] == ABORTED


def test_a_done_session_cannot_be_resumed_and_a_transformed_one_not_at_all() -> None:
    options = SessionOptions.create(3, epsilon=8.0, delta=0.9, solve="private", **TEST_KEYS)
    logs = synthetic_log(seed=3, users=24).split_by_user(3)
    network = InMemoryNetwork(session_hosts(logs, options, allow_insecure_key_bits=True))
    roles = start_session(network, options)
    assert roles["party-1"].finished
    host = network.roles["party-2"].host
    with pytest.raises(ProtocolError, match="the session to resume ended with its output"):
        host.create(dataclasses.replace(options, resume=True), now=0.0)
    with pytest.raises(ValueError, match="'transformed' cannot be resumed"):
        SessionOptions.create(3, epsilon=8.0, delta=0.9, solve="transformed", resume=True)
    assert options.digest() == dataclasses.replace(options, resume=True).digest() != dataclasses.replace(options, epsilon=7.0).digest()
