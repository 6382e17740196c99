"""cels.logs.parquet: Parquet logs (a file, a dataset directory, a file:// URI) read row group by
row group with the text readers' checks and limits, the row-group shards, `cels split` to
Parquet, and a Parquet log through `cels sanitize` and `cels simulate` (docs/formats.md, "Parquet")."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cels.cli import main
from cels.logs import LoadOptions, LogError, SearchLog, load_log, parse_columns, synthetic_log, write_log
from cels.logs.parquet import ParquetLog, RowGroup, load_parquet, write_parquet
from tests.test_logs import histogram


def merged(logs: list[SearchLog]) -> dict[tuple[str, str, str], int]:
    out: dict[tuple[str, str, str], int] = {}
    for log in logs:
        for key, count in histogram(log).items():
            out[key] = out.get(key, 0) + count
    return out


def put(path, columns: dict, row_group_size: int = 2, schema=None):
    pq.write_table(pa.table(columns, schema=schema), path, row_group_size=row_group_size)
    return path


ROWS = {
    "user": ["7", "7", "7", "9", "9", "8"],
    "query": ["Weather  Boston", "weather boston", "no click", "caf\u00e9 paris", "weather boston", "weather boston"],
    "url": ["http://weather.com/", "http://weather.com/", None, "http://cafe.fr/", "", "http://weather.com/"],
}
HISTOGRAM = {
    ("7", "weather boston", "http://weather.com/"): 2,
    ("9", "caf\u00e9 paris", "http://cafe.fr/"): 1,
    ("8", "weather boston", "http://weather.com/"): 1,
}


def test_a_row_is_a_click_unless_a_count_column_says_more(tmp_path) -> None:
    """Without a count column every row counts 1 (an AOL click), a null or empty url is a query
    without a click; with one, its counts; the first file's source says how it was read."""
    log = load_log(put(tmp_path / "a.parquet", ROWS), LoadOptions("parquet"))
    assert histogram(log) == HISTOGRAM
    assert log.source["columns"] == {"user": "user", "query": "query", "url": "url"}
    assert (log.source["files"], log.source["row_groups"]) == (1, 3)
    counted = load_log(put(tmp_path / "c.parquet", {**ROWS, "count": [1, 2, 3, 4, 5, 6]}), LoadOptions("parquet"))
    assert histogram(counted) == {("7", "weather boston", "http://weather.com/"): 3, ("9", "caf\u00e9 paris", "http://cafe.fr/"): 4,
                                  ("8", "weather boston", "http://weather.com/"): 6}  # fmt: skip
    assert counted.size == 1 + 2 + 4 + 6


def test_a_dataset_directory_a_uri_integer_users_and_mapped_columns(tmp_path) -> None:
    """A directory of Parquet files is one log (files in path order; hidden and _ files skipped),
    also as a file:// URI; integer user ids are read as text; --columns maps other names."""
    lake = tmp_path / "lake"
    lake.mkdir()
    names = {"AnonID": [7, 7, 9], "Query": ["a", "a", "b"], "ClickURL": ["u", "u", "v"], "n": [1, 2, 5]}
    put(lake / "part-0.parquet", names)
    put(lake / "part-1.parquet", {**names, "AnonID": [8, 8, 8]})
    (lake / "_SUCCESS").write_bytes(b"")
    (lake / ".part-2.parquet.tmp").write_bytes(b"not parquet")
    options = LoadOptions("parquet", columns=parse_columns("user=AnonID,query=Query,url=ClickURL,count=n", by_name=True))
    for path in (lake, lake.as_uri()):
        log = load_log(path, options)
        assert histogram(log) == {("7", "a", "u"): 3, ("9", "b", "v"): 5, ("8", "a", "u"): 3, ("8", "b", "v"): 5}
    assert log.source["files"] == 2
    # the release keeps the input's column names (count always present)
    write_log(log, tmp_path / "out.parquet")
    assert pq.read_schema(tmp_path / "out.parquet").names == ["AnonID", "Query", "ClickURL", "n"]
    assert histogram(load_log(tmp_path / "out.parquet", options)) == histogram(log)
    with pytest.raises(ValueError, match="column user=''"):
        parse_columns("user=,query=q,url=u", by_name=True)
    with pytest.raises(ValueError, match="Parquet strings are UTF-8"):
        LoadOptions("parquet", encoding="latin-1")


