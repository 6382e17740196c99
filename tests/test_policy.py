"""A party's own rules (cels.node.policy; docs/site-rules.md, "A party's policy"): checked at
StartSession, before the engine, the budget or the log, refused with FAILED_PRECONDITION
naming the rule."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import pytest

from cels.node.cluster import LOOPBACK, free_port
from cels.node.ledger_file import read_reservations
from cels.node.peers import sent_abort
from cels.node.policy import RULES, PartyPolicy, add_policy_arguments, admitting, policy_table
from cels.node.schemas import NODE_SCHEMAS, check_toml
from cels.protocol.aborts import REFUSED, describe
from cels.protocol.options import SessionOptions
from cels.protocol.roles import Refusal
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from party_node.__main__ import start as party_start
from tests.test_sanitize_cli import aol_file, figure1_rows

REPO = Path(__file__).resolve().parent.parent


def session(**given) -> SessionOptions:
    return SessionOptions.create(["party-1", "party-2", "party-3"], **{"epsilon": 1.0, "delta": 0.4, "session_id": "s", **given})


@pytest.mark.parametrize(
    ("given", "table", "rule", "said"),
    [
        ({"keep_user_ids": True}, {}, "keep_user_ids", "real user ids into the release"),
        ({"solve": "transformed"}, {}, "solves", "solve = transformed is not one of private"),
        ({"epsilon": 50.0}, {}, "max_epsilon", "epsilon = 50 is above 10"),
        ({"epsilon": 1e9}, {}, "max_epsilon", "epsilon = 1e+09 is above 10"),
        ({"delta": 0.9}, {}, "max_delta", "delta = 0.9 is above 0.5"),
        ({"initiator": "party-2"}, {"initiators": ("party-1",)}, "initiators", "the initiator party-2 is not one of party-1"),
        ({"release": "dp", "delta": 1e-6}, {"releases": ("sampled",)}, "releases", "release = dp is not one of sampled"),
        ({}, {"max_noise_epsilon": 1.0}, "max_noise_epsilon", "the counts carry no noise"),
        ({"noise_epsilon": 2.0, "sensitivity": 5}, {"max_noise_epsilon": 1.0}, "max_noise_epsilon", "noise_epsilon = 2 is above 1"),
        ({"release": "dp", "delta": 1e-6, "collusion": 1}, {"dp_min_collusion": 2}, "dp_min_collusion", "collusion t = 1 is below 2"),
        ({"release": "dp", "delta": 1e-6, "items": "pairs:2,queries:3"}, {"dp_max_items_per_user": 4}, "dp_max_items_per_user",
         "Delta = 5 (pairs:2,queries:3) is above 4"),
    ],
)  # fmt: skip
def test_a_session_outside_the_policy_is_refused_naming_the_rule_and_the_value(given, table, rule, said) -> None:
    with pytest.raises(Refusal) as err:
        PartyPolicy.of(table).check("party-3", session(**given))
    assert err.value.public == f"policy.{rule}" and not any(c.isdigit() for c in err.value.public)
    assert str(err.value).startswith(f"party-3 refuses session s: policy.{rule}: ") and said in str(err.value)


def test_the_default_policy_admits_the_demo_sessions_and_what_a_table_allows() -> None:
    PartyPolicy.of({}).check("party-1", session())
    PartyPolicy.of({}).check("party-1", session(release="dp", delta=1e-6, collusion=2, max_items_per_user=5))
    PartyPolicy.of({"solves": ("private", "transformed"), "keep_user_ids": True}).check("party-1", session(solve="transformed", keep_user_ids=True))
    for options in (session(epsilon=50.0, delta=0.9, keep_user_ids=True, solve="transformed"), session(release="dp", delta=1e-6)):
        parser = argparse.ArgumentParser()
        add_policy_arguments(parser)
        PartyPolicy.of({}, parser.parse_args(admitting(options))).check("party-2", options)  # cels simulate's parties


def test_flags_override_the_table_and_a_bad_value_is_refused_naming_the_rule() -> None:
    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    policy = PartyPolicy.of({"max_epsilon": 1.0, "solves": ["private"]}, parser.parse_args(["--policy-max-epsilon", "3", "--policy-solves", "private,transformed"]))
    assert (policy.value("max_epsilon"), policy.value("solves"), policy.value("max_delta")) == (3.0, ("private", "transformed"), 0.5)
    with pytest.raises(ValueError, match=r"policy.solves \(--policy-solves\): 'fast' is not one of"):
        PartyPolicy.of({}, parser.parse_args(["--policy-solves", "fast"]))
    with pytest.raises(ValueError, match=r"party.toml: \[policy\] unknown key 'max_epsilonn'"):
        check_toml({"policy": {"max_epsilonn": 1.0}}, Path("party.toml"), NODE_SCHEMAS["data"])
    with pytest.raises(ValueError, match=r"party.toml: \[policy\] max_delta"):
        check_toml({"policy": {"max_delta": 2.0}}, Path("party.toml"), NODE_SCHEMAS["data"])


def test_docs_show_the_policy_rules_as_they_are() -> None:
    assert policy_table() in (REPO / "docs" / "site-rules.md").read_text()
    assert len(policy_table().splitlines()) == 2 + len(RULES)


def test_a_party_node_refuses_before_its_budget_is_reserved_with_failed_precondition(tmp_path, caplog) -> None:
    """The node's policy comes first: FAILED_PRECONDITION naming the rule (the value for the
    node's controller), the structured refusal peers read, and no reservation in its ledger."""
    ledger = tmp_path / "l.json"
    data = aol_file(tmp_path / "d.tsv", figure1_rows())
    address = f"{LOOPBACK}:{free_port()}"
    argv = ["--name", "party-1", "--listen", address, "--insecure", "--data", str(data), "--session-keys", "--obfuscators", "0",
            "--peer", "party-2=127.0.0.1:1", "--peer", "solver=127.0.0.1:2", "--ledger", str(ledger), "--budget-epsilon", "100",
            "--policy-max-epsilon", "4"]  # fmt: skip
    node = party_start(argv)
    node.start()
    try:
        with grpc.insecure_channel(address) as channel:
            options = SessionOptions.create(["party-1", "party-2"], epsilon=8.0, delta=0.1, session_id="greedy")
            run = cels_pb2_grpc.CelsNodeStub(channel).Run(cels_pb2.RunRequest(config=options.to_config()), timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                next(iter(run))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "party-1 refuses session greedy: policy.max_epsilon: epsilon = 8 is above 4" in err.value.details()
        notice = sent_abort(err.value)
        assert (notice.origin, notice.kind, notice.reason) == ("party-1", REFUSED, "policy.max_epsilon")
        assert describe(notice) == "no session ran: refused by party-1 (policy.max_epsilon)"
        assert read_reservations(ledger)[0] == {}
        assert "party-1 refuses session greedy: policy.max_epsilon: epsilon = 8 is above 4" in caplog.text  # the refusing node's own log
    finally:
        node.stop()
