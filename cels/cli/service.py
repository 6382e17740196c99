"""``cels certs``, ``cels run``, ``cels simulate``: CELS as a distributed service.

- ``cels certs --out DIR --parties R``: a development CA and one certificate per node.
- ``cels run --config session.toml``: start a session on running nodes (the initiator is a
  party node); the sanitized log and its public release note are written where ``[run] output``
  says, the confidential operator report where ``[run] report`` says (default: cels.reports).
- ``cels simulate``: split a log by user over R parties, start R party nodes and a solver node
  as separate processes on 127.0.0.1 with a fresh dev CA, run one session, stop them.
"""

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


from cels.certs import SOLVER, controller_name, make_dev_certs, node_names
from cels.cli.notices import EXIT_EMPTY_RELEASE, empty_release_reason, privacy_notice, utility_words
from cels.cli.progress import SessionProgress
from cels.cli.options import DEMO_BUDGET, SESSION_FLAGS, add_force_argument, add_option_arguments, delimiter, session_values, single_holder_arguments
from cels.logs import FORMATS, LogRecord, SearchLog, iter_records, split_records_by_user, synthetic_log, write_log, write_records
from cels.crypto.paillier import DEFAULT_KEY_BITS
from cels.claims import TRANSFORMED_WARNING, items_words
from cels.node.policy import admitting
from cels.fileio import check_output_paths
from cels.node.client import (
    CONNECT_TIMEOUT, Controller, SessionAborted, node_statuses, run_on_nodes, wait_for_stock, wait_reachable,
)  # fmt: skip
from cels.node.cluster import LOOPBACK, LocalCluster, PhaseCpu, free_port, peer_args, python_module, tls_args
from cels.releases import DP_HISTOGRAM, SAMPLED, release_kind, report_kind
from cels.node.config import add_engine_arguments, add_seed_argument, engine_argv, engine_options, load_toml, seed_argv
from cels.node.schemas import SESSION_SCHEMA, check_toml
from cels.node.health import wait_serving
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.wire import cels_pb2
from cels.protocol.wire.codec import phase_label, table_of
from cels.reports import default_operator_path, release_note_path, write_reports

DEFAULT_TIMEOUT = 4 * 3600.0


def register(subparsers: argparse._SubParsersAction) -> None:
    certs = subparsers.add_parser("certs")
    certs.add_argument("--out", required=True, type=Path, help="directory for ca.pem and NAME.pem / NAME.key")
    certs.add_argument("--parties", type=int, default=3, help="number of party nodes (default 3)")
    certs.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    certs.set_defaults(func=run_certs)

    run = subparsers.add_parser("run")
    run.add_argument("--config", required=True, type=Path, help="session.toml (see docs/deployment.md)")
    add_force_argument(run)
    run.set_defaults(func=run_run)

    sim = subparsers.add_parser("simulate")
    sim.add_argument("--parties", type=int, default=3, help="number of parties R (default 3)")
    sim.add_argument("--input", type=Path, help="the log to split by user (default: the embedded synthetic log)")
    sim.add_argument("--synthetic-users", type=int, default=300, metavar="N", help="users of the embedded synthetic log (default 300; a session of a few seconds with 2048-bit keys)")
    sim.add_argument("--synthetic-pairs", type=int, default=200, metavar="N", help="shared pairs of the embedded synthetic log (default 200)")
    sim.add_argument("--format", choices=FORMATS, help="input format (required with --input)")
    sim.add_argument("--columns", help="tsv column mapping, e.g. user=1,query=2,url=4[,count=5] (parquet: column names)")
    sim.add_argument("--no-header", action="store_true", help="the input has no header line")
    sim.add_argument("--delimiter", default="\t", type=delimiter, help="tsv field delimiter, one character (default tab)")
    sim.add_argument("--lenient", action="store_true", help="skip bad lines instead of failing")
    sim.add_argument("--encoding", default="utf-8", help="how the log bytes are text (default utf-8; e.g. latin-1): a line not valid in it is an error naming file, line and field")
    add_option_arguments(sim, SESSION_FLAGS, DEMO_BUDGET)
    sim.add_argument("--out", required=True, type=Path, help="directory for sanitized.<ext>, its public release note sanitized.<ext>.release-note.json and the node logs")
    sim.add_argument("--report", type=Path, metavar="REPORT.json", help="the confidential operator report (mode 0600; default: under $CELS_REPORT_DIR or ~/.local/state/cels/reports, never beside the release)")
    sim.add_argument("--record-view", type=Path, metavar="DIR", help="every node records its view of the session under DIR (`cels views DIR`)")
    add_force_argument(sim)
    add_stock_arguments(sim)
    add_engine_arguments(sim)
    add_seed_argument(sim)
    single_holder_arguments(sim)
    sim.set_defaults(func=run_simulate)


