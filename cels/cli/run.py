"""``cels certs`` and ``cels run`` (flags: :mod:`cels.cli.distributed`): a development CA, and a
session on running nodes, its release, public release note and confidential operator report;
the summary and privacy lines ``cels simulate`` prints too."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

from cels.certs import make_dev_certs, node_names
from cels.cli.distributed import DEFAULT_TIMEOUT
from cels.cli.notices import EXIT_EMPTY_RELEASE, empty_release_reason, privacy_notice, utility_words
from cels.cli.progress import SessionProgress
from cels.claims import TRANSFORMED_WARNING, items_words
from cels.fileio import check_output_paths
from cels.node.client import CONNECT_TIMEOUT, Controller, SessionAborted, run_on_nodes, wait_reachable
from cels.node.config import load_toml
from cels.node.schemas import SESSION_SCHEMA, check_toml
from cels.protocol.aborts import BEFORE_START, RESUMABLE
from cels.protocol.options import SessionOptions
from cels.protocol.wire.codec import phase_to_wire
from cels.protocol.releases import DP_HISTOGRAM, SAMPLED, report_kind
from cels.reports import default_operator_path, release_note_path


def run_certs(args: argparse.Namespace) -> int:
    names = node_names(args.parties)
    make_dev_certs(args.out, names, days=args.days)
    print(f"wrote {args.out}/ca.pem and certificates for {', '.join(names)} (development CA, {args.days} days)")
    return 0


def run_ray_tls(args: argparse.Namespace) -> int:
    from cels.engine.ray.tls import write_ray_tls

    named = write_ray_tls(args.ca, args.out, args.name, client=args.client, days=args.days)
    print(f"wrote {args.out}/tls.pem, tls.key and ca.pem: {'a client certificate' if args.client else 'a Ray host certificate'} of {args.ca}'s Ray CA for {', '.join(named)}")
    return 0


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
    if args.resume is not None and table.get("session_id", args.resume) != args.resume:
        raise ValueError(f"{args.config}: [session] session_id = {table['session_id']!r}, but --resume names {args.resume!r}")
    resumed = {"session_id": args.resume, "resume": True} if args.resume is not None else {}
    try:
        options = session_options({**table, "initiator": run["initiator"], **resumed})
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
    tries = 1 + (AUTO_RESUMES if run.get("resume", False) and options.replayable else 0)
    for attempt in range(tries):
        progress = None
        try:
            wait_reachable(controller, nodes, float(run.get("wait", CONNECT_TIMEOUT)), unreachable_printer())
            # the session's id once the nodes answer: no id is printed for a session that never started
            again = " (resumed: every node's kept keys)" if options.resume else ""
            print(f"session {options.session_id}{again}: {len(options.parties)} parties and {options.solver}, initiator {options.initiator}", flush=True)
            warn_transformed(options, "cels run")
            progress = SessionProgress(options)
            report = run_on_nodes(
                controller, options.to_config(), output, report_path, float(run.get("timeout", DEFAULT_TIMEOUT)), progress.step,
                on_phase_start=progress.start, on_approval=approval_printer(options), force=args.force,
            )  # fmt: skip
        except SessionAborted as exc:
            print(f"cels run: {exc}", file=sys.stderr)
            if not resumable(exc, options):
                return 1
            if attempt + 1 == tries:
                print(f"cels run: once every node serves again: cels run --config {args.config} --resume {options.session_id} "
                      "(nodes with a state_dir keep its keys: docs/deployment.md, \"Resume after a node restart\")", file=sys.stderr)  # fmt: skip
                return 1
            print(f"cels run: [run] resume: running session {options.session_id} again once every node answers "
                  f"(try {attempt + 2} of {tries})", file=sys.stderr)  # fmt: skip
            options = replace(options, resume=True)
            time.sleep(RESUME_PAUSE)
            continue
        finally:
            if progress is not None:
                progress.close()
        progress.finish(report)
        return release_notes(report, output, report_path)
    raise AssertionError("unreachable: every try returns")


def resumable(aborted: SessionAborted, options: SessionOptions) -> bool:
    """Whether a session that ``aborted`` can run again with the nodes' kept keys: a node or
    the controller went away after the session began, and its messages are replayable."""
    return aborted.abort.kind in RESUMABLE and aborted.abort.phase != phase_to_wire(BEFORE_START) and options.replayable


AUTO_RESUMES = 3
"""Re-runs ``cels run`` makes of a session a node's death aborted, with ``[run] resume = true``."""
RESUME_PAUSE = 2.0
"""Seconds ``[run] resume`` waits before it asks the nodes again (a restarted node's peers
reconnect within about 2 s: docs/faults.md, "Restart")."""


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
    from cels.mechanism.models import mip_stop_notice  # scipy: imported once a release is there, not for --help

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
"""The summary line of each release kind (cels.protocol.releases)."""


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
