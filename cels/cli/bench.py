"""``cels bench {mechanism,crypto,protocol,scale,engine,read}``: benchmarks that print JSON."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = ("cels.bench.mechanism", "cels.bench.crypto", "cels.bench.protocol", "cels.bench.scale", "cels.bench.engine", "cels.bench.read")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench")
    bench_sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name in BENCHMARKS:
        importlib.import_module(name).register(bench_sub)
