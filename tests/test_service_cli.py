"""``cels run`` / ``cels simulate`` as an operator meets them (issue 16): typos in session.toml,
nodes that are not up, a missing input, and the live phase lines of a session."""

from __future__ import annotations

import io

import pytest

import cels.cli.service as service
from cels.cli import main
from cels.cli.progress import SessionProgress
from cels.node.cluster import LOOPBACK, free_port
from cels.protocol.options import SessionOptions
from cels.protocol.wire import cels_pb2

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
        ("timeout = true", "", "[run] timeout = True is not a int or float"),
        ("", "[sesion]\nepsilon = 1\n", "unknown table [sesion]"),
    ],
)
def test_session_toml_typos_name_file_table_and_key(tmp_path, capsys, extra, session, message):
    path = session_toml(tmp_path, extra=extra, session=session)
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and message in err and len(err.strip().splitlines()) == 1


def test_run_without_nodes_says_which_are_unreachable_at_which_address(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(service, "CONNECT_TIMEOUT", 1.5)
    initiator, solver = f"{LOOPBACK}:{free_port()}", f"{LOOPBACK}:{free_port()}"
    path = session_toml(tmp_path, initiator, extra=f'nodes = {{ solver = "{solver}" }}')
    assert main(["run", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    waiting = [line for line in err.splitlines() if "waiting" in line]
    assert waiting and all(f"party-1 at {initiator} (UNAVAILABLE)" in line and f"solver at {solver}" in line for line in waiting)
    assert f"cels run: no session ran: party-1 unreachable (not running, wrong address, or a certificate that does not name the node): party-1 at {initiator} (UNAVAILABLE), solver at {solver} (UNAVAILABLE) after " in err
    assert "aborted by" not in err
    assert list((tmp_path / "out").iterdir()) == []


def test_simulate_with_a_missing_input_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "s1"
    assert main(["simulate", "--input", str(tmp_path / "nosuch.tsv"), "--format", "aol", "--out", str(out)]) == 2
    assert f"--input {tmp_path / 'nosuch.tsv'} does not exist" in capsys.readouterr().err and not out.exists()
    assert main(["simulate", "--input", str(tmp_path / "nosuch.tsv"), "--out", str(out)]) == 2
    assert "--input needs --format" in capsys.readouterr().err and not out.exists()


def report(node: str, phase: str, seconds: float = 1.0) -> cels_pb2.StepReport:
    return cels_pb2.StepReport(node=node, phase=phase, seconds=seconds, bytes_sent=1000)


def test_progress_lines_follow_protocol_order_and_list_the_initiator():
    config = SessionOptions.create(["party-1", "party-2"], epsilon=1.0, delta=0.4, solve="transformed")
    stream = io.StringIO()
    progress = SessionProgress(config, stream=stream, bars=False)
    progress.start(report("party-1", "load", 0))
    progress.start(report("solver", "nlp", 0))
    for phase in sorted(("load", "universe", "counts", "nlp", "sampling", "union")):  # today's emitter: alphabetical
        progress.step(report("party-2", phase))
    progress.step(report("solver", "nlp", 7.5))
    phases_of_initiator = {p: {"seconds": {"party-1": 2.0}, "bytes": {"party-1": 10}} for p in ("union", "load", "nlp")}
    progress.finish({"phases": phases_of_initiator})
    lines = stream.getvalue().splitlines()
    assert "party-1 (initiator) load      started" in lines[0] and "solver nlp       started" in lines[1]
    party2 = [line.split()[4] for line in lines if " party-2 " in line]
    assert party2 == ["load", "universe", "counts", "nlp", "sampling", "union"]
    initiator = [line.split()[5] for line in lines if "party-1 (initiator)" in line and "done" in line]
    assert initiator == ["load", "nlp", "union"]  # from the report: no event carries the initiator's own phases
    assert any("solver" in line and "7.50 s busy" in line for line in lines)


def test_cels_help_is_for_users_and_imports_no_subcommand():
    import subprocess
    import sys

    code = (
        "import sys\nfrom cels.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('scipy', 'matplotlib', 'numpy', 'grpc', 'cels.cli.sanitize', 'cels.cli.service') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out  # lazy: measured 2.26 s -> 0.08 s (docs/bench/cli-help-startup.json)
    assert "Publish one sanitized search log" in out and "subcommand module" not in out
    assert "3 empty release" in out and "split" in out and "ledger" in out
