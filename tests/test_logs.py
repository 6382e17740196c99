"""cels.logs: readers, writers, round trips, bad input, the synthetic log and the real-data facts."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from cels.logs import (
    LoadOptions,
    LogError,
    LogRecord,
    SearchLog,
    bench_load,
    default_data_dir,
    iter_records,
    load_log,
    parse_columns,
    synthetic_log,
    write_log,
    write_synthetic,
)

MSNBC_HEADER = (
    b"% Different categories found in input file:\r\n\r\n"
    b"frontpage news tech local opinion on-air misc weather msn-news health living business "
    b"msn-sports sports summary bbs travel\r\n\r\n\r\n% Sequences:\r\n\r\n"
)


def histogram(log: SearchLog) -> dict[tuple[str, str, str], int]:
    """{(user, query, url): c_ij} -- independent of row and column order."""
    c = log.counts.tocoo()
    out: dict[tuple[str, str, str], int] = {}
    for j, i, v in zip(c.row, c.col, c.data):
        key = (log.users[j], *log.pairs[i])
        out[key] = out.get(key, 0) + int(v)
    return out


def put(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


AOL_ROWS = (
    b"AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n"
    b"7\tWeather  Boston\t2006-03-01 07:17:12\t1\thttp://weather.com/\n"
    b"7\tweather boston\t2006-03-01 07:18:00\t\thttp://weather.com/\n"
    b"7\tno click\t2006-03-01 07:19:00\n"
    b"9\tcaf\xc3\xa9 paris\t2006-03-02 10:00:00\t3\thttp://cafe.fr/\n"
    b"9\tweather boston\t2006-03-02 10:01:00\t\t\n"
    b"8\tweather boston\t2006-03-02 11:00:00\t2\thttp://weather.com/\n"
)
AOL_HISTOGRAM = {
    ("7", "weather boston", "http://weather.com/"): 2,
    ("9", "caf\u00e9 paris", "http://cafe.fr/"): 1,
    ("8", "weather boston", "http://weather.com/"): 1,
}


# ---------------------------------------------------------------- options


def test_parse_columns_accepts_the_cli_form() -> None:
    assert parse_columns("user=1,query=2,url=4") == {"user": 1, "query": 2, "url": 4}
    assert parse_columns(" user=3, query=1 ,url=2,count=5") == {"user": 3, "query": 1, "url": 2, "count": 5}


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("user=1,query=2", "lacks url"),
        ("user=1,query=2,url=x", "'x' is not a column number"),
        ("user=1,query=2,url=0", "numbered from 1"),
        ("user=1,query=2,url=2", "share one column"),
        ("user=1,query=2,url=3,time=4", "unknown column name"),
        ("user=1,query=2,url", "is not name=number"),
        ("user=1,user=2,query=3,url=4", "user given twice"),
    ],
)
def test_parse_columns_says_what_is_wrong(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_columns(spec)


def test_load_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown log format"):
        LoadOptions("csv")
    with pytest.raises(ValueError, match="needs a column mapping"):
        LoadOptions("tsv")
    with pytest.raises(ValueError, match="fixed columns"):
        LoadOptions("aol", columns={"user": 1, "query": 2, "url": 3})
    with pytest.raises(ValueError, match="max_users"):
        LoadOptions("aol", max_users=0)
    with pytest.raises(ValueError, match="unknown encoding 'latin-9000'"):
        LoadOptions("aol", encoding="latin-9000")
    with pytest.raises(ValueError, match="ASCII-compatible"):
        LoadOptions("aol", encoding="utf-16")


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CELS_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("CELS_DATA")
    repo = Path(__file__).resolve().parent.parent
    assert default_data_dir() == repo.parent / "shared" / "data"


# ---------------------------------------------------------------- AOL


def test_aol_reader_events_normalisation_and_query_only_rows(tmp_path: Path) -> None:
    path = put(tmp_path / "a.tsv", AOL_ROWS)
    records = list(iter_records(path, LoadOptions("aol")))
    assert [(r.user, r.query, r.url, r.line) for r in records] == [
        ("7", "weather boston", "http://weather.com/", 2),
        ("7", "weather boston", "http://weather.com/", 3),
        ("7", "no click", None, 4),
        ("9", "caf\u00e9 paris", "http://cafe.fr/", 5),
        ("9", "weather boston", None, 6),
        ("8", "weather boston", "http://weather.com/", 7),
    ]
    log = load_log(path, LoadOptions("aol"))
    assert histogram(log) == AOL_HISTOGRAM
    assert log.users == ["7", "9", "8"] and log.size == 4
    assert log.source["header"] == "AnonID\tQuery\tQueryTime\tItemRank\tClickURL"


@pytest.mark.parametrize("name", ["a.tsv", "a.tsv.gz"])
def test_aol_round_trip_keeps_histogram_and_bytes(tmp_path: Path, name: str) -> None:
    log = load_log(put(tmp_path / name, AOL_ROWS), LoadOptions("aol"))
    out = tmp_path / ("out-" + name)
    assert write_log(log, out) == 4  # one row per click: (7, weather) twice
    raw = gzip.decompress(out.read_bytes()) if name.endswith(".gz") else out.read_bytes()
    assert raw.splitlines()[0] == b"AnonID\tQuery\tQueryTime\tItemRank\tClickURL"
    assert raw.count(b"7\tweather boston\t\t\thttp://weather.com/\n") == 2
    assert b"9\tcaf\xc3\xa9 paris\t\t\thttp://cafe.fr/\n" in raw  # UTF-8 comes back as it was
    assert histogram(load_log(out, LoadOptions("aol"))) == AOL_HISTOGRAM


def test_bytes_that_are_not_utf8_are_refused_naming_line_and_field(tmp_path: Path) -> None:
    """Issue 13 item 6: a latin-1 byte is refused at load (it used to become a lone surrogate that
    no protobuf string can carry), naming file, line, field and the option that reads it."""
    latin1 = AOL_ROWS.replace(b"caf\xc3\xa9", b"caf\xe9")
    path = put(tmp_path / "a.tsv", latin1)
    with pytest.raises(LogError) as caught:
        load_log(path, LoadOptions("aol"))
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), 5, "Query")
    assert "byte 0xe9 is not valid UTF-8 (byte 6 of the line)" in error.reason and "--encoding latin-1" in error.reason
    with pytest.raises(LogError, match=r"line 1, field 'QueryTime': byte 0xff is not valid UTF-8 \(byte 5 "):
        load_log(put(tmp_path / "t.tsv", b"7\tq\t\xff\t1\thttp://x/\n"), LoadOptions("aol"))
    with pytest.raises(LogError, match=r"line 1, field 'column 4': byte 0xc3 is not valid UTF-8"):  # a UTF-8 sequence cut short
        load_log(put(tmp_path / "c.csv", b"u;q;http://x/;\xc3\n"), LoadOptions("tsv", columns=parse_columns("user=1,query=2,url=3"), delimiter=";"))


def test_aol_header_detection_bom_and_crlf(tmp_path: Path) -> None:
    body = b"7\tweather boston\t\t\thttp://weather.com/\r\n8\tweather boston\t\t\thttp://weather.com/\r\n"
    no_header = load_log(put(tmp_path / "n.tsv", body), LoadOptions("aol"))
    assert no_header.source["header"] is None and no_header.source["newline"] == "\r\n"
    assert histogram(no_header) == {("7", "weather boston", "http://weather.com/"): 1,
                                     ("8", "weather boston", "http://weather.com/"): 1}
    with_bom = load_log(put(tmp_path / "b.tsv", b"\xef\xbb\xbf" + AOL_ROWS), LoadOptions("aol"))
    assert with_bom.source["bom"] and histogram(with_bom) == AOL_HISTOGRAM
    forced = load_log(put(tmp_path / "f.tsv", body), LoadOptions("aol", header=True))
    assert forced.users == ["8"]  # the first line was taken as the header


def test_max_users_keeps_the_first_users_in_file_order(tmp_path: Path) -> None:
    rows = b"".join(b"%d\tq%d\t\t\thttp://u/\n" % (u, k) for k, u in enumerate([5, 3, 5, 9, 3, 1]))
    log = load_log(put(tmp_path / "a.tsv", rows), LoadOptions("aol", header=False, max_users=2))
    assert log.users == ["5", "3"] and log.size == 4
    assert log.source["max_users"] == 2


# ---------------------------------------------------------------- generic delimited text and histogram


def test_tsv_with_count_column_comma_delimiter_header_and_round_trip(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbfn,when,who,q,u\r\n3,t1,alice,Cheap  Flights,http://f.com/\r\n1,t2,bob,cheap flights,http://f.com/\r\n"
    options = LoadOptions("tsv", columns=parse_columns("user=3,query=4,url=5,count=1"), delimiter=",")
    log = load_log(put(tmp_path / "in.csv", data), options)
    assert histogram(log) == {("alice", "cheap flights", "http://f.com/"): 3, ("bob", "cheap flights", "http://f.com/"): 1}
    assert log.source["header"] == "n,when,who,q,u" and log.source["bom"]
    out = tmp_path / "out.csv"
    assert write_log(log, out) == 2
    assert out.read_bytes() == (
        b"\xef\xbb\xbfn,when,who,q,u\r\n3,,alice,cheap flights,http://f.com/\r\n1,,bob,cheap flights,http://f.com/\r\n"
    )
    assert histogram(load_log(out, options)) == histogram(log)


@pytest.mark.parametrize("header", [True, False])
def test_tsv_without_count_repeats_rows(tmp_path: Path, header: bool) -> None:
    data = (b"user\tquery\turl\n" if header else b"") + b"u1\tq\thttp://x/\nu1\tq\thttp://x/\nu2\tq\thttp://x/\n"
    options = LoadOptions("tsv", columns=parse_columns("user=1,query=2,url=3"), header=header)
    log = load_log(put(tmp_path / "in.tsv", data), options)
    assert histogram(log) == {("u1", "q", "http://x/"): 2, ("u2", "q", "http://x/"): 1}
    out = tmp_path / "out.tsv"
    write_log(log, out)
    assert out.read_bytes() == data
    assert histogram(load_log(out, options)) == histogram(log)


def test_histogram_format_round_trip_and_header_detection(tmp_path: Path) -> None:
    log = load_log(put(tmp_path / "a.tsv", AOL_ROWS), LoadOptions("aol"))
    out = tmp_path / "h.tsv"
    write_log(log, out, {"format": "histogram"})
    assert out.read_text(encoding="utf-8", errors="surrogateescape").splitlines()[:2] == [
        "user\tquery\turl\tcount",
        "7\tweather boston\thttp://weather.com/\t2",
    ]
    again = load_log(out, LoadOptions("histogram"))
    assert histogram(again) == AOL_HISTOGRAM and again.source["header"] == "user\tquery\turl\tcount"
    headless = put(tmp_path / "n.tsv", b"a\tq\thttp://x/\t4\n")
    assert histogram(load_log(headless, LoadOptions("histogram"))) == {("a", "q", "http://x/"): 4}


def test_writer_refuses_values_holding_the_delimiter(tmp_path: Path) -> None:
    options = LoadOptions("tsv", columns=parse_columns("user=1,query=2,url=3"), header=False, delimiter=";")
    log = load_log(put(tmp_path / "in.txt", b"u;a,b;http://x/\n"), options)
    log.source["delimiter"] = ","
    with pytest.raises(ValueError, match="'a,b'.*contains the delimiter"):
        write_log(log, tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()


def test_suppressed_pairs_are_not_written(tmp_path: Path) -> None:
    log = load_log(put(tmp_path / "a.tsv", AOL_ROWS), LoadOptions("aol"))
    log.counts.data[log.counts.data < 2] = 0  # explicit zeros: only (7, weather) x 2 is released
    assert write_log(log, tmp_path / "o.tsv") == 2
    assert histogram(load_log(tmp_path / "o.tsv", LoadOptions("aol"))) == {("7", "weather boston", "http://weather.com/"): 2}


# ---------------------------------------------------------------- MSNBC


MSNBC_BODY = b"1 1 \r\n2 \r\n3 2 2 4 2 \r\n17 1 \r\n\r\n6 6 6"


def test_msnbc_reader_users_pairs_and_events(tmp_path: Path) -> None:
    path = put(tmp_path / "m.seq", MSNBC_HEADER + MSNBC_BODY)
    log = load_log(path, LoadOptions("msnbc"))
    assert log.source["categories"][16] == "travel" and len(log.source["header_lines"]) == 7
    assert log.users == ["1", "2", "3", "4", "6"]  # line 5 is empty: user 5 holds nothing
    assert log.pairs == [("frontpage", "1"), ("news", "2"), ("tech", "3"), ("local", "4"),
                         ("on-air", "6"), ("travel", "17")]
    assert log.counts.toarray().tolist() == [
        [2, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 3, 1, 1, 0, 0], [1, 0, 0, 0, 0, 1], [0, 0, 0, 0, 3, 0]]
    records = list(iter_records(path, LoadOptions("msnbc")))
    assert len(records) == log.size == 13 and records[3] == LogRecord("3", "tech", "3", 1, 10)
    assert histogram(SearchLog.from_records(records)) == histogram(log)


@pytest.mark.parametrize("name", ["m.seq", "m.seq.gz"])
def test_msnbc_round_trip_reproduces_the_file_up_to_visit_order(tmp_path: Path, name: str) -> None:
    log = load_log(put(tmp_path / name, MSNBC_HEADER + MSNBC_BODY), LoadOptions("msnbc"))
    out = tmp_path / ("out-" + name)
    assert write_log(log, out) == 5
    raw = gzip.decompress(out.read_bytes()) if name.endswith(".gz") else out.read_bytes()
    assert raw == MSNBC_HEADER + b"1 1 \r\n2 \r\n2 2 2 3 4 \r\n1 17 \r\n6 6 6 \r\n"
    again = load_log(out, LoadOptions("msnbc"))  # users renumber (the empty line 5 is gone): 6 becomes 5
    assert again.users == ["1", "2", "3", "4", "5"] and again.pairs == log.pairs
    assert again.counts.toarray().tolist() == log.counts.toarray().tolist()


def test_msnbc_max_users_counts_data_lines(tmp_path: Path) -> None:
    log = load_log(put(tmp_path / "m.seq", MSNBC_HEADER + MSNBC_BODY), LoadOptions("msnbc", max_users=3))
    assert log.users == ["1", "2", "3"] and log.size == 8


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("fmt", "data", "line", "field", "reason"),
    [
        ("aol", AOL_ROWS.replace(b"8\tweather", b" \tweather"), 7, "AnonID", "empty user id"),
        ("aol", b"AnonID\tQuery\n7\n", 2, "Query", "missing"),
        ("aol", b"7\tq\tt\t1\thttp://x/\textra\n", 1, None, "6 fields"),
        ("aol", AOL_ROWS.replace(b"caf\xc3\xa9", b"caf\xe9"), 5, "Query", "byte 0xe9 is not valid UTF-8"),
        ("histogram", b"a\tq\thttp://x/\t2\nb\tq\thttp://x/\xff\t1\n", 2, "url", "byte 0xff is not valid UTF-8"),
        ("histogram", b"a\tq\thttp://x/\t2\nb\tq\thttp://x/\t0\n", 2, "count", "'0' is not a positive integer"),
        ("histogram", b"user\tquery\turl\tcount\nb\tq\thttp://x/\ttwo\n", 2, "count", "'two' is not a positive"),
        ("histogram", b"a\tq\thttp://x/\t2\nb\tq\n", 2, "url", "missing"),
        ("msnbc", MSNBC_HEADER + b"1 2\r\n3 x 4\r\n", 9, "category", "visit 2 is 'x'"),
        ("msnbc", MSNBC_HEADER + b"1 2\r\n18\r\n", 9, "category", "not a category number 1..17"),
        ("msnbc", MSNBC_HEADER + b"1 2\r\n1 170\r\n", 9, "category", "'170'"),
        ("msnbc", b"1 2 3\r\n", 1, "header", "starts with a '%' header"),
        ("msnbc", MSNBC_HEADER.replace(b"travel", b"tr\xe8s"), 3, "header", "byte 0xe8 is not valid UTF-8"),
        ("msnbc", MSNBC_HEADER + b"1 2\r\n3 \xe9\r\n", 9, "category", r"visit 2 is '\\\\xe9'"),
        ("histogram", b"a\tq\xe9\thttp://x/\t2\n", 1, "query", r"byte 0xe9 is not valid UTF-8 \(byte 4 of the line\)"),
    ],
)
def test_bad_input_names_file_line_and_field(
    tmp_path: Path, fmt: str, data: bytes, line: int, field: str | None, reason: str
) -> None:
    path = put(tmp_path / "bad.txt", data)
    with pytest.raises(LogError, match=reason) as caught:
        load_log(path, LoadOptions(fmt))
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), line, field)
    assert str(caught.value).startswith(f"{path}, line {line}")


def test_a_declared_encoding_reads_latin1_and_writes_utf8(tmp_path: Path) -> None:
    """Issue 13 item 6: a latin-1 log read with encoding="latin-1" (CLI --encoding, [data]
    encoding); the output is UTF-8 whatever the input's encoding (docs/formats.md)."""
    path = put(tmp_path / "a.tsv", AOL_ROWS.replace(b"caf\xc3\xa9", b"caf\xe9"))
    log = load_log(path, LoadOptions("aol", encoding="latin-1"))
    assert histogram(log) == AOL_HISTOGRAM
    write_log(log, tmp_path / "out.tsv")
    assert b"9\tcaf\xc3\xa9 paris\t\t\thttp://cafe.fr/\n" in (tmp_path / "out.tsv").read_bytes()
    lenient = load_log(path, LoadOptions("aol", lenient=True))
    assert lenient.source["skipped_lines"] == 1 and "line 5, field 'Query'" in lenient.source["skipped_examples"][0]
    with pytest.raises(ValueError, match="unknown encoding 'klingon'"):
        LoadOptions("aol", encoding="klingon")


