"""``cels simulate`` (flags: :mod:`cels.cli.distributed`): one log split by user over R party
nodes and a solver node, started as processes on 127.0.0.1 with a fresh dev CA, one session,
the nodes stopped (:func:`run_nodes`, which the benchmarks and tests use too)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

from cels.certs import SOLVER, controller_name, make_dev_certs
from cels.cli.distributed import DEFAULT_TIMEOUT, session_stock
from cels.cli.options import seed_argv, session_values
from cels.cli.progress import SessionProgress
from cels.cli.run import node_log_dir, operator_path, release_notes, warn_transformed
from cels.crypto.key_sizes import DEFAULT_KEY_BITS
from cels.engine.options import engine_options
from cels.fileio import check_output_paths
from cels.logs.formats import log_format
from cels.logs import LogRecord, SearchLog, iter_records, split_records_by_user, synthetic_log, write_log, write_records
from cels.node.client import Controller, SessionAborted, node_statuses, run_on_nodes, wait_for_stock
from cels.node.cluster import LOOPBACK, LocalCluster, PhaseCpu, free_port, peer_args, python_module, tls_args
from cels.node.health import wait_serving
from cels.node.policy import admitting
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_label, table_of
from cels.reports import release_note_path, write_reports


def output_suffix(path: Path | None) -> str:
    """``.tsv.gz`` for ``aol-dev.tsv.gz``, ``.seq`` for ``x.seq``; ``.tsv`` for the synthetic log."""
    if path is None:
        return ".tsv"
    suffixes = path.suffixes
    return "".join(suffixes[-2:]) if suffixes and suffixes[-1] == ".gz" else (suffixes[-1] if suffixes else ".out")


def input_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--format", args.format or "aol"]
    if args.columns:
        flags += ["--columns", args.columns]
    if args.no_header:
        flags.append("--no-header")
    if args.delimiter != "\t":
        flags += ["--delimiter", args.delimiter]
    if args.lenient:
        flags.append("--lenient")
    if args.encoding != "utf-8":
        flags += ["--encoding", args.encoding]
    return flags


def simulate_options(args: argparse.Namespace, parties: int) -> SessionOptions:
    """The session of ``cels simulate``: its session option flags (cels.cli.options)."""
    if args.preprocess:
        raise ValueError("--preprocess is not part of the distributed protocol (no party sees every user's log)")
    if args.integer != "mip":
        raise ValueError("the solver node rounds with the MIP (--integer mip)")
    return SessionOptions.create(parties, **session_values(args))


def run_nodes(
    shares: Sequence[SearchLog | list[LogRecord] | Path],
    options: SessionOptions,
    out: Path,
    suffix: str,
    fmt_args: list[str],
    report_path: Path,
    extra: dict[str, Any] | None = None,
    record_view: Path | None = None,
    stock: dict[str, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    node_flags: dict[str, list[str]] | None = None,
    while_up: Callable[[LocalCluster, Controller], None] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Start a solver and one party node per share as processes on 127.0.0.1 with a fresh dev
    CA, run ``config`` through ``cels run``'s client, stop the nodes.  Writes
    ``out/sanitized<suffix>`` (a DP histogram: ``out/dp-histogram.tsv``; cels.protocol.releases), its release note and the operator report at ``report_path``
    (cels.reports); returns the report (SessionAborted if
    the session failed; the node logs stay in :func:`node_log_dir`, the operator's, never beside the release).

    ``stock`` (key owner -> obfuscators) runs the offline phase first: every party node stocks
    that many obfuscators for each owner's node key, and the session starts once all stocks
    are complete; the report's ``offline`` key has its seconds and what the session used.
    Without it the nodes stock nothing (obfuscators are computed during the session).

    A share is a SearchLog (written to a temporary file), a list of events (written so in the
    AOL layout: ``fmt_args`` must then name it), or the path of a log file already in the
    format ``fmt_args`` name.  ``timeout`` bounds the offline phase and the session
    together (TimeoutError or SessionAborted past it).  The report adds each phase's wall
    clock seen here (``phase_wall_seconds``), the CPU seconds every node's process tree used
    in it (``phase_cpu_seconds``, cels.node.cluster.PhaseCpu), every node's peak RSS
    (``peak_rss_bytes``) and every party's engine with what its workers used (``engine``:
    the node's session summary, cels.engine).

    ``node_flags``: more flags for some nodes (name -> flags, e.g. ``--metrics-listen``);
    ``while_up(cluster, controller)`` runs after the session, before the nodes stop (``controller``:
    the initiator's, as ``cels run``'s); ``force`` replaces an
    existing release (cels.node.client.run_on_nodes)."""
    parties = list(options.parties)
    limit = time.monotonic() + timeout
    out.mkdir(parents=True, exist_ok=True)
    output = out / options.release_kind.output_name(suffix)
    with tempfile.TemporaryDirectory(prefix="cels-nodes-") as tmp:
        work = Path(tmp)
        nodes = [SOLVER, *parties]
        certs = make_dev_certs(work / "certs", [*nodes, *(controller_name(n) for n in nodes)])  # one controller per organisation
        addresses = {name: f"{LOOPBACK}:{free_port()}" for name in [SOLVER, *parties]}
        options = options.with_addresses(addresses)
        common = ["--deadline", str(options.deadline), "--node-key-bits", str(options.key_bits)]
        started = time.monotonic()
        # every core for each party's obfuscator workers (as before the idle-host default of half the cores):
        # the simulated nodes share one host and are idle only for the offline phase
        stocking = ["--obfuscators", "0", "--obfuscator-workers", str(os.cpu_count() or 1),
                    *(a for owner, n in (stock or {}).items() for a in ("--stock", f"{owner}={n}"))]  # fmt: skip
        if options.key_bits < DEFAULT_KEY_BITS:
            common += ["--min-key-bits", str(options.key_bits)]
        if record_view is not None:
            common += ["--record-view", str(record_view.resolve())]
        print(f"starting {len(addresses)} node processes on {LOOPBACK} (fresh dev CA, each makes its {options.key_bits}-bit node key)",
              file=sys.stderr, flush=True)  # fmt: skip
        with LocalCluster(node_log_dir(report_path)) as cluster:
            for name in addresses:
                argv = ["--name", name, "--listen", addresses[name], *tls_args(certs[name]), *peer_args(addresses, name), *common]
                argv += (node_flags or {}).get(name, [])
                if name != SOLVER:  # the simulated parties' operators are the user who asked for this session
                    argv += admitting(options)
                if name == SOLVER:
                    cluster.start(name, addresses[name], python_module("solver_node") + argv)
                else:
                    share = shares[parties.index(name)]
                    if isinstance(share, SearchLog):
                        data = work / f"{name}{suffix}"
                        write_log(share, data)
                    elif isinstance(share, list):
                        data = work / f"{name}.tsv"
                        write_records(share, data)
                    else:
                        data = share
                    party = python_module("party_node") + argv + ["--data", str(data), *fmt_args, *stocking]
                    cluster.start(name, addresses[name], party)
            cluster.wait_ready(timeout=60)
            # the one user of a simulation runs every organisation's controller: each node is asked with its own
            ctrl, identities = certs[controller_name(parties[0])], {n: (certs[controller_name(n)].cert, certs[controller_name(n)].key) for n in nodes}
            # the nodes make their node keys at start-up: a deployment's nodes are long-running,
            # so the session (and its online clock) starts once every node is SERVING
            wait_serving(addresses, {name: (ctrl.ca, *identities[name]) for name in addresses}, timeout=max(60.0, limit - time.monotonic()), alive=cluster.check_alive)
            print(f"started {len(addresses)} node processes on {LOOPBACK} (mutual TLS, fresh dev CA), all serving after "
                  f"{time.monotonic() - started:.1f} s; logs in {cluster.log_dir}", file=sys.stderr, flush=True)  # fmt: skip
            controller = Controller(parties[0], addresses[parties[0]], ctrl.ca, ctrl.cert, ctrl.key, identities=identities)
            party_addresses = {p: addresses[p] for p in parties}
            offline = offline_phase(controller, party_addresses, limit - time.monotonic()) if stock else None
            print(f"session {options.session_id}: running (each node's phases as they end)", file=sys.stderr, flush=True)
            progress, cpu = SessionProgress(options), PhaseCpu(cluster)

            def phase_started(event: cels_pb2.PhaseStart) -> None:
                if event.node == options.initiator and phase_label(event.phase) != Phase.OVER:  # the phases' clock: the initiator's
                    cpu.mark(phase_label(event.phase))
                progress.start(event)

            try:
                report = run_on_nodes(
                    controller, options.to_config(), output, report_path, limit - time.monotonic(),
                    progress.step, extra=extra, on_phase_start=phase_started, force=force,
                )  # fmt: skip
            finally:
                progress.close()
            progress.finish(report)
            if offline is not None:
                report["offline"] = offline_report(offline, node_statuses(controller, party_addresses))
            report["phase_wall_seconds"] = progress.phase_wall_seconds()
            report["phase_cpu_seconds"] = cpu.seconds()
            report["peak_rss_bytes"] = cluster.peak_rss_bytes()
            report["engine"] = engine_usage(controller, party_addresses, options.session_id)
            write_reports(report, output, report_path)
            if while_up is not None:
                while_up(cluster, controller)
            return report


