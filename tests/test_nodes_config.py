"""Node configuration: TOML file, flags over it, TLS required unless --insecure (with a warning)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import grpc
import pytest

from cels.certs import make_dev_certs, node_names
from cels.cli.run import session_options
from cels.node.cluster import LOOPBACK, LocalCluster, free_port, python_module
from cels.node.config import add_data_arguments, add_node_arguments, data_source, node_config
from cels.node.schemas import SESSION_SCHEMA, check_toml
from cels.node.service import Node
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from party_node.__main__ import main as party_main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    add_data_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_dev_certs(tmp_path_factory.mktemp("certs"), node_names(2))


def test_toml_file_with_flags_over_it(tmp_path, certs) -> None:
    (tmp_path / "logs").mkdir()
    config = tmp_path / "party-1.toml"
    config.write_text(
        f"""
[node]
name = "party-1"
listen = "127.0.0.1:7101"
deadline = 30

[tls]
ca = "{certs['party-1'].ca}"
cert = "{certs['party-1'].cert}"
key = "{certs['party-1'].key}"

[peers]
solver = "127.0.0.1:7100"
party-2 = "127.0.0.1:7102"

[data]
path = "logs/mine.tsv"
format = "tsv"
columns = "user=1,query=2,url=3"
lenient = true
encoding = "latin-1"
"""
    )
    args = parse(["--config", str(config), "--peer", "party-2=10.0.0.2:7102", "--deadline", "12", "--no-header"])
    cfg = node_config(args, "data")
    assert (cfg.name, cfg.listen, cfg.deadline, cfg.insecure) == ("party-1", "127.0.0.1:7101", 12.0, False)
    assert cfg.peers == {"solver": "127.0.0.1:7100", "party-2": "10.0.0.2:7102"}
    assert cfg.min_key_bits == 2048
    path, options = data_source(args, cfg.extra)
    assert path == tmp_path / "logs" / "mine.tsv"  # relative to the TOML file
    assert (options.format, options.columns, options.header, options.lenient) == ("tsv", {"user": 1, "query": 2, "url": 3}, False, True)
    assert options.encoding == "latin-1"
    assert data_source(parse(["--config", str(config), "--encoding", "cp1252"]), cfg.extra)[1].encoding == "cp1252"
    assert data_source(parse(["--data", "x.tsv"]), {})[1].encoding == "utf-8"  # strict UTF-8 unless told


def test_a_node_refuses_to_start_with_another_nodes_certificate(certs) -> None:
    """Issue 13 item 12: a node's own certificate must be a node certificate naming it."""
    base = ["--listen", "127.0.0.1:7101", "--peer", "solver=127.0.0.1:7100"]
    own = certs["party-1"]
    args = [*base, "--ca", str(own.ca), "--key", str(own.key)]
    assert node_config(parse([*args, "--name", "party-1", "--cert", str(own.cert)]), "data").name == "party-1"
    with pytest.raises(ValueError, match=r"names 'party-2', not this node 'party-1'"):
        node_config(parse([*args, "--name", "party-1", "--cert", str(certs["party-2"].cert)]), "data")
    with pytest.raises(ValueError, match="is no node certificate: "):
        node_config(parse([*args, "--name", "party-1", "--cert", str(own.key)]), "data")


def test_tls_is_required_unless_insecure(tmp_path) -> None:
    base = ["--name", "party-1", "--listen", "127.0.0.1:7101", "--peer", "solver=127.0.0.1:7100"]
    with pytest.raises(ValueError, match="mutual TLS needs ca, cert, key"):
        node_config(parse(base), "data")
    with pytest.raises(ValueError, match="does not exist"):
        node_config(parse([*base, "--ca", str(tmp_path / "x"), "--cert", str(tmp_path / "y"), "--key", str(tmp_path / "z")]), "data")
    with pytest.raises(ValueError, match="lists itself"):
        node_config(parse([*base, "--insecure", "--peer", "party-1=127.0.0.1:1"]), "data")
    assert node_config(parse([*base, "--insecure"]), "data").insecure


def test_insecure_node_prints_a_warning_and_still_checks_peer_names(capfd) -> None:
    address = f"{LOOPBACK}:{free_port()}"
    node = Node(node_config(parse(["--name", "party-1", "--listen", address, "--peer", "party-2=127.0.0.1:1", "--insecure"]), "data"), None)
    node.start()
    try:
        assert "--insecure: no TLS, peers are NOT authenticated" in capfd.readouterr().err
        with grpc.insecure_channel(address) as channel:
            stub = cels_pb2_grpc.CelsNodeStub(channel)
            envelope = cels_pb2.Envelope(session_id="s", sender="mallory", abort=cels_pb2.Abort(session_id="s"))
            frames = [cels_pb2.Frame(session_id="s", index=0, last=True, data=envelope.SerializeToString())]
            with pytest.raises(grpc.RpcError) as err:
                stub.Deliver(iter(frames), timeout=5)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        node.stop()