def test_tsv_missing_column_and_empty_log(tmp_path: Path) -> None:
    options = LoadOptions("tsv", columns=parse_columns("user=1,query=2,url=4"), header=False)
    with pytest.raises(LogError, match=r"line 2, field 'url': missing: the line has 3 field\(s\), url is column 4"):
        load_log(put(tmp_path / "t.tsv", b"u\tq\tx\thttp://a/\nu\tq\tx\n"), options)
    with pytest.raises(LogError, match="no query-url pair in"):
        load_log(put(tmp_path / "e.tsv", b"AnonID\tQuery\tQueryTime\n7\tq\tt\n"), LoadOptions("aol"))
    with pytest.raises(LogError, match="no query-url pair in"):
        load_log(put(tmp_path / "e.seq", MSNBC_HEADER), LoadOptions("msnbc"))


def test_lenient_mode_skips_and_counts_bad_lines(tmp_path: Path) -> None:
    data = b"a\tq\thttp://x/\t2\nb\tq\thttp://x/\t-1\n\tq\thttp://x/\t1\nc\tq\thttp://x/\t1\n"
    log = load_log(put(tmp_path / "h.tsv", data), LoadOptions("histogram", lenient=True))
    assert histogram(log) == {("a", "q", "http://x/"): 2, ("c", "q", "http://x/"): 1}
    assert log.source["skipped_lines"] == 2
    assert "line 2, field 'count'" in log.source["skipped_examples"][0]
    assert "line 3, field 'user'" in log.source["skipped_examples"][1]
    seq = put(tmp_path / "m.seq", MSNBC_HEADER + b"1 1\r\n2 99\r\n3\r\n")
    msnbc = load_log(seq, LoadOptions("msnbc", lenient=True))
    assert msnbc.users == ["1", "3"] and msnbc.source["skipped_lines"] == 1  # users keep their line numbers


