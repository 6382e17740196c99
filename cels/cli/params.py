"""``cels params {zealous,korolova,safelog}``: the baselines' parameter calculations as JSON.

Examples (docs/baselines.md):
  cels params zealous --epsilon 1 --delta 0.001 --m 2 --users 500000
  cels params zealous --mode indistinguishability --epsilon 10 --delta 1e-41 --m 5
  cels params korolova --epsilon 2.302585093 --delta 1e-5 --d 40
  cels params safelog --K 10 --b 10 --bq 10 --bc 10 --qf 100 --cf 100
"""

from __future__ import annotations

import argparse
import json
import math

from cels.baselines import korolova, safelog, zealous
from cels.baselines.params import pool_release_probability, retention_probability


def _round(value: object, digits: int) -> object:
    """Floats to ``digits`` decimals, or to ``digits`` significant digits when smaller than 0.01."""
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, digits) if abs(value) >= 0.01 else float(f"{value:.{digits}g}")
    return value


def _zealous(args: argparse.Namespace) -> dict:
    users = args.users if args.mode == "probabilistic" else 1
    if args.mode == "probabilistic" and args.users is None:
        raise ValueError("--users is required for the probabilistic setting (Theorem 3 uses U)")
    out = zealous.resolve(args.epsilon, args.delta, args.m, users, args.mode, args.tau, args.lam)
    if args.count is not None:
        out["retention_probability"] = retention_probability(args.count, out["tau_prime"], out["lambda"])
    return out


def _korolova(args: argparse.Namespace) -> dict:
    return korolova.resolve(args.epsilon, args.delta, args.d, args.dc, args.K, args.b, args.bq, args.bc)


def _safelog(args: argparse.Namespace) -> dict:
    out = safelog.resolve(
        args.epsilon,
        args.qf,
        args.cf,
        args.K,
        args.b,
        args.bq,
        args.bc,
        args.pg,
        args.bt,
        args.bt is not None or args.transitions,
    )
    out["pool_release_probability"] = pool_release_probability(out["K"], out["b"])
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("params", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--digits", type=int, default=4, help="decimals printed (default 4)")
    methods = parser.add_subparsers(dest="baseline", required=True, metavar="METHOD")

    z = methods.add_parser("zealous", help="ZEALOUS: lambda, tau, tau' (Götz et al. Theorems 2, 3, Prop. 4)")
    z.add_argument("--mode", choices=zealous.MODES, default="probabilistic")
    z.add_argument("--epsilon", type=float, required=True, help="epsilon (epsilon' in indistinguishability mode)")
    z.add_argument("--delta", type=float, required=True, help="delta (delta' in indistinguishability mode)")
    z.add_argument("--m", type=int, required=True, help="items per user")
    z.add_argument("--users", type=int, help="U, the number of users (probabilistic mode)")
    z.add_argument("--tau", type=int, help="first threshold (default: Prop. 4)")
    z.add_argument("--lambda", dest="lam", type=float, help="noise scale (default 2m/epsilon)")
    z.add_argument("--count", type=float, help="also print the retention probability of an item with this count")
    z.set_defaults(compute=_zealous)

    k = methods.add_parser("korolova", help="Korolova et al.: K, b, alpha, epsilon, delta")
    k.add_argument("--epsilon", type=float, required=True)
    k.add_argument("--delta", type=float, required=True)
    k.add_argument("--d", type=int, required=True, help="query events kept per user")
    k.add_argument("--dc", type=int, default=0, help="clicks kept per user")
    k.add_argument("--K", type=float, help="threshold (default: optimum)")
    k.add_argument("--b", type=float, help="selection noise (default: optimum)")
    k.add_argument("--bq", type=float, help="query count noise (counts it into epsilon)")
    k.add_argument("--bc", type=float, help="click count noise (counts it into epsilon)")
    k.set_defaults(compute=_korolova)

    s = methods.add_parser("safelog", help="Safelog: epsilon with and without transitions, pool release probability")
    s.add_argument("--epsilon", type=float, help="derive missing K, b, bq, bc, bt from this budget")
    s.add_argument("--qf", type=int, required=True)
    s.add_argument("--cf", type=int, required=True)
    for name in ("K", "b", "bq", "bc", "bt"):
        s.add_argument(f"--{name}", type=float)
    s.add_argument("--pg", type=float, default=1.0, help="pool inclusion probability p_g (default 1)")
    s.add_argument("--transitions", action="store_true", help="include the transition term (implied by --bt)")
    s.set_defaults(compute=_safelog)

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(_round(args.compute(args), args.digits)))
    return 0
