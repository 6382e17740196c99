"""``cels demo``: sanitize the embedded synthetic log end to end and print a short summary.

Writes ./demo-out/single-holder/input.tsv (AOL format), then runs exactly the ``cels sanitize`` code path
on it (load, optimal method, atomic writes) into demo-out/single-holder/sanitized.tsv with its public release
note; the confidential operator report goes where ``cels sanitize`` puts it (cels.reports).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cels.cli import sanitize as sanitize_cli
from cels.cli.notices import utility_words

DEMO_DIR = Path("demo-out") / "single-holder"
"""Beside ``make demo``'s demo-out/sampled and demo-out/dp (the distributed service), not over them."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo")
    parser.add_argument("--dir", default=str(DEMO_DIR), help=f"output directory (default ./{DEMO_DIR})")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=0.4, help="default 0.4: b = min(eps/2, ln 1/(1-delta)) = 0.5, enough for a visible output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cels.logs import synthetic_log, write_log

    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    input_path = out_dir / "input.tsv"
    write_log(synthetic_log(), input_path)
    argv = [
        "sanitize", str(input_path), "--format", "aol",
        "--epsilon", str(args.epsilon), "--delta", str(args.delta),
        "--objective", "kl", "--time-limit", "3",
        "--out", str(out_dir / "sanitized.tsv"), "--force",  # the demo's own directory: a second demo replaces the first
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="cels")
    sanitize_cli.register(parser.add_subparsers(dest="command"))
    sanitize_args = parser.parse_args(argv)
    r = sanitize_cli.execute(sanitize_args).report
    s, u, p, z = r["solver"], r["utility"], r["privacy"], r["sizes"]
    print(f"input      {input_path}: {z['users']} users, {z['pairs']} pairs, |D| = {z['input_size']}, "
          f"{z['nonunique_pairs']} pairs held by 2+ users, {z['constraint_rows_after_pruning']} condition rows after pruning")
    print(f"privacy    epsilon {p['epsilon']}, delta {p['delta']} -> b = {p['b']:.5f} ({p['bound']} bound): {p['guarantee']}")
    for sentence in p["plain"]:
        print(f"           in plain words: {sentence}")
    print(f"counts     objective {s['objective']}: LP bound |O| <= {s['max_output_lp']:.2f}, target |O| = {s['output_size']:.2f}, "
          f"released {s['integer_total']} (integer ratio {s['integer_ratio']:.3f}, {s['integer_method']}, x from {s['integer_source']})")
    print(f"utility    {utility_words(u)}, top-100 coverage {u['top_100']['coverage']:.2f} (the share of the 100 most frequent pairs released)")
    print(f"output     {sanitize_args.out} ({z['output_users']} pseudonymous users, {z['output_pairs']} pairs), "
          f"release note {sanitize_args.out}.release-note.json, confidential operator report {sanitize_args.report}")
    return 0
