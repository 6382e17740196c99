"""The party node's privacy budget ledger (cels.node.ledger): refusal with the numbers at
StartSession, persistence across restarts, a corrupted file refused loudly."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import stat
from pathlib import Path

import grpc
import pytest

from cels.cli import main
from cels.node.cluster import LOOPBACK, free_port
from cels.node.ledger import Ledger, LedgerPolicy
from cels.node.ledger_file import LedgerError, Reservation, digest, key_path, mac, read_entries, read_reservations, reservations_path
from cels.node.peers import sent_abort
from cels.protocol.aborts import REFUSED, describe
from cels.protocol.phases import Phase
from cels.protocol.options import SessionOptions
from cels.protocol.roles import Refusal
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from cels.protocol.wire.codec import phase_from_wire
from party_node.__main__ import main as party_main, start as party_start
from tests.test_sanitize_cli import aol_file, figure1_rows

DAY = 86400.0


class Clock:
    def __init__(self, now: float = 1_000 * DAY) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FinishingRole:
    """A role whose part is finished after its first message (what the ledger waits for)."""

    def __init__(self) -> None:
        self.finished, self.aborted, self.phase_hook = False, None, None

    def begin(self) -> list:
        return []

    def receive(self, sender, envelope) -> list:
        self.finished = True
        return []


def session(session_id: str, epsilon: float = 1.0, delta: float = 0.1, **kw) -> SessionOptions:
    return SessionOptions.create(["party-1", "party-2"], epsilon=epsilon, delta=delta, session_id=session_id, **kw)


def finish(ledger: Ledger, options: SessionOptions) -> None:
    role = ledger.admit(options, FinishingRole)
    role.phase_hook = print  # the host's hook reaches the role
    assert role._role.phase_hook is print
    role.begin()
    assert not role.finished
    role.receive("party-2", None)


def test_sessions_compose_and_a_session_over_budget_is_refused_with_the_numbers(tmp_path):
    clock = Clock()
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json", budget_epsilon=3.5, budget_delta=1.0, window_days=30), clock)
    finish(ledger, session("s1", 1.0, 0.1))
    finish(ledger, session("s2", 1.0, 0.1, noise_epsilon=1.0, sensitivity=30, solve="transformed"))  # end to end: eps + eps'
    with pytest.raises(ValueError) as refused:
        ledger.admit(session("s3", 1.0, 0.1), FinishingRole)
    message = str(refused.value)
    assert "session s3 needs epsilon 1, but 2 session(s) in the window spent 3 of the budget 3.5 per 30 days" in message
    assert "basic composition" in message and str(tmp_path / "l.json") in message
    clock.now += 31 * DAY  # s1 and s2 left the window
    finish(ledger, session("s3", 1.0, 0.1))
    assert [e["session_id"] for e in read_entries(tmp_path / "l.json")] == ["s1", "s2", "s3"]


def test_a_dp_histogram_is_a_dp_entry_charged_with_a_partys_view(tmp_path, capsys):
    """A DP histogram spends (eps + 2 eps_pad, 3 delta), a party's view (docs/releases.md), and
    is recorded as DP end to end, apart from the sampled release's probabilistic DP."""
    clock = Clock()
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json", budget_epsilon=2.5, budget_delta=1.0), clock)
    finish(ledger, session("sampled", 1.0, 0.1))
    finish(ledger, session("dp", 1.0, 1e-6, release="dp", padding_epsilon=0.1))
    sampled, dp = read_entries(tmp_path / "l.json")
    assert (dp["epsilon_total"], dp["delta"], dp["guarantee"], dp["end_to_end"]) == (pytest.approx(1.2), pytest.approx(3e-6), "DP end to end", True)
    assert sampled["guarantee"] == "probabilistic DP of the sampling given the counts" and not sampled["end_to_end"]
    with pytest.raises(ValueError, match="needs epsilon 1.2, but 2 session"):
        ledger.admit(session("dp2", 1.0, 1e-6, release="dp"), FinishingRole)
    assert main(["ledger", "--ledger", str(tmp_path / "l.json")]) == 0
    assert "1 DP histogram(s), DP end to end" in capsys.readouterr().out


