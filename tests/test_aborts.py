"""What an abort tells the other nodes (issue 22 findings 4 and 6, issue 23 items 9, 10, 15).

A peer is told the origin, the kind and the phase of a failure and a generic reason, never a
number from the data; the details stay with the node that failed.  The private solve's parties
agree on the verdict transcript before they use x, so an aggregator that equivocates, or that
marks a rejected proposal accepted to see who complains, gets an abort that names nobody."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cels.protocol.phases import Phase
from cels.inprocess import InMemoryNetwork, abort_message, session_hosts, start_session
from cels.logs import synthetic_log
from cels.node.client import SessionAborted
from cels.protocol.aborts import DIED, LOCAL_FAILURE, PROTOCOL_ERROR, REFUSED, UNREACHABLE, abort_notice, describe
from cels.protocol.options import SessionOptions
from cels.protocol.roles import ProtocolError
from cels.protocol.wire.codec import phase_from_wire

TEST_KEYS = {"key_bits": 256, "group_bits": 1024}


@pytest.fixture(scope="module")
def logs():
    return synthetic_log(seed=11, users=36).split_by_user(3)


class Tap:
    """A node whose received envelopes are kept (``seen``) and whose messages ``out(sender,
    envelope, messages)`` may change before they leave."""

    def __init__(self, node, inbox=None, out=None) -> None:
        self.host, self.inbox, self.out, self.seen = node, inbox, out, []

    def receive(self, sender, env):
        self.seen.append((sender, env))
        if self.inbox is not None:
            self.inbox(sender, env)
        messages = self.host.receive(sender, env)
        if self.out is not None:
            self.out(sender, env, messages)
        return messages


def aborts_received(taps: dict[str, Tap], but: str) -> list:
    """Every Abort a node other than ``but`` received."""
    return [env.abort for name, tap in taps.items() if name != but for _sender, env in tap.seen if env.WhichOneof("step") == "abort"]


def test_a_failed_feasibility_check_tells_peers_no_number(logs) -> None:
    """Finding 4: party-2's check of its own rows on x fails; the Abort every other node gets
    says who, what and where, and carries no digit (the load stays in party-2's failure)."""
    options = SessionOptions.create(3, epsilon=8.0, delta=0.9, objective="max-output", solve="transformed", **TEST_KEYS)

    def inflate(_sender, env) -> None:
        if env.WhichOneof("step") == "nlp_solution" and env.nlp_solution.unpermuted == 3:  # the final x, from P_1
            env.nlp_solution.x[:] = [v * 1000 + 1000 for v in env.nlp_solution.x]

    nodes = session_hosts(logs, options, allow_insecure_key_bits=True)
    taps = {name: Tap(node, inbox=inflate if name == "party-2" else None) for name, node in nodes.items()}
    roles = start_session(InMemoryNetwork(taps), options)
    failure = roles["party-2"].failure
    load = re.search(r"\((\S+) > b = (\S+)\)", failure)
    assert load is not None, failure  # the local error keeps the numbers
    received = aborts_received(taps, but="party-2")
    assert received and all(a.SerializeToString() == received[0].SerializeToString() for a in received)
    notice = received[0]
    assert (notice.origin, notice.kind, phase_from_wire(notice.phase), notice.reason) == ("party-2", LOCAL_FAILURE, "nlp", "the solution breaks one of its conditions")
    assert load.group(1) not in str(notice) and not re.search(r"\d", notice.reason)
    assert describe(notice) == "party-2 failed in phase nlp (the solution breaks one of its conditions)"
    # in one process the caller is every node: its message keeps party-2's numbers
    assert abort_message(roles).endswith(f"party-2's log: {failure}") and load.group(0) in abort_message(roles)


def private_hosts(logs, tamper):
    """A private-solve session whose aggregator's RoundVerdicts pass ``tamper(round, party,
    verdict, parties' roles)`` on their way out."""
    options = SessionOptions.create(3, epsilon=8.0, delta=0.9, objective="kl", **TEST_KEYS)
    nodes = session_hosts(logs, options, allow_insecure_key_bits=True)

    def out(_sender, _env, messages) -> None:
        for recipient, env in messages:
            if env.WhichOneof("step") == "round_verdict":
                parties = {p: nodes[p].host.role(options.session_id) for p in options.parties}
                tamper(env.round_verdict.round, recipient, env.round_verdict, parties)

    taps = {name: Tap(node, out=out if name == "solver" else None) for name, node in nodes.items()}
    return options, taps


def bits(verdict) -> np.ndarray:
    return np.unpackbits(np.frombuffer(verdict.accepted, dtype=np.uint8), bitorder="little")[: verdict.proposals]


def set_bit(verdict, q: int) -> None:
    flags = bits(verdict).astype(bool)
    flags[q] = True
    verdict.accepted = np.packbits(flags, bitorder="little").tobytes()


def assert_generic_transcript_abort(taps, roles, parties) -> None:
    for name in parties:
        notice = roles[name].aborted
        assert notice is not None, name
        assert (notice.origin, notice.kind, phase_from_wire(notice.phase), notice.reason) == ("solver", PROTOCOL_ERROR, "solve", "verdict transcripts differ")
    for notice in aborts_received(taps, but=""):
        assert notice.reason == "verdict transcripts differ" and notice.origin == "solver", notice
        assert not any(p in str(notice) for p in parties), notice  # no party named


def test_an_equivocating_aggregator_is_caught_by_transcript_agreement(logs) -> None:
    """Finding 6: the aggregator sends party-3 another RoundVerdict than the others (bytes that
    change no bit, so every party's rounds go on alike): the digests differ and every party
    aborts before it uses x, blaming the aggregator with a reason that names no party."""

    def equivocate(round_number, party, verdict, _roles) -> None:
        if round_number == 0 and party == "party-3":
            verdict.session_id += "-"  # another transcript, the same update

    options, taps = private_hosts(logs, equivocate)
    roles = start_session(InMemoryNetwork(taps), options)
    assert_generic_transcript_abort(taps, roles, options.parties)
    assert all("differ from this party's" in roles[p].failure for p in options.parties)  # details: each party's own log
    assert all(roles[p].phase == Phase.FAILED and roles[p].solved is None for p in options.parties)


@pytest.mark.parametrize("vetoer", ["party-2", "party-3"])
def test_a_rejection_marked_accepted_does_not_name_the_vetoing_party(logs, vetoer: str) -> None:
    """Finding 6: the aggregator marks accepted a proposal exactly one party rejected, in every
    party's RoundVerdict, to learn who complains.  The vetoing party applies it like the others
    and sends random bytes as its digest: every party aborts with "verdict transcripts differ",
    and no abort, refusal or message names the vetoing party; only its own failure says why."""
    chosen: list[tuple[int, int]] = []

    def mark_accepted(round_number, party, verdict, parties) -> None:
        if not chosen:
            own = {p: role.solve.private.own_verdicts for p, role in parties.items()}
            for q in np.flatnonzero(bits(verdict) == 0):
                if [p for p in own if own[p][q]] == [vetoer]:
                    chosen.append((round_number, int(q)))
                    break
        if chosen and chosen[0][0] == round_number:
            set_bit(verdict, chosen[0][1])

    options, taps = private_hosts(logs, mark_accepted)
    roles = start_session(InMemoryNetwork(taps), options)  # no ProtocolError: nobody refuses the verdict
    assert chosen, "no proposal rejected by the vetoer alone"
    assert_generic_transcript_abort(taps, roles, options.parties)
    assert "proposal(s) this party rejected" in roles[vetoer].failure
    assert all("rejected" not in roles[p].failure for p in options.parties if p != vetoer)


def test_an_honest_private_session_agrees_on_its_transcript(logs) -> None:
    options, taps = private_hosts(logs, lambda *_: None)
    roles = start_session(InMemoryNetwork(taps), options)
    assert roles["party-1"].report is not None and all(r.aborted is None for r in roles.values())
    digests = [env.transcript_digest.sha256 for tap in taps.values() for _s, env in tap.seen if env.WhichOneof("step") == "transcript_digest"]
    assert len(digests) == 6 and len(set(digests)) == 1  # r (r - 1) messages, one digest
    assert not any(env.WhichOneof("step") == "transcript_digest" for _s, env in taps["solver"].seen)


def test_a_round_verdict_with_the_wrong_number_of_bits_says_what_is_wrong(logs) -> None:
    """Issue 23 item 15: the refusal names the bytes it got and the bytes it expected."""
    seen = []

    def truncate(round_number, party, verdict, _roles) -> None:
        if party == "party-2" and not seen:
            seen.append((verdict.proposals, len(verdict.accepted)))
            verdict.accepted = verdict.accepted[:-1]

    options, taps = private_hosts(logs, truncate)
    with pytest.raises(ProtocolError) as err:
        start_session(InMemoryNetwork(taps), options)
    proposals, size = seen[0]
    assert err.value.code == ProtocolError.INVALID_ARGUMENT
    assert str(err.value) == f"party-2: round_verdict has {size - 1} bytes of accepted bits for {proposals} proposals, expected {size}"


@pytest.mark.parametrize(
    ("notice", "text"),
    [
        (abort_notice("s", "party-2", REFUSED, "privacy budget exceeded", "start"), "no session ran: refused by party-2 (privacy budget exceeded)"),
        (abort_notice("s", "party-1", UNREACHABLE, "not running", "start"), "no session ran: party-1 unreachable (not running)"),
        (abort_notice("s", "party-3", DIED, "stopped answering", "counts"), "party-3 died in phase counts (stopped answering)"),
        (abort_notice("s", "solver", PROTOCOL_ERROR, "delivering sum_hop: refused it", "counts"), "protocol error at solver in phase counts (delivering sum_hop: refused it)"),
    ],
)
def test_session_aborted_renders_one_clear_line(notice, text) -> None:
    """Issue 23 items 9 and 10: what happened, to whom, in which phase, once; no "aborted by"
    for a session that never ran, no doubled prefix."""
    aborted = SessionAborted(notice)
    assert str(aborted) == text and "\n" not in str(aborted)
    assert (aborted.origin, aborted.phase) == (notice.origin, phase_from_wire(notice.phase))
    assert aborted.kind == {REFUSED: "REFUSED", UNREACHABLE: "UNREACHABLE", DIED: "DIED", PROTOCOL_ERROR: "PROTOCOL_ERROR"}[notice.kind]


def test_an_abort_reason_for_peers_carries_no_digit() -> None:
    with pytest.raises(ValueError, match="no digit"):
        abort_notice("s", "party-2", LOCAL_FAILURE, "load 1.25 > b", "nlp")
