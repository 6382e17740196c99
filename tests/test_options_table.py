"""Session options declared once (issue 24): every field of SessionOptions is an entry of
cels.protocol.options.OPTIONS, and the proto, the session TOML's schema, the command lines and
the mechanism's parameters are all read from that one table."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf.descriptor import FieldDescriptor
from jsonschema import Draft202012Validator

from cels.cli import build_parser
from cels.cli.options import DEMO_BUDGET, MECHANISM_FLAGS, SESSION_FLAGS, DeferredParser
from cels.cli.run import session_options
from cels.cli.simulate import simulate_options
from cels.inprocess import InMemoryNetwork, session_hosts, start_session
from cels.logs import synthetic_log
from cels.mechanism.sanitize import SanitizeParams
from cels.node.schemas import SESSION_SCHEMA
from cels.protocol.options import NODES, OPTIONS, SessionOptions
from cels.protocol.solver import SolverRole
from cels.protocol.wire import cels_pb2

WIRE_TYPES = {
    float: {FieldDescriptor.TYPE_DOUBLE},
    int: {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64},
    str: {FieldDescriptor.TYPE_STRING},
    bool: {FieldDescriptor.TYPE_BOOL},
}
SINGLE_HOLDER = {"preprocess", "seed", "integer"}
"""SanitizeParams' fields that no session has (one holder's log only)."""


def flags_of(argv: list[str]) -> dict[str, object]:
    """dest -> argparse action of the subcommand ``argv`` names."""
    parser = build_parser(argv[0])
    for name in argv:
        parser = next(a for a in parser._actions if a.dest in ("command", "benchmark")).choices[name]
        parser = parser.load() if isinstance(parser, DeferredParser) else parser  # a benchmark's flags: its module
    return {action.dest: action for action in parser._actions}


def test_every_field_is_declared_once_and_reaches_the_proto_the_toml_and_the_flags() -> None:
    assert [o.name for o in OPTIONS] == [f.name for f in dataclasses.fields(SessionOptions) if f.name != "b"]
    config = cels_pb2.SessionConfig.DESCRIPTOR.fields_by_name
    for declared in OPTIONS:
        if declared.wire is NODES:  # the session's nodes: NodeAddress name and address
            assert declared.name == "addresses" or config[declared.name].message_type == cels_pb2.NodeAddress.DESCRIPTOR
        else:
            expected = WIRE_TYPES[int] if declared.wire_scale != 1 else WIRE_TYPES[declared.kind]
            assert config[declared.proto_field].type in expected, declared.name
    assert list(SESSION_SCHEMA["properties"]["session"]["properties"]) == [o.name for o in OPTIONS if o.toml]
    simulate, bench, sanitize = flags_of(["simulate"]), flags_of(["bench", "protocol"]), flags_of(["sanitize"])
    for declared in SESSION_FLAGS:
        for command, flags in (("simulate", simulate), ("bench protocol", bench)):
            assert flags[declared.name].option_strings[0] == declared.flag, command
            assert flags[declared.name].default == DEMO_BUDGET.get(declared.name, declared.default) or declared.name == "solve"
        assert (declared.name in sanitize) == (declared.mechanism or declared.holder)
    assert {o.name for o in MECHANISM_FLAGS} == {o.name for o in OPTIONS if o.mechanism}
    assert sanitize["epsilon"].required and sanitize["delta"].required and sanitize["time_limit"].option_strings == ["--time-limit"]


def test_the_mechanism_options_are_sanitize_params_with_the_same_defaults() -> None:
    params = {f.name: f for f in dataclasses.fields(SanitizeParams)}
    mechanism = [o for o in OPTIONS if o.mechanism]
    assert {o.name for o in mechanism} == set(params) - SINGLE_HOLDER
    assert all(o.required or params[o.name].default == o.default for o in mechanism)


def bad_values(declared) -> list:
    """Values just outside an option's declared range."""
    bounds, bad = declared.bounds, []
    if "minimum" in bounds:
        bad.append(bounds["minimum"] - 1 if declared.kind is int else bounds["minimum"] - 0.5)
    bad += [bounds[k] for k in ("exclusiveMinimum", "exclusiveMaximum") if k in bounds]
    if "multipleOf" in bounds:
        bad.append(bounds.get("minimum", 0) + 1)
    if declared.choices:
        bad.append("nope")
    return bad