def test_counts_past_the_limits_are_refused_naming_the_line_or_the_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23 items 3-4: a count past 2^31 - 1 on a line, a pair's total past it, or a log's
    total past 2^53 (docs/formats.md, "Limits") are bad input, not an OverflowError or a
    wrapped int64 sum."""
    from cels.logs import options, records

    huge = put(tmp_path / "huge.tsv", b"user\tquery\turl\tcount\nu1\tq\tu\t99999999999999999999999999\n")
    for read in (load_log, lambda p, o: list(iter_records(p, o))):
        with pytest.raises(LogError, match=r"99999999999999999999999999 is above the largest count a line may give, 2147483647") as caught:
            read(huge, LoadOptions("histogram"))
        assert (caught.value.line, caught.value.field) == (2, "count")
    at_limit = b"u1\tq\tu\t2147483647\nu2\tp\tu\t2147483647\n"
    assert load_log(put(tmp_path / "ok.tsv", at_limit), LoadOptions("histogram")).size == 2 * (2**31 - 1)
    pair = put(tmp_path / "pair.tsv", at_limit.replace(b"\tp\t", b"\tq\t"))
    with pytest.raises(LogError, match=r"^.*pair.tsv: pair \(query 'q', url 'u'\) totals 4294967294 over the log, above the 2147483647"):
        load_log(pair, LoadOptions("histogram"))
    monkeypatch.setattr(options, "MAX_LOG_TOTAL", 3 * (2**31 - 1))  # 2^53 takes 2^22 lines at the line limit
    total = put(tmp_path / "total.tsv", b"".join(b"u%d\tq%d\tu\t2147483647\n" % (k, k) for k in range(4)))
    with pytest.raises(LogError, match=r"line 4, field 'count': the log's counts add up to 8589934588 here, above the 6442450941"):
        load_log(total, LoadOptions("histogram"))
    assert records.MAX_LOG_TOTAL == 2**53
    lenient = load_log(total, LoadOptions("histogram", lenient=True))
    assert lenient.size == 3 * (2**31 - 1) and lenient.source["skipped_lines"] == 1


@pytest.mark.parametrize("fmt", ["histogram", "msnbc"])
def test_a_truncated_or_corrupted_gzip_log_names_the_file_and_the_last_line(tmp_path: Path, fmt: str) -> None:
    """Issue 23 item 13: a damaged .gz is bad input naming the file and the last line read,
    not an EOFError / BadGzipFile / zlib.error traceback."""
    lines = MSNBC_HEADER if fmt == "msnbc" else b""
    lines += b"".join((b"1 2 3\r\n" if fmt == "msnbc" else b"u%d\tq%d\thttp://x/\t1\n" % (k, k % 7)) for k in range(20000))
    data = gzip.compress(lines)
    cases = {
        "truncated": (data[: len(data) // 2], r"the compressed data ends after line \d+ \(the last line read\), before gzip's end-of-stream marker: the file is truncated"),
        "not gzip": (lines, r"damaged gzip data before its first line: Not a gzipped file"),
        "bad crc": (data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:], r"damaged gzip data after line 20\d\d\d \(the last line read\): CRC check failed"),
        "bad deflate block": (data[:10] + b"\xff\xff" + data[12:], r"damaged gzip data before its first line: Error -3 while decompressing data"),
    }
    for name, (damaged, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.gz"
        path.write_bytes(damaged)
        with pytest.raises(LogError, match=message) as caught:
            load_log(path, LoadOptions(fmt))
        assert str(caught.value).startswith(f"{path}: "), name


# ---------------------------------------------------------------- synthetic log


def test_synthetic_log_is_deterministic_per_seed() -> None:
    a, b, c = synthetic_log(seed=7), synthetic_log(seed=7), synthetic_log(seed=8)
    assert a.users == b.users and a.pairs == b.pairs and (a.counts != b.counts).nnz == 0
    assert histogram(a) != histogram(c)
    assert a.source["format"] == "aol"


def test_synthetic_log_shape() -> None:
    log = synthetic_log()
    per_user = np.sort(np.asarray(log.counts.sum(axis=1)).ravel())[::-1]
    assert log.n_users == 2000 and per_user.min() >= 1
    assert per_user[:200].sum() >= 0.5 * log.size  # heavy tail: the top 10 % of users hold half the events
    holders = np.diff(log.counts.tocsc().indptr)
    assert (holders >= 2).sum() >= 500  # pairs the mechanism may release
    # Pairs a single unit of which satisfies every condition at epsilon=1, delta=0.01 (CELS Thm 2).
    b = min(1 / 2, np.log(1 / (1 - 0.01)))
    csc, totals = log.counts.tocsc(), log.pair_totals()
    worst = np.array([np.log(totals[i] / (totals[i] - csc[:, i].max())) if holders[i] >= 2 else np.inf
                      for i in range(log.n_pairs)])
    assert (worst <= b).sum() >= 10


def test_write_synthetic_gives_an_aol_file(tmp_path: Path) -> None:
    log = write_synthetic(tmp_path / "demo.tsv", seed=3, users=50)
    assert (tmp_path / "demo.tsv").read_text().startswith("AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n")
    assert histogram(load_log(tmp_path / "demo.tsv", LoadOptions("aol"))) == histogram(log)


def test_bench_load_reports_time_memory_and_size(tmp_path: Path) -> None:
    result = bench_load(put(tmp_path / "a.tsv", AOL_ROWS), LoadOptions("aol"))
    assert result["seconds"] >= 0 and result["peak_rss_bytes"] >= result["peak_rss_before_bytes"] > 0
    assert (result["users"], result["pairs"], result["events"]) == (3, 2, 4)


# ---------------------------------------------------------------- real data (shared/data/README.md)


@pytest.mark.realdata
def test_aol_slice_facts(aol_path: Path, tmp_path: Path) -> None:
    log = load_log(aol_path, LoadOptions("aol"))
    assert (log.n_users, log.n_pairs, log.size) == (500, 143_934, 207_990)
    csc = log.counts.tocsc()
    shared = np.flatnonzero(np.diff(csc.indptr) >= 2)
    assert len(shared) == 2_849
    assert len(np.unique(csc[:, shared].indices)) == 489
    assert (log.pair_totals()[shared] >= 20).sum() == 173
    write_log(log, tmp_path / "aol.tsv.gz")
    assert histogram(load_log(tmp_path / "aol.tsv.gz", LoadOptions("aol"))) == histogram(log)


@pytest.mark.realdata
def test_msnbc_first_40829_users_facts(msnbc_path: Path) -> None:
    options = LoadOptions("msnbc", max_users=40_829)
    log = load_log(msnbc_path, options)
    assert (log.n_users, log.size) == (40_829, 200_009)
    dense = np.zeros((log.n_users, 17), dtype=np.int64)
    dense[:, [int(url) - 1 for _, url in log.pairs]] = log.counts.toarray()
    assert len(np.unique(dense, axis=0)) == 8_769
    # the numpy fast path agrees with the line-by-line reader
    assert histogram(SearchLog.from_records(iter_records(msnbc_path, options))) == histogram(log)
