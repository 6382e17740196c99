"""The DP histogram across organisations (``--release dp``; docs/releases.md).

Known answers (the threshold of the session, the release of a pair held by many users and
not of one held by one), the options refused in one line before any work, the protocol's
invariants (only noisy values opened, every released count at or above tau, the same bytes
under ``--seed``), a peer's bad step messages refused, and the single holder's release."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cels.baselines.release import read_release
from cels.crypto.streams import DrawKeys
from cels.inprocess import InMemoryNetwork, run_session, session_hosts, start_session
from cels.logs import synthetic_log
from cels.logs.model import SearchLog
from cels.logs.records import LogRecord
from cels.mechanism.dp_release import DpHistogram, bounded_counts, distinct_users, sanitize_dp
from cels.protocol.options import SessionOptions
from cels.protocol.roles import ProtocolError
from cels.protocol.stages.dp_release import release_threshold
from cels.protocol.wire import cels_pb2

TEST_KEYS = {"key_bits": 512, "group_bits": 1024}
REPO = Path(__file__).resolve().parent.parent


def dp_options(**given) -> SessionOptions:
    return SessionOptions.create(3, **{"epsilon": 1.0, "delta": 1e-6, "release": "dp", **TEST_KEYS, **given})


def crowd_log(popular: int = 60, source: dict | None = None) -> SearchLog:
    """A pair held by ``popular`` users, one held by a single user, and noise pairs."""
    return SearchLog.from_records(crowd_records(popular), source=source)


def crowd_records(popular: int) -> list[LogRecord]:
    records = [LogRecord(f"u{j}", "popular query", "http://popular.example/", 1 + j % 3) for j in range(popular)]
    records.append(LogRecord("loner", "only mine", "http://loner.example/", 5))
    return records + [LogRecord(f"u{j}", f"q{j}", f"http://q{j}.example/", 1) for j in range(popular)]


def test_the_threshold_of_a_session_is_the_known_answer() -> None:
    """tau = 16 at eps = 1, delta = 1e-6, Delta_0 = 1, r = 3, t = 1 (beta = 1.5)."""
    assert release_threshold(dp_options()) == 16
    assert release_threshold(dp_options(collusion=0)) == 15  # beta = 1: the discrete twin of Google's formula
    assert release_threshold(dp_options(max_items_per_user=10)) == 169


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"max_items_per_user": 0}, "max_items_per_user must be >= 1"),
        ({"collusion": 3}, "collusion t = 3 must be below the 3 parties"),
        ({"collusion": -1}, "collusion must be >= 0"),
    ],
)
def test_a_bad_parameter_is_refused_in_one_line(given, said) -> None:
    with pytest.raises(ValueError) as err:
        dp_options(**given)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_collusion_zero_travels_as_a_value_not_as_the_default() -> None:
    options = dp_options(collusion=0)
    assert SessionOptions.from_config(options.to_config()).collusion == 0
    assert SessionOptions.from_config(dp_options().to_config()).collusion == 1


def test_a_session_releases_the_crowd_and_not_the_loner_with_noisy_counts_at_or_above_tau() -> None:
    shares = crowd_log().split_by_user(3)
    release, report = run_session(shares, dp_options(), allow_insecure_key_bits=True, seed=4)
    assert isinstance(release, DpHistogram) and release.threshold == 16
    kept = {(i.query, i.url): i.count for i in release.items}
    assert ("popular query", "http://popular.example/") in kept
    assert ("only mine", "http://loner.example/") not in kept  # released with probability <= delta'
    assert all(count >= 16 for count in kept.values())
    assert report["privacy"]["end_to_end"] is False and report["privacy"]["private"] is False  # seeded: NOT private
    assert report["release"] == {"kind": "dp", "threshold": 16, "items": len(release)}


def test_the_solver_opens_the_sum_of_counts_and_shares_and_releases_exactly_what_passes() -> None:
    """n + Z at the solver is the sum of every party's distinct-user counts and noise shares
    (signed words under pairwise masks), and the release is the columns at or above tau."""
    log = synthetic_log(users=400, pairs=60, seed=2)
    options = dp_options(epsilon=4.0, delta=1e-3, max_items_per_user=2)
    network = InMemoryNetwork(session_hosts(log.split_by_user(3), options, seed=9, allow_insecure_key_bits=True))
    roles = start_session(network, options)
    solver = roles[options.solver]
    totals = np.asarray(solver.dp.sum.result, dtype=np.int64)
    every = np.arange(len(totals))
    counts = sum(np.asarray(roles[p].work.log.counts_over(every).sum(axis=0)).ravel() for p in options.parties)
    noise = totals - counts
    assert np.all(counts[solver.dp.kept] >= 1)  # a kept column is some party's pair, not a dummy (here)
    assert abs(noise.mean()) < 1.0 and 0 < noise.var()  # the noise is there, centred (scale Delta_0/eps = 0.5)
    assert set(solver.dp.kept.tolist()) == set(np.flatnonzero(totals >= release_threshold(options)).tolist())
    release = roles[options.initiator].output
    assert sorted(i.count for i in release.items) == sorted(totals[solver.dp.kept].tolist())


def test_a_seeded_session_gives_the_same_bytes_twice(tmp_path) -> None:
    shares = synthetic_log(users=300, pairs=40, seed=5).split_by_user(3)
    options = dp_options(epsilon=2.0, delta=1e-4, max_items_per_user=3)
    first, _ = run_session(shares, options, allow_insecure_key_bits=True, seed=11)
    again, _ = run_session(shares, options, allow_insecure_key_bits=True, seed=11)
    assert first == again and len(first) > 0


def test_a_party_bounds_each_user_to_max_items_distinct_pairs_uniformly() -> None:
    """Each user keeps at most Delta_0 pairs, entries 1; over many keys each of a user's 4
    pairs is kept about half the time at Delta_0 = 2 (binomial, 5 sigma)."""
    log = SearchLog.from_records([LogRecord("a", f"q{i}", "u", 3) for i in range(4)] + [LogRecord("b", "q0", "u", 1)])
    kept = np.zeros(4)
    trials = 400
    for seed in range(trials):
        bounded = bounded_counts(log.counts, log.users, lambda cols: [f"{c}".encode() for c in cols], DrawKeys.replay(seed, "p").secret("item choice"), 2)
        assert bounded.max() == 1 and np.all(np.asarray(bounded.sum(axis=1)).ravel() <= 2)
        kept += np.asarray(bounded[log.users.index("a")].todense()).ravel()
    assert np.all(np.abs(kept - trials / 2) < 5 * np.sqrt(trials / 4))


def test_the_single_holder_release_keeps_the_crowd() -> None:
    log = crowd_log()
    release, n, noisy = sanitize_dp(log, 1.0, 1e-6, 1, DrawKeys.replay(3, "holder"))
    assert release.threshold == 15
    assert {(i.query, i.url) for i in release.items} == {("popular query", "http://popular.example/")}
    assert n[log.pairs.index(("popular query", "http://popular.example/"))] == distinct_users(log, 1, DrawKeys.replay(3, "holder")).max()


def role_pair(options: SessionOptions):
    hosts = session_hosts(crowd_log().split_by_user(3), options, allow_insecure_key_bits=True)
    roles = start_session(InMemoryNetwork(hosts), options)
    return roles


def test_a_peers_bad_dp_messages_are_refused_not_crashed() -> None:
    options = dp_options()
    roles = role_pair(options)
    initiator, solver = roles[options.initiator], roles[options.solver]
    sid = options.session_id
    forged = cels_pb2.Envelope(session_id=sid, sender="party-2", dp_release=cels_pb2.DpRelease(session_id=sid))
    with pytest.raises(ProtocolError) as err:
        initiator.receive("party-2", forged)
    assert err.value.code == ProtocolError.FAILED_PRECONDITION
    late = cels_pb2.Envelope(session_id=sid, sender="party-2", dp_items=cels_pb2.DpItems(session_id=sid, items=[b"x"]))
    with pytest.raises(ProtocolError) as err:
        solver.receive("party-2", late)
    assert err.value.code == ProtocolError.FAILED_PRECONDITION


def test_simulate_writes_the_dp_histogram_and_its_note(tmp_path) -> None:
    """``cels simulate --release dp`` over gRPC: the release in the baselines' format, its
    note with the threshold, epsilon, delta, Delta_0, t and the unit of privacy."""
    out = tmp_path / "out"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "cels"), "simulate", "--parties", "3", "--out", str(out), "--release", "dp", "--key-bits", "512",
         "--synthetic-users", "600", "--seed", "3", "--report", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    items = read_release(out / "dp-histogram.tsv")
    note = json.loads((out / "dp-histogram.tsv.release-note.json").read_text())
    privacy = note["privacy"]
    assert (privacy["threshold"], privacy["epsilon"], privacy["delta"], privacy["max_items_per_user"], privacy["collusion"]) == (16, 1.0, 1e-6, 1, 1)
    assert privacy["unit"] == "one user's records at one organisation" and note["sizes"]["output_items"] == len(items)
    assert all(item.kind == "click" and item.count >= 16 for item in items)
    assert "SEEDED, NOT PRIVATE" in done.stdout  # a seeded run says so on its summary line


def test_sanitize_release_dp_writes_one_holders_histogram_and_refuses_a_method(tmp_path, capsys) -> None:
    from cels.cli import main
    from cels.logs import write_log

    source = tmp_path / "crowd.tsv"
    write_log(crowd_log(source={"format": "aol"}), source)
    out = tmp_path / "dp.tsv"
    args = ["sanitize", str(source), "--format", "aol", "--release", "dp", "--epsilon", "1", "--delta", "1e-6", "--out", str(out),
            "--report", str(tmp_path / "r.json"), "--seed", "2"]  # fmt: skip
    assert main(args) == 0
    items = read_release(out)
    assert [(i.query, i.url) for i in items] == [("popular query", "http://popular.example/")]
    note = json.loads(Path(f"{out}.release-note.json").read_text())
    assert note["privacy"]["threshold"] == 15 and note["sizes"]["output_items"] == 1
    assert "in plain words: this run replayed its draws from --seed" in capsys.readouterr().err
    assert main([*args[:-2], "--method", "zealous"]) == 2
    assert "--release dp is its own method" in capsys.readouterr().err


@pytest.mark.parametrize("release", ["sampled", "dp"])
def test_a_seeded_run_says_it_is_not_private_in_every_guarantee_sentence(release, tmp_path, capsys) -> None:
    """A --seed run's note and console say NOT private first, for either release kind."""
    from cels.cli import main
    from cels.logs import write_log

    source = tmp_path / "crowd.tsv"
    write_log(crowd_log(source={"format": "aol"}), source)
    out = tmp_path / "out.tsv"
    delta = "1e-6" if release == "dp" else "0.5"
    main(["sanitize", str(source), "--format", "aol", "--release", release, "--epsilon", "2", "--delta", delta, "--out", str(out),
          "--report", str(tmp_path / "r.json"), "--seed", "5", "-q"])  # fmt: skip
    privacy = json.loads(Path(f"{out}.release-note.json").read_text())["privacy"]
    assert privacy["private"] is False
    assert privacy["guarantee"].startswith("NONE: this run replayed every draw") and privacy["guarantee"] != privacy["against_recipients"]
    assert privacy["against_recipients"].startswith("NONE") and "NOT private" in privacy["against_recipients"]
    captured = capsys.readouterr()
    assert "privacy: THIS RUN IS NOT PRIVATE" in captured.err and "SEEDED, NOT PRIVATE" in captured.out


