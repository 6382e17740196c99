"""``cels attack {solver-reconstruction,local-sampling,union-origin}``: the paper's weaknesses
shown by running code (SECURITY.md).  Each prints its JSON and writes it to ``--json FILE``."""

from __future__ import annotations

import argparse
import json
import sys

from cels.fileio import atomic_write_json
from cels.crypto.key_sizes import PAPER_KEY_BITS as PAPER_BITS
from cels.logs.formats import FORMATS, parse_columns
from cels.logs.options import LoadOptions
from cels.mechanism.defaults import OBJECTIVES
from cels.protocol.options import SOLVE_MODES


def _warn_paper_bits(what: str, bits: int) -> None:
    if bits in PAPER_BITS:
        print(f"cels attack: warning: {bits}-bit {what} reproduces the paper's setting and is NOT secure", file=sys.stderr)


def _finish(result: dict, path: str) -> int:
    atomic_write_json(path, result)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


def run_solver_reconstruction(args: argparse.Namespace) -> int:
    from cels.attacks.solver_reconstruction import demonstrate
    from cels.logs import load_log, synthetic_log

    if args.parties < 2:
        raise ValueError("--parties must be at least 2")
    if args.input:
        options = LoadOptions(
            format=args.format, columns=parse_columns(args.columns) if args.columns else None, max_users=args.max_users
        )
        log = load_log(args.input, options)
    else:
        log = synthetic_log(seed=args.seed, users=args.users)
    for what, bits in (("Paillier", args.key_bits), ("Pohlig-Hellman group", args.group_bits)):
        _warn_paper_bits(what, bits)
    print(f"cels attack: running a recorded session: {log.n_users} users over {args.parties} parties (-v: progress) ...", file=sys.stderr)
    result = demonstrate(
        log, args.parties, epsilon=args.epsilon, delta=args.delta, objective=args.objective, key_bits=args.key_bits,
        group_bits=args.group_bits, allow_insecure_key_bits=args.key_bits in PAPER_BITS or args.group_bits in PAPER_BITS,
        view_dir=args.record_view, solve=args.solve,
    )  # fmt: skip
    return _finish(result, args.json)


def run_local_sampling(args: argparse.Namespace) -> int:
    from cels.attacks.local_sampling import demonstrate

    if args.simulations < 100:
        raise ValueError("--simulations must be at least 100")
    return _finish(demonstrate(args.simulations, args.seed, progress=not args.quiet), args.json)


def run_union_origin(args: argparse.Namespace) -> int:
    from cels.attacks.union_origin import demonstrate

    if args.parties < 3:
        raise ValueError("--parties must be at least 3 (with 2 the other party's records are its own by elimination)")
    _warn_paper_bits("Pohlig-Hellman group", args.group_bits)
    result = demonstrate(
        args.parties, args.records, seed=args.seed, group_bits=args.group_bits,
        allow_paper_bits=args.group_bits in PAPER_BITS, view_dir=args.record_view,
    )  # fmt: skip
    return _finish(result, args.json)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("attack")
    attacks = parser.add_subparsers(dest="attack", required=True, metavar="ATTACK")

    p = attacks.add_parser("solver-reconstruction", help="P_0 rebuilds every constraint row and count from its view")
    p.add_argument("--parties", type=int, default=3, metavar="R", help="parties (users dealt round-robin; default 3)")
    p.add_argument("--input", default=None, metavar="LOG", help="a log instead of the embedded synthetic one")
    p.add_argument("--format", choices=FORMATS, default="aol", help="format of --input (default aol)")
    p.add_argument("--columns", default=None, help="tsv column mapping of --input, e.g. user=1,query=2,url=4")
    p.add_argument("--max-users", type=int, default=None, metavar="N", help="first N users of --input")
    p.add_argument("--users", type=int, default=60, metavar="N", help="users of the synthetic log (default 60)")
    p.add_argument("--seed", type=int, default=5, metavar="S", help="seed of the synthetic log (default 5)")
    p.add_argument("--epsilon", type=float, default=20.0, help="session epsilon (default 20: many pairs released)")
    p.add_argument("--delta", type=float, default=0.99, help="session delta (default 0.99)")
    p.add_argument("--objective", choices=OBJECTIVES, default="kl")
    p.add_argument("--key-bits", type=int, choices=(2048, 3072, *PAPER_BITS), default=2048, help="Paillier bits (512/1024: the paper's, insecure)")
    p.add_argument("--group-bits", type=int, choices=(2048, 3072, 1024), default=2048, help="union group bits (1024: the paper's, insecure)")
    p.add_argument("--record-view", default=None, metavar="DIR", help="keep every node's recorded view in DIR (default: a temporary directory)")
    p.add_argument(
        "--solve", choices=SOLVE_MODES, default="transformed",
        help="the session's solve: transformed (the paper's Algorithm 2, default: the solver rebuilds every row) "
        "or private (the solver only aggregates masked verdicts: 0 cells)",
    )  # fmt: skip
    p.add_argument("--json", required=True, metavar="FILE", help="write the result here")
    p.set_defaults(func=run_solver_reconstruction)

    p = attacks.add_parser("local-sampling", help="the paper's local sampling exceeds delta; exact sampling does not")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the simulations")
    p.add_argument("--simulations", type=int, default=20_000, metavar="N", help="runs per mode (default 20000)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", required=True, metavar="FILE", help="write the result here")
    p.set_defaults(func=run_local_sampling)

    p = attacks.add_parser("union-origin", help="Algorithm 3 as printed tells the coordinator every record's origin")
    p.add_argument("--parties", type=int, default=3, metavar="R", help="parties (default 3)")
    p.add_argument("--records", type=int, default=60, metavar="N", help="records per party (default 60)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the records and of the guesses")
    p.add_argument("--group-bits", type=int, choices=(2048, 3072, 1024), default=2048, help="Pohlig-Hellman group bits")
    p.add_argument("--record-view", default=None, metavar="DIR", help="keep the recorded views in DIR")
    p.add_argument("--json", required=True, metavar="FILE", help="write the result here")
    p.set_defaults(func=run_union_origin)
