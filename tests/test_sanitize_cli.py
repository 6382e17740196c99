"""``cels sanitize`` / ``cels demo``: exit codes, one-line errors, no partial output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cels.cli import main
from cels.cli.sanitize import METHODS

HEADER = "AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n"


def aol_file(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text(HEADER + "".join(f"{u}\t{q}\t2006-03-01 00:00:00\t\t{url}\n" for u, q, url in rows))
    return path


def figure1_rows() -> list[tuple[str, str, str]]:
    counts = {
        "081": {("pregnancy test", "m.com"): 2, ("book", "amazon.com"): 3, ("google", "google.com"): 15},
        "082": {("car price", "kbb.com"): 2, ("google", "google.com"): 7},
        "083": {("google", "google.com"): 17, ("diabetes", "w.com"): 1, ("book", "amazon.com"): 1, ("car price", "kbb.com"): 5},
    }
    return [(u, q, url) for u, pairs in counts.items() for (q, url), k in pairs.items() for _ in range(k)]


def run(tmp_path: Path, *extra: str, input_path: Path | None = None) -> int:
    src = input_path or aol_file(tmp_path / "in.tsv", figure1_rows())
    return main(["sanitize", str(src), "--format", "aol", "--quiet", "--out", str(tmp_path / "out.tsv"),
                 "--report", str(tmp_path / "report.json"), "--force", *extra])  # fmt: skip (one output, run again and again)


def test_sanitize_writes_output_and_report(tmp_path, capsys):
    code = run(tmp_path, "--epsilon", "40", "--delta", "0.9999999", "--objective", "max-output", "--seed", "1")
    assert code == 0
    out = (tmp_path / "out.tsv").read_text().splitlines()
    assert out[0] + "\n" == HEADER and len(out) > 1
    assert all(line.split("\t")[1] in {"book", "google", "car price"} for line in out[1:])
    report = json.loads((tmp_path / "report.json").read_text())
    for key in ("privacy", "solver", "sizes", "utility", "timings", "input"):
        assert key in report
    assert report["privacy"]["b"] == pytest.approx(16.118095, rel=1e-6)  # ln 1/(1-delta) < eps/2
    assert report["solver"]["max_output_lp"] == pytest.approx(1.8128574 * report["privacy"]["b"], rel=1e-6)
    assert report["sizes"]["nonunique_pairs"] == 3 and report["privacy"]["private"] is False
    assert "|O|" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        (("--epsilon", "0", "--delta", "0.1"), "epsilon must be a positive"),
        (("--epsilon", "1", "--delta", "1"), "delta must lie in (0, 1)"),
        (("--epsilon", "1", "--delta", "0"), "delta must lie in (0, 1)"),
        (("--epsilon", "4", "--delta", "0.5", "--output-size", "1000"), "exceeds the maximum"),
        (("--epsilon", "4", "--delta", "0.5", "--noise-epsilon", "1"), "go together"),
    ],
)
def test_parameter_errors_exit_2_without_output(tmp_path, capsys, args, message):
    assert run(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.tsv").exists() and not (tmp_path / "report.json").exists()


def test_empty_log_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.tsv"
    empty.write_text(HEADER)
    assert run(tmp_path, "--epsilon", "1", "--delta", "0.5", input_path=empty) == 2
    assert "no query-url pair" in capsys.readouterr().err
    assert not (tmp_path / "out.tsv").exists()


def test_log_without_shared_pair_exit_2(tmp_path, capsys):
    src = aol_file(tmp_path / "uniq.tsv", [("1", "a", "x.com"), ("2", "b", "y.com"), ("2", "b", "y.com")])
    assert run(tmp_path, "--epsilon", "1", "--delta", "0.5", input_path=src) == 2
    assert "held by two or more users" in capsys.readouterr().err
    assert not (tmp_path / "out.tsv").exists() and not (tmp_path / "report.json").exists()


def test_latin1_input_is_refused_unless_encoding_says_so(tmp_path, capsys):
    """Issue 13 item 6 at the CLI: a latin-1 byte exits 2 naming file, line and field; with
    ``--encoding latin-1`` the log is read and the output is UTF-8."""
    src = aol_file(tmp_path / "in.tsv", figure1_rows())
    src.write_bytes(src.read_bytes().replace(b"pregnancy", b"pr\xe9gnancy"))
    args = ("--epsilon", "40", "--delta", "0.9999999", "--seed", "1", "--objective", "max-output")
    assert run(tmp_path, *args, input_path=src) == 2
    err = capsys.readouterr().err.strip()
    assert f"{src}, line 2, field 'Query': byte 0xe9" in err and "not valid UTF-8" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.tsv").exists()
    assert run(tmp_path, *args, "--encoding", "latin-1", input_path=src) == 0
    assert (tmp_path / "out.tsv").read_bytes().decode("utf-8").startswith(HEADER)


def test_failed_run_keeps_an_existing_output_untouched(tmp_path):
    (tmp_path / "out.tsv").write_text("previous\n")
    assert run(tmp_path, "--epsilon", "-1", "--delta", "0.5") == 2
    assert (tmp_path / "out.tsv").read_text() == "previous\n"


def test_noise_run_claims_no_end_to_end_bound(tmp_path):
    """Issue 22 finding 2: the repair reads the data again, so a noisy run claims no
    (eps + eps', delta) composition, only the sampling given the released counts."""
    assert run(tmp_path, "--epsilon", "40", "--delta", "0.9999999", "--noise-epsilon", "1", "--sensitivity", "2", "--seed", "4") == 0
    privacy = json.loads((tmp_path / "report.json").read_text())["privacy"]
    assert privacy["end_to_end"] is False and "total_epsilon" not in privacy
    assert "no end-to-end bound is claimed" in privacy["against_recipients"] and "d assumed" in privacy["against_recipients"]
    assert "basic composition" not in json.dumps(privacy)


def test_method_registry_shape():
    assert "optimal" in METHODS and callable(METHODS["optimal"].run)


def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path / "demo-out")]) == 0
    out = capsys.readouterr().out
    assert "KL" in out and "recall" in out and "b = " in out
    note = json.loads((tmp_path / "demo-out" / "sanitized.tsv.release-note.json").read_text())
    rows = (tmp_path / "demo-out" / "sanitized.tsv").read_text().splitlines()[1:]
    assert note["sizes"]["output_records"] == len(rows) > 0 and "utility" not in note  # read off the release: its rows
    assert note["sizes"]["output_users"] == len({row.split("\t")[0] for row in rows})
    assert sorted(p.name for p in (tmp_path / "demo-out").iterdir()) == ["input.tsv", "sanitized.tsv", "sanitized.tsv.release-note.json"]
    assert (tmp_path / "demo-out" / "sanitized.tsv").read_text().startswith("AnonID")