def test_running_sessions_are_reserved_and_released_once_when_they_end(tmp_path):
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json", budget_delta=0.5), Clock())
    first = ledger.admit(session("a", delta=0.3), FinishingRole)
    assert read_reservations(tmp_path / "l.json")[0] == {"a": Reservation(1.0, 0.3, 1_000 * DAY)}
    with pytest.raises(ValueError, match=r"needs delta 0.3, but 0 session.*running ones reserve 0.3 \(a\) of the budget 0.5 in total"):
        ledger.admit(session("b", delta=0.3), FinishingRole)
    assert first is not None  # the role is still referenced (the host keeps ended sessions)
    assert ledger.release("a") and not ledger.release("a")  # the session ended without output: released once
    assert ledger.reserved() == {} and read_reservations(tmp_path / "l.json")[0] == {}
    finish(ledger, session("b", delta=0.3))
    assert not ledger.release("b")  # recorded, so nothing was held any more
    assert [e["session_id"] for e in read_entries(tmp_path / "l.json")] == ["b"]


def test_a_role_that_cannot_be_built_holds_no_reservation(tmp_path):
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json", budget_delta=0.5), Clock())

    def broken():
        raise OSError("no node key")

    with pytest.raises(OSError):
        ledger.admit(session("a", delta=0.3), broken)
    assert ledger.reserved() == {}


def test_cels_ledger_shows_spent_reserved_with_age_and_left(tmp_path, capsys):
    clock = Clock()
    path = tmp_path / "l.json"
    ledger = Ledger.open(LedgerPolicy(path, budget_delta=2.0))
    ledger.clock = clock
    finish(ledger, session("done", delta=0.4))
    ledger.admit(session("running", delta=0.4), FinishingRole)
    assert main(["ledger", "--ledger", str(path), "--budget-delta", "2", "--budget-epsilon", "10"]) == 0
    out = capsys.readouterr().out
    assert "reserved by 1 running session(s) of node process" in out
    assert "  running  eps 1  delta 0.4  for " in out
    assert "budget: eps 10 (spent 1, reserved 1, 8 left), delta 2 (spent 0.4, reserved 0.4, 1.2 left)" in out
    Ledger.open(LedgerPolicy(path))  # a restarted node: the reservations ended with the old process
    assert main(["ledger", "--ledger", str(path), "--budget-delta", "2"]) == 0
    assert "reserved by 0 running session(s)\nbudget: delta 2 (spent 0.4, reserved 0, 1.6 left)" in capsys.readouterr().out


def test_an_aborted_role_is_not_recorded(tmp_path):
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json"), Clock())
    role = ledger.admit(session("x"), FinishingRole)
    role.aborted = cels_pb2.Abort(reason="peer gone")
    role.receive("party-2", None)
    assert read_entries(tmp_path / "l.json") == []