@pytest.mark.parametrize(
    ("column", "values", "where"),
    [
        ("user", ["7", "7", "7", None, "9", "8"], r"row 4 \(row 2 of row group 1\), field 'user': null user id"),
        ("query", ["q", "q", "q", "q", " ", None], r"row 6 \(row 2 of row group 2\), field 'query': null query"),
        ("count", [1, 2, 2**31, 1, 1, 1], r"row 3 \(row 1 of row group 1\), field 'count': 2147483648 is above the largest count a row may give, 2147483647"),
        ("count", ["1", "2", "3", "x1", "1", "1"], r"row 4 \(row 2 of row group 1\), field 'count': 'x1' is not a positive integer"),
        ("count", [1, 0, 1, 1, 1, 1], r"row 2 \(row 2 of row group 0\), field 'count': 0 is not a positive integer"),
        ("count", [1, 1, 1, 1, None, 1], r"row 5 \(row 1 of row group 2\), field 'count': null is not a positive integer"),
    ],
)
def test_a_bad_row_names_file_row_and_column_and_lenient_skips_it(tmp_path, column, values, where) -> None:
    path = put(tmp_path / "bad.parquet", {**ROWS, column: values})
    with pytest.raises(LogError, match=f"^{path}, {where}"):
        load_log(path, LoadOptions("parquet"))
    lenient = load_log(path, LoadOptions("parquet", lenient=True))
    assert lenient.source["skipped_lines"] == 1
    assert lenient.source["skipped_at"][0].startswith(f"{path}:")


def test_a_wrong_column_type_or_a_missing_column_is_refused_for_the_file(tmp_path) -> None:
    doubles = put(tmp_path / "d.parquet", {**ROWS, "count": [1.0] * 6})
    with pytest.raises(LogError, match=f"^{doubles}, field 'count': column type double; count must be an integer or string column"):
        load_log(doubles, LoadOptions("parquet", lenient=True))
    missing = put(tmp_path / "m.parquet", {"user": ["u"], "query": ["q"]})
    with pytest.raises(LogError, match=f"^{missing}, field 'url': no such column"):
        load_log(missing, LoadOptions("parquet"))
    text = tmp_path / "t.parquet"
    text.write_text("user\tquery\turl\n")
    with pytest.raises(LogError, match=f"^{text}: cannot open as Parquet: .*magic bytes not found"):
        load_log(text, LoadOptions("parquet"))


def test_the_log_total_limit_holds_across_row_groups(tmp_path, monkeypatch) -> None:
    from cels.logs import options

    monkeypatch.setattr(options, "MAX_LOG_TOTAL", 10)
    path = put(tmp_path / "t.parquet", {**ROWS, "count": [3, 3, 3, 3, 3, 3]})
    with pytest.raises(LogError, match=r"row 4 \(row 2 of row group 1\), field 'count': the log's counts add up to 12 here, above the 10"):
        load_log(path, LoadOptions("parquet"))
    assert load_log(path, LoadOptions("parquet", lenient=True)).source["skipped_lines"] == 3


USERS = ["7", " 7", "8\t", "9", "", " ", None]
QUERIES = ["Weather  Boston", " weather boston", "WEATHER\tboston ", "caf\u00e9 paris", "CAF\u00c9 PARIS", "x", " ", None]
URLS = ["http://weather.com/", " http://weather.com/ ", "http://cafe.fr/", "", "  ", None]
COUNTS = [1, 2, 5, 0, -1, 2**31, None]