@pytest.mark.parametrize("bits", [1, 1536, 4096])
def test_a_group_no_phase_offers_is_refused_with_the_options(bits) -> None:
    """group_bits = 1 was taken and failed in the sampling (issue 41 finding 24): refused at once."""
    with pytest.raises(ValueError, match=f"Pohlig-Hellman group of {bits} bits not offered"):
        SessionOptions.create(3, epsilon=1.0, delta=0.4, group_bits=bits)


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", "nohost"])
def test_a_listen_address_outside_the_port_range_is_refused_naming_it(listen, tmp_path, capsys) -> None:
    """cels-party --listen 127.0.0.1:99999 said it served there while gRPC bound another port
    (issue 41 finding 5): refused with exit 2, one line naming the address."""
    from party_node.__main__ import main as party_main

    data = tmp_path / "log.tsv"
    data.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\t\t1\tu\n")
    assert party_main(["--name", "party-1", "--listen", listen, "--insecure", "--data", str(data), "--format", "aol"]) == 2
    assert f"listen address {listen!r} is not host:port with a port from 1 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("program", ["cels", "cels-party", "cels-solver"])
def test_every_program_says_its_version_and_cels_alone_lists_its_commands(program) -> None:
    """--version, not -v (verbose), and a bare ``cels`` shows the command list (issue 41 finding 8)."""
    from cels import __version__

    binary = str(Path(sys.executable).parent / program)
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"{program} {__version__}"
    if program == "cels":
        bare = subprocess.run([binary], capture_output=True, text=True, timeout=60)
        assert bare.returncode == 2 and "simulate" in bare.stderr and "sanitize" in bare.stderr


