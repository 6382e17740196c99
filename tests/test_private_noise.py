"""End-to-end noise in the private solve (cels.protocol.private_solve, step 5), driven in memory:
the aggregator's z is exactly the sum of the parties' Polya shares (the masks cancel), the
release keeps every condition between min(x, x') and x' = max(x + z, 0), the noise pass's
verdicts replay from (x, z, x''), and bad noise messages are refused without a change of state."""

from __future__ import annotations

from collections import deque
from fractions import Fraction

import numpy as np
import pytest

from cels.crypto.streams import CipherRandom
from cels.logs import synthetic_log
from cels.mechanism.conditions import build_conditions
from cels.mechanism.greedy import ProposalRule, central_run, replay
from cels.mechanism.noise import laplace_share
from cels.mechanism.solvers import feasible
from cels.protocol.private_solve import PrivateSolveAggregator, PrivateSolveParty
from cels.protocol.roles import ProtocolError
from cels.protocol.wire import cels_pb2

SESSION = "s-noise"
B = np.log(10)
SCALE = Fraction(2)


@pytest.fixture(scope="module")
def cond():
    c, _ = build_conditions(synthetic_log(seed=5, users=90), B)
    return c


def nodes(r: int, noise: bool = True):
    names = [f"party-{k}" for k in range(1, r + 1)]
    seeds = [11 * (k + 1) for k in range(r)]
    parties = {n: PrivateSolveParty(n, names, "solver", SESSION, SCALE if noise else None, CipherRandom(s)) for n, s in zip(names, seeds)}
    return parties, PrivateSolveAggregator("solver", names, SESSION), seeds


def drive(cond, rule, parties, aggregator) -> list[cels_pb2.RoundVerdict]:
    """Run to the end in FIFO order; returns the RoundVerdicts the aggregator sent (one copy)."""
    r = len(parties)
    queue = deque()
    for k, (name, p) in enumerate(parties.items()):
        queue.extend((name, to, e) for to, e in p.mask_keys() + p.start(rule, cond.G[k::r], B))
    sent = []
    while queue:
        sender, to, env = queue.popleft()
        step = env.WhichOneof("step")
        node = aggregator if to == "solver" else parties[to]
        out = getattr(node, f"on_{step}")(sender, getattr(env, step))
        if to == "solver":
            sent += [e.round_verdict for dst, e in out if dst == "party-1" and e.WhichOneof("step") == "round_verdict"]
        queue.extend((to, dst, e) for dst, e in out)
    return sent


def bits(rounds) -> list[bytes]:
    return [np.packbits(rnd.accepted, bitorder="little").tobytes() for rnd in rounds]


@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_noise_shares_add_up_and_the_noise_pass_replays(cond, r) -> None:
    rule = ProposalRule("kl", cond.c, batch=8)
    parties, aggregator, seeds = nodes(r)
    sent = drive(cond, rule, parties, aggregator)
    expected = np.zeros(len(cond.c), dtype=np.int64)
    for seed in seeds:  # the same seeds draw the same shares again
        again = CipherRandom(seed)
        expected += [laplace_share(SCALE, r, again) for _ in range(len(cond.c))]
    lead = parties["party-1"]
    z, first, released = aggregator.noise_total, lead.first_x, lead.x
    assert aggregator.done and all(p.done for p in parties.values())
    assert np.array_equal(z, expected) and np.any(z != 0)
    assert all(np.array_equal(p.x, released) and np.array_equal(p.noise_total, z) for p in parties.values())
    x, _ = central_run(rule, [cond.G[k::r] for k in range(r)], B)
    assert np.array_equal(first, x)  # the first pass is the noise-free greedy
    target = np.maximum(first + z, 0)
    assert feasible(cond, released) and np.all(np.minimum(first, target) <= released) and np.all(released <= target)
    again, _ = central_run(rule, [cond.G[k::r] for k in range(r)], B, rule.noise_pass(first, z))
    assert np.array_equal(released, again)
    simulated = replay(rule, first) + replay(rule, released, rule.noise_pass(first, z))
    assert [v.accepted for v in sent] == bits(simulated) and [v.round for v in sent] == list(range(len(simulated)))


def test_without_noise_the_first_pass_is_the_release(cond) -> None:
    rule = ProposalRule("kl", cond.c, batch=8)
    parties, aggregator, _ = nodes(3, noise=False)
    drive(cond, rule, parties, aggregator)
    x, _ = central_run(rule, [cond.G[k::3] for k in range(3)], B)
    assert aggregator.noise_total is None and np.array_equal(parties["party-2"].x, x)


def refused(code: str, call, match: str, node) -> None:
    before = (node.round, node.done, None if node.noise_total is None else node.noise_total.copy())
    with pytest.raises(ProtocolError, match=match) as info:
        call()
    assert info.value.code == code
    after = (node.round, node.done, None if node.noise_total is None else node.noise_total.copy())
    assert before[:2] == after[:2] and (before[2] is None) == (after[2] is None)