def read_both(path, options: LoadOptions) -> tuple:
    """The columnar reader's histogram and the row reader's (SearchLog.from_records), or the
    error each raised."""
    from cels.logs.parquet import ParquetReader

    out = []
    for read in (lambda: load_parquet(path, options), lambda: SearchLog.from_records((reader := ParquetReader(path, options)).records(), reader.source)):
        try:
            log = read()
            out.append((log.users, log.pairs, histogram(log), log.source))
        except LogError as exc:
            out.append(str(exc))
    return tuple(out)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(USERS), st.sampled_from(QUERIES), st.sampled_from(URLS), st.sampled_from(COUNTS)), max_size=30),
    with_count=st.booleans(), integer_users=st.booleans(), lenient=st.booleans(),
    row_group_size=st.integers(1, 12), batch_rows=st.integers(1, 8), max_users=st.none() | st.integers(1, 3),
)
@example(  # a user and a query first seen without a click: numbered where first clicked
    rows=[("7", "x", None, 1), ("8", "caf\u00e9 paris", "http://cafe.fr/", 1), ("7", "x", "http://weather.com/", 1)],
    with_count=False, integer_users=False, lenient=False, row_group_size=12, batch_rows=8, max_users=None,
)
def test_the_columnar_reader_reads_as_the_row_reader(rows, with_count, integer_users, lenient, row_group_size, batch_rows, max_users) -> None:
    """Batch by batch through distinct values, or row by row where a batch has a bad row: the
    same users and pairs in the same order, the same counts, the same skips, or the same error
    (users with whitespace, queries normalised, null, empty and blank urls, bad counts, a cut
    to the first users)."""
    import tempfile
    from unittest import mock

    from cels.logs import parquet

    columns = {
        "user": [None if u is None else (int(u) if u.strip() else None) for u in (r[0] for r in rows)] if integer_users else [r[0] for r in rows],
        "query": [r[1] for r in rows], "url": [r[2] for r in rows],
    }  # fmt: skip
    types = [("user", pa.int64() if integer_users else pa.string()), ("query", pa.string()), ("url", pa.string())]
    if with_count:
        columns["count"] = [r[3] for r in rows]
        types.append(("count", pa.int64()))
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(parquet, "BATCH_ROWS", batch_rows):
        path = put(f"{tmp}/h.parquet", columns, row_group_size, pa.schema(types))
        columnar, by_rows = read_both(path, LoadOptions("parquet", lenient=lenient, max_users=max_users))
    assert columnar == by_rows


def test_only_the_batches_with_a_bad_row_are_read_row_by_row(tmp_path, monkeypatch) -> None:
    """A clean log is read through distinct values alone; with one bad row (skipped), only its
    batch goes row by row."""
    from cels.logs import parquet

    monkeypatch.setattr(parquet, "BATCH_ROWS", 2)
    by_rows = []
    row_reader = parquet.ParquetReader._batch_records
    monkeypatch.setattr(parquet.ParquetReader, "_batch_records", lambda self, group, first, *rest: by_rows.append((group.index, first)) or row_reader(self, group, first, *rest))
    clean = put(tmp_path / "clean.parquet", ROWS, row_group_size=6)
    assert histogram(load_parquet(clean, LoadOptions("parquet"))) == HISTOGRAM
    assert by_rows == []
    bad = put(tmp_path / "bad.parquet", {**ROWS, "user": ["7", "7", "7", " ", "9", "8"]}, row_group_size=6)
    log = load_parquet(bad, LoadOptions("parquet", lenient=True))
    assert by_rows == [(0, 2)]
    assert log.source["skipped_lines"] == 1 and log.source["skipped_at"] == [f"{bad}:4:user"]
    assert histogram(log) == {key: count for key, count in HISTOGRAM.items() if key[0] != "9"}


