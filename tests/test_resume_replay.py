"""A re-run goes on from where each node was (cels.protocol.resume; docs/deployment.md, "Resume
after a node restart"), checked on the sans-I/O hosts over the in-memory network, with every
draw replayed from a seed:

- party-2 "dies" after it took a given share of its messages (nothing reaches it after that,
  what it took is in its record); the others abort, naming it (as their watchdogs would);
- party-2 comes back as a new host, and the session runs again with ``resume``: every node
  replays its record, tells each peer how many of its messages it took (ResumeFrom), and
  sends only what its peers never took.

The release is the uninterrupted session's, and on every link the step messages taken in the
two runs, one after the other, are exactly the uninterrupted session's, byte for byte: no
message is taken twice, none is lost (StepReports, which carry each run's seconds, aside).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import defaultdict

import pytest

import cels.inprocess
from cels.logs import synthetic_log
from cels.protocol.aborts import DIED, PROTOCOL_ERROR
from cels.protocol.hosted import ABORTED, HOST_STEPS, RUNNING, Recorded
from cels.protocol.options import SessionOptions
from cels.protocol.roles import Envelope, ProtocolError, step_name

VICTIM = "party-2"
UNCOMPARED = HOST_STEPS | {"step_report"}


class KeptNode(cels.inprocess.MemoryNode):
    """A node that records every step message it takes (as cels.node.session_store does), and
    can die: after ``dies_after`` step messages taken it takes nothing more (it began)."""

    def __init__(self, host, taken: list, links: dict, dies_after: int | None = None) -> None:
        super().__init__(host)
        self.taken, self.links, self.dies_after = taken, links, dies_after

    @property
    def dead(self) -> bool:
        return self.dies_after is not None and len(self.taken) >= self.dies_after

    def receive(self, sender: str, envelope: Envelope):
        if self.dead and step_name(envelope) != "start_session":
            return []
        out = super().receive(sender, envelope)
        if step_name(envelope) not in HOST_STEPS:
            self.taken.append((sender, envelope))
            if step_name(envelope) not in UNCOMPARED:
                self.links[(sender, self.host.name)].append(envelope.SerializeToString())
        return out

    def drained(self):
        return [] if self.dead else super().drained()


def released(output) -> object:
    """A release, comparable: the sampled log's users, pairs and counts, or the DP histogram."""
    if hasattr(output, "counts") and hasattr(output.counts, "toarray"):
        return list(output.users), list(output.pairs), output.counts.toarray().tolist()
    return output


def recorded(taken: list):
    def record(_session_id: str) -> Recorded:
        digests: dict[str, list[bytes]] = {}
        for sender, envelope in taken:
            digests.setdefault(sender, []).append(hashlib.sha256(envelope.SerializeToString(deterministic=True)).digest())
        return Recorded(digests, iter(list(taken)))

    return record


def run(logs, options: SessionOptions, taken: dict, links: dict, dies_after: int | None = None, hosts: dict | None = None):
    """One run of the session over in-memory hosts that keep what they take (``hosts``: the
    survivors' of an earlier run, whose sessions aborted there); the roles, and the hosts."""
    made = cels.inprocess.session_hosts(logs, options, seed=4, allow_insecure_key_bits=True)
    nodes = {}
    for name, node in made.items():
        host = hosts[name] if hosts is not None and name in hosts else node.host
        host.record = recorded(taken[name])
        nodes[name] = KeptNode(host, taken[name], links, dies_after if name == VICTIM else None)
    network = cels.inprocess.InMemoryNetwork(nodes)
    return cels.inprocess.start_session(network, options), {n: node.host for n, node in nodes.items()}


WHOLE: dict[str, tuple[object, dict, int]] = {}


def whole_session(logs, options: SessionOptions) -> tuple[object, dict, int]:
    """The uninterrupted session: its release, each link's step messages, party-2's count (once per options)."""
    if options.session_id not in WHOLE:
        WHOLE[options.session_id] = uninterrupted(logs, options)
    return WHOLE[options.session_id]


def uninterrupted(logs, options: SessionOptions) -> tuple[object, dict, int]:
    taken, links = defaultdict(list), defaultdict(list)
    roles, _ = run(logs, options, taken, links)
    assert cels.inprocess.abort_message(roles) is None
    return roles[options.initiator].output, links, len(taken[VICTIM])


@pytest.fixture(scope="module")
def logs():
    return synthetic_log(seed=7, users=60).split_by_user(3)


RELEASES = {
    "sampled": dict(delta=0.9, noise_epsilon=1.0, sensitivity=2),
    "dp": dict(release="dp", delta=1e-6, max_items_per_user=2),
}


