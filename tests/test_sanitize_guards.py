"""``cels sanitize`` guards against costly mistakes (issue 16): outputs checked before any work,
the input never overwritten, an empty release explained, the guarantee printed on every run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from cels.cli import main
from cels.cli.notices import EXIT_EMPTY_RELEASE, empty_dp_reason
from tests.test_sanitize_cli import HEADER, aol_file, figure1_rows

ARGS = ("--format", "aol", "--quiet", "--epsilon", "40", "--delta", "0.9999999", "--objective", "max-output", "--seed", "1")


def sanitize(src: Path, out: Path, *extra: str) -> int:
    return main(["sanitize", str(src), *ARGS, "--out", str(out), *extra])


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_out_equal_to_the_input_is_refused(tmp_path, capsys, link):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    before = src.read_bytes()
    out = tmp_path / "alias.tsv"
    if link == "same":
        out = src
    elif link == "symlink":
        out.symlink_to(src)
    else:
        os.link(src, out)
    assert sanitize(src, out) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is the input {src}" in err and len(err.strip().splitlines()) == 1
    assert src.read_bytes() == before


def test_out_through_a_relative_path_to_the_input_is_refused(tmp_path, capsys, monkeypatch):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["sanitize", str(src), *ARGS, "--out", "../s.tsv"]) == 2
    assert "is the input" in capsys.readouterr().err
    assert src.read_text().count("\n") == len(figure1_rows()) + 1


def test_directory_as_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    (tmp_path / "outdir").mkdir()
    import cels.cli.sanitize as cli

    monkeypatch.setattr(cli, "load_input", lambda args: pytest.fail("the input was read before the output check"))
    assert sanitize(src, tmp_path / "outdir") == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'outdir'} is a directory" in err and ".tmp" not in err


def test_unwritable_or_missing_directory_is_refused(tmp_path, capsys, monkeypatch):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    assert sanitize(src, tmp_path / "nosuch" / "o.tsv") == 2
    assert f"--out {tmp_path / 'nosuch' / 'o.tsv'}: directory {tmp_path / 'nosuch'} does not exist" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    real_access = os.access  # root may write anyway: ask the permission bits, as a user would
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and Path(p) != locked)
    assert sanitize(src, locked / "o.tsv") == 2
    assert f"--out {locked / 'o.tsv'}: directory {locked} is not writable" in capsys.readouterr().err
    assert list(locked.iterdir()) == []


def test_report_equal_to_out_is_refused(tmp_path, capsys):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    assert sanitize(src, tmp_path / "o.tsv", "--report", str(tmp_path / "o.tsv")) == 2
    assert "are the same file" in capsys.readouterr().err
    assert not (tmp_path / "o.tsv").exists()


def test_only_the_release_note_is_written_beside_the_output_without_report_flag(tmp_path, capsys, monkeypatch):
    """Issue 22 finding 3: beside the release goes the public note; the operator report (mode
    0600, confidential first) goes to the operator report directory."""
    reports = tmp_path.parent / f"{tmp_path.name}-reports"  # this test's own operator report directory
    monkeypatch.setenv("CELS_REPORT_DIR", str(reports))
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    assert sanitize(src, tmp_path / "o.tsv") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.tsv", "o.tsv.release-note.json", "s.tsv"]
    privacy = json.loads((tmp_path / "o.tsv.release-note.json").read_text())["privacy"]
    assert privacy["end_to_end"] is False and "NOT differentially private end to end" in privacy["guarantee"]
    (operator,) = reports.iterdir()
    assert operator.stat().st_mode & 0o777 == 0o600
    assert next(iter(json.loads(operator.read_text()))) == "confidential"
    assert str(operator) in capsys.readouterr().err


def test_every_run_names_the_guarantee_for_each_observer(tmp_path, capsys):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    assert sanitize(src, tmp_path / "o.tsv") == 0
    captured = capsys.readouterr()
    assert "DP of the sampling given the counts, NOT end-to-end" in captured.out  # the summary line
    assert "privacy: against recipients: " in captured.err and "privacy: against partners: no partner" in captured.err
    assert "privacy: learns (single holder, noise off): party: " in captured.err
    assert "not the negligible delta << 1/n" in captured.err
    assert sanitize(src, tmp_path / "n.tsv", "--noise-epsilon", "1", "--sensitivity", "2") == 0
    captured = capsys.readouterr()
    assert "no end-to-end bound" in captured.out and "end-to-end DP (eps" not in captured.out
    assert "learns (single holder, noise on)" in captured.err


def test_empty_release_says_why_and_exits_3(tmp_path, capsys):
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    code = main(["sanitize", str(src), "--format", "aol", "--quiet", "--epsilon", "1", "--delta", "0.01",
                 "--objective", "max-output", "--out", str(tmp_path / "o.tsv")])  # fmt: skip
    assert code == EXIT_EMPTY_RELEASE == 3
    err = capsys.readouterr().err
    b = math.log(1 / 0.99)
    assert f"b = min{{eps/2 = 0.5, ln 1/(1-delta) = {b:.4g}}} = {b:.4g} (set by delta)" in err
    assert f"LP bound |O_max| = {1.8128574 * b:.4g}" in err  # EDBT Fig. 1: |O_max| = 1.8128574 b
    need = 0.572519  # EDBT Fig. 1: one pair (google) fits from b = 0.572519 on (D-UMP's first step)
    assert f"largest per-pair bound max u_i {b / need:.4g} < 1" in err
    assert f"b >= {need:.4g}: --delta >= {1 - math.exp(-need):.4g} and --epsilon >= {2 * need:.4g}" in err
    assert (tmp_path / "o.tsv").read_text() == HEADER  # written: the report says what happened
    assert json.loads((tmp_path / "o.tsv.release-note.json").read_text())["sizes"]["output_records"] == 0


def test_tsv_takes_any_delimiter(tmp_path, capsys):
    src = tmp_path / "s.csv"
    src.write_text("user;query;url\n" + "".join(f"{u};{q};{url}\n" for u, q, url in figure1_rows()))
    code = main(["sanitize", str(src), "--format", "tsv", "--columns", "user=1,query=2,url=3", "--delimiter", ";",
                 *ARGS[2:], "--out", str(tmp_path / "o.csv")])  # fmt: skip
    assert code == 0
    lines = (tmp_path / "o.csv").read_text().splitlines()
    assert lines[0] == "user;query;url" and len(lines) > 1 and all(line.count(";") == 2 for line in lines)
    with pytest.raises(SystemExit) as exc:
        main(["sanitize", str(src), "--format", "tsv", "--delimiter", ";;", "--out", "x", "--epsilon", "1", "--delta", "0.5"])
    assert exc.value.code == 2 and "';;' is not one character" in capsys.readouterr().err


def test_a_second_run_to_an_existing_release_is_refused_unless_forced(tmp_path, capsys):
    """Issue 41 finding 2: a second run overwrote the first release; now it refuses before any
    work, naming the flag, and --force replaces it."""
    src = aol_file(tmp_path / "s.tsv", figure1_rows())
    out = tmp_path / "o.tsv"
    assert sanitize(src, out) in (0, EXIT_EMPTY_RELEASE)
    first = out.read_bytes(), (tmp_path / "o.tsv.release-note.json").read_bytes()
    capsys.readouterr()
    assert sanitize(src, out) == 2
    assert capsys.readouterr().err == f"cels sanitize: error: --out {out} exists: give --force to replace it, or another path\n"
    assert (out.read_bytes(), (tmp_path / "o.tsv.release-note.json").read_bytes()) == first
    assert sanitize(src, out, "--force") in (0, EXIT_EMPTY_RELEASE)
    note = json.loads((tmp_path / "o.tsv.release-note.json").read_text())
    assert note["sizes"]["output_records"] == len(out.read_text().splitlines()) - 1


def test_an_empty_dp_histogram_suggests_only_what_can_help() -> None:
    """Fewer items a user helps only above one item a user (the newcomer's hint said to lower a
    bound of 1); its words serve `cels run`'s session TOML as well as the flags."""
    def report(max_items: int, released: int = 0) -> dict:
        items = {"pairs": {"max_items": max_items, "epsilon": 1.0}}
        return {"privacy": {"threshold": 16, "epsilon": 1.0, "delta": 1e-6, "items": items}, "release": {"items": released}}

    assert empty_dp_reason(report(1, released=3)) is None
    at_one, at_five = empty_dp_reason(report(1)), empty_dp_reason(report(5))
    assert "tau = 16" in at_one and "raise epsilon or delta" in at_one and "max_items_per_user" not in at_one
    assert "keep fewer items a user (max_items_per_user)" in at_five
