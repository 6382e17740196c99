"""``cels split LOG --format F --parties R --out 'data/party-{k}.tsv' [--seed S]``: one log
into per-party files, each user's whole log at exactly one party (CELS section 4's horizontal
partition; :meth:`SearchLog.split_by_user`: round-robin, or seeded random with ``--seed``).

Each file is written in the input's format (the histogram: AOL rows lose QueryTime and
ItemRank), e.g. the ``deploy/data/party-{1,2,3}.tsv`` that docker-compose.yml mounts; a
pattern ending in ``.parquet`` writes Parquet files whatever the input's format (columns
user, query, url, count; row groups of at most 65,536 rows; docs/formats.md, "Parquet").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cels.cli.sanitize import add_input_arguments, load_input
from cels.cli.options import add_force_argument
from cels.fileio import check_output_paths


DESCRIPTION = """Split one log into per-party files: each user's whole log at exactly one party (the
paper's horizontal partition), user j to party j mod R, or a seeded random partition with
--seed.  Each file is written in the input's format (AOL rows lose QueryTime and ItemRank);
a pattern ending in .parquet writes Parquet files whatever the input's format.

  cels split LOG --format aol --parties 3 --out 'data/party-{k}.tsv'"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("split", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", metavar="INPUT", help="the log to split")
    add_input_arguments(parser)
    parser.add_argument("--parties", type=int, required=True, metavar="R", help="number of parties (files)")
    parser.add_argument("--seed", type=int, default=None, help="a seeded random partition (default: user j to party j mod R)")
    parser.add_argument("--out", required=True, metavar="PATTERN", help="output path with {k} for the party number 1..R (directories are made); ending in .parquet: Parquet files")
    add_force_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cels.logs.writers import write_log

    if "{k}" not in args.out:
        raise ValueError(f"--out {args.out!r} needs {{k}} for the party number, e.g. data/party-{{k}}.tsv")
    outputs = {f"--out (party {k})": args.out.replace("{k}", str(k)) for k in range(1, args.parties + 1)}
    if not Path(args.input).exists():  # before any directory is made: a typo leaves nothing behind
        raise ValueError(f"input {args.input} does not exist")
    log = load_input(args)
    for path in outputs.values():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    check_output_paths(outputs, inputs=(args.input,), force=args.force)
    shares = log.split_by_user(args.parties, seed=args.seed)
    for path, share in zip(outputs.values(), shares):
        write_log(share, path)
        print(f"{path}: {share.n_users} users, |D_k| = {share.size} (user, pair) counts")
    return 0
