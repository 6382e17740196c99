"""``cels bench protocol``: seconds and bytes of a whole CELS session, per phase and per node.

``--runner inmemory`` (default) runs the roles in one process over the in-memory network
(cels.inprocess); every party's obfuscators (encryptions of zero) are computed inline and timed,
which splits each node's time into *offline* (obfuscators: what an ObfuscatorPool computes
ahead of time) and *online* (everything else).  ``--runner processes`` runs the same session
as ``cels simulate`` does (R party node processes and a solver node over gRPC with mutual TLS
on 127.0.0.1) and reports the wall time and the bytes on the wire, frames included; with
``--stock-nlp`` / ``--stock-sum`` the nodes first stock obfuscators for the solver's and P_1's
node keys (the offline phase, timed apart), so the session's wall time is the online time.
The engine flags (``--engine ray --shards P``, as on ``cels simulate``) put every party's
local work on its own Ray instance (with ``--runner inmemory``: one, in this process); the
processes runner reports what each party's workers used (``engine``).
Prints JSON (and writes it to ``--json FILE``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cels.cli.options import DEMO_BUDGET, SESSION_FLAGS, add_option_arguments, session_values
from cels.cli.distributed import DEFAULT_TIMEOUT, add_stock_arguments, session_stock
from cels.crypto.obfuscators import InlineObfuscators
from cels.crypto.key_sizes import DEFAULT_KEY_BITS
from cels.fileio import atomic_write_json
from cels.cli.options import add_seed_argument, seed_argv
from cels.engine.options import add_engine_arguments, engine_options
from cels.logs import FORMATS, LoadOptions, SearchLog, load_log, parse_columns, synthetic_log
from cels.protocol.options import SessionOptions
from cels.engine.routines import ItemBound

RUNNERS = ("inmemory", "processes")


class TimedObfuscators:
    """Inline obfuscators whose cost is charged to one node's offline ledger."""

    def __init__(self, n: int, ledger: dict[str, float]) -> None:
        self._inner = InlineObfuscators(n)
        self.n = n
        self._ledger = ledger

    def take(self, hs: int, count: int) -> list:
        start = time.perf_counter()
        values = self._inner.take(hs, count)
        self._ledger["seconds"] += time.perf_counter() - start
        self._ledger["obfuscators"] += count
        return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench protocol`` (cels.cli.bench)."""
    parser.add_argument("--input", type=Path, help="log to split by user over the parties (default: the synthetic log)")
    parser.add_argument("--format", choices=FORMATS, default="aol")
    parser.add_argument("--columns", help="tsv column mapping")
    parser.add_argument("--no-header", action="store_true")
    parser.add_argument("--max-users", type=int, help="keep the first N users of the input (MSNBC subsets)")
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--runner", choices=RUNNERS, default="inmemory", help="roles in one process (default) or node processes over gRPC")
    parser.add_argument("--json", type=Path, help="also write the JSON here (atomically)")
    add_option_arguments(
        parser, SESSION_FLAGS, DEMO_BUDGET,
        {"solve": {"action": "append", "default": None, "help": "phase 3's mode; repeat to compare both in the same run (default private)"}},
    )  # fmt: skip
    add_stock_arguments(parser)
    add_engine_arguments(parser)
    add_seed_argument(parser)
    parser.set_defaults(func=run)


def bench_log(args: argparse.Namespace) -> SearchLog:
    if args.input is None:
        return synthetic_log() if args.max_users is None else synthetic_log(users=args.max_users)
    options = LoadOptions(
        format=args.format,
        columns=parse_columns(args.columns) if args.columns else None,
        header=False if args.no_header else None,
        max_users=args.max_users,
    )
    return load_log(args.input, options)


def bench_inmemory(
    shares: list[SearchLog], options: SessionOptions, allow_small: bool, engine: Any = None, seed: int | None = None
) -> dict[str, Any]:
    """One session in memory; node time split into offline (obfuscators) and online.
    ``engine`` (cels.engine.Engine, default in process) runs every party's local work;
    ``seed`` replays every party's draws (NOT private)."""
    from cels.crypto.streams import DrawKeys
    from cels.engine import InProcessEngine
    from cels.inprocess import InMemoryNetwork, MemoryNode, abort_message, start_session
    from cels.protocol.host import SessionHost
    from cels.protocol.party import PartyRole
    from cels.protocol.solver import SolverRole
    from cels.session_report import session_report

    ledgers: dict[str, dict[str, float]] = defaultdict(lambda: {"seconds": 0.0, "obfuscators": 0})
    engine = engine or InProcessEngine()
    hosts, works = {}, {}
    for name, log in zip(options.parties, shares):
        timed = lambda n, ledger=ledgers[name]: TimedObfuscators(n, ledger)  # noqa: E731
        draws = DrawKeys.of(seed, name)
        works[name] = engine.work(log, options.cap, draws, ItemBound.of(options))
        factory = lambda opts, name=name, log=log, timed=timed, draws=draws: PartyRole(  # noqa: E731
            name, opts, log, allow_insecure_key_bits=allow_small, obfuscators=timed, session_report=session_report,
            draws=draws, work=works[name],
        )  # fmt: skip
        hosts[name] = MemoryNode(SessionHost(name, factory, time.perf_counter))
    solver = lambda opts: SolverRole(options.solver, opts, allow_insecure_key_bits=allow_small)  # noqa: E731
    hosts[options.solver] = MemoryNode(SessionHost(options.solver, solver, time.perf_counter))
    network = InMemoryNetwork(hosts)
    start = time.perf_counter()
    roles = start_session(network, options)
    wall = time.perf_counter() - start
    if (aborted := abort_message(roles)) is not None:
        raise RuntimeError(aborted)
    lead = roles[options.initiator]
    busy = dict(network.stats.seconds)
    offline = {name: ledgers[name]["seconds"] for name in hosts}
    return {
        "report": lead.report | {"engine": {name: engine.usage(work) for name, work in works.items()}},
        "wall_seconds": wall,
        "offline": {
            "what": "obfuscators h_s^a mod N^2 (an ObfuscatorPool computes them ahead of time)",
            "seconds_by_node": offline,
            "obfuscators_by_node": {name: int(ledgers[name]["obfuscators"]) for name in hosts},
            "seconds_total": sum(offline.values()),
        },
        "online": {
            "seconds_by_node": {name: busy.get(name, 0.0) - offline[name] for name in hosts},
            "wall_seconds": wall - sum(offline.values()),  # one process: nodes run one after another
        },
    }


