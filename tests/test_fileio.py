"""cels.fileio: outputs appear complete or not at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cels.fileio import atomic_write, atomic_write_json


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_atomic_write_creates_the_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with atomic_write(target) as fh:
        fh.write("héllo\n")
        assert not target.exists()  # nothing visible before the block ends
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert _leftovers(tmp_path, {"out.txt"}) == []


def test_exception_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_write(target) as fh:
            fh.write("new, half written")
            raise RuntimeError("boom")
    assert target.read_text() == "old\n"
    assert _leftovers(tmp_path, {"out.txt"}) == []


def test_exception_on_a_new_path_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with atomic_write(tmp_path / "new.bin", mode="wb") as fh:
            fh.write(b"\x00\x01")
            raise KeyError("x")
    assert _leftovers(tmp_path, set()) == []


def test_binary_mode_and_newline_translation(tmp_path: Path) -> None:
    with atomic_write(tmp_path / "a.bin", mode="wb") as fh:
        fh.write(b"\xff\r\n")
    assert (tmp_path / "a.bin").read_bytes() == b"\xff\r\n"
    with atomic_write(tmp_path / "b.txt", newline="\r\n") as fh:
        fh.write("x\n")
    assert (tmp_path / "b.txt").read_bytes() == b"x\r\n"
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(tmp_path / "c", mode="a"):
            pass


def test_modes_follow_umask_or_the_replaced_file(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "new") as fh:
            fh.write("x")
        assert (tmp_path / "new").stat().st_mode & 0o777 == 0o644
        old = tmp_path / "old"
        old.write_text("x")
        old.chmod(0o640)
        with atomic_write(old) as fh:
            fh.write("y")
        assert old.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_atomic_write_json_round_trip(tmp_path: Path) -> None:
    obj = {"epsilon": 1.0, "pairs": [["q", "u"]], "name": "ünïcode"}
    atomic_write_json(tmp_path / "r.json", obj)
    text = (tmp_path / "r.json").read_text(encoding="utf-8")
    assert json.loads(text) == obj and text.endswith("\n")


SIGNALLED_WRITER = """
import sys, time
import cels.fileio as fileio
fileio.TERMINATION_GRACE = float(sys.argv[2])
fileio.raise_on_termination()
with fileio.atomic_write(sys.argv[1]) as fh:
    fh.write("half a release")
    fh.flush()
    try:  # the signal comes once "open" is read: from inside the try
        print("open", flush=True)
        time.sleep(60)
    except fileio.Terminated:
        if sys.argv[3] == "hang":  # a library that swallows the exception and blocks on a lock
            time.sleep(60)
        raise
"""


@pytest.mark.parametrize("unwinding", ["unwinds", "hang"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_removes_the_temporary_file(tmp_path: Path, sig: signal.Signals, unwinding: str) -> None:
    """Issue 13 item 4: a terminated writer leaves nothing; when unwinding hangs, the grace
    timer removes the temporary file and exits 128 + signal."""
    target = tmp_path / "sanitized.tsv"
    writer = subprocess.Popen([sys.executable, "-c", SIGNALLED_WRITER, str(target), "1.0", unwinding], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "open\n"
    assert len(list(tmp_path.iterdir())) == 1
    start = time.monotonic()
    writer.send_signal(sig)
    writer.communicate(timeout=20)
    assert writer.returncode == (128 + sig if unwinding == "hang" else 1)
    assert time.monotonic() - start < 10
    assert not list(tmp_path.iterdir())


def test_an_existing_output_is_refused_unless_forced_and_a_racing_writer_loses(tmp_path: Path) -> None:
    """Issue 41 finding 2: two runs to one path both wrote it, and one release was lost."""
    from cels.fileio import check_output_paths

    out = tmp_path / "sanitized.tsv"
    out.write_text("first release\n")
    with pytest.raises(ValueError, match=rf"--out {out} exists: give --force to replace it"):
        check_output_paths({"--out": out})
    check_output_paths({"--out": out}, force=True)
    with pytest.raises(FileExistsError, match="another run wrote it meanwhile"):  # the check passed, then another run published
        with atomic_write(out, replace=False) as fh:
            fh.write("second release\n")
    assert out.read_text() == "first release\n" and [p.name for p in tmp_path.iterdir()] == ["sanitized.tsv"]
    fresh = tmp_path / "fresh.tsv"
    with atomic_write(fresh, replace=False) as fh:
        fh.write("mine\n")
    assert fresh.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["fresh.tsv", "sanitized.tsv"]
