"""make compose-test's data and its verdict (deploy/compose-test.sh); run with the project's Python.

``slice LOG --users N --parties R --out DIR [--format msnbc]``: the first N users of an AOL (or MSNBC) log, written whole to
DIR/input.tsv and split by user into DIR/party-{1..R}.tsv (what docker-compose.yml mounts).

``audit --input DIR/input.tsv --out OUT --session session.toml``: OUT/sanitized.tsv and
OUT/operator/report.json against the input and the session's parameters: every released pair is an input
pair, no unique pair is released (CELS Theorem 2, condition 1), every user's
sum_i x_i ln t_ij <= b (conditions 2+3; cels.mechanism.conditions), the report counts the
released rows and has every phase of every party (docs/protocol.md).  Exit 1 naming the
first violation.  A DP histogram's session (``release = "dp"``) audits OUT/dp-histogram.tsv
instead: every released pair is an input pair, every count at or above the threshold its note
states (the session's), none above the pair's distinct users plus the noise's 1e-9 tail.

``loopback --out FILE``: docker-compose.yml for the host's network (what deploy/compose-test.yml
overrides): its networks and published ports dropped (host networking has neither), and every
node listening on 127.0.0.1 instead of every interface of its container.

``metrics --api HOST:PORT``: the metrics profile's Prometheus (its HTTP API) scraped every node,
saw a session running on each, and saw every party leave its counts phase (cels_phase_seconds);
exit 1 naming what it lacks.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import mpmath
import numpy as np
import yaml

from cels.baselines.release import read_release
from cels.mechanism.dp_histogram import count_scale, noise_tail, share_beta
from cels.protocol.machines import party_machine
from cels.protocol.stages.dp_release import release_threshold
from cels.cli.run import session_options
from cels.fileio import atomic_write
from cels.logs import LoadOptions, load_log, write_log
from cels.logs.model import SearchLog
from cels.mechanism.conditions import build_conditions
from cels.mechanism.solvers import feasible
from cels.node.config import load_toml

AOL = LoadOptions(format="aol")
AOL_SOURCE = {"format": "aol"}


def write_slice(log_path: Path, users: int, parties: int, out: Path, fmt: str = "aol") -> None:
    """The first ``users`` users of the log (in ``fmt``), written in the AOL format the nodes read."""
    log = load_log(log_path, LoadOptions(format=fmt, max_users=users))
    write_log(log, out / "input.tsv", AOL_SOURCE)
    for k, share in enumerate(log.split_by_user(parties), start=1):
        write_log(share, out / f"party-{k}.tsv", AOL_SOURCE)
    print(f"{log_path}: first {log.n_users} users, {log.n_pairs} pairs, |D| = {log.size}, over {parties} parties in {out}")


def released_counts(log: SearchLog, release: SearchLog) -> np.ndarray:
    """x_i: the release's count of every pair of ``log`` (ValueError for a pair not in it)."""
    index = {pair: i for i, pair in enumerate(log.pairs)}
    foreign = [pair for pair in release.pairs if pair not in index]
    if foreign:
        raise ValueError(f"{len(foreign)} released pairs are not in the input, e.g. {foreign[0]}")
    x = np.zeros(log.n_pairs, dtype=np.int64)
    np.add.at(x, [index[pair] for pair in release.pairs], np.asarray(release.counts.sum(axis=0)).ravel().astype(np.int64))
    return x


def audit_dp(log: SearchLog, out: Path, options) -> list[str]:
    """A DP histogram (docs/releases.md) against its input: every released pair is an input
    pair, every count is at or above the threshold the note states (the session's), and no
    count exceeds the pair's distinct users in the input by more than the noise's 1e-9 tail."""
    items = read_release(out / "dp-histogram.tsv")
    note = json.loads((out / "dp-histogram.tsv.release-note.json").read_text())
    report = json.loads((out / "operator" / "report.json").read_text())
    tau = release_threshold(options)
    users = {pair: int(n) for pair, n in zip(log.pairs, np.asarray((log.counts > 0).sum(axis=0)).ravel())}
    problems = []
    if note["privacy"].get("threshold") != tau or note["privacy"].get("release") != "dp" or not note["privacy"].get("end_to_end"):
        problems.append(f"the release note says threshold {note['privacy'].get('threshold')}, release {note['privacy'].get('release')}, "
                        f"end to end {note['privacy'].get('end_to_end')}; the session's threshold is {tau}")  # fmt: skip
    tail = noise_bound(options)
    for item in items:
        n = users.get((item.query, item.url))
        if n is None:
            problems.append(f"released pair {(item.query, item.url)} is not in the input")
        elif item.count < tau or item.count > n + tail:
            problems.append(f"released pair {(item.query, item.url)}: count {item.count} outside [{tau}, {n} users + {tail}]")
    missing = set(party_machine(options).phases) - set(report["phases"])
    if missing:
        problems.append(f"report.json lacks the phases {sorted(missing)}")
    print(f"audit: {log.n_users} users, {log.n_pairs} pairs in; {len(items)} pairs out at tau = {tau}: {'clean' if not problems else 'VIOLATED'}; "
          f"phases {', '.join(report['phases'])}")  # fmt: skip
    return problems


def noise_bound(options) -> int:
    """The least k with Pr[Z > k] <= 1e-9 for the session's total noise NB(r/h) - NB(r/h)."""
    beta = share_beta(len(options.parties), options.collusion)
    scale = count_scale(options.epsilon, options.max_items_per_user)
    alpha = mpmath.exp(-mpmath.mpf(scale.denominator) / scale.numerator)
    k = 0
    while noise_tail(k + 1, alpha, beta) > 1e-9:
        k += 1
    return k