@pytest.mark.parametrize("method", ["zealous", "korolova", "safelog"])
def test_baseline_methods_release_through_sanitize(tmp_path, capsys, method):
    # 60 users who all click the same pair twice: every baseline's threshold is cleared at eps 10
    rows = [(f"u{j:03d}", "weather", "weather.com") for j in range(60) for _ in range(2)]
    src = aol_file(tmp_path / "crowd.tsv", rows)
    code = run(tmp_path, "--epsilon", "10", "--delta", "0.001", "--method", method, "--seed", "3", input_path=src)
    assert code == 0
    lines = (tmp_path / "out.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["type", "query", "url", "next_query", "count"]
    released = {(f[0], f[1]) for f in (line.split("\t") for line in lines[1:])}
    assert ("query", "weather") in released or ("click", "weather") in released
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["privacy"]["epsilon"] <= 10 + 1e-9 and "dp_claim" in report["privacy"]
    assert capsys.readouterr().out.startswith(f"{method}: users 60")


HISTOGRAM = "user\tquery\turl\tcount\n"


@pytest.mark.parametrize("command", ["sanitize", "split", "simulate"])
def test_a_count_past_the_limit_or_a_damaged_gzip_exits_2_naming_file_and_line(tmp_path, capsys, command):
    """Issue 23 items 3 and 13: a count of 10^26 was an OverflowError traceback (exit 1), a
    truncated .gz an EOFError traceback; both are bad input (exit 2, one line)."""
    import gzip

    huge = tmp_path / "huge.tsv"
    huge.write_text(HISTOGRAM + "u1\tq\thttp://x/\t99999999999999999999999999\n")
    truncated = tmp_path / "truncated.tsv.gz"
    whole = gzip.compress("".join(f"u{k}\tq{k % 5}\thttp://x/{k % 5}\t1\n" for k in range(5000)).encode())
    truncated.write_bytes(whole[: len(whole) // 2])
    out = {"sanitize": ["--epsilon", "1", "--delta", "0.4", "--out", str(tmp_path / "o.tsv")],
           "split": ["--parties", "2", "--out", str(tmp_path / "p{k}.tsv")], "simulate": ["--out", str(tmp_path / "sim")]}[command]  # fmt: skip
    for path, where in [(huge, f"{huge}, line 2, field 'count': 99999999999999999999999999 is above the largest count"),
                        (truncated, f"{truncated}: the compressed data ends after line ")]:  # fmt: skip
        flag = ["--input", str(path)] if command == "simulate" else [str(path)]
        assert main([command, *flag, "--format", "histogram", *out]) == 2
        lines = capsys.readouterr().err.splitlines()
        if command == "simulate":  # it says what it is doing first
            assert lines.pop(0) == f"reading {path} ..."
        assert lines[0].startswith(f"cels {command}: error: {where}") and len(lines) == 1, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.tsv", "truncated.tsv.gz"]


def test_counts_that_overflow_when_summed_exit_2_naming_the_pair(tmp_path, capsys):
    """Issue 23 item 4: two rows of 5 * 10^18 for one pair summed to a negative int64 |D|."""
    src = tmp_path / "sum.tsv"
    src.write_text(HISTOGRAM + "u1\tq\tu\t5000000000000000000\nu2\tq\tu\t5000000000000000000\n")
    argv = ["sanitize", str(src), "--format", "histogram", "--epsilon", "1", "--delta", "0.4", "--out", str(tmp_path / "o.tsv")]
    assert main(argv) == 2
    assert f"{src}, line 2, field 'count': 5000000000000000000 is above the largest count a line may give, 2147483647" in capsys.readouterr().err
    src.write_text(HISTOGRAM + "u1\tq\tu\t2147483647\nu2\tq\tu\t2147483647\n")  # each line fits, the pair does not
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"cels sanitize: error: {src}: pair (query 'q', url 'u') totals 4294967294 over the log, above the 2147483647 (2^31 - 1) one pair may total (docs/formats.md, Limits)\n"
    assert not (tmp_path / "o.tsv").exists()


def test_an_empty_baseline_release_exits_3_with_the_reason(tmp_path, capsys):
    """Issue 23 item 7: ZEALOUS releasing 0 clicks exited 0 without a word; the summary's eps
    is printed with :g (issue 23 item 10: it read 1.0000000000000002)."""
    src = aol_file(tmp_path / "sparse.tsv", [(f"u{j}", f"q{j}", f"x{j}.com") for j in range(40)])  # no item held twice
    assert run(tmp_path, "--epsilon", "1", "--delta", "0.4", "--method", "zealous", "--seed", "1", input_path=src) == 3
    captured = capsys.readouterr()
    assert "EMPTY RELEASE: zealous released nothing (0 of the 40 click items in the log) at eps 1, delta 0.4" in captured.err
    assert (tmp_path / "out.tsv").exists() and (tmp_path / "report.json").exists()
    rows = [(f"u{j:03d}", "weather", "weather.com") for j in range(60) for _ in range(2)]
    assert run(tmp_path, "--epsilon", "1", "--delta", "0.4", "--method", "korolova", "--seed", "3", input_path=aol_file(tmp_path / "c.tsv", rows)) == 0
    out = capsys.readouterr().out
    assert ", eps 1, delta " in out and "0000000" not in out


def test_lenient_says_on_stderr_which_lines_it_skipped(tmp_path, capsys):
    """Issue 23 item 10: --lenient skipped lines without a word on the console."""
    src = aol_file(tmp_path / "in.tsv", figure1_rows())
    lines = src.read_text().splitlines(keepends=True)
    lines[3:3] = ["\tno user\t2006-03-01 00:00:00\t\tx.com\n", "7\tq\tt\t1\thttp://x/\textra\n"]
    src.write_text("".join(lines))
    args = ("--epsilon", "40", "--delta", "0.9999999", "--seed", "1", "--lenient")
    assert run(tmp_path, *args, input_path=src) == 0
    err = capsys.readouterr().err
    notice = [line for line in err.splitlines() if "--lenient" in line]
    assert notice == [f"cels sanitize: --lenient skipped 2 bad lines: {src}:4:AnonID, {src}:5 (the first: {src}, line 4, field 'AnonID': empty user id)"]
    assert run(tmp_path, *args, "--method", "zealous", input_path=src) in (0, 3)
    assert f"cels sanitize: --lenient skipped 2 bad lines: {src}:4:AnonID, {src}:5" in capsys.readouterr().err
    assert main(["split", str(src), "--format", "aol", "--lenient", "--parties", "2", "--out", str(tmp_path / "p{k}.tsv")]) == 0
    assert "cels split: --lenient skipped 2 bad lines" in capsys.readouterr().err


def test_safelog_transitions_on_a_log_without_any_summarises(tmp_path, capsys):
    """A log whose users each issue one query has no query pairs: the summary said KeyError 'recall'."""
    rows = [(f"u{j:03d}", "weather", "weather.com") for j in range(60)]
    src = aol_file(tmp_path / "single.tsv", rows)
    code = run(tmp_path, "--epsilon", "10", "--delta", "0.001", "--method", "safelog", "--safelog-transitions", "--seed", "3", input_path=src)
    assert code in (0, 3)
    assert "query_pair: 0 released, none in the log" in capsys.readouterr().out