def test_sanitize_draws_no_progress_frames_into_a_file(tmp_path) -> None:
    """``cels sanitize > file 2>&1`` wrote the bar's carriage-return frames into the file
    (issue 41 finding 12): bars only on a terminal."""
    from cels.logs import write_log

    source = tmp_path / "crowd.tsv"
    write_log(crowd_log(source={"format": "aol"}), source)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "cels"), "sanitize", str(source), "--format", "aol", "--epsilon", "2", "--delta", "0.5",
         "--out", str(tmp_path / "out.tsv"), "--report", str(tmp_path / "r.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "\r" not in done.stdout and "sanitize:" not in done.stdout.replace("cels sanitize:", "")


def test_status_json_gives_byte_counts_as_numbers() -> None:
    """``cels status --json`` printed 64-bit counters as strings (issue 41 finding 18)."""
    from cels.cli.status import json_message

    summary = json_message(cels_pb2.SessionSummary(session_id="1234", bytes_sent=2**40, bytes_received=7))
    assert summary["bytes_sent"] == 2**40 and summary["bytes_received"] == 7 and summary["session_id"] == "1234"
    assert json_message(cels_pb2.SessionState(bytes_sent={"universe_hop": 5}))["bytes_sent"] == {"universe_hop": 5}


def test_a_reader_that_stops_early_gets_no_broken_pipe_message(tmp_path) -> None:
    """``cels ... | head`` printed "Broken pipe" (issue 41 finding 18): the reader left, nothing to say."""
    from cels.node.ledger_file import digest

    entries = [{"session_id": f"s{i}", "finished_at": 1e9 + i, "epsilon": 1.0, "delta": 0.1, "noise_epsilon": 0.0, "epsilon_total": 1.0,
                "end_to_end": False, "parties": ["party-1", "party-2"], "initiator": "party-1"} for i in range(20_000)]  # fmt: skip
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"version": 1, "sessions": entries, "sha256": digest(entries)}))  # an older node's ledger: read without a key
    cels = Path(sys.executable).parent / "cels"
    done = subprocess.run(f"'{cels}' ledger --ledger '{ledger}' | head -1", shell=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("ledger ") and "Broken pipe" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_cels_demo_and_make_demo_write_apart() -> None:
    """``make demo`` and ``cels demo`` both wrote ./demo-out (issue 41 finding 15)."""
    import re

    from cels.cli.demo import DEMO_DIR

    make_demo = re.findall(r"--out (\S+)", (REPO / "Makefile").read_text().split("\ndemo:")[1].split("\n\n")[0])
    assert make_demo == ["demo-out/sampled", "demo-out/dp"] and str(DEMO_DIR) not in make_demo and str(DEMO_DIR) != "demo-out"
