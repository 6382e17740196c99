"""``cels bench resume``: what a node's death costs a session that is then resumed
(docs/deployment.md, "Resume after a node restart").

Over node processes on 127.0.0.1 that keep their sessions' keys (``--state-dir``), every draw
replayed from ``--seed`` so that the releases can be compared (NOT private): one uninterrupted
session, then, for each phase, a session in which party-2 is SIGKILLed when its log says it
entered the phase, restarted, and the session resumed (``cels run --resume``) until it
completes.  Prints JSON: per phase, how long the killed run had worked, the restart, the re-run
(and its tries, and every node's busy seconds in each of its phases), the re-run over the
uninterrupted session (``resume_ratio``), and whether its release has the uninterrupted
release's SHA-256.  Default input: the AOL slice
(``$CELS_DATA/aol-dev.tsv.gz``) over r = 3 parties; ``--engine ray --shards P`` puts every
party's work on its own Ray instance, which the restarted party-2 starts again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cels.cli.options import DEMO_BUDGET, SESSION_FLAGS, add_option_arguments, session_values
from cels.engine.options import add_engine_arguments, engine_options
from cels.fileio import atomic_write_json
from cels.bench.scale import parse_sizes
from cels.logs import load_log
from cels.logs.synthetic import synthetic_histogram
from cels.logs.options import LoadOptions, default_data_dir
from cels.protocol.aborts import DIED
from cels.protocol.machines import party_machine
from cels.protocol.options import SessionOptions

AOL_SLICE = "aol-dev.tsv.gz"
VICTIM_INDEX = 1
"""The party killed: party-2 (neither the initiator nor the ring's first)."""
RETRY_SECONDS = 60.0
"""How long the re-run is tried again after the restart (a peer's channel may still back off)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``cels bench resume`` (cels.cli.bench)."""
    parser.add_argument("--input", type=Path, help=f"AOL-format log (default: $CELS_DATA/{AOL_SLICE})")
    parser.add_argument("--pairs", help="instead of --input: the synthetic AOL-shaped histogram of this many pairs (e.g. 1M; cels bench scale's)")
    parser.add_argument("--max-users", type=int, help="keep the first N users of the input")
    parser.add_argument("--parties", type=int, default=3, help="number of parties r (default 3)")
    parser.add_argument("--phases", help="comma list of the phases to kill in (default: every phase of the release)")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="the replay seed of every node's draws (default 1; the releases are NOT private)")
    parser.add_argument("--json", type=Path, help="also write the JSON here (atomically)")
    add_engine_arguments(parser)
    add_option_arguments(parser, SESSION_FLAGS, DEMO_BUDGET)
    parser.set_defaults(func=run)


def kill_phases(options: SessionOptions, text: str | None) -> list[str]:
    """The phases to kill party-2 in: every working phase of the session's machine, or those of ``text``."""
    every = [str(p) for p in party_machine(options).phases]
    if text is None:
        return every
    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in every]
    if unknown or not asked:
        raise ValueError(f"--phases: {', '.join(unknown) or 'none given'}; this release's phases are {', '.join(every)}")
    return asked


def wait_for_line(path: Path, offset: int, pattern: str, timeout: float, alive) -> bool:
    """Whether ``pattern`` appears in the log at ``path`` after byte ``offset`` within ``timeout``."""
    limit, found = time.monotonic() + timeout, re.compile(pattern, re.M)
    while time.monotonic() < limit and alive():
        with open(path, "rb") as fh:
            fh.seek(offset)
            if found.search(fh.read().decode(errors="replace")):
                return True
        time.sleep(0.01)
    return False


def run_resumed(controller, options: SessionOptions, output: Path, report: Path, timeout: float) -> tuple[dict[str, Any], int]:
    """The session run again with the nodes' kept keys (``resume``) until it completes, tried
    again for :data:`RETRY_SECONDS` while it aborts as DIED (a peer's channel to a restarted
    node may still back off: docs/faults.md, "Restart"); its report and the tries it took."""
    from cels.node.client import SessionAborted, run_on_nodes

    again, started = dataclasses.replace(options, resume=True).to_config(), time.monotonic()
    for tries in itertools.count(1):
        try:
            return run_on_nodes(controller, again, output, report, timeout, force=True), tries
        except SessionAborted as exc:
            if exc.abort.kind != DIED or time.monotonic() - started > RETRY_SECONDS:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable: itertools.count does not end")


