"""A node fixes glibc malloc's thresholds (cels.node.process.fix_malloc_thresholds; docs/ray.md,
"Memory of a node"): a block freed no longer raises the mmap threshold, so a later chunk-sized
buffer is mapped (and given back when freed), not carved from a heap that keeps it."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, os, sys
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "fix":
    from cels.node.process import fix_malloc_thresholds
    fix_malloc_thresholds()
big = bytearray(16 << 20)  # glibc maps it; freeing it raises the default mmap threshold to 16 MiB
del big
before = libc.mallinfo2().hblkhd
chunk = bytearray(512 << 10)  # a universe chunk's size
print(json.dumps({"mapped": libc.mallinfo2().hblkhd - before, "env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}))
"""

glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="malloc is not glibc >= 2.33")


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=clean | env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@glibc
def test_a_node_maps_chunk_sized_buffers_after_a_large_free() -> None:
    fixed, default = probe("fix"), probe("default")
    assert fixed["mapped"] >= 512 << 10  # mapped: freed to the system when the chunk goes
    assert default["mapped"] == 0  # glibc's default: from the heap, after the 16 MiB free
    assert fixed["env"] == {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}  # for its Ray processes


@glibc
def test_an_operators_thresholds_stay() -> None:
    """MALLOC_MMAP_THRESHOLD_ set by the operator (1 MiB): glibc applies it at start, the node keeps it."""
    kept = probe("fix", MALLOC_MMAP_THRESHOLD_="1048576")
    assert kept["mapped"] == 0  # 512 KiB is below the operator's fixed 1 MiB
    assert kept["env"] == {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "131072"}
