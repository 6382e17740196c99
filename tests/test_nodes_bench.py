"""`cels bench protocol`: the JSON adds up (phases, nodes, offline + online = busy time)."""

from __future__ import annotations

import json

import pytest

from cels.cli import main


def test_bench_protocol_inmemory_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "protocol", "--max-users", "60", "--parties", "2", "--key-bits", "512", "--json", str(out),
            "--solve", "private", "--solve", "transformed"]  # fmt: skip
    assert main(argv) == 0
    both = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == both
    assert (both["runner"], both["parties"], both["users"], both["key_bits"]) == ("inmemory", 2, 60, 512)
    assert list(both["solves"]) == ["private", "transformed"]
    compared = both["comparison"]
    assert compared["solve_phase_bytes"]["private"] == both["solves"]["private"]["phases"]["solve"]["bytes_total"]
    assert compared["solve_phase_bytes"]["transformed"] == both["solves"]["transformed"]["phases"]["nlp"]["bytes_total"]
    assert compared["solve_phase_bytes_ratio"] > 10  # the masked verdicts are far smaller than A(T|F|B)
    result = both["solves"]["transformed"]
    nodes = {"party-1", "party-2", "solver"}
    assert set(result["bytes_by_node"]) <= nodes
    assert result["bytes_total"] == sum(p["bytes_total"] for p in result["phases"].values()) == sum(result["bytes_by_node"].values())
    offline, online = result["offline"], result["online"]
    assert offline["obfuscators_by_node"]["solver"] == 0  # the solver only decrypts
    assert min(offline["obfuscators_by_node"]["party-1"], offline["obfuscators_by_node"]["party-2"]) > 0
    for node in nodes:  # offline + online = time inside the node's role (the phases' seconds)
        busy = sum(p["seconds"].get(node, 0.0) for p in result["phases"].values())
        assert offline["seconds_by_node"][node] + online["seconds_by_node"][node] == pytest.approx(busy, rel=0.05, abs=0.05)
    assert online["wall_seconds"] == pytest.approx(result["wall_seconds"] - offline["seconds_total"])
    table5 = result["paper_table5"]
    assert table5["this_run_mb"] == pytest.approx(result["bytes_total"] / 1e6)
    assert table5["paper_r"] == [2] and table5["paper_mb"]["AOL 1M"] == {"2": 3.7} and table5["paper_mb"]["MSNBC 200K"] == {"2": 2.2}


def test_paper_table5_columns_for_odd_r() -> None:
    from cels.bench.protocol import paper_reference

    ref = paper_reference(3, 42_858_380)  # the table has r = 2, 4, .., 10: r = 3 sits between 2 and 4
    assert ref["paper_r"] == [2, 4] and ref["paper_mb"]["AOL 1M"] == {"2": 3.7, "4": 14.3}
    assert ref["this_run_mb"] == 42.85838
    assert paper_reference(11, 0)["paper_r"] == [10] and paper_reference(1, 0)["paper_r"] == [2]