@pytest.mark.parametrize("share", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("release", ["sampled", "dp"])
def test_a_re_run_takes_every_message_once_and_releases_the_same(logs, release: str, share: float) -> None:
    options = SessionOptions.create(3, session_id=f"kept-{release}", epsilon=1.0, key_bits=256, group_bits=1024, **RELEASES[release])
    output, whole_links, victim_takes = whole_session(logs, options)

    taken, links = defaultdict(list), defaultdict(list)
    dies_after = int(share * victim_takes)
    roles, hosts = run(logs, options, taken, links, dies_after=dies_after)
    assert not roles[options.initiator].finished  # the session stalled at party-2
    for name, host in hosts.items():
        if name != VICTIM:  # each survivor's watchdog ends it, naming party-2
            host.abort(options.session_id, VICTIM, DIED, "stopped answering", time.monotonic())
    del hosts[VICTIM]  # it died: a new process, a new host, its record kept
    assert len(taken[VICTIM]) == dies_after

    resumed = dataclasses.replace(options, resume=True)
    roles, _ = run(logs, resumed, taken, links, hosts=hosts)
    assert cels.inprocess.abort_message(roles) is None
    assert released(roles[options.initiator].output) == released(output)
    assert set(links) == set(whole_links)
    for link in whole_links:
        assert links[link] == whole_links[link], link


def test_a_record_that_does_not_replay_ends_the_session_for_good(logs) -> None:
    options = SessionOptions.create(3, session_id="kept-bad", epsilon=1.0, key_bits=256, group_bits=1024, **RELEASES["sampled"])
    taken, hosts = crashed(logs, options, 0.5)
    links = defaultdict(list)
    sender, envelope = taken[VICTIM][-1]
    taken[VICTIM].append((sender, envelope))  # its record holds a message twice
    roles, _ = run(logs, dataclasses.replace(options, resume=True), taken, links, hosts=hosts)
    aborted = roles[VICTIM].aborted
    assert aborted is not None and aborted.origin == VICTIM and "does not replay" in aborted.reason


def crashed(logs, options: SessionOptions, share: float) -> tuple[dict, dict]:
    """A session party-2 died in after ``share`` of its messages, aborted on the survivors:
    what each node took, and the survivors' hosts."""
    taken, links = defaultdict(list), defaultdict(list)
    _, hosts = run(logs, options, taken, links, dies_after=int(share * whole_session(logs, options)[2]))
    for name, host in hosts.items():
        if name != VICTIM:
            host.abort(options.session_id, VICTIM, DIED, "stopped answering", time.monotonic())
    del hosts[VICTIM]
    return taken, hosts


@pytest.mark.parametrize("tamper", [False, True])
def test_a_message_sent_again_is_refused_and_one_with_other_bytes_ends_the_session_for_good(logs, tamper: bool) -> None:
    """party-1 re-runs the session and replays its record; then party-2's first message to it
    comes again (numbered 1): the same bytes are refused (taken before), other bytes are an
    equivocation, which aborts the session for good, naming party-2."""
    options = SessionOptions.create(3, session_id="kept-twice", epsilon=1.0, key_bits=256, group_bits=1024, **RELEASES["sampled"])
    taken, hosts = crashed(logs, options, 0.6)
    host, resumed = hosts["party-1"], dataclasses.replace(options, resume=True)
    host.create(resumed, time.monotonic())
    host.begin(options.session_id, time.monotonic())
    cels.inprocess._replayed(host, options.session_id)
    [first] = [envelope for sender, envelope in taken["party-1"] if sender == VICTIM][:1]
    again = Envelope.FromString(first.SerializeToString())
    assert again.seq == 1
    if tamper:
        again.sender += " "  # any other byte
    with pytest.raises(ProtocolError) as refused:
        host.deliver(VICTIM, again, time.monotonic())
    state, abort = host.state(options.session_id)
    if tamper:
        assert refused.value.code == ProtocolError.INVALID_ARGUMENT and "other bytes for its message #1" in str(refused.value)
        assert state == ABORTED and abort.origin == VICTIM and abort.kind == PROTOCOL_ERROR
    else:
        assert "was taken in an earlier run" in str(refused.value) and state == RUNNING


def test_a_resume_point_comes_once_from_a_peer_of_a_re_run(logs) -> None:
    from cels.protocol.hosted import Resend
    from cels.protocol.wire import cels_pb2

    resend = Resend(["party-1", "solver"])
    made = [("party-1", Envelope(session_id="s", sender="party-2", seq=n, mask_key=cels_pb2.MaskKey())) for n in (1, 2, 3)]
    assert resend.passed(made) == []  # held until party-1 says what it took
    assert resend.told("party-1", 2) == made[2:]
    later = [("party-1", Envelope(session_id="s", sender="party-2", seq=4, mask_key=cels_pb2.MaskKey()))]
    assert resend.passed(made[:1] + later) == later  # numbered: what party-1 took stays dropped
    with pytest.raises(ProtocolError, match="said twice"):
        resend.told("party-1", 0)
    with pytest.raises(ProtocolError, match="not a peer"):
        resend.told("party-3", 0)