def audit(input_path: Path, out: Path, session_path: Path) -> list[str]:
    """The violations (empty: the release audits clean) and what was checked, printed."""
    doc = load_toml(session_path)
    options = session_options({**doc["session"], "initiator": doc["run"]["initiator"]})
    if options.release == "dp":
        return audit_dp(load_log(input_path, AOL), out, options)
    log, release = load_log(input_path, AOL), load_log(out / "sanitized.tsv", AOL)
    report = json.loads((out / "operator" / "report.json").read_text())
    x = released_counts(log, release)
    cond, var_pairs = build_conditions(log, options.b, options.min_count, options.cap, prune=False)
    problems = []
    outside = np.delete(x, var_pairs)
    if outside.any():
        problems.append(f"{int(np.count_nonzero(outside))} unique (or cleaned) pairs released")
    if not feasible(cond, x[var_pairs]):
        worst = float((cond.G @ x[var_pairs].astype(np.float64)).max())
        problems.append(f"a user's sum_i x_i ln t_ij is {worst:.6g} > b = {options.b:.6g}")
    if report["solver"]["integer_total"] != int(x.sum()):
        problems.append(f"report.json says {report['solver']['integer_total']} released clicks, sanitized.tsv holds {int(x.sum())}")
    missing = set(party_machine(options).phases) - set(report["phases"])
    if missing:
        problems.append(f"report.json lacks the phases {sorted(missing)}")
    print(
        f"audit: {log.n_users} users, {log.n_pairs} pairs in; {int(x.sum())} clicks on {int(np.count_nonzero(x))} pairs out; "
        f"max user sum {float((cond.G @ x[var_pairs].astype(np.float64)).max(initial=0.0)):.4f} <= b = {options.b:.4f}: "
        f"{'clean' if not problems else 'VIOLATED'}; phases {', '.join(report['phases'])}"
    )
    return problems


NODES = ("solver", "party-1", "party-2", "party-3")
PROMETHEUS_CHECKS = {
    "scraped (up)": ('max_over_time(up{job="cels"}[1h]) == 1', NODES),
    "ran a session (cels_active_sessions)": ('max_over_time(cels_active_sessions{job="cels"}[1h]) >= 1', NODES),
    "left its counts phase (cels_phase_seconds)": ('max_over_time(cels_phase_seconds_count{job="cels", phase="counts"}[1h]) >= 1', NODES[1:]),
}
"""What Prometheus must have seen of the compose run: query -> the nodes (target label ``node``) it must return."""


def prometheus_query(api: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"http://{api}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10) as reply:
        body = json.loads(reply.read())
    if body.get("status") != "success":
        raise ValueError(f"Prometheus at {api} refused {promql!r}: {body}")
    return body["data"]["result"]


def check_metrics(api: str) -> list[str]:
    """The checks Prometheus fails (empty: it saw everything), each printed."""
    problems = []
    for what, (promql, nodes) in PROMETHEUS_CHECKS.items():
        seen = sorted({r["metric"].get("node", "?") for r in prometheus_query(api, promql)})
        missing = sorted(set(nodes) - set(seen))
        print(f"metrics: {what}: {', '.join(seen) or 'none'}")
        if missing:
            problems.append(f"Prometheus did not see {', '.join(missing)} {what}")
    done = prometheus_query(api, 'max by (node) (max_over_time(cels_sessions_total{job="cels", outcome="done"}[1h]))')
    print("metrics: sessions done as last scraped before each node stopped: " + ", ".join(f"{r['metric']['node']} {r['value'][1]}" for r in done))
    return problems


def loopback_compose(compose: dict) -> dict:
    """``compose`` (docker-compose.yml, parsed) for the host's network: what compose refuses
    beside ``network_mode: host`` (networks) or discards (published ports) goes, and a node's
    ``--listen=0.0.0.0:PORT`` (every interface of its container) becomes 127.0.0.1:PORT."""
    out = {key: value for key, value in compose.items() if key != "networks"}
    out["services"] = {}
    for name, service in compose["services"].items():
        service = {key: value for key, value in service.items() if key not in ("networks", "ports")}
        if "command" in service and isinstance(service["command"], list):
            service["command"] = [a.replace("--listen=0.0.0.0:", "--listen=127.0.0.1:") if isinstance(a, str) else a for a in service["command"]]
        out["services"][name] = service
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deploy/compose_release.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("slice", help="the first N users of an AOL log over R parties")
    s.add_argument("log", type=Path)
    s.add_argument("--users", type=int, required=True)
    s.add_argument("--parties", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--format", default="aol", choices=("aol", "msnbc"), help="the log's format (the slice is written as AOL)")
    a = sub.add_parser("audit", help="the release against its input and session")
    a.add_argument("--input", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True, help="the directory with sanitized.tsv, its release note and operator/report.json")
    a.add_argument("--session", type=Path, required=True, help="the session.toml of the run")
    m = sub.add_parser("metrics", help="what the metrics profile's Prometheus saw of the run")
    m.add_argument("--api", required=True, metavar="HOST:PORT", help="Prometheus's HTTP address")
    lo = sub.add_parser("loopback", help="docker-compose.yml for the host's network (make compose-test)")
    lo.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "loopback":
        compose = yaml.safe_load((Path(__file__).resolve().parent.parent / "docker-compose.yml").read_text())
        with atomic_write(args.out) as fh:
            yaml.safe_dump(loopback_compose(compose), fh, sort_keys=False)
        return 0
    if args.command == "slice":
        write_slice(args.log, args.users, args.parties, args.out, args.format)
        return 0
    problems = check_metrics(args.api) if args.command == "metrics" else audit(args.input, args.out, args.session)
    for problem in problems:
        print(f"{args.command}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
