"""Settings declared once (cels.settings): the flags, the TOML schemas and the values "flags over
file" all come from the dataclass fields, so a value survives a round trip through its own
flags, a flag overrides its TOML key, a repeated flag adds to its TOML table, a TOML path is
relative to the file, and a schema is closed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from cels.engine.options import EngineOptions
from cels.node.ledger import LedgerPolicy
from cels.node.schemas import check_toml
from cels.node.settings import DataSource, KeyPolicy, NodeConfig
from cels.settings import add_arguments, argv, declared, given, markdown_table, table_schemas

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8)


def parse(cls: type, flags: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, cls)
    return parser.parse_args(flags)


@hypothesis_settings(max_examples=60, deadline=None)
@hypothesis_given(
    session_keys=st.booleans(),
    key_bits=st.sampled_from([2048, 3072]),
    stock=st.integers(0, 10_000),
    stock_for=st.dictionaries(NAMES, st.integers(0, 100), max_size=3),
    workers=st.one_of(st.none(), st.integers(1, 16)),
    nice=st.integers(0, 19),
)
def test_a_key_policy_survives_its_own_flags(session_keys, key_bits, stock, stock_for, workers, nice) -> None:
    value = KeyPolicy(session_keys=session_keys, key_bits=key_bits, stock=stock, stock_for=stock_for, workers=workers, nice=nice)
    assert KeyPolicy(**given(KeyPolicy, parse(KeyPolicy, argv(value)), {})) == value


@hypothesis_settings(max_examples=40, deadline=None)
@hypothesis_given(kind=st.sampled_from(["local", "ray"]), shards=st.integers(1, 64), in_flight=st.integers(1, 64), address=st.sampled_from(["local", "10.0.0.2:6379"]))
def test_an_engine_survives_its_own_flags(kind, shards, in_flight, address) -> None:
    value = EngineOptions(kind, address, shards, in_flight) if kind == "ray" else EngineOptions()
    assert EngineOptions(**given(EngineOptions, parse(EngineOptions, value.argv()), {})) == value
    assert value.argv() == argv(value)


def test_a_flag_can_set_false_and_survives_its_round_trip() -> None:
    """``--no-header`` sets header False over the file's True; the default (None: detected) gives no flag."""
    assert given(DataSource, parse(DataSource, ["--no-header"]), {"data": {"header": True}}) == {"header": False}
    value = DataSource(path=Path("log.tsv"), format="tsv", header=False, lenient=True, delimiter=";")
    assert DataSource(**given(DataSource, parse(DataSource, argv(value)), {})) == value
    assert argv(DataSource()) == []


def test_a_flag_overrides_its_key_and_a_repeated_flag_adds_to_its_table() -> None:
    doc = {"keys": {"obfuscators": 9, "stock": {"solver": 1}, "nice": 3}}
    values = given(KeyPolicy, parse(KeyPolicy, ["--obfuscators", "5", "--stock", "party-2=2"]), doc)
    assert values == {"stock": 5, "stock_for": {"solver": 1, "party-2": 2}, "nice": 3}
    assert KeyPolicy(**values).target("party-2") == 2 and KeyPolicy(**values).target("party-3") == 5


def test_a_toml_path_is_relative_to_the_file_and_a_flag_path_is_taken_as_given(tmp_path) -> None:
    doc = {"ledger": {"path": "books/party-1.json", "budget_epsilon": 4}}
    values = given(LedgerPolicy, parse(LedgerPolicy, []), doc, tmp_path)
    assert values == {"path": tmp_path / "books/party-1.json", "budget_epsilon": 4}
    assert LedgerPolicy(**values).budget_epsilon == 4.0
    flagged = given(LedgerPolicy, parse(LedgerPolicy, ["--ledger", "here.json"]), doc, tmp_path)
    assert flagged["path"] == Path("here.json")


def test_every_table_is_closed_and_names_its_keys() -> None:
    schemas = {**table_schemas(NodeConfig), **table_schemas(KeyPolicy), **table_schemas(DataSource), **table_schemas(LedgerPolicy), **table_schemas(EngineOptions)}
    assert set(schemas) == {"node", "tls", "peers", "metrics", "keys", "data", "ledger", "engine"}
    closed = {"type": "object", "additionalProperties": False, "properties": schemas}
    check_toml({"keys": {"obfuscators": 3}, "engine": {"shards": 2}}, "party.toml", closed)
    with pytest.raises(ValueError, match=r"party.toml: \[keys\] unknown key 'obfuscator'"):
        check_toml({"keys": {"obfuscator": 3}}, "party.toml", closed)
    with pytest.raises(ValueError, match=r"party.toml: \[engine\] shards: expected an integer >= 1, got 0"):
        check_toml({"engine": {"shards": 0}}, "party.toml", closed)


def test_the_reference_table_has_one_row_per_declared_setting() -> None:
    classes = (NodeConfig, KeyPolicy, DataSource, LedgerPolicy, EngineOptions)
    rows = markdown_table(*classes).splitlines()[2:]
    flags = [s.flag for cls in classes for _f, s in declared(cls)]
    assert len(rows) == len(flags) == len(set(flags))
    assert all(f"`{flag}`" in row for flag, row in zip(flags, rows))