@pytest.mark.parametrize("declared", [o for o in OPTIONS if o.toml and o.wire is not NODES and (o.kind in (int, float) or o.choices)], ids=lambda o: o.name)
def test_the_toml_schema_and_session_options_refuse_the_same_values(declared) -> None:
    table = {"parties": ["party-1", "party-2"], "epsilon": 1.0, "delta": 0.4, "solve": "transformed"}
    validator = Draft202012Validator(SESSION_SCHEMA["properties"]["session"])
    assert not list(validator.iter_errors(table)) and session_options(table).epsilon == 1.0
    assert bad_values(declared)
    for value in bad_values(declared):
        assert list(validator.iter_errors({**table, declared.name: value})), (declared.name, value)
        with pytest.raises(ValueError, match=declared.name):
            session_options({**table, declared.name: value})


def test_a_round_batch_flag_reaches_the_proposal_rule_of_every_party() -> None:
    """``--round-batch`` -> SessionOptions -> SessionConfig (StartSession) -> each party's
    SessionOptions -> ProposalRule.batch, with nothing in between naming the option."""
    args = build_parser("simulate").parse_args(
        ["simulate", "--round-batch", "7", "--key-bits", "256", "--epsilon", "8", "--delta", "0.9", "--support", "0.01", "--out", "unused"]
    )  # fmt: skip
    options = dataclasses.replace(simulate_options(args, 2), group_bits=1024)
    assert options.round_batch == 7
    nodes = session_hosts(synthetic_log(seed=9, users=60).split_by_user(2), options, allow_insecure_key_bits=True)
    roles = start_session(InMemoryNetwork(nodes), options)
    assert all(role.aborted is None for role in roles.values())
    for party in options.parties:
        assert roles[party].options.round_batch == 7 and roles[party].solve.private.rule.batch == 7


def test_the_solver_caps_the_time_limit_without_touching_the_options() -> None:
    options = SessionOptions.create(2, epsilon=1.0, delta=0.4, time_limit=30.0, solve="transformed", key_bits=256)
    capped = SolverRole("solver", options, allow_insecure_key_bits=True, max_time_limit=5.0)
    assert capped.params.time_limit == 5.0 and options.time_limit == 30.0 == options.params.time_limit
    assert SolverRole("solver", options, allow_insecure_key_bits=True).params.time_limit == 30.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        capped.params.time_limit = 60.0  # type: ignore[misc]


def range_of(declared) -> str:
    """An option's range in words (its choices, or its bounds)."""
    if declared.choices:
        return ", ".join(f"`{c}`" for c in declared.choices)
    words = {"minimum": ">= {:g}", "exclusiveMinimum": "> {:g}", "maximum": "<= {:g}", "exclusiveMaximum": "< {:g}", "multipleOf": "a multiple of {:g}",
             "minLength": "non-empty", "maxLength": "at most {:g} characters", "minItems": "at least {:g} names"}  # fmt: skip
    return ", ".join(words[k].format(v) for k, v in declared.bounds.items()) or declared.kind.__name__


def options_markdown() -> str:
    """The session options as docs/deployment.md shows them (generated from OPTIONS)."""
    required = SESSION_SCHEMA["properties"]["session"]["required"]
    rows = ["| `[session]` key | flag | default | range | what |", "| --- | --- | --- | --- | --- |"]
    for o in OPTIONS:
        if o.toml:
            default = "required" if o.name in required else "a fresh one" if o.required else "none" if o.default is None else f"`{str(o.default).lower() if o.kind is bool else o.default}`"
            what = o.help.replace("|", "\\|")
            rows.append(f"| `{o.name}` | {f'`{o.flag}`' if o.flag else ''} | {default} | {range_of(o)} | {what} |")
    return "\n".join(rows).replace("<", "&lt;")


def test_docs_show_the_session_options_as_they_are() -> None:
    from pathlib import Path

    assert options_markdown() in (Path(__file__).resolve().parent.parent / "docs" / "deployment.md").read_text()