def test_party_node_refuses_to_start_without_its_data(tmp_path, capsys) -> None:
    argv = ["--name", "party-1", "--listen", "127.0.0.1:7101", "--insecure", "--data", str(tmp_path / "missing.tsv")]
    assert party_main(argv) == 2
    assert "missing.tsv does not exist" in capsys.readouterr().err


def test_session_toml_table_becomes_the_session_config() -> None:
    table = {"parties": ["party-1", "party-2"], "epsilon": 1.0, "delta": 0.1, "min_count": 20, "key_bits": 3072, "deadline": 42}
    options = session_options({**table, "initiator": "party-2"})
    assert options.parties == ("party-1", "party-2") and options.solver == "solver"
    assert (options.initiator, options.min_count, options.key_bits, options.deadline) == ("party-2", 20, 3072, 42)
    assert options.session_id  # fresh
    config = options.to_config()
    assert [p.name for p in config.parties] == ["party-1", "party-2"] and config.deadline_ms == 42_000
    with pytest.raises(ValueError, match="unknown session option"):
        session_options({**table, "epsilonn": 1.0})
    run = {"initiator": "party-1", "address": "127.0.0.1:7101", "output": "o.tsv", "report": "r.json"}
    with pytest.raises(ValueError, match=r"^session.toml: \[session\] needs 'delta'$"):
        check_toml({"run": run, "session": {"parties": ["party-1", "party-2"], "epsilon": 1.0}}, "session.toml", SESSION_SCHEMA)
    with pytest.raises(ValueError, match=r"^session.toml: \[session\] unknown key 'epsilonn' \(known: parties, session_id, epsilon"):
        check_toml({"run": run, "session": {**table, "epsilonn": 1.0}}, "session.toml", SESSION_SCHEMA)


def test_the_session_schema_lists_every_session_option() -> None:
    """[session]'s keys are SessionOptions' fields but the ones [run], ``cels run --resume`` or the nodes set."""
    from dataclasses import fields

    from cels.protocol.options import SessionOptions

    keys = set(SESSION_SCHEMA["properties"]["session"]["properties"])
    assert keys == {f.name for f in fields(SessionOptions)} - {"b", "addresses", "initiator", "resume"}


@pytest.mark.parametrize(
    "toml,message",
    [
        ('[node]\nname = "party-1"\ndeadlin = 5\n', "[node] unknown key 'deadlin'"),
        ('[data]\npath = "x.tsv"\nfromat = "msnbc"\n', "[data] unknown key 'fromat'"),
        ('[keys]\nworkers = "two"\n', '[keys] workers: expected an integer >= 1, got "two"'),
        ('[node]\ndeadline = "soon"\n', '[node] deadline: expected a number > 0, got "soon"'),
        ("[node]\ndeadline = -5\n", "[node] deadline: expected a number > 0, got -5"),
        ('[data]\nformat = "csv"\n', '[data] format: expected one of "aol", "msnbc", "tsv", "histogram", "parquet", got "csv"'),
        ("[keys]\nstock = { solver = -1 }\n", "[keys] stock.solver: expected an integer >= 0, got -1"),
        ('[peers]\nparty-2 = "nowhere"\n', '[peers] party-2: expected host:port (a port from 1 to 65535), got "nowhere"'),
        ("[ledger]\nbudget_epsilon = true\n", "[ledger] budget_epsilon: expected a number > 0, got true"),
        ('[solver]\ntime_limit = 5\n', "unknown table [solver]"),  # a party node has no [solver] table
        # a session file given to a node: the table says which file it is (a newcomer's cels status --config session.toml)
        ('[run]\ninitiator = "party-1"\n', "[run] is a table of a session file (cels run --config); is this the right file?"),
        ('[ledger]\nbudget_eps = 1\n', "[ledger] unknown key 'budget_eps'"),
        ("deadline = 5\n", "key 'deadline' outside any table"),
    ],
)
def test_node_toml_typos_name_the_file_table_and_key(tmp_path, capsys, toml, message) -> None:
    config = tmp_path / "party.toml"
    config.write_text(toml)
    assert party_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cels-party: error: {config}: ") and message in err and len(err.strip().splitlines()) == 1


def test_solver_node_rejects_a_party_table(tmp_path, capsys) -> None:
    from solver_node.__main__ import main as solver_main

    config = tmp_path / "solver.toml"
    config.write_text('[data]\npath = "x.tsv"\n')
    assert solver_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown table [data]" in err and "[data] is a table of a party node's file (cels-party --config)" in err


