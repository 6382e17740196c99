"""The in-process runtime runs the sharded work's calls as Ray would (cels.engine.runtime):
a call's error is raised by ``get``, not by the call; a reference passed to a call is its
value; ``num_returns`` splits a call's values; the window collects every item once, in order."""

from __future__ import annotations

import numpy as np
import pytest

from cels.engine.runtime import InProcessRuntime, fetch, in_slices, windowed
from cels.engine.shards import ShardState


class Counter(ShardState):
    def __init__(self) -> None:
        self.total = 0
        self.handed = {"values": np.arange(10)}

    def add(self, value: int) -> int:
        if value < 0:
            raise ValueError(f"negative: {value}")
        self.total += value
        return self.total

    def split(self, n: int) -> tuple[int, ...]:
        return tuple(range(n)) if n > 1 else 0


def test_a_call_runs_at_once_and_its_error_waits_for_get() -> None:
    runtime = InProcessRuntime()
    shard = runtime.shard(Counter, 0)
    first = shard.add.remote(2)
    bad = shard.add.remote(-1)  # raises nothing yet, as a Ray call would not
    then = shard.add.remote(runtime.put(3))  # a reference is passed as its value
    assert runtime.get([first, then]) == [2, 5]
    with pytest.raises(ValueError, match="negative: -1"):
        runtime.get([first, bad])
    with pytest.raises(ValueError, match="negative: -1"):  # a call given a failed reference fails with its error
        runtime.get([shard.add.remote(bad)])
    three = shard.split.options(num_returns=3).remote(3)
    assert runtime.get(three) == [0, 1, 2] and runtime.get([shard.split.remote(1)]) == [0]


def test_fetch_and_the_window_over_the_in_process_runtime() -> None:
    runtime = InProcessRuntime()
    shard = runtime.shard(Counter, 0)
    refs = fetch(runtime, shard, "values", 7, np.int64, start=2)
    assert len(refs) == 1 and np.array_equal(np.concatenate(runtime.get(refs)), np.arange(2, 9))  # unsliced in process
    assert in_slices(10, 8, 24) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    seen: list[int] = []
    windowed(runtime, range(5), lambda i: (shard.add.remote(i), i), lambda ref, i: seen.append(i) or runtime.get([ref]), 2)
    assert seen == [0, 1, 2, 3, 4] and runtime.get([shard.add.remote(0)]) == [10]
    assert runtime.lost_shards(RuntimeError("x"), [shard]) == []
