"""Every privacy-relevant draw comes from the ChaCha20 stream (issue 22, finding 5;
docs/crypto.md, Randomness): sampling, pseudonyms, noise and Polya shares, the paper mode's
A_k and F_k, the permutations and shuffles, the baselines.  PCG64 and the Mersenne Twister can
be predicted from their outputs, so none of these paths may draw from them.

Two kinds of check: spies on the generator each path is handed (its bit generator must be
ChaCha with 20 rounds), and trip wires on numpy's other bit generators, on ``random.Random``'s
Mersenne Twister and on ``random.SystemRandom``, recording any draw whose nearest caller is in
cels.mechanism, cels.protocol or cels.baselines (Paillier's keys and ciphertext randomness in
cels.crypto come from ``secrets`` by design; synthetic data in cels.logs is not private).  And
a seeded session sends the same bytes twice (the private solve's and the DP release's).
"""

from __future__ import annotations

import importlib
import random
import sys
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from randomgen import ChaCha
from scipy.stats import chisquare

import cels.crypto.streams as streams
import cels.inprocess
import cels.mechanism.sampling as mech_sampling
from cels.baselines import BASELINES, baseline_rng
from cels.baselines.safelog import release_transitions
from cels.baselines.sampling import zero_count_survivors
from cels.cli import main
from cels.crypto.groups import group_for_bits
from cels.crypto.streams import CipherRandom, DrawKeys, cipher_generator
from cels.logs import synthetic_log
from cels.mechanism.conditions import build_conditions
from cels.mechanism.noise import discrete_laplace
from cels.mechanism.noisy_counts import add_noise_and_repair
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.protocol.options import SessionOptions
from cels.protocol.private_solve import PrivateSolveParty
from cels.protocol.roles import Envelope, step_name
from cels.protocol.secure_union import SecureUnion
from cels.protocol.transform import transform_constraints

sanitize_module = importlib.import_module("cels.mechanism.sanitize")  # the package re-exports the function

PRIVATE_PACKAGES = ("cels.mechanism", "cels.protocol", "cels.baselines")
"""Where a draw is privacy-relevant (the trip wires look at the nearest caller's module)."""

PLUMBING = ("random", "secrets")
"""Modules between a draw and the code that asked for it (skipped when naming the caller)."""