def add_stock_arguments(parser: argparse.ArgumentParser) -> None:
    """The offline phase of a simulated deployment (cels.node.keys)."""
    parser.add_argument(
        "--stock-nlp",
        type=int,
        default=0,
        metavar="N",
        help="offline phase: every party stocks N obfuscators for the solver's node key (the NLP of --solve transformed) before the session starts",
    )
    parser.add_argument(
        "--stock-sum",
        type=int,
        default=0,
        metavar="N",
        help="offline phase: every party stocks N obfuscators for P_1's node key (the secure sums of --solve transformed) before the session starts",
    )


def session_stock(args: argparse.Namespace, options: SessionOptions) -> dict[str, int] | None:
    """Key owner -> stock size for the keys a session encrypts under (None: no offline phase).
    Only the paper's mode (--solve transformed) encrypts with Paillier; the private mode masks
    its sums and solve (docs/protocol.md), so neither stock is filled for it."""
    if args.stock_nlp < 0 or args.stock_sum < 0:
        raise ValueError("--stock-nlp / --stock-sum must be >= 0")
    if options.solve != "transformed":
        return None
    stock = {options.parties[0]: args.stock_sum, options.solver: args.stock_nlp}
    return {owner: n for owner, n in stock.items() if n > 0} or None


# -- cels certs ------------------------------------------------------------------------------


def run_certs(args: argparse.Namespace) -> int:
    names = node_names(args.parties)
    make_dev_certs(args.out, names, days=args.days)
    print(f"wrote {args.out}/ca.pem and certificates for {', '.join(names)} (development CA, {args.days} days)")
    return 0


# -- cels run --------------------------------------------------------------------------------


