"""End to end with the product's defaults: `cels simulate` with 2048-bit keys and the private
solve, 3 party node processes and a solver node over mutual TLS, on a small synthetic log (the
ONE slow test), and the private mode's end-to-end noise over node processes with test-only keys."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cels.cli import main
from cels.logs import LoadOptions, load_log, synthetic_log
from cels.views import load_views


@pytest.mark.slow
def test_simulate_with_default_2048_bit_keys(tmp_path, capsys) -> None:
    out, views = tmp_path / "out", tmp_path / "views"
    argv = ["simulate", "--parties", "3", "--synthetic-users", "60", "--synthetic-pairs", "30", "--out", str(out),
            "--record-view", str(views), "--report", str(tmp_path / "operator" / "report.json")]  # fmt: skip
    assert main(argv) == 0
    console = capsys.readouterr()
    assert "started 4 node processes on 127.0.0.1" in console.err
    assert "released |O| = " in console.out
    assert "privacy: learns (private solve, noise off): party: " in console.err

    report = json.loads((tmp_path / "operator" / "report.json").read_text())
    assert (tmp_path / "operator").stat().st_mode & 0o777 == 0o700
    assert report["key_bits"] == 2048
    assert report["privacy"]["b"] == pytest.approx(min(1.0 / 2, math.log(1 / (1 - 0.4))))
    assert report["simulation"]["users_per_party"] == [20, 20, 20]  # 60 users split by user
    assert report["solve"]["mode"] == "private" and report["solve"]["rounds"] >= 1
    assert "nlp" not in report["phases"]
    for phase in ("universe", "counts", "solve", "sampling", "union"):
        entry = report["phases"][phase]
        assert set(entry["bytes"]) <= {"party-1", "party-2", "party-3", "solver"}
        assert entry["bytes_total"] == sum(entry["bytes"].values())
    assert report["bytes_total"] == sum(e["bytes_total"] for e in report["phases"].values())
    assert report["wire"]["bytes_total"] >= report["bytes_total"]  # frames and session control on top
    assert {"kl", "recall"} <= set(report["utility"])

    # no offline phase: the private mode masks its secure sums (and its solve), so nothing is
    # encrypted under a Paillier key and --stock-sum stocks nothing
    assert report.get("offline") is None
    # the wall clock of every phase and each node's peak RSS (node process and its workers)
    assert set(report["phase_wall_seconds"]) >= {"universe", "counts", "solve", "sampling", "union"}
    assert set(report["peak_rss_bytes"]) == {"party-1", "party-2", "party-3", "solver"}
    assert all(v["process"] > 10 * 2**20 for v in report["peak_rss_bytes"].values())

    released = load_log(out / "sanitized.tsv", LoadOptions(format="aol"))  # the input's format
    assert released.size == report["solver"]["integer_total"]
    source_pairs = set(synthetic_log(users=60, pairs=30).pairs)
    assert set(released.pairs) <= source_pairs
    assert not set(released.users) & set(synthetic_log(users=60, pairs=30).users)  # pseudonyms

    # every node process recorded its view of the one session (--record-view), and `cels views` reads them
    (session,) = load_views(views).values()
    assert set(session) == {"party-1", "party-2", "party-3", "solver"}
    solver_steps = {e["step"] for e in session["solver"].entries}
    assert "masked_verdicts" in solver_steps and "round_verdict" in solver_steps
    party_steps = {e["step"] for node in ("party-1", "party-2", "party-3") for e in session[node].entries}
    assert "masked_sum_share" in party_steps and not party_steps & {"sum_key", "sum_hop"}
    assert not {s for s in solver_steps if s.startswith("nlp_")}  # no constraint row reached the solver
    assert main(["views", str(views)]) == 0
    assert list(views.rglob("sequence.mmd")) and list(views.rglob("sequence.png"))

    # every node process was stopped: their ports are free again
    logs = list((tmp_path / "operator" / "report.node-logs").glob("*.log"))  # beside the operator report, not the release
    assert len(logs) == 4
    for line in logs:
        address = next(l for l in line.read_text().splitlines() if "listening on" in l).rsplit(" ", 1)[1]
        host, port = address.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()


def test_end_to_end_noise_over_node_processes(tmp_path, capsys) -> None:
    """--noise-epsilon in the private mode over gRPC (CELS App. C): the parties' masked Polya
    shares reach the solver node and the release stays within the noisy target (small test-only
    keys: no Paillier in this mode).  Issue 22: the public release note beside the release holds
    no exact total, utility, rounds or timings, its learns row says what partners learn, and the
    operator report (default place, mode 0600) holds the rest."""
    out = tmp_path / "out"
    argv = ["simulate", "--parties", "3", "--synthetic-users", "60", "--synthetic-pairs", "30", "--out", str(out),
            "--key-bits", "512", "--epsilon", "4", "--delta", "0.9", "--noise-epsilon", "1", "--sensitivity", "5",
            "--round-batch", "8"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    console = captured.err
    operator = Path(next(l for l in captured.out.splitlines() if "confidential operator report" in l).rsplit(" is ", 1)[1])
    assert operator.parent != out and operator.stat().st_mode & 0o777 == 0o600
    report = json.loads(operator.read_text())
    assert next(iter(report)) == "confidential"
    assert sorted(p.name for p in out.iterdir()) == ["sanitized.tsv", "sanitized.tsv.release-note.json"]  # no node log beside the release
    logs = operator.with_name(f"{operator.name.removesuffix('.json')}.node-logs")
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700 and {stat.S_IMODE(p.stat().st_mode) for p in logs.glob("*.log")} == {0o600}
    assert not [p.name for p in logs.glob("*.log") if "leaked semaphore" in p.read_text()]  # finding 10: every pool ends with its node
    note_text = (out / "sanitized.tsv.release-note.json").read_text()
    note = json.loads(note_text)
    for secret in ("total_before", "utility", "kl", "rounds", "seconds", "bytes", "phases", "noise_l1", "input_size"):
        assert f'"{secret}"' not in note_text, secret
    rows = load_log(out / "sanitized.tsv", LoadOptions("aol"))
    assert note["sizes"] == {"output_records": rows.size, "output_users": rows.n_users, "output_pairs": rows.n_pairs}  # as the single holder's (finding 16)
    assert "noise-free first-pass counts x, the noise total z" in note["privacy"]["learns"]["party"]
    assert note["privacy"]["end_to_end"] is False
    # the closing lines per phase carry the bytes all nodes sent (the report's figure, in MB) and the initiator's seconds
    line = next(l for l in console.splitlines() if l.startswith("  counts "))
    assert float(line.split()[3]) == pytest.approx(report["phases"]["counts"]["bytes_total"] / 1e6, abs=6e-4)  # printed to 3 decimals
    assert float(line.split()[1]) == pytest.approx(report["phase_wall_seconds"]["counts"], abs=6e-3)
    noise = report["solver"]["noise"]
    assert noise["scale"] == 5.0 and noise["noise_l1"] > 0
    assert noise["total_after_repair"] <= noise["total_noisy"]
    assert noise["total_after_repair"] == report["solver"]["integer_total"]
    assert report["privacy"]["end_to_end"] is False and "no end-to-end bound" in report["privacy"]["against_recipients"]
    steps = report["wire"]["nodes"]["solver"]["messages_sent"]
    assert steps["noise_total"] == 3  # z to every party, from the masked shares


def run_on_a_pty(argv: list[str], timeout: float) -> tuple[int, list[tuple[float, bytes]]]:
    """Run ``argv`` with a pseudo-terminal as stdin, stdout and stderr, left at 0 x 0 as nobody
    sized it (``script``, ``docker exec -t``); its exit code and what it wrote, as (seconds
    since the start, bytes) chunks."""
    master, slave = pty.openpty()
    start = time.monotonic()
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    try:
        while time.monotonic() - start < timeout:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append((time.monotonic() - start, data))
            elif process.poll() is not None:
                break
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        os.close(master)
    return process.returncode, chunks


def first_seen(chunks: list[tuple[float, bytes]], pattern: bytes) -> float | None:
    """When the first match of ``pattern`` was complete on the terminal (None: never)."""
    text, ends = b"", []
    for at, data in chunks:
        text += data
        ends.append((len(text), at))
    match = re.search(pattern, text)
    return None if match is None else next(at for end, at in ends if end >= match.end())


def test_simulate_on_a_terminal_shows_bars_says_what_it_does_and_peers_phases_as_they_end(tmp_path) -> None:
    """Issue 23: under a pty nobody sized, `cels simulate` showed no bar, nothing for its
    first seconds, and every peer's phase lines in one burst at the end of the session."""
    cels = str(Path(sys.executable).parent / "cels")
    argv = [cels, "simulate", "--parties", "3", "--synthetic-users", "2000", "--synthetic-pairs", "1500", "--key-bits", "512",
            "--out", str(tmp_path / "out")]  # fmt: skip
    code, chunks = run_on_a_pty(argv, timeout=300)
    console = b"".join(data for _, data in chunks).decode(errors="replace")
    assert code == 0, console[-3000:]
    assert first_seen(chunks, rb"\r(load|universe|counts|solve|sampling|union) [^\r\n]*\d+/\d+ nodes done") is not None, "no bar frame"
    starting, started = first_seen(chunks, rb"starting 4 node processes"), first_seen(chunks, rb"started 4 node processes")
    assert starting is not None and started is not None and starting < started
    released = first_seen(chunks, rb"released \|O\| = ")
    for peer in (b"party-2", b"party-3"):
        ended = first_seen(chunks, peer + rb" universe +\d+\.\d\d s")  # seen by the initiator's watchdog, as it ends
        assert ended is not None and released is not None, console[-3000:]
        assert ended + 1.0 < released, (peer, ended, released)
        assert len(re.findall(peer.decode() + r" universe ", console)) == 1, console[-3000:]  # one line (issue 41 finding 11)
    assert "session wall time" in console and "cels simulate took" in console


def test_two_simulations_name_their_reports_by_session_and_the_note_names_the_session(tmp_path, capsys, monkeypatch) -> None:
    """Issue 41 finding 2: two runs in one second shared a report name (one-second stamps),
    and nothing tied a release to the parties' ledger entries.  Now the default report is named
    by the session id, which the release note carries too."""
    monkeypatch.setenv("CELS_REPORT_DIR", str(tmp_path / "reports"))
    notes = []
    for k in range(2):
        out = tmp_path / f"out-{k}"
        assert main(["simulate", "--parties", "2", "--synthetic-users", "40", "--synthetic-pairs", "20", "--key-bits", "512", "--out", str(out)]) == 0
        notes.append(json.loads((out / "sanitized.tsv.release-note.json").read_text()))
    capsys.readouterr()
    reports = sorted((tmp_path / "reports").glob("*.report.json"))
    assert len(reports) == 2 and notes[0]["session_id"] != notes[1]["session_id"]
    for note in notes:
        (report,) = [r for r in reports if note["session_id"] in r.name]
        assert json.loads(report.read_text())["session_id"] == note["session_id"]