NUMPY_BIT_GENERATORS = ("default_rng", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def is_chacha20(rng) -> bool:
    """``rng`` (a numpy Generator or a CipherRandom) draws from ChaCha with 20 rounds."""
    generator = rng.generator if isinstance(rng, CipherRandom) else rng
    if isinstance(generator, Recorder):
        generator = generator.generator
    if not isinstance(generator, np.random.Generator) or not isinstance(generator.bit_generator, ChaCha):
        return False
    return generator.bit_generator.state["state"]["rounds"] == 20


class Recorder:
    """A numpy Generator that notes which of its methods a path used."""

    def __init__(self, generator: np.random.Generator) -> None:
        self.generator, self.used = generator, set()

    def __getattr__(self, name: str):
        self.used.add(name)
        return getattr(self.generator, name)


def _caller() -> str:
    """The module that asked for the draw: the nearest frame outside this file and the plumbing."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name not in (*PLUMBING, __name__) and not name.startswith("numpy"):
            return name
        frame = frame.f_back
    return ""


@pytest.fixture
def weak_draws(monkeypatch) -> set[tuple[str, str]]:
    """(generator, caller) of every draw a privacy-relevant path takes from PCG64 & co., the
    Mersenne Twister or SystemRandom while the test runs (empty on a correct tree)."""
    found: set[tuple[str, str]] = set()

    def note(kind: str) -> None:
        caller = _caller()
        if caller.startswith(PRIVATE_PACKAGES):
            found.add((kind, caller))

    def wire(owner, name: str, kind: str) -> None:
        original = getattr(owner, name)

        def tripped(*args, **kwargs):
            note(kind)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, tripped)

    for name in NUMPY_BIT_GENERATORS:
        wire(np.random, name, f"numpy.random.{name}")
    for name in ("random", "getrandbits"):
        wire(random.Random, name, "Mersenne Twister")
        wire(random.SystemRandom, name, "SystemRandom")
    return found


# ---------------------------------------------------------------------------- the primitive


def test_an_unseeded_stream_is_chacha20_keyed_with_256_bits_from_secrets(monkeypatch) -> None:
    asked = []

    def randbits(k: int) -> int:
        asked.append(k)
        return (1 << 255) | 12345

    monkeypatch.setattr(streams.secrets, "randbits", randbits)
    generator = cipher_generator()
    assert asked == [256] and is_chacha20(generator)
    assert generator.bit_generator.state["state"]["ctr"].tolist() == [0, 0]
    same = np.random.Generator(ChaCha(key=(1 << 255) | 12345, rounds=20))
    assert generator.bytes(64) == same.bytes(64)  # the key is the 256 bits, not a hash of them


def test_unseeded_streams_differ_and_seeded_streams_replay() -> None:
    assert cipher_generator().bytes(32) != cipher_generator().bytes(32)
    assert CipherRandom().getrandbits(256) != CipherRandom().getrandbits(256)
    assert cipher_generator(7).bytes(64) == cipher_generator(7).bytes(64)
    assert cipher_generator(7).bytes(64) != cipher_generator(8).bytes(64)
    assert CipherRandom(7).getrandbits(1000) == CipherRandom(7).getrandbits(1000)
    # one stream, two interfaces: CipherRandom(generator=g) continues g's words
    shared = cipher_generator(9)
    shared.bytes(8)
    assert CipherRandom(generator=shared).getrandbits(64) == int.from_bytes(cipher_generator(9).bytes(16)[8:], "little")


def test_cipher_random_follows_the_subclassing_contract() -> None:
    rng = CipherRandom(3)
    state = rng.getstate()
    drawn = [rng.randrange(10**40), rng.random(), rng.getrandbits(0), rng.getrandbits(65)]
    rng.setstate(state)
    assert [rng.randrange(10**40), rng.random(), rng.getrandbits(0), rng.getrandbits(65)] == drawn
    assert 0 <= drawn[1] < 1 and drawn[2] == 0 and drawn[3] < 2**65
    rng.seed(3)
    assert rng.randrange(10**40) == drawn[0]
    with pytest.raises(ValueError, match="non-negative"):
        rng.getrandbits(-1)
    for bad in (-1, 2**256, 1.5, "seed"):
        with pytest.raises(ValueError, match="stream seed"):
            CipherRandom(bad)
    with pytest.raises(ValueError, match="not both"):
        CipherRandom(1, generator=cipher_generator(1))


ALPHA = 1e-3
"""Significance of the statistical checks: each is run on a fixed seed, so it is deterministic;
on a fresh stream it would fail with probability ALPHA."""


def test_discrete_laplace_through_the_adapter_matches_its_pmf() -> None:
    """Chi-square of 20,000 exact samples at scale 3/2 against P(k) = (1-q)/(1+q) q^|k|,
    q = e^(-2/3), over k = -8..8 with both tails pooled into the end bins."""
    scale, draws, top = Fraction(3, 2), 20_000, 8
    rng = CipherRandom(2026)
    samples = np.clip([discrete_laplace(scale, rng) for _ in range(draws)], -top, top)
    q = np.exp(-1 / float(scale))
    ks = np.arange(-top, top + 1)
    pmf = (1 - q) / (1 + q) * q ** np.abs(ks)
    pmf[0] = pmf[-1] = q ** top / (1 + q)  # P(k <= -8) = P(k >= 8)
    observed = np.bincount(samples + top, minlength=2 * top + 1)
    assert pmf.sum() == pytest.approx(1.0)
    assert chisquare(observed, draws * pmf).pvalue > ALPHA


def test_randrange_beyond_one_word_is_uniform() -> None:
    """randrange(3 * 2^100) (two 64-bit words, rejection above the bound) in 12 equal bins."""
    bound, bins, draws = 3 * 2**100, 12, 12_000
    rng = CipherRandom(11)
    observed = np.bincount([rng.randrange(bound) * bins // bound for _ in range(draws)], minlength=bins)
    assert chisquare(observed).pvalue > ALPHA


# ---------------------------------------------------------------------------- the paths


@pytest.fixture(scope="module")
def log():
    return synthetic_log(seed=7, users=60)


@pytest.mark.parametrize("seed", [None, 5])
def test_the_single_holder_release_draws_from_chacha20(monkeypatch, weak_draws, log, seed) -> None:
    """Noise, multinomial sampling and pseudonyms of ``cels sanitize`` (seeded or not)."""
    handed: dict[str, object] = {}

    def spy(module, name: str, position: int) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            handed[name] = kwargs["rng"] if "rng" in kwargs else args[position]
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(sanitize_module, "add_noise_and_repair", 4)
    spy(sanitize_module, "multinomial_sample", 2)
    spy(mech_sampling, "pseudonyms", 1)
    params = SanitizeParams(epsilon=8.0, delta=0.9, noise_epsilon=1.0, sensitivity=2, seed=seed, integer="greedy")
    sanitize(log, params, progress=False)
    assert set(handed) == {"add_noise_and_repair", "multinomial_sample", "pseudonyms"}
    assert isinstance(handed["add_noise_and_repair"], CipherRandom)
    assert all(is_chacha20(rng) for rng in handed.values()), handed
    assert weak_draws == set()


def test_a_seeded_release_replays_and_an_unseeded_one_does_not(log) -> None:
    params = SanitizeParams(epsilon=8.0, delta=0.9, noise_epsilon=1.0, sensitivity=2, seed=5, integer="greedy")
    first, _ = sanitize(log, params, progress=False)
    again, _ = sanitize(log, params, progress=False)
    assert first.users == again.users and first.pairs == again.pairs
    assert (first.counts != again.counts).nnz == 0
    fresh = [sanitize(log, SanitizeParams(epsilon=8.0, delta=0.9, integer="greedy"), progress=False)[0] for _ in range(2)]
    assert not set(fresh[0].users) & set(fresh[1].users)


SESSIONS = {
    # the paper's Algorithm 2 (A_k, F_k, pi_k), exact staged sampling, pseudonyms, the union
    "transformed": (
        dict(solve="transformed", noise_epsilon=1.0, sensitivity=2),
        {"standard_normal", "uniform", "permutation", "poisson", "integers", "shuffle"},
    ),
    # the private solve's Polya noise shares (CipherRandom over the party's stream), paper sampling
    "private": (
        dict(solve="private", noise_epsilon=1.0, sensitivity=2, sampling="paper"),
        {"bit_generator", "binomial", "multinomial", "integers", "shuffle"},
    ),
}


@pytest.mark.parametrize("mode", sorted(SESSIONS))
def test_every_party_draw_of_a_session_comes_from_its_chacha20_stream(monkeypatch, weak_draws, log, mode) -> None:
    """Every stream a party draws from is one of its DrawKeys' ChaCha20 streams: its own
    (party) stream and those its work indexes by user bucket."""
    options, used = SESSIONS[mode]
    streams_made: list[tuple[str, Recorder]] = []
    indexed = DrawKeys.indexed

    def recorded_stream(self, label: str, index: int) -> Recorder:
        streams_made.append((label, Recorder(indexed(self, label, index))))
        return streams_made[-1][1]

    monkeypatch.setattr(DrawKeys, "indexed", recorded_stream)
    config = SessionOptions.create(
        3, epsilon=8.0, delta=0.9, objective="max-output", key_bits=256, group_bits=1024, **options
    )
    roles = cels.inprocess.start_session(
        cels.inprocess.InMemoryNetwork(cels.inprocess.session_hosts(log.split_by_user(3), config, allow_insecure_key_bits=True)),
        config,
    )
    assert roles["party-1"].finished and roles["party-1"].output.n_users > 0
    party_streams = [stream for label, stream in streams_made if label == "party"]
    assert len(party_streams) == 3
    assert all(is_chacha20(stream.generator) for _, stream in streams_made)
    for name in config.parties:
        role = roles[name]
        assert role._rng in party_streams
        if mode == "private":
            assert isinstance(role.solve.private.rng, CipherRandom) and role.solve.private.rng.generator is role._rng
    drawn = set().union(*(stream.used for _, stream in streams_made))
    assert used <= drawn, f"drew {used - drawn} elsewhere"
    assert weak_draws == set()


def test_the_defaults_of_each_draw_path_are_chacha20(weak_draws, log) -> None:
    """Called without a generator: the solver's noise, A_k and F_k, the private solve's shares,
    the union's shuffles, the pseudonyms of released_log."""
    cond, _ = build_conditions(log, 2.0)
    add_noise_and_repair(cond, np.ones(cond.n, dtype=np.int64), 1.0, 2)
    transform_constraints(sp.csr_matrix(np.eye(3)), 2.0, 4)
    assert is_chacha20(PrivateSolveParty("a", ["a", "b"], "s", "sid", Fraction(2)).rng)
    union = SecureUnion(name="a", session_id="s", ring=["a"], records=[b"x", b"y"], group=group_for_bits(1024, allow_paper_bits=True))
    assert is_chacha20(union.rng)
    union.start()
    assert is_chacha20(mech_sampling.make_rng()) and is_chacha20(mech_sampling.make_rng(3))
    released = mech_sampling.released_log(log, sp.csr_matrix(log.counts))
    assert len(released.users) == log.n_users
    assert weak_draws == set()


def test_the_baselines_draw_from_chacha20(weak_draws, tmp_path) -> None:
    """Every baseline, through ``cels sanitize --method`` (seeded and not): noise, item choice,
    the query pool, the zero-count survivors."""
    assert isinstance(baseline_rng(), CipherRandom) and is_chacha20(baseline_rng()) and is_chacha20(baseline_rng(4))
    rows = [(f"u{j:03d}", f"query {j % 4}", f"q{j % 4}.com") for j in range(60) for _ in range(2)]
    src = tmp_path / "in.tsv"
    src.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n" + "".join(f"{u}\t{q}\t2006-03-01 00:00:00\t\t{url}\n" for u, q, url in rows))
    for method in sorted(BASELINES):
        for seed in ([], ["--seed", "3"]):
            name = f"{method}{'-seeded' if seed else ''}"
            argv = ["sanitize", str(src), "--format", "aol", "--quiet", "--out", str(tmp_path / f"{name}.tsv"),
                    "--report", str(tmp_path / f"{name}.json"), "--epsilon", "10", "--delta", "0.001",
                    "--method", method, *seed]  # fmt: skip
            assert main(argv) == 0
    # Safelog's transitions: the zero-count pairs' binomial draw (a PCG64 of its own before)
    assert len(zero_count_survivors(10_000, 1, 2.0, baseline_rng())) > 0
    release_transitions(["a", "b", "c"], Counter({("a", "b"): 9}), 2.0, 1, baseline_rng(4))
    assert weak_draws == set()


def session_messages(log, seed: int, release: str) -> dict[tuple[str, str], list[bytes]]:
    """Every message of a seeded in-memory session, per link (sender, recipient), in the order
    sent; StepReports left out (their seconds are the run's, not the data's)."""
    extra = dict(release="dp", delta=1e-6, max_items_per_user=2) if release == "dp" else dict(delta=0.9, noise_epsilon=1.0, sensitivity=2)
    config = SessionOptions.create(3, session_id="replayed", epsilon=1.0, key_bits=256, group_bits=1024, **extra)
    network = cels.inprocess.InMemoryNetwork(cels.inprocess.session_hosts(log.split_by_user(3), config, seed=seed, allow_insecure_key_bits=True))
    sent: dict[tuple[str, str], list[bytes]] = {}
    enqueue = network._enqueue

    def recorded(queue, src, messages) -> None:
        before = len(queue)
        enqueue(queue, src, messages)
        for s, d, data in list(queue)[before:]:
            if step_name(Envelope.FromString(data)) != "step_report":
                sent.setdefault((s, d), []).append(data)

    network._enqueue = recorded
    roles = cels.inprocess.start_session(network, config)
    assert cels.inprocess.abort_message(roles) is None
    return sent


@pytest.mark.parametrize("release", ["sampled", "dp"])
def test_a_seeded_session_sends_every_message_again_byte_for_byte(log, release) -> None:
    """Every message a party or the solver sends in the private solve's sampled release and in
    the DP release is a function of its draw keys and its data (the pairwise mask keys, the
    OR shares' rho, the union's key e and shuffles included: docs/crypto.md, Randomness), so
    the same keys send the same bytes; other keys change them (the check can fail)."""
    first, again = session_messages(log, 11, release), session_messages(log, 11, release)
    assert first.keys() == again.keys() and len(first) == 12  # every link among 3 parties and the solver
    assert first == again
    other = session_messages(log, 12, release)
    assert any(first[link] != other.get(link) for link in first)
