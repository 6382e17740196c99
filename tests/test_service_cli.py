"""``cels run`` / ``cels simulate`` as an operator meets them (issue 16): typos in session.toml,
nodes that are not up, a missing input, and the live phase lines of a session."""

from __future__ import annotations

import io
import time

import pytest

import cels.cli.run as run_cli
from cels.cli import COMMANDS
from cels.cli import main
from cels.cli.progress import SessionProgress
from cels.node.cluster import LOOPBACK, free_port
from cels.protocol.options import SessionOptions
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_to_wire

RUN = """
[run]
initiator = "party-1"
address = "{address}"
insecure = true
output = "out/sanitized.tsv"
report = "out/report.json"
{extra}

[session]
parties = ["party-1", "party-2"]
epsilon = 1.0
delta = 0.4
"""


def session_toml(tmp_path, address: str = "127.0.0.1:1", extra: str = "", session: str = ""):
    (tmp_path / "out").mkdir(exist_ok=True)
    path = tmp_path / "session.toml"
    path.write_text(RUN.format(address=address, extra=extra) + session)
    return path


@pytest.mark.parametrize(
    "extra,session,message",
    [
        ('outptu = "x.tsv"', "", "[run] unknown key 'outptu'"),
        ("", "epsilonn = 2.0\n", "[session] unknown key 'epsilonn'"),
        ("timeout = true", "", "[run] timeout: expected a number > 0, got true"),
        ("", "[sesion]\nepsilon = 1\n", "unknown table [sesion]"),
        # issue 23 item 5: a wrongly typed value is named with what was expected, not a TypeError's text
        ("", '[session.x]\n', "[session] unknown key 'x'"),
        ("nodes = { solver = 7100 }", "", "[run] nodes.solver: expected host:port (a port from 1 to 65535), got 7100"),
    ],
)
def test_session_toml_typos_name_file_table_and_key(tmp_path, capsys, extra, session, message):
    path = session_toml(tmp_path, extra=extra, session=session)
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "session,message",
    [
        ('epsilon = "one"', '[session] epsilon: expected a number > 0, got "one"'),
        ("delta = 1.5", "[session] delta: expected a number > 0 and < 1, got 1.5"),
        ('parties = ["party-1"]', '[session] parties: expected an array of strings with at least 2 items, got ["party-1"]'),
        ('solve = "fast"', '[session] solve: expected one of "private", "transformed", got "fast"'),
        ("min_count = 2.5", "[session] min_count: expected an integer >= 0, got 2.5"),
        ("parties = 3", "[session] parties: expected an array of strings with at least 2 items, got 3"),
    ],
)
def test_a_wrongly_typed_session_value_names_the_key_and_what_it_takes(tmp_path, capsys, session, message):
    """Issue 23 item 5: ``epsilon = "one"`` was "'>' not supported between instances of 'str' and 'int'"."""
    key = session.split(" = ")[0]
    (tmp_path / "out").mkdir()
    path = tmp_path / "session.toml"
    path.write_text("\n".join(line for line in RUN.format(address="127.0.0.1:1", extra="").splitlines() if not line.startswith(f"{key} = ")) + f"\n{session}\n")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"cels run: error: {path}: {message}\n"