def test_the_ledger_survives_restarts_and_cels_ledger_shows_it(tmp_path, capsys):
    config = tmp_path / "party.toml"
    config.write_text('[node]\nname = "party-1"\n\n[ledger]\nbudget_epsilon = 10\nwindow_days = 7\n')
    path = tmp_path / "party-1.ledger.json"  # the default: NAME.ledger.json beside the TOML file
    finish(Ledger(LedgerPolicy(path)), session("s1", 2.0, 0.25))
    finish(Ledger(LedgerPolicy(path)), session("s2", 1.5, 0.25))  # a restarted node appends
    assert main(["ledger", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "s1  eps 2 (no noise on the counts)  delta 0.25" in out
    assert "(7 days): 2 session(s), eps 3.5, delta 0.5; 2 without noise on the counts" in out
    assert "budget: eps 10 (spent 3.5, reserved 0, 6.5 left)" in out


def test_a_session_id_used_before_is_refused_after_a_restart(tmp_path):
    """The ids of charged sessions are kept across a restart: a replayed StartSession (or an
    initiator reusing an id) cannot make a second release under the id of the first."""
    path = tmp_path / "party-1.ledger.json"
    finish(Ledger(LedgerPolicy(path)), session("s1"))
    restarted = Ledger(LedgerPolicy(path))
    with pytest.raises(Refusal, match=r"session s1 was charged already \(finished \d{4}-\d\d-\d\d") as refused:
        restarted.admit(session("s1"), FinishingRole)
    assert refused.value.public == "the session id is taken"
    restarted.admit(session("s2"), FinishingRole)
    with pytest.raises(Refusal, match=r"session s2 was charged already \(running\)"):
        restarted.admit(session("s2"), FinishingRole)
    assert len(read_entries(path)) == 1


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda text: text[: len(text) // 2], "not JSON"),
        (lambda text: text.replace('"epsilon": 1.0', '"epsilon": 0.1', 1), "its MAC does not match"),
        (lambda text: text.replace('"delta": 0.1', '"delta": "0.1"', 1), "field 'delta'"),
    ],
)
def test_a_corrupted_ledger_is_refused_loudly(tmp_path, capsys, damage, message):
    path = tmp_path / "l.json"
    finish(Ledger(LedgerPolicy(path)), session("s1"))
    path.write_text(damage(path.read_text()))
    with pytest.raises(LedgerError, match=message):
        Ledger.open(LedgerPolicy(path))
    with pytest.raises(LedgerError, match=message):  # a running node refuses the next session too
        Ledger(LedgerPolicy(path)).admit(session("s2"), FinishingRole)
    data = aol_file(tmp_path / "d.tsv", figure1_rows())
    argv = ["--name", "party-1", "--listen", "127.0.0.1:1", "--insecure", "--data", str(data), "--ledger", str(path)]
    assert party_main(argv) == 2  # the node does not start on a corrupted ledger
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cels-party: error: ledger {path} is corrupted") and len(err.splitlines()) == 1


def test_the_node_refuses_at_start_session_with_failed_precondition(tmp_path):
    path = tmp_path / "l.json"
    finish(Ledger(LedgerPolicy(path)), session("old", 1.0, 0.1))
    data = aol_file(tmp_path / "d.tsv", figure1_rows())
    address = f"{LOOPBACK}:{free_port()}"
    argv = ["--name", "party-1", "--listen", address, "--insecure", "--data", str(data), "--session-keys",
            "--obfuscators", "0", "--peer", "party-2=127.0.0.1:1", "--peer", "solver=127.0.0.1:2",
            "--ledger", str(path), "--budget-epsilon", "1.5"]  # fmt: skip
    node = party_start(argv)
    node.start()
    try:
        with grpc.insecure_channel(address) as channel:
            request = cels_pb2.RunRequest(config=session("new", 1.0, 0.1).to_config())
            run = cels_pb2_grpc.CelsNodeStub(channel).Run(request, timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                next(iter(run))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "privacy budget exceeded: session new needs epsilon 1, but 1 session(s) in the window spent 1" in err.value.details()
        # no doubled prefix; the numbers for this node's controller only; the structured refusal
        # a peer or cels run reads (issue 23 items 9, 10)
        assert err.value.details().startswith("party-1: session 'new' refused: privacy budget exceeded (privacy budget exceeded: session new")
        notice = sent_abort(err.value)
        assert (notice.origin, notice.kind, phase_from_wire(notice.phase), notice.reason) == ("party-1", REFUSED, "start", "privacy budget exceeded")
        assert describe(notice) == "no session ran: refused by party-1 (privacy budget exceeded)"
        assert [e["session_id"] for e in read_entries(path)] == ["old"]
    finally:
        node.stop()


class PhasedRole(FinishingRole):
    """A party role that walks through the given phases, one per message."""

    def __init__(self, phases) -> None:
        super().__init__()
        self.phases, self.phase = list(phases), Phase.READY

    def receive(self, sender, envelope) -> list:
        self.phase = self.phases.pop(0)
        return []


def three_sessions(tmp_path) -> Path:
    path = tmp_path / "l.json"
    ledger = Ledger.open(LedgerPolicy(path))
    for k in range(3):
        finish(ledger, session(f"s{k}"))
    return path


def test_dropping_entries_and_recomputing_a_digest_is_refused_and_so_is_a_downgrade(tmp_path) -> None:
    """The review's attack: two of three entries dropped and the digest recomputed, the spend
    falling from 3 to 1, is now refused; without the key no MAC can be recomputed, and with
    it a dropped middle entry still breaks the chain."""
    path = three_sessions(tmp_path)
    doc = json.loads(path.read_text())
    assert [e["prev"] for e in doc["sessions"]] == ["", doc["sessions"][0]["mac"], doc["sessions"][1]["mac"]]
    kept = doc["sessions"][:1]
    path.write_text(json.dumps({"version": 2, "sessions": kept, "mac": digest(kept)}))
    with pytest.raises(LedgerError, match="its MAC does not match"):
        read_entries(path)
    key = key_path(path).read_bytes()
    gap = [doc["sessions"][0], doc["sessions"][2]]
    path.write_text(json.dumps({"version": 2, "sessions": gap, "mac": mac(key, {"version": 2, "sessions": gap})}))
    with pytest.raises(LedgerError, match="session 1 breaks the chain of MACs"):
        read_entries(path)
    plain = [{k: v for k, v in e.items() if k not in ("prev", "mac")} for e in kept]
    path.write_text(json.dumps({"version": 1, "sessions": plain, "sha256": digest(plain)}))
    with pytest.raises(LedgerError, match="unkeyed version 1 file beside the key"):
        Ledger.open(LedgerPolicy(path))


def test_a_missing_ledger_or_key_fails_closed_and_the_files_are_private(tmp_path) -> None:
    path = three_sessions(tmp_path)
    for made in (path, key_path(path), reservations_path(path)):
        assert stat.S_IMODE(made.stat().st_mode) == 0o600, made
    path.rename(tmp_path / "elsewhere.json")
    with pytest.raises(LedgerError, match="is missing but its key .* exists"):
        Ledger.open(LedgerPolicy(path, budget_epsilon=5.0))
    with pytest.raises(LedgerError, match="is missing but its key"):  # a running node refuses its next session
        Ledger(LedgerPolicy(path, budget_epsilon=5.0)).admit(session("next"), FinishingRole)
    (tmp_path / "elsewhere.json").rename(path)
    key_path(path).rename(tmp_path / "key")
    with pytest.raises(LedgerError, match="its MAC key .* is missing"):
        Ledger.open(LedgerPolicy(path))
    assert main(["ledger", "--ledger", str(path)]) == 2


def test_an_old_unkeyed_ledger_is_signed_once_with_its_sessions_kept(tmp_path) -> None:
    path = tmp_path / "l.json"
    entries = [{"session_id": "old", "finished_at": 1.0, "epsilon": 1.0, "delta": 0.1, "noise_epsilon": 0.0, "epsilon_total": 1.0,
                "end_to_end": False, "parties": ["party-1", "party-2"], "initiator": "party-1"}]  # fmt: skip
    path.write_text(json.dumps({"version": 1, "sessions": entries, "sha256": digest(entries)}))
    Ledger.open(LedgerPolicy(path))
    assert [e["session_id"] for e in read_entries(path)] == ["old"] and json.loads(path.read_text())["version"] == 2


@pytest.mark.parametrize(
    ("release", "phases", "charged"),
    [
        ("sampled", [Phase.COUNTS, Phase.UNION], True),  # its records went into the union, then the session aborted
        ("sampled", [Phase.COUNTS, Phase.SOLVE], False),  # aborted before any record left
        ("dp", [Phase.UNIVERSE, Phase.COUNTS], True),  # its noisy counts went into the masked sum
        ("dp", [Phase.LOAD, Phase.UNIVERSE], False),
    ],
)
def test_a_party_is_charged_when_its_data_for_the_release_leaves_it(tmp_path, release, phases, charged) -> None:
    ledger = Ledger(LedgerPolicy(tmp_path / "l.json"), Clock())
    options = session("x", delta=1e-6 if release == "dp" else 0.1, release=release)
    role = ledger.admit(options, lambda: PhasedRole(phases))
    role.begin()
    for _ in phases:
        role.receive("party-2", None)
    role.aborted = cels_pb2.Abort(reason="peer gone")
    assert [e["session_id"] for e in read_entries(tmp_path / "l.json")] == (["x"] if charged else [])


def _append(path: str, first: int) -> None:
    ledger = Ledger(LedgerPolicy(Path(path)))
    for k in range(first, first + 8):
        finish(ledger, session(f"s{k}"))


def test_two_processes_appending_at_once_lose_no_entry(tmp_path) -> None:
    """The lock is the file's (flock), not one process's: 2 x 8 sessions, one chain."""
    path = tmp_path / "l.json"
    Ledger.open(LedgerPolicy(path))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append, args=(str(path), first)) for first in (0, 100)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    assert sorted(e["session_id"] for e in read_entries(path)) == sorted(f"s{k}" for k in [*range(8), *range(100, 108)])


def test_a_resumed_session_is_charged_once(tmp_path):
    """A re-run (``resume``) of a session its first run charged is admitted, over the budget
    too (it spends nothing new: the same bytes again), and not charged a second time; one
    its first run never charged is reserved and charged as any."""
    path = tmp_path / "party-1.ledger.json"
    ledger = Ledger(LedgerPolicy(path, budget_epsilon=1.0))
    finish(ledger, session("s1"))
    restarted = Ledger(LedgerPolicy(path, budget_epsilon=1.0))
    again = dataclasses.replace(session("s1"), resume=True)
    role = restarted.admit(again, FinishingRole)
    assert isinstance(role, FinishingRole) and restarted.reserved() == {}
    role.receive("party-2", None)
    assert [e["session_id"] for e in read_entries(path)] == ["s1"]
    with pytest.raises(Refusal, match="privacy budget exceeded"):  # a first run's s2 is over the budget; so is its re-run
        restarted.admit(dataclasses.replace(session("s2"), resume=True), FinishingRole)
    roomy = Ledger(LedgerPolicy(path, budget_epsilon=3.0))
    finish(roomy, dataclasses.replace(session("s2"), resume=True))
    assert [e["session_id"] for e in read_entries(path)] == ["s1", "s2"]