def test_missing_config_file_is_one_line_with_exit_2(tmp_path, capsys) -> None:
    assert party_main(["--config", str(tmp_path / "nosuch.toml")]) == 2
    err = capsys.readouterr().err
    assert err == f"cels-party: error: config file {tmp_path / 'nosuch.toml'} does not exist\n"


def test_ctrl_c_during_start_up_is_one_line_with_exit_130(tmp_path, capsys, monkeypatch) -> None:
    import cels.node.config

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cels.node.config, "node_config", interrupted)
    assert party_main(["--name", "party-1", "--listen", "127.0.0.1:1", "--insecure"]) == 130
    assert capsys.readouterr().err == "cels-party: interrupted during start-up\n"


def test_the_local_deployment_example_is_a_valid_configuration() -> None:
    from pathlib import Path

    from cels.node.config import load_toml
    from cels.node.schemas import PARTY_SCHEMA, SOLVER_SCHEMA

    local = Path(__file__).resolve().parent.parent / "deploy" / "local"
    for name, schema in [("party-1", PARTY_SCHEMA), ("party-2", PARTY_SCHEMA), ("party-3", PARTY_SCHEMA), ("solver", SOLVER_SCHEMA)]:
        path = local / f"{name}.toml"
        doc = load_toml(path)
        check_toml(doc, path, schema)
        assert doc["node"]["name"] == name and name not in doc["peers"]
        assert len(doc["peers"]) == 3 and doc["node"]["listen"] not in doc["peers"].values()
    for session_file in (local / "session.toml", local.parent / "session.toml"):
        check_toml(load_toml(session_file), session_file, SESSION_SCHEMA)
    session = load_toml(local / "session.toml")
    options = session_options({**session["session"], "initiator": session["run"]["initiator"]})
    assert options.parties == ("party-1", "party-2", "party-3")
    assert session["run"]["address"] == load_toml(local / "party-1.toml")["node"]["listen"]


def test_a_second_node_on_a_taken_address_exits_1_naming_it(tmp_path) -> None:
    """gRPC's listeners set SO_REUSEPORT by default: a second node on a served address used
    to bind it too, print that it serves and keep running (README, exit codes: 1 when the
    listen address is taken).  Two real node processes."""
    data = tmp_path / "d.tsv"
    data.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\t2006-03-01 00:00:00\t1\thttp://x\n")
    address = f"{LOOPBACK}:{free_port()}"
    common = ["--listen", address, "--insecure", "--data", str(data), "--session-keys", "--obfuscators", "0"]
    with LocalCluster(tmp_path / "logs") as cluster:
        cluster.start("party-2", address, python_module("party_node") + ["--name", "party-2", *common])
        cluster.wait_ready()
        second = cluster.start("party-3", address, python_module("party_node") + ["--name", "party-3", *common])
        try:
            code = second.process.wait(20)
        except subprocess.TimeoutExpired:
            code = None
        err = second.log_text()
        assert code == 1, f"the second node still runs on {address}:\n{err}"
        assert f"cels-party: cannot serve: party-3: cannot listen on {address}" in err
        assert "serving on" not in err and "listening on" not in err
        assert cluster.nodes["party-2"].process.poll() is None  # the first node serves on


def test_a_missing_certificate_names_its_toml_key_and_flag(tmp_path, capsys) -> None:
    """Issue 41 finding 21: "cert file X does not exist" did not say where X was set."""
    from party_node.__main__ import main as party_main

    data = tmp_path / "d.tsv"
    data.write_text("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n1\tq\t\t\thttp://x/\n")
    for name in ("ca.pem", "party-1.key"):
        (tmp_path / name).write_text("x")
    config = tmp_path / "party.toml"
    config.write_text(f'[node]\nname = "party-1"\nlisten = "127.0.0.1:7101"\n[tls]\nca = "ca.pem"\ncert = "party-1.pem"\nkey = "party-1.key"\n'
                      f'[data]\npath = "{data}"\n')  # fmt: skip
    assert party_main(["--config", str(config)]) == 2
    assert capsys.readouterr().err == f"cels-party: error: [tls] cert (--cert): {tmp_path / 'party-1.pem'} does not exist\n"


def test_docs_show_the_node_settings_as_they_are() -> None:
    """docs/deployment.md carries the table generated from the one declaration of each setting."""
    from cels.engine.options import EngineOptions
    from cels.node.ledger import LedgerPolicy
    from cels.node.settings import DataSource, KeyPolicy, NodeConfig
    from cels.settings import markdown_table

    table = markdown_table(NodeConfig, KeyPolicy, DataSource, LedgerPolicy, EngineOptions)
    assert table in (Path(__file__).resolve().parent.parent / "docs" / "deployment.md").read_text()
    assert len(table.splitlines()) == 2 + 14 + 6 + 7 + 5 + 4  # every setting of the five classes is a row