def test_runs_of_row_groups_add_up_to_the_whole_log(tmp_path) -> None:
    """The Ray engine's reader tasks each read a run of row groups (of every file of a
    dataset: cels.engine.log_pieces.read_batches); their histograms merged are the whole log's,
    whatever the run length."""
    from cels.engine.log_pieces import read_batches

    log = synthetic_log(users=80, pairs=40)
    lake = tmp_path / "lake"
    lake.mkdir()
    for k, share in enumerate(log.split_by_user(2)):
        write_parquet(share, lake / f"part-{k}.parquet", row_group_rows=50)
    groups = ParquetLog(lake).row_groups
    assert len(groups) > 6 and max(g.rows for g in groups) == 50 and {g.file for g in groups} == {str(lake / "part-0.parquet"), str(lake / "part-1.parquet")}
    whole = load_log(lake, LoadOptions("parquet"))
    assert histogram(whole) == histogram(log)
    for rows in (49, 120, 10_000):
        batches = read_batches(groups, rows)
        assert [g for batch in batches for g in batch] == groups
        assert all(sum(g.rows for g in batch) <= max(rows, 50) for batch in batches)
        assert len(batches) == {49: len(groups), 10_000: 1}.get(rows, len(batches))  # a group larger than the run goes alone
        parts = [load_parquet(lake, LoadOptions("parquet"), batch) for batch in batches]
        assert sum(p.source["row_groups"] for p in parts) == len(groups)
        assert merged(parts) == histogram(log)