def test_bad_noise_messages_are_refused(cond) -> None:
    rule = ProposalRule("kl", cond.c, batch=8)
    parties, aggregator, _ = nodes(2)
    party = parties["party-1"]
    n = len(cond.c)
    total = cels_pb2.NoiseTotal(session_id=SESSION, noise=[0] * n)
    refused(ProtocolError.FAILED_PRECONDITION, lambda: party.on_noise_total("party-2", total), "expected from 'solver'", party)
    party.start(rule, cond.G[0::2], B)
    refused(ProtocolError.FAILED_PRECONDITION, lambda: party.on_noise_total("solver", total), "before this party's noise share", party)
    share = cels_pb2.MaskedNoiseShare(session_id=SESSION, values=[0] * n)
    refused(ProtocolError.FAILED_PRECONDITION, lambda: aggregator.on_masked_noise_share("mallory", share), "not a party", aggregator)
    assert aggregator.on_masked_noise_share("party-1", share) == []
    refused(ProtocolError.FAILED_PRECONDITION, lambda: aggregator.on_masked_noise_share("party-1", share), "out of order", aggregator)
    short = cels_pb2.MaskedNoiseShare(session_id=SESSION, values=[0] * (n - 1))
    refused(ProtocolError.INVALID_ARGUMENT, lambda: aggregator.on_masked_noise_share("party-2", short), "differ", aggregator)
    verdicts = cels_pb2.MaskedVerdicts(session_id=SESSION, round=0, values=[0])
    refused(ProtocolError.FAILED_PRECONDITION, lambda: aggregator.on_masked_verdicts("party-2", verdicts), "noise shares", aggregator)


def test_a_party_refuses_a_malformed_noise_total(cond) -> None:
    """A party whose first pass ended takes only a NoiseTotal of n values within +-2^62."""
    rule = ProposalRule("kl", cond.c, batch=8)
    parties, aggregator, _ = nodes(2)
    queue = deque()
    for k, (name, p) in enumerate(parties.items()):
        queue.extend((name, to, e) for to, e in p.mask_keys() + p.start(rule, cond.G[k::2], B))
    while queue:  # run until the aggregator would send the NoiseTotal
        sender, to, env = queue.popleft()
        step = env.WhichOneof("step")
        if step == "noise_total":
            break
        node = aggregator if to == "solver" else parties[to]
        queue.extend((to, dst, e) for dst, e in getattr(node, f"on_{step}")(sender, getattr(env, step)))
    party = parties["party-1"]
    n = len(cond.c)
    for noise, match in (([0] * (n + 1), "values for"), ([2**62 + 1] + [0] * (n - 1), "beyond")):
        bad = cels_pb2.NoiseTotal(session_id=SESSION, noise=noise)
        refused(ProtocolError.INVALID_ARGUMENT, lambda bad=bad: party.on_noise_total("solver", bad), match, party)
    assert party.on_noise_total("solver", env.noise_total)  # the real one starts the noise pass


def test_a_verdict_accepting_what_a_party_rejected_fails_transcript_agreement() -> None:
    """A lying aggregator (or the r 2^-64 event) cannot get x used: the party that rejected an
    accepted proposal takes the verdict like the others (refusing it would tell the aggregator
    who vetoed) but sends a random digest, so transcript agreement fails (step 6)."""
    tight, _ = build_conditions(synthetic_log(seed=5, users=90), 0.05)
    rule = ProposalRule("kl", tight.c, batch=8)
    parties, _, _ = nodes(2, noise=False)
    keys = {n: p.mask_keys() for n, p in parties.items()}
    for sender, out in keys.items():
        for to, env in out:
            parties[to].on_mask_key(sender, env.mask_key)
    for k, p in enumerate(parties.values()):
        p.start(rule, tight.G[k::2], 0.05)
    vetoer = next(name for name, p in parties.items() if np.any(p.own_verdicts))
    n = len(parties[vetoer].proposals)
    lie = cels_pb2.RoundVerdict(session_id=SESSION, round=0, proposals=n, accepted=np.packbits(np.ones(n, bool), bitorder="little").tobytes())
    for p in parties.values():
        p.on_round_verdict("solver", lie)  # no refusal
        p.done = True  # the rounds are over for this check
    assert "this party rejected" in parties[vetoer].rejected_accepted
    sent = {name: p.send_digest() for name, p in parties.items()}
    for sender, out in sent.items():
        for to, env in out:
            parties[to].on_transcript_digest(sender, env.transcript_digest)
    assert all(p.agreement() is False for p in parties.values())
    honest = [p for name, p in parties.items() if name != vetoer and not np.any(p.own_verdicts)]
    assert all(p.digests[p.name] == p.transcript.digest() for p in honest)
