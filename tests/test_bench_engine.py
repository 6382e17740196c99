"""``cels bench engine`` (cels.bench.engine): a seeded session over node processes releases the
same bytes with the party nodes' work in process and on Ray with two user shards, on the AOL
slice.  (That another seed releases other records: tests/test_engine_ray.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cels[ray]'; CI installs it)")

from cels.bench.engine import shard_counts  # noqa: E402

SMALL = ["--max-users", "60", "--parties", "2", "--key-bits", "512", "--epsilon", "8", "--delta", "0.9"]


def bench(aol_path, *flags: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from cels.cli import main; sys.exit(main())", "bench", "engine", "--input", str(aol_path), *SMALL, *flags],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_seeded_release_is_the_same_bytes_in_process_and_on_two_ray_shards(aol_path) -> None:
    out = bench(aol_path, "--shards", "2", "--seed", "5")
    local, ray2 = out["runs"]
    assert (local["run"], ray2["run"]) == ("local", "ray P=2")
    assert local["released_records"] > 0
    assert out["same_output"] is True and ray2["sha256"] == local["sha256"]


@pytest.mark.parametrize("text", ["", "0,2", "two", "1,-1"])
def test_bad_shard_lists_are_refused(text) -> None:
    with pytest.raises(ValueError, match="--shards must be a comma list of positive integers"):
        shard_counts(text)


def test_a_shard_list_keeps_its_order_once_each() -> None:
    assert shard_counts("4,1,2,4") == [4, 1, 2]
