"""``cels bench resume`` (cels.bench.resume): a seeded session whose party-2 is SIGKILLed in
its counts, restarted and resumed writes the uninterrupted session's release, on the AOL slice
cut to its first users.  Every phase of both releases: tests/faults/test_resume.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cels.bench.resume import kill_phases
from cels.protocol.options import SessionOptions

SMALL = ["--max-users", "60", "--parties", "3", "--key-bits", "512", "--epsilon", "8", "--delta", "0.9"]


def test_a_session_killed_in_its_counts_and_resumed_writes_the_same_release(aol_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from cels.cli import main; sys.exit(main())", "bench", "resume", "--input", str(aol_path),
         *SMALL, "--phases", "counts", "--seed", "5"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    counts = out["phases"]["counts"]
    assert out["same_release"] is True and counts["same_release"] is True
    assert counts["resume_tries"] >= 1 and 0 < counts["killed_after_seconds"] < out["uninterrupted_seconds"] * 3
    assert counts["resume_ratio"] == pytest.approx(counts["resume_seconds"] / out["uninterrupted_seconds"])


def test_the_phases_to_kill_in_are_the_releases_own() -> None:
    sampled = SessionOptions.create(3, epsilon=1.0, delta=0.4)
    assert kill_phases(sampled, None) == ["load", "universe", "counts", "solve", "sampling", "union"]
    dp = SessionOptions.create(3, epsilon=1.0, delta=1e-6, release="dp")
    assert kill_phases(dp, None) == ["load", "universe", "counts"]
    with pytest.raises(ValueError, match="this release's phases are load, universe, counts"):
        kill_phases(dp, "sampling")