def session_options(table: dict[str, Any]) -> SessionOptions:
    """The session of session.toml's [session] table (its keys are SessionOptions' fields; the
    schema has checked their types and ranges, SessionOptions checks the rest)."""
    options = dict(table)
    try:
        return SessionOptions.create(list(options.pop("parties")), **options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[session]: {exc}") from None


def approval_printer(options: SessionOptions) -> Callable[[str, bool], None]:
    """``cels run``'s lines for a party whose operator approves the session first."""

    def show(party: str, approved: bool) -> None:
        if approved:
            print(f"cels run: {party}'s operator approved session {options.session_id}", file=sys.stderr)
        else:
            print(f"cels run: {party} waits for its operator to approve session {options.session_id} (on its host: cels approve "
                  f"--config {party}.toml {options.session_id}; at most {options.approval_wait:g} s, --approval-wait)", file=sys.stderr)  # fmt: skip

    return show


def unreachable_printer(every: float = 5.0) -> Callable[[dict[str, str], float], None]:
    """``cels run`` while it waits for nodes: which are unreachable at which address, when
    that changes and every ``every`` seconds."""
    last: dict[str, Any] = {"nodes": None, "at": -every}

    def show(missing: dict[str, str], waited: float) -> None:
        if missing != last["nodes"] or waited - last["at"] >= every:
            last.update(nodes=dict(missing), at=waited)
            nodes = ", ".join(f"{name} at {where}" for name, where in missing.items())
            print(f"  waiting {waited:4.0f} s for {nodes}", file=sys.stderr, flush=True)

    return show


def run_run(args: argparse.Namespace) -> int:
    doc = load_toml(args.config)
    check_toml(doc, args.config, SESSION_SCHEMA)
    base = args.config.resolve().parent
    run, table = doc["run"], doc["session"]
    try:
        options = session_options({**table, "initiator": run["initiator"]})
    except ValueError as exc:
        raise ValueError(f"{args.config}: {exc}") from None
    insecure = bool(run.get("insecure", False))
    paths = {k: base / run[k] for k in ("ca", "cert", "key") if k in run}
    if not insecure and len(paths) < 3:
        raise ValueError(f"{args.config}: [run] needs ca, cert and key (the controller's credentials) or insecure = true")
    for key, path in paths.items():  # every file the run reads, before the first line of work
        if not insecure and not path.is_file():
            raise ValueError(f"{args.config}: [run] {key} = {run[key]!r}: {path} {'is not a file' if path.exists() else 'does not exist'}")
    controller = Controller(run["initiator"], run["address"], insecure=insecure, **paths)
    output = base / run["output"]
    report_path = operator_path(base / run["report"] if "report" in run else None, output, options.session_id)
    check_output_paths({"[run] output": output, "release note": release_note_path(output), "[run] report": report_path}, force=args.force)
    nodes = {run["initiator"]: run["address"], **{str(k): str(v) for k, v in run.get("nodes", {}).items()}}
    progress = None
    try:
        wait_reachable(controller, nodes, float(run.get("wait", CONNECT_TIMEOUT)), unreachable_printer())
        # the session's id once the nodes answer: no id is printed for a session that never started
        print(f"session {options.session_id}: {len(options.parties)} parties and {options.solver}, initiator {options.initiator}", flush=True)
        warn_transformed(options, "cels run")
        progress = SessionProgress(options)
        report = run_on_nodes(
            controller, options.to_config(), output, report_path, float(run.get("timeout", DEFAULT_TIMEOUT)), progress.step,
            on_phase_start=progress.start, on_approval=approval_printer(options), force=args.force,
        )  # fmt: skip
    except SessionAborted as exc:
        print(f"cels run: {exc}", file=sys.stderr)
        return 1
    finally:
        if progress is not None:
            progress.close()
    progress.finish(report)
    return release_notes(report, output, report_path)


def node_log_dir(report_path: Path) -> Path:
    """Where a simulation's node logs go: beside its operator report (``NAME.node-logs/``,
    0700), since they name the input's sizes."""
    return report_path.with_name(f"{report_path.name.removesuffix('.json')}.node-logs")


def operator_path(given: Path | None, output: Path, session_id: str | None = None) -> Path:
    """The operator report's path: the one given (its directory made 0700 if missing), else a
    new one under the operator report directory (cels.reports), never beside the release."""
    if given is None:
        return default_operator_path(output, session_id)
    given.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return given


def warn_transformed(options: SessionOptions, command: str) -> None:
    """The paper's Algorithm 2 lets the solver rebuild every row: say so before it runs."""
    if options.solve == "transformed":
        print(f"{command}: {TRANSFORMED_WARNING}", file=sys.stderr, flush=True)


def release_notes(report: dict[str, Any], output: Path, report_path: Path, took: str = "") -> int:
    """Summary, what was written (``took``: what the whole command took, if more than the
    session) and the privacy notice; the exit code (3: empty release)."""
    print(SUMMARIES[report_kind(report)](report))
    print(f"session wall time {report['wall_seconds']:.1f} s (the operator report's wall_seconds: on the initiator, from the Run "
          "request to the report, every phase; not node start-up)")  # fmt: skip
    print(f"wrote {output} and its public release note {release_note_path(output)}; "
          f"the confidential operator report (not to be published) is {report_path}")  # fmt: skip
    if took:
        print(took)
    from cels.mechanism.solvers import mip_stop_notice  # scipy: imported once a release is there, not for --help

    notice = mip_stop_notice(report.get("solver", {}))
    if notice is not None:
        print(f"solver: {notice}", file=sys.stderr)
    print("\n".join(privacy_notice(report["privacy"])), file=sys.stderr)
    reason = empty_release_reason(report)
    if reason is not None:
        print(reason, file=sys.stderr)
        return EXIT_EMPTY_RELEASE
    return 0


SUMMARIES = {SAMPLED: lambda report: summary(report), DP_HISTOGRAM: lambda report: dp_summary(report)}
"""The summary line of each release kind (cels.releases)."""


# -- cels simulate ---------------------------------------------------------------------------


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
    while_up: Callable[[LocalCluster], None] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Start a solver and one party node per share as processes on 127.0.0.1 with a fresh dev
    CA, run ``config`` through ``cels run``'s client, stop the nodes.  Writes
    ``out/sanitized<suffix>`` (a DP histogram: ``out/dp-histogram.tsv``; cels.releases), its release note and the operator report at ``report_path``
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
    ``while_up(cluster)`` runs after the session, before the nodes stop; ``force`` replaces an
    existing release (cels.node.client.run_on_nodes)."""
    parties = list(options.parties)
    limit = time.monotonic() + timeout
    out.mkdir(parents=True, exist_ok=True)
    output = out / release_kind(options).output_name(suffix)
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
                while_up(cluster)
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
    if engine_options(args, {}).kind == "ray" and importlib.util.find_spec("ray") is None:  # before any node starts
        raise ValueError("--engine ray needs the ray extra (pip install 'cels[ray]')")
    warn_transformed(options, "cels simulate")
    if options.key_bits < DEFAULT_KEY_BITS:
        print(f"cels simulate: WARNING: {options.key_bits}-bit Paillier keys are NOT secure (paper reproduction only)", file=sys.stderr)
    stock = session_stock(args, options)
    t0 = time.perf_counter()
    if args.input is None:
        log, fmt_args = synthetic_log(users=args.synthetic_users, pairs=args.synthetic_pairs), ["--format", "aol"]
    else:  # read before --out is made: a bad input leaves nothing behind
        if not (args.input.is_file() or (args.format == "parquet" and args.input.is_dir())):
            raise ValueError(f"--input {args.input} does not exist")
        print(f"reading {args.input} ...", file=sys.stderr, flush=True)
        log, fmt_args = load_input(args), input_flags(args)
    suffix = ".parquet" if args.format == "parquet" else output_suffix(args.input)
    args.out.mkdir(parents=True, exist_ok=True)
    output = args.out / release_kind(options).output_name(suffix)
    report_path = operator_path(args.report, output, options.session_id)
    check_output_paths({"--out": output, "release note": release_note_path(output), "--report": report_path}, inputs=(args.input,) if args.input else (), force=args.force)
    shares = log.split_by_user(args.parties)
    print(f"input: {log.n_users} users, {log.n_pairs} pairs, |D| = {log.size}; split over {args.parties} parties "
          f"({', '.join(str(s.n_users) for s in shares)} users)", flush=True)  # fmt: skip
    extra = {"simulation": {"parties": args.parties, "users_per_party": [s.n_users for s in shares], "processes": args.parties + 1}}
    if options.release == "dp" and not options.item_kinds.only_pairs:  # the kinds count events in order: each party gets its events
        events = log.records() if args.input is None else list(iter_records(args.input, input_options(args)))
        shares, fmt_args = split_records_by_user(events, args.parties), ["--format", "aol"]
    try:
        flags = {party: engine_argv(args) + seed_argv(args) for party in options.parties} | {options.solver: seed_argv(args)}
        report = run_nodes(shares, options, args.out, suffix, fmt_args, report_path, extra, args.record_view, stock, node_flags=flags, force=args.force)
    except SessionAborted as exc:
        print(f"cels simulate: {exc} (node logs in {node_log_dir(report_path)})", file=sys.stderr)
        return 1
    took = f"cels simulate took {time.perf_counter() - t0:.1f} s in all (reading and splitting the input, starting the nodes and their keys, the session)"
    return release_notes(report, output, report_path, took)


def dp_summary(report: dict[str, Any]) -> str:
    """One human line about a DP histogram (``--release dp``)."""
    p, r = report["privacy"], report["release"]
    seeded = " -- SEEDED, NOT PRIVATE: do not publish" if p.get("reproducible_seed") else ""
    return (
        f"released {r['items']} items with noisy distinct-user counts (threshold tau = {r['threshold']}, at most "
        f"{items_words(p['items'])} a user); ({p['epsilon']:g}, {p['delta']:g})-DP end to end against recipients{seeded}; "
        f"{report['bytes_total'] / 1e6:.2f} MB of protocol messages"
    )


def summary(report: dict[str, Any]) -> str:
    """One human line about a distributed release."""
    from cels.cli.sanitize import guarantee_word

    s, u, p = report["solver"], report["utility"], report["privacy"]
    return (
        f"released |O| = {s.get('integer_total')} "
        + (f"(LP bound {s['max_output_lp']:.1f}), " if "max_output_lp" in s else f"(private solve, {s.get('rounds')} rounds), ")
        + f"{utility_words(u)}; b = {p['b']:.4g} (eps {p['epsilon']}, delta {p['delta']}), {guarantee_word(p)}; "
        f"{report['bytes_total'] / 1e6:.2f} MB of protocol messages ({report['wire']['bytes_total'] / 1e6:.2f} MB on the wire)"
    )
