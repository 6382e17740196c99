"""``cels bench {mechanism,crypto,protocol,scale,engine,read,resume}``: benchmarks that print JSON.

Each benchmark's module declares its flags (``add_arguments``) and sets ``func``; it is
imported only when its parser parses (:class:`cels.cli.options.DeferredParser`)."""

from __future__ import annotations

import argparse

from cels.cli.options import DeferredParser

BENCHMARKS = {
    "mechanism": "load/prune/solve/sample times and memory on the real logs",
    "crypto": "packed Paillier vs naive secure sum; commutative cipher speed",
    "protocol": "a whole CELS session: seconds and bytes per phase and node",
    "scale": "the cost curve: whole sessions on synthetic AOL-shaped logs of growing size",
    "engine": "the same seeded release in process and on Ray with P user shards (SHA-256 per run)",
    "read": "a Parquet log read through distinct values vs row by row",
    "resume": "a node killed in each phase, restarted, the session resumed: its cost and the same release",
}
"""Benchmark -> its one-line help; its module is ``cels.bench.<name>``."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench")
    bench_sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK", parser_class=DeferredParser)
    for name, help in BENCHMARKS.items():
        bench_sub.add_parser(name, help=help, module=f"cels.bench.{name}")