def test_a_missing_controller_key_is_named_before_the_session_starts(tmp_path, capsys):
    """Issue 23 item 6: [run] key pointing nowhere was a raw [Errno 2] after the session banner."""
    for name in ("ca.pem", "controller.pem"):
        (tmp_path / name).write_text("x")
    path = session_toml(tmp_path, extra='ca = "ca.pem"\ncert = "controller.pem"\nkey = "controller.key"')
    path.write_text(path.read_text().replace("insecure = true\n", ""))
    assert main(["run", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no session banner: nothing was started
    assert captured.err == f"cels run: error: {path}: [run] key = 'controller.key': {tmp_path / 'controller.key'} does not exist\n"


def test_cels_ledger_on_a_solver_config_says_the_solver_keeps_none(tmp_path, capsys):
    """Issue 23 item 10: it said "unknown table [solver]"."""
    config = tmp_path / "solver.toml"
    config.write_text('[node]\nname = "solver"\n\n[solver]\ntime_limit = 20.0\n')
    assert main(["ledger", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == f"cels ledger: error: {config} configures a solver node, which keeps no privacy budget ledger (it holds no data); give a party node's TOML\n"


def test_run_without_nodes_says_which_are_unreachable_at_which_address(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_cli, "CONNECT_TIMEOUT", 1.5)
    initiator, solver = f"{LOOPBACK}:{free_port()}", f"{LOOPBACK}:{free_port()}"
    path = session_toml(tmp_path, initiator, extra=f'nodes = {{ solver = "{solver}" }}')
    assert main(["run", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    waiting = [line for line in err.splitlines() if "waiting" in line]
    assert waiting and all(f"party-1 at {initiator} (UNAVAILABLE)" in line and f"solver at {solver}" in line for line in waiting)
    assert f"cels run: no session ran: party-1 unreachable (not running, or at another address): party-1 at {initiator} (UNAVAILABLE), solver at {solver} (UNAVAILABLE) after " in err
    assert "aborted by" not in err
    assert list((tmp_path / "out").iterdir()) == []


def test_simulate_with_a_missing_input_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "s1"
    assert main(["simulate", "--input", str(tmp_path / "nosuch.tsv"), "--format", "aol", "--out", str(out)]) == 2
    assert f"--input {tmp_path / 'nosuch.tsv'} does not exist" in capsys.readouterr().err and not out.exists()
    assert main(["simulate", "--input", str(tmp_path / "nosuch.tsv"), "--out", str(out)]) == 2
    assert "--input needs --format" in capsys.readouterr().err and not out.exists()


def report(node: str, phase: str, seconds: float = 1.0) -> cels_pb2.StepReport:
    return cels_pb2.StepReport(node=node, phase=phase_to_wire(phase), seconds=seconds, bytes_sent=1000)


def start(node: str, phase: str, at: float = 0.0) -> cels_pb2.PhaseStart:
    return cels_pb2.PhaseStart(node=node, phase=phase_to_wire(phase), seconds_since_start=at)


def test_progress_is_one_line_per_node_and_phase_in_protocol_order_with_one_kind_of_seconds():
    """Issue 41 finding 11: a peer's phases appeared twice ("ended ... wall", then "done ...
    busy"), busy seconds exceeded wall ones, and bars stacked out of order.  Now each node's
    phase is one line when it is left, with its wall-clock seconds between the stamps, and the
    end has one line per phase in protocol order."""
    config = SessionOptions.create(["party-1", "party-2"], epsilon=1.0, delta=0.4, solve="transformed")
    stream = io.StringIO()
    progress = SessionProgress(config, stream=stream, bars=False)
    phases = ("load", "universe", "counts", "nlp", "sampling", "union")
    for k, phase in enumerate(phases):
        progress.start(start("party-1", phase, 2.0 * k))
    progress.start(start("party-1", "over", 12.0))
    progress.start(start("party-2", "load", 0.5))
    progress.start(start("party-2", "counts", 4.5))  # the probes missed universe: it ends with load, unseen beginning
    progress.start(start("solver", "nlp", 6.25))
    progress.start(start("solver", "over", 8.0))
    progress.step(report("party-2", "union"))  # a peer's reports come once its part is over: union ends here
    progress.finish({"phases": {phase: {"bytes_total": 1_000_000 * (k + 1)} for k, phase in enumerate(phases)}})
    lines = stream.getvalue().splitlines()
    rows = [line.split("]", 1)[1].split() for line in lines if line.startswith("  [")]
    party1 = [r[2:4] for r in rows if r[0] == "party-1"]
    assert party1 == [[phase, "2.00"] for phase in phases]  # every phase 2 s between its stamps, in protocol order
    party2 = [r[1] for r in rows if r[0] == "party-2"]
    assert party2 == list(phases)  # its union report ended what no stamp ended, in protocol order
    assert [r[1:3] for r in rows if r[0] == "solver"] == [["nlp", "1.75"]]
    assert sum(1 for r in rows if r[0] == "party-2" and r[1] == "load") == 1 and ["party-2", "universe", "ended"] in rows
    assert not any(word in stream.getvalue() for word in ("busy", " done ", "started"))
    table = lines[lines.index(next(l for l in lines if l.startswith("phases ("))) + 1 :]
    assert [row.split()[0] for row in table] == list(phases)
    assert table[0].split()[1:] == ["2.00", "s", "1.000", "MB"]  # on the initiator: they add up to its 12 s
    assert sum(progress.phase_wall_seconds().values()) == pytest.approx(12.0)


def test_cels_help_is_for_users_and_imports_no_subcommand():
    import subprocess
    import sys

    code = (
        "import sys\nfrom cels.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('scipy', 'matplotlib', 'numpy', 'grpc', 'cels.cli.sanitize', 'cels.cli.distributed') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out  # lazy: measured 2.26 s -> 0.08 s (docs/bench/cli-help-startup.json)
    assert "a DP histogram of query-url pairs" in out and "one sanitized search" in out and "subcommand module" not in out
    assert "3 empty release" in out and "split" in out and "ledger" in out


HEAVY = ("scipy.optimize", "scipy.sparse", "matplotlib", "grpc", "jsonschema", "gmpy2", "ray", "pyarrow")
"""What no subcommand's --help may import: the solver, the histogram, plots, gRPC, schemas, Paillier, engines."""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_subcommands_help_loads_no_solver_grpc_or_plots(command):
    """``cels COMMAND --help`` prints its flags without the modules that run it (the bench of
    the whole process: docs/bench/cli-help-startup.json).  ``cels bench --help`` and ``cels
    experiment --help`` list theirs without importing one; ``cels bench protocol --help``
    imports that benchmark's module, where its flags are declared."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom cels.cli import main\n"
        f"try:\n    main({command.split()!r} + ['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: cels" in out and "HEAVY []" in out, out[-400:]


def test_a_peer_entering_a_phase_ends_its_earlier_ones_live():
    """Peers report their figures only when their part is over; the initiator's watchdog sees
    them enter phases, so their phases are shown as they end, not in one burst at the end."""
    config = SessionOptions.create(["party-1", "party-2"], epsilon=1.0, delta=0.4)
    stream = io.StringIO()
    progress = SessionProgress(config, stream=stream, bars=False)
    progress.start(start("party-2", "load", 1.0))
    assert stream.getvalue() == ""  # entering prints nothing
    progress.start(start("party-2", "counts", 4.0))  # the probe missed universe
    rows = [line.split("]", 1)[1].split() for line in stream.getvalue().splitlines()]
    assert rows == [["party-2", "load", "3.00", "s"], ["party-2", "universe", "ended"]]
    for phase in ("load", "universe"):  # its reports at the end print nothing more
        progress.step(report("party-2", phase))
    assert len(stream.getvalue().splitlines()) == 2


def test_simulate_on_ray_without_the_extra_says_so_before_any_node_starts(tmp_path, capsys, monkeypatch) -> None:
    """Issue 41 finding 3: the nodes were started and one ended in a traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["simulate", "--parties", "2", "--engine", "ray", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "cels simulate: error: --engine ray needs the ray extra (pip install 'cels[ray]')\n"
    assert not (tmp_path / "out").exists()


def test_split_of_a_missing_input_says_so_in_one_line_and_makes_no_directory(tmp_path, capsys) -> None:
    """Issue 41 finding 17: a raw [Errno 2], and the output directories were made first."""
    assert main(["split", str(tmp_path / "nosuch.tsv"), "--format", "aol", "--parties", "2", "--out", str(tmp_path / "parts" / "party-{k}.tsv")]) == 2
    assert capsys.readouterr().err == f"cels split: error: input {tmp_path / 'nosuch.tsv'} does not exist\n"
    assert not (tmp_path / "parts").exists()
    with pytest.raises(SystemExit):
        main(["split", "--help"])
    assert "``" not in capsys.readouterr().out  # plain text, not reST


def test_run_waits_for_the_nodes_as_long_as_run_wait_says(tmp_path, capsys) -> None:
    """Issue 41 finding 21: the 60 s wait for the nodes could not be changed."""
    path = session_toml(tmp_path, address=f"127.0.0.1:{free_port()}", extra="wait = 2")
    started = time.monotonic()
    assert main(["run", "--config", str(path)]) == 1
    assert time.monotonic() - started < 20
    printed = capsys.readouterr()
    assert "party-1" in printed.err
    assert "session " not in printed.out  # finding 21: no session id for a session that never started


def test_run_refuses_an_existing_output_before_it_calls_a_node(tmp_path, capsys) -> None:
    """Issue 41 finding 2: two `cels run` of one session.toml both wrote out/sanitized.tsv."""
    path = session_toml(tmp_path, address=f"127.0.0.1:{free_port()}", extra="wait = 1")
    (tmp_path / "out" / "sanitized.tsv").write_text("an earlier release\n")
    assert main(["run", "--config", str(path)]) == 2
    printed = capsys.readouterr()
    assert "[run] output" in printed.err and "exists: give --force to replace it" in printed.err and "waiting" not in printed.err
    assert (tmp_path / "out" / "sanitized.tsv").read_text() == "an earlier release\n"
    assert main(["run", "--config", str(path), "--force"]) == 1  # forced: it goes on, to the unreachable initiator


def test_simulate_refuses_an_existing_release_before_it_reads_the_input(tmp_path, capsys) -> None:
    """A second `cels simulate --out DIR` said so only after reading the whole input: now at
    once (the input here is not even a log, and is never read)."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "sanitized.tsv").write_text("an earlier release\n")
    (tmp_path / "in.tsv").write_text("not\ta log\n")
    assert main(["simulate", "--parties", "2", "--input", str(tmp_path / "in.tsv"), "--format", "aol", "--out", str(tmp_path / "sim")]) == 2
    printed = capsys.readouterr()
    assert "--out" in printed.err and "exists: give --force to replace it" in printed.err and "reading" not in printed.err
    assert (tmp_path / "sim" / "sanitized.tsv").read_text() == "an earlier release\n"


def test_status_shows_a_sessions_whole_reason() -> None:
    """A refusal's reason is the last column, shown whole (it was cut at 80 characters, in the
    middle of the rule's value)."""
    from cels.cli.status import tables

    reason = "party-2 refuses session s-1: policy.releases: release = sampled is not one of dp (the party's [policy] releases)"
    session = {"session_id": "s-1", "outcome": "refused", "phase": "ready", "started_at": 0.0, "seconds": 0.0,
               "bytes_sent": 0, "bytes_received": 0, "initiator": "party-1", "origin": "party-2", "reason": reason}  # fmt: skip
    result = {"node": "solver", "role": "solver", "address": "127.0.0.1:1", "health": "SERVING", "config": "solver.toml", "peers": {},
              "status": {"node_key_bits": 2048, "running_sessions": 0, "sessions": [session]}}  # fmt: skip
    assert f"party-2: {reason}" in tables(result, 2.0)