def bench_processes(
    shares: Sequence[SearchLog | Path], options: SessionOptions, fmt_args: list[str], stock: dict[str, int] | None,
    timeout: float = DEFAULT_TIMEOUT, party_flags: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One session over gRPC between node processes (the ``cels simulate`` machinery); with
    ``stock`` the nodes run the offline phase first and the session's wall time is online.
    A share is a log or the path of a log file in ``fmt_args``' format; ``timeout`` bounds
    the offline phase and the session together; ``party_flags`` (the engine, a replay seed)
    go to every party node.  The result has the release file's SHA-256."""
    from cels.cli.simulate import run_nodes

    with tempfile.TemporaryDirectory(prefix="cels-bench-") as tmp:
        start = time.perf_counter()
        report = run_nodes(
            shares, options, Path(tmp), ".tsv", fmt_args, Path(tmp) / "operator-report.json", stock=stock, timeout=timeout,
            node_flags={party: party_flags or [] for party in options.parties},
        )  # fmt: skip
        wall = time.perf_counter() - start
        release_sha256 = hashlib.sha256((Path(tmp) / options.release_kind.output_name(".tsv")).read_bytes()).hexdigest()
    offline = report.get("offline")
    note = (
        "obfuscators from the nodes' stocks (computed_online counts those the stock lacked)"
        if offline
        else "no offline phase: obfuscators computed during the session on each node's worker processes"
    )
    return {
        "report": report,
        "wall_seconds": wall,
        "release_sha256": release_sha256,
        "offline": offline,
        "online": {"wall_seconds": report["wall_seconds"], "note": note},
    }


PAPER_TABLE5_MB = {
    "AOL 1M": {2: 3.7, 4: 14.3, 6: 30.3, 8: 56.2, 10: 85.2},
    "AOL 2M": {2: 9.8, 4: 28.2, 6: 65.3, 8: 121.2, 10: 183.8},
    "AOL 4M": {2: 19.3, 4: 66.0, 6: 152.6, 8: 257.4, 10: 405.3},
    "MSNBC 200K": {2: 2.2, 4: 8.8, 6: 19.1, 8: 32.6, 10: 46.2},
    "MSNBC 400K": {2: 4.6, 4: 18.3, 6: 40.9, 8: 62.1, 10: 87.3},
    "MSNBC 800K": {2: 8.9, 4: 36.5, 6: 89.3, 8: 132.7, 10: 194.6},
}
"""CELS Table 5: all parties' total bandwidth in MB (512-bit Paillier, 1024-bit PH) by input and r."""


def paper_reference(parties: int, bytes_total: int) -> dict:
    """This run's total bytes next to the paper's Table 5 column for the same r, or, for an r
    the table skips (it has r = 2, 4, .., 10), the columns on either side."""
    near = sorted({r for row in PAPER_TABLE5_MB.values() for r in row}, key=lambda r: (abs(r - parties), r))
    columns = [parties] if parties in near else [r for r in near if abs(r - parties) == abs(near[0] - parties)]
    return {
        "source": "CELS Table 5 (512-bit Paillier, 1024-bit Pohlig-Hellman; inputs of 200K-4M pairs)",
        "this_run_mb": bytes_total / 1e6,
        "paper_r": columns,
        "paper_mb": {name: {str(r): row[r] for r in columns} for name, row in PAPER_TABLE5_MB.items()},
    }


def run(args: argparse.Namespace) -> int:
    from cels.engine import open_engine

    engine = engine_options(args, {})  # checked before the log is read
    log = bench_log(args)
    shares = log.split_by_user(args.parties)
    if args.runner == "processes":  # the shares are written as histogram TSV (lossless, any input format)
        for share in shares:
            share.source = {"format": "histogram"}
    solves = {}
    in_process = open_engine(engine) if args.runner == "inmemory" else None
    try:
        for solve in dict.fromkeys(args.solve or ["private"]):  # in the order given, each once
            options, solves[solve] = bench_solve(args, shares, solve, in_process)
    finally:
        if in_process is not None:
            in_process.close()
    out = {
        "benchmark": "protocol",
        "runner": args.runner,
        "seed": args.seed,
        "input": str(args.input) if args.input else "synthetic",
        "format": args.format,
        "users": log.n_users,
        "pairs": log.n_pairs,
        "size": log.size,
        "parties": args.parties,
        "key_bits": options.key_bits,
        "universe_cipher": options.universe_cipher,
        "sampling": options.sampling,
        "engine": asdict(engine),
        "min_count": args.min_count,
        "solves": solves,
        **({"comparison": comparison(solves)} if len(solves) == 2 else {}),
    }
    text = json.dumps(out, indent=2, default=float)
    print(text)
    if args.json is not None:
        atomic_write_json(args.json, json.loads(text))
    return 0


def bench_solve(args: argparse.Namespace, shares: list[SearchLog], solve: str, engine: Any) -> tuple[SessionOptions, dict[str, Any]]:
    """One session of phase-3 mode ``solve``: in memory on ``engine``, or over node processes
    given the engine flags; its options and figures."""
    options = SessionOptions.create(args.parties, **{**session_values(args), "solve": solve})
    if options.key_bits < DEFAULT_KEY_BITS:
        print(f"cels bench protocol: WARNING: {options.key_bits}-bit keys are NOT secure (paper reproduction only)", file=sys.stderr)
    print(f"cels bench protocol: solve = {solve} ...", file=sys.stderr, flush=True)
    if args.runner == "inmemory":
        result = bench_inmemory(shares, options, allow_small=options.key_bits < DEFAULT_KEY_BITS, engine=engine, seed=args.seed)
    else:
        flags = engine_options(args, {}).argv() + seed_argv(args)
        result = bench_processes(shares, options, ["--format", "histogram"], session_stock(args, options), party_flags=flags)
    return options, solve_result(result, args.parties)


def solve_result(result: dict[str, Any], parties: int) -> dict[str, Any]:
    """One session's figures: per phase and node, offline and online, the solve's summary."""
    report = result.pop("report")
    return {
        **result,
        "solve": report.get("solve"),
        "phases": report["phases"],
        "bytes_total": report["bytes_total"],
        "paper_table5": paper_reference(parties, report["bytes_total"]),
        "bytes_by_node": {
            node: sum(p["bytes"].get(node, 0) for p in report["phases"].values())
            for node in sorted({n for p in report["phases"].values() for n in p["bytes"]})
        },
        "wire": report.get("wire"),
        "phase_wall_seconds": report.get("phase_wall_seconds"),
        "phase_cpu_seconds": report.get("phase_cpu_seconds"),
        "peak_rss_bytes": report.get("peak_rss_bytes"),
        "engine": report.get("engine"),
        "sizes": report.get("sizes"),
        "solver": {k: report["solver"].get(k) for k in ("objective", "integer_total", "max_output_lp", "seconds", "rounds") if k in report.get("solver", {})},
    }


def comparison(solves: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Private against transformed in the same run: the solve phase's bytes and the whole session."""
    private, transformed = solves["private"], solves["transformed"]
    online = {mode: s["online"]["wall_seconds"] for mode, s in solves.items()}
    offline = {mode: (s.get("offline") or {}).get("seconds", (s.get("offline") or {}).get("seconds_total")) for mode, s in solves.items()}
    return {
        "solve_phase_bytes": {"private": private["solve"]["bytes"], "transformed": transformed["solve"]["bytes"]},
        "solve_phase_bytes_ratio": transformed["solve"]["bytes"] / max(private["solve"]["bytes"], 1),
        "bytes_total": {"private": private["bytes_total"], "transformed": transformed["bytes_total"]},
        "online_wall_seconds": online,
        "offline_seconds": offline,
        "integer_total": {"private": private["solver"].get("integer_total"), "transformed": transformed["solver"].get("integer_total")},
    }