def engine_usage(controller: Controller, parties: dict[str, str], session_id: str, timeout: float = 10.0) -> dict[str, dict[str, Any] | None]:
    """Every party's engine and what the session's work used, from its ``Status`` session
    summary once the session ended there (None: not recorded within ``timeout`` seconds)."""
    limit = time.monotonic() + timeout
    while True:
        found = {
            name: next((table_of(s.engine) for s in status.sessions if s.session_id == session_id and s.HasField("engine")), None)
            for name, status in node_statuses(controller, parties).items()
        }  # fmt: skip
        if all(found.values()) or time.monotonic() >= limit:
            return found
        time.sleep(0.2)


def offline_phase(controller: Controller, nodes: dict[str, str], timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Wait (with a progress bar) until every party node's obfuscator stock is complete."""
    from tqdm import tqdm

    start = time.perf_counter()
    with tqdm(desc="offline: obfuscators", unit="obf", file=sys.stderr, mininterval=1.0) as bar:

        def progress(ready: int, target: int) -> None:
            bar.total = target
            bar.update(ready - bar.n)

        statuses = wait_for_stock(controller, nodes, timeout, progress)
    return {"seconds": time.perf_counter() - start, "before": statuses}


def offline_report(offline: dict[str, Any], after: dict[str, cels_pb2.NodeStatus]) -> dict[str, Any]:
    """Seconds of the offline phase and, per party node and key owner, the stock the session
    found and the obfuscators it used (beyond the stock, they were computed online)."""
    used = {}
    for node, status in after.items():
        before = {e.owner: e for e in offline["before"][node].stock}
        used[node] = {
            e.owner: {"stocked": int(before[e.owner].ready), "used": int(e.handed_out - before[e.owner].handed_out)}
            for e in status.stock
            if e.owner in before
        }
    return {
        "what": "obfuscators h_s^a mod N^2 for the node keys, computed before the session (cels.node.keys)",
        "seconds": offline["seconds"],
        "by_node": used,
        "computed_online": sum(max(0, u["used"] - u["stocked"]) for node in used.values() for u in node.values()),
    }


def run_simulate(args: argparse.Namespace) -> int:
    from cels.cli.sanitize import input_options, load_input  # the single holder's reading: imported when it runs, not for --help

    if args.input is not None and args.format is None:
        raise ValueError("--input needs --format")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory")
    options = simulate_options(args, args.parties)
    engine = engine_options(args, {})
    if engine.kind == "ray" and importlib.util.find_spec("ray") is None:  # before any node starts
        raise ValueError("--engine ray needs the ray extra (pip install 'cels[ray]')")
    warn_transformed(options, "cels simulate")
    if options.key_bits < DEFAULT_KEY_BITS:
        print(f"cels simulate: WARNING: {options.key_bits}-bit Paillier keys are NOT secure (paper reproduction only)", file=sys.stderr)
    stock = session_stock(args, options)
    t0 = time.perf_counter()
    fmt = log_format(args.format or "aol")  # the embedded log is AOL
    suffix = fmt.release_suffix or output_suffix(args.input)
    output = args.out / options.release_kind.output_name(suffix)
    releases, inputs = {"--out": output, "release note": release_note_path(output)}, (args.input,) if args.input else ()
    if args.out.is_dir():  # an earlier release is refused before the input is read
        check_output_paths(releases, inputs=inputs, force=args.force)
    if args.input is None:
        log, fmt_args = synthetic_log(users=args.synthetic_users, pairs=args.synthetic_pairs), ["--format", "aol"]
    else:  # read before --out is made: a bad input leaves nothing behind
        if not fmt.exists(args.input):
            raise ValueError(f"--input {args.input} does not exist")
        print(f"reading {args.input} ...", file=sys.stderr, flush=True)
        log, fmt_args = load_input(args), input_flags(args)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = operator_path(args.report, output, options.session_id)
    check_output_paths(releases | {"--report": report_path}, inputs=inputs, force=args.force)
    shares = log.split_by_user(args.parties)
    print(f"input: {log.n_users} users, {log.n_pairs} pairs, |D| = {log.size}; split over {args.parties} parties "
          f"({', '.join(str(s.n_users) for s in shares)} users)", flush=True)  # fmt: skip
    extra = {"simulation": {"parties": args.parties, "users_per_party": [s.n_users for s in shares], "processes": args.parties + 1}}
    if options.release_kind.private_universe and not options.item_kinds.only_pairs:  # the kinds count events in order: each party gets its events
        events = log.records() if args.input is None else list(iter_records(args.input, input_options(args)))
        shares, fmt_args = split_records_by_user(events, args.parties), ["--format", "aol"]
    try:
        flags = {party: engine.argv() + seed_argv(args) for party in options.parties} | {options.solver: seed_argv(args)}
        report = run_nodes(shares, options, args.out, suffix, fmt_args, report_path, extra, args.record_view, stock, node_flags=flags, force=args.force)
    except SessionAborted as exc:
        print(f"cels simulate: {exc} (node logs in {node_log_dir(report_path)})", file=sys.stderr)
        return 1
    took = f"cels simulate took {time.perf_counter() - t0:.1f} s in all (reading and splitting the input, starting the nodes and their keys, the session)"
    return release_notes(report, output, report_path, took)