def killed_and_resumed(cluster, controller, options: SessionOptions, phase: str, out: Path, timeout: float) -> dict[str, Any]:
    """One trial: the session, party-2 SIGKILLed once it entered ``phase``, restarted, the re-run."""
    from cels.node.client import SessionAborted, run_on_nodes

    victim = options.parties[VICTIM_INDEX]
    node = cluster.nodes[victim]
    offset, outcome = node.log_path.stat().st_size, {}
    out.mkdir(parents=True, exist_ok=True)
    output, report = out / options.release_kind.output_name(".tsv"), out / "operator-report.json"

    def first_run() -> None:
        try:
            run_on_nodes(controller, options.to_config(), output, report, timeout)
        except SessionAborted as exc:
            outcome["aborted"] = exc
        except Exception as exc:  # noqa: BLE001 - reported by the trial
            outcome["failed"] = exc

    runner, started = threading.Thread(target=first_run, daemon=True), time.monotonic()
    runner.start()
    if not wait_for_line(node.log_path, offset, rf"session {re.escape(options.session_id)}: .* now {phase}$", timeout, runner.is_alive):
        raise RuntimeError(f"session {options.session_id} ended before {victim} entered {phase}: {outcome}")
    worked = time.monotonic() - started
    cluster.kill(victim)
    runner.join(timeout)
    if "aborted" not in outcome:
        raise RuntimeError(f"session {options.session_id} did not abort after {victim} was killed")
    restart = time.monotonic()
    cluster.start(victim, node.address, node.process.args)
    cluster.wait_ready(timeout=60)
    restarted = time.monotonic()
    resumed, tries = run_resumed(controller, options, output, report, timeout)
    return {
        "killed_after_seconds": worked,
        "restart_seconds": restarted - restart,
        "resume_seconds": time.monotonic() - restarted,
        "resume_tries": tries,
        "resumed_busy_seconds": {phase: entry["seconds"] for phase, entry in resumed["phases"].items()},
        "sha256": hashlib.sha256(output.read_bytes()).hexdigest(),
    }


def run(args: argparse.Namespace) -> int:
    from cels.cli.simulate import run_nodes

    engine = engine_options(args, {})  # checked before the log is read
    options = SessionOptions.create(args.parties, **session_values(args))
    dataclasses.replace(options, resume=True)  # refused by the options' own check if the session cannot be resumed
    phases = kill_phases(options, args.phases)
    trials: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cels-bench-resume-") as tmp:
        root = Path(tmp)
        if args.pairs is not None:
            [pairs] = parse_sizes(args.pairs, "--pairs")
            histogram = synthetic_histogram(pairs)
            (root / "data").mkdir()
            shares, source = histogram.write_shares(root / "data", args.parties), f"synthetic_histogram({pairs}, seed=7)"
            users, size = histogram.users, pairs
        else:
            path = args.input or default_data_dir() / AOL_SLICE
            if not path.is_file():
                raise ValueError(f"{path} is missing (give --input or set CELS_DATA)")
            log = load_log(path, LoadOptions(format="aol", max_users=args.max_users))
            shares, source, users, size = log.split_by_user(args.parties), str(path), log.n_users, log.n_pairs
            for share in shares:  # written as histogram TSV: lossless for any input
                share.source = {"format": "histogram"}
        flags = {n: ["--seed", str(args.seed), "--state-dir", str(root / "state" / n)] for n in options.nodes}
        for party in options.parties:  # a party on its own Ray instance: the restart re-creates its shards
            flags[party] += engine.argv()

        def trial_each_phase(cluster, controller) -> None:
            for phase in phases:
                print(f"cels bench resume: party-{VICTIM_INDEX + 1} killed in {phase} ...", file=sys.stderr, flush=True)
                trial = dataclasses.replace(options, session_id=f"{options.session_id}-{phase}")
                trials[phase] = killed_and_resumed(cluster, controller, trial, phase, root / phase, timeout=600.0)

        print("cels bench resume: the uninterrupted session ...", file=sys.stderr, flush=True)
        report = run_nodes(shares, options, root / "whole", ".tsv", ["--format", "histogram"], root / "whole-report.json",
                           node_flags=flags, while_up=trial_each_phase)  # fmt: skip
        whole = hashlib.sha256((root / "whole" / options.release_kind.output_name(".tsv")).read_bytes()).hexdigest()
    seconds = report["wall_seconds"]
    for trial in trials.values():
        trial["resume_ratio"] = trial["resume_seconds"] / seconds
        trial["same_release"] = trial.pop("sha256") == whole
    out = {
        "benchmark": "resume",
        "input": source,
        "users": users,
        "pairs": size,
        "parties": args.parties,
        "release": options.release,
        "engine": dataclasses.asdict(engine),
        "seed": args.seed,
        "what_a_re_run_redoes": "each node replays what it took, from its record, and sends only what its peers never took (cels.protocol.resume)",
        "uninterrupted_seconds": seconds,
        "phases": trials,
        "same_release": all(t["same_release"] for t in trials.values()),
    }
    text = json.dumps(out, indent=2, default=float)
    print(text)
    if args.json is not None:
        atomic_write_json(args.json, json.loads(text))
    return 0 if out["same_release"] else 1