def test_runs_of_row_groups_are_as_even_as_whole_groups_allow() -> None:
    """A 1M party's log (326,629 rows in groups of 65,536) in runs of at most 262,144 rows:
    two runs, 131,072 and 195,557 rows (cut at the first 262,144 they were 262,144 and 64,485);
    runs never pass the bound, and a log within it is one run."""
    from cels.engine.log_pieces import read_batches

    def groups(*sizes: int) -> list[RowGroup]:
        return [RowGroup("a.parquet", k, n, sum(sizes[:k])) for k, n in enumerate(sizes)]

    def runs(sizes: tuple[int, ...], rows: int) -> list[int]:
        batches = read_batches(groups(*sizes), rows)
        assert [g for batch in batches for g in batch] == groups(*sizes)
        return [sum(g.rows for g in batch) for batch in batches]

    assert runs((65_536,) * 4 + (64_485,), 262_144) == [131_072, 195_557]
    assert runs((10,) * 10, 40) == [30, 40, 30]  # 100 rows in three runs: not 40, 40, 20
    assert runs((10,) * 10, 100) == [100]
    assert runs((60, 60, 60), 100) == [60, 60, 60]  # no two groups fit in one run
    assert runs((300, 10, 10), 100) == [300, 20]  # a larger group alone


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch) -> None:
    path = put(tmp_path / "a.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ValueError, match=r"needs pyarrow: pip install 'cels\[parquet\]'"):
        load_log(path, LoadOptions("parquet"))


def test_sanitize_exits_2_naming_the_row_and_releases_parquet_or_tsv(tmp_path, capsys) -> None:
    bad = put(tmp_path / "bad.parquet", {**ROWS, "user": ["7", "7", "7", None, "9", "8"]})
    flags = ["--epsilon", "1", "--delta", "0.4", "--keep-user-ids"]
    assert main(["sanitize", str(bad), "--format", "parquet", *flags, "--out", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"cels sanitize: error: {bad}, row 4 (row 2 of row group 1), field 'user': null user id"]
    assert main(["sanitize", str(bad), "--format", "parquet", "--lenient", *flags, "--out", str(tmp_path / "o.parquet")]) in (0, 3)
    assert f"--lenient skipped 1 bad line: {bad}:4:user" in capsys.readouterr().err
    assert pq.read_schema(tmp_path / "o.parquet").names == ["user", "query", "url", "count"]
    assert main(["sanitize", str(bad), "--format", "parquet", "--lenient", *flags, "--out", str(tmp_path / "o.tsv")]) in (0, 3)
    assert (tmp_path / "o.tsv").read_text().startswith("user\tquery\turl\tcount\n")


@pytest.mark.realdata
def test_aol_slice_through_cels_split_to_parquet_reads_back_equal(aol_path, tmp_path, capsys) -> None:
    """The AOL slice split into Parquet files by `cels split`: the dataset of the three files
    holds the text reader's histogram, each file its party's share."""
    text = load_log(aol_path, LoadOptions("aol", max_users=300))
    source = tmp_path / "aol-300.tsv"
    write_log(text, source)
    out = tmp_path / "lake"
    assert main(["split", str(source), "--format", "aol", "--parties", "3", "--out", str(out / "party-{k}.parquet")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["party-1.parquet", "party-2.parquet", "party-3.parquet"]
    shares = text.split_by_user(3)
    for k, share in enumerate(shares, start=1):
        read = load_log(out / f"party-{k}.parquet", LoadOptions("parquet"))
        assert histogram(read) == histogram(share)
    whole = load_log(out, LoadOptions("parquet"))
    assert histogram(whole) == histogram(text) and whole.size == text.size
    # and back: a Parquet input split into text histograms
    assert main(["split", str(out), "--format", "parquet", "--parties", "2", "--out", str(tmp_path / "t-{k}.tsv")]) == 0
    back = [load_log(tmp_path / f"t-{k}.tsv", LoadOptions("histogram")) for k in (1, 2)]
    assert merged(back) == histogram(text)


@pytest.mark.slow
def test_simulate_serves_a_parquet_log_from_party_nodes(tmp_path, capsys) -> None:
    """`cels simulate --input x.parquet --format parquet`: the shares go to the party nodes as
    Parquet files (each node reads its own with --format parquet) and the release is Parquet."""
    log = synthetic_log(users=60, pairs=30)
    source = tmp_path / "log.parquet"
    write_log(log, source)
    out = tmp_path / "out"
    argv = ["simulate", "--input", str(source), "--format", "parquet", "--parties", "2", "--key-bits", "512",
            "--epsilon", "4", "--delta", "0.9", "--out", str(out), "--report", str(tmp_path / "report.json")]  # fmt: skip
    assert main(argv) == 0
    assert "released |O| = " in capsys.readouterr().out
    released = load_log(out / "sanitized.parquet", LoadOptions("parquet"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert released.size == report["sizes"]["output_records"] > 0
    assert released.n_users == report["sizes"]["output_users"]
    assert set(released.pairs) <= set(log.pairs)


def test_a_party_node_reads_parquet_columns_from_its_data_table(tmp_path) -> None:
    """[data] format = "parquet" with a table of column names (the schema allows names for
    parquet), or the --columns string form; a dataset directory is a party's log."""
    import argparse

    from cels.node.config import add_data_arguments, data_source
    from cels.node.schemas import PARTY_SCHEMA, check_toml

    table = {"path": "lake", "format": "parquet", "columns": {"user": "AnonID", "query": "Query", "url": "ClickURL"}}
    check_toml({"data": table}, tmp_path / "party.toml", {**PARTY_SCHEMA, "required": []})
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    path, options = data_source(parser.parse_args([]), {**table, "base": tmp_path})
    assert path == tmp_path / "lake" and options.columns == table["columns"]
    flags = parser.parse_args(["--data", str(tmp_path), "--format", "parquet", "--columns", "user=AnonID,query=Query,url=ClickURL"])
    assert data_source(flags, {})[1].columns == table["columns"]


def test_bench_read_compares_both_readers_on_one_file(tmp_path, capsys) -> None:
    """`cels bench read` reads one synthetic Parquet log both ways; both histograms equal, the
    rows and pairs are the log's, and the JSON file is what it printed."""
    from cels.logs.synthetic import synthetic_histogram

    out = tmp_path / "read.json"
    assert main(["bench", "read", "--pairs", "3000", "--repeat", "1", "--json", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    shape = synthetic_histogram(3000).shape()
    assert printed == json.loads(out.read_text())
    assert (printed["rows"], printed["pairs"], printed["users"], printed["size"]) == (shape["entries"], shape["pairs"], shape["users"], shape["size"])
    assert printed["same_histogram"] is True and printed["cpu_speedup"] > 0
