"""``cels sanitize INPUT --format F --epsilon E --delta D --out OUT [--report R]``.

The release method is looked up in :data:`METHODS` (``--method``, default ``optimal``: the
CELS/EDBT multinomial sampling with optimal counts).  A method is a :class:`Method`: an
optional ``add_arguments(parser)`` for its own flags and ``run(args) -> Release`` (it loads
the input it needs: the histogram for ``optimal``, the events in log order for the baselines
ZEALOUS, Korolova et al. and Safelog of :mod:`cels.baselines`).
OUT, its public release note ``OUT.release-note.json`` and the confidential operator REPORT
(mode 0600; default under ``$CELS_REPORT_DIR`` or ``~/.local/state/cels/reports``, never beside
OUT: cels.reports) are checked before any work starts and written atomically only after the
whole run succeeded.

Reading the flags loads no numpy arrays, LP solver or log reader (``cels sanitize --help``):
the modules that release are imported by the function that runs them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cels.cli.options import HOLDER_FLAGS, MECHANISM_FLAGS, add_force_argument, add_option_arguments, delimiter, option_values, single_holder_arguments
from cels.cli.notices import EXIT_EMPTY_RELEASE, empty_release_reason, lenient_notice, privacy_notice, utility_words
from cels.fileio import check_output_paths
from cels.baselines import BASELINES
from cels.baselines.base import Baseline
from cels.logs.formats import FORMATS, log_format
from cels.logs.options import LoadOptions
from cels.logs.textio import ENCODING
from cels.reports import default_operator_path, release_note_path, write_reports
from cels.protocol.releases import DP_HISTOGRAM, release_kind

if TYPE_CHECKING:
    from cels.logs.model import SearchLog
    from cels.mechanism.sanitize import SanitizeParams


@dataclass
class Release:
    """A method's result: the report and how to write the output (atomically) to a path."""

    report: dict
    write: Callable[[str], object]


@dataclass
class Method:
    """One entry of :data:`METHODS`."""

    run: Callable[[argparse.Namespace], Release]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    help: str = ""


def params_from_args(args: argparse.Namespace) -> SanitizeParams:
    """The optimal method's parameters from the parsed flags (the session options' flags and
    the single-holder ones)."""
    from cels.mechanism.sanitize import SanitizeParams

    return SanitizeParams(
        **option_values(args, MECHANISM_FLAGS),
        preprocess=args.preprocess,
        seed=args.seed,
        integer=args.integer,
    )


def run_optimal(args: argparse.Namespace) -> Release:
    """CELS/EDBT: optimal counts under the privacy conditions, then multinomial sampling."""
    from cels.logs.writers import write_log
    from cels.mechanism.sanitize import sanitize

    out, report = sanitize(load_input(args), params_from_args(args), progress=not args.quiet)
    return Release(report, lambda path: write_log(out, path))


def run_dp_histogram(args: argparse.Namespace) -> Release:
    """``--release dp``: one holder's DP histogram of query-url pairs, or of the ``--items``
    kinds (cels.mechanism.dp_release, cels.mechanism.item_kinds)."""
    from cels.claims import dp_release_accounting
    from cels.crypto.streams import DrawKeys
    from cels.logs.readers import iter_records
    from cels.mechanism.dp_histogram import release_accounting
    from cels.mechanism.dp_release import release_utility, sanitize_dp
    from cels.mechanism.item_kinds import ItemKinds
    from cels.protocol.options import DEFAULT_PADDING_EPSILON

    kinds = ItemKinds.parse(args.items, args.max_items_per_user)
    accounting = release_accounting(args.epsilon, args.delta, kinds, DEFAULT_PADDING_EPSILON, 1, 0)  # a bad bound fails before the read
    if kinds.only_pairs:
        log = load_input(args)
    else:
        source: dict = {}
        log = kinds.histogram(iter_records(args.input, input_options(args), source), source)
        tell_skipped(args.command, source)
    draws = DrawKeys.of(args.seed, "holder")
    histogram, n, _ = sanitize_dp(log, args.epsilon, args.delta, kinds, draws)
    true = {log.pairs[i]: int(c) for i, c in enumerate(n.tolist()) if c}
    report = {
        "method": "dp-histogram",
        "privacy": dp_release_accounting(accounting, parties=1, seeded=args.seed is not None, single=True),
        "release": {"kind": DP_HISTOGRAM.name, "threshold": histogram.threshold, "items": len(histogram)},
        "sizes": {"users": log.n_users, "items": log.n_pairs, "output_items": len(histogram)},
        "utility": {**release_utility(histogram, true), "against": "the distinct-user counts after the bound"},
    }
    return Release(report, lambda path: DP_HISTOGRAM.write(histogram, path))


def baseline_method(baseline: Baseline) -> Method:
    """A baseline of :mod:`cels.baselines` as a ``--method``: it reads the events in log order
    and writes its own release format (docs/baselines.md)."""

    def run(args: argparse.Namespace) -> Release:
        from cels.baselines.release import write_release
        from cels.baselines.sampling import baseline_rng
        from cels.logs.readers import iter_records

        source: dict = {}
        records = list(iter_records(args.input, input_options(args), source))
        tell_skipped(args.command, source)
        items, report = baseline.run(records, args, baseline_rng(args.seed))
        return Release(report, lambda path: write_release(items, path))

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        baseline.add_arguments(parser.add_argument_group(f"{baseline.name} baseline (--method {baseline.name})"))

    return Method(run, add_arguments, f"{baseline.name} baseline")


def _optimal_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("optimal method (CELS/EDBT multinomial sampling)")
    add_option_arguments(g, [o for o in MECHANISM_FLAGS if not o.required])
    single_holder_arguments(g)


METHODS: dict[str, Method] = {
    "optimal": Method(run_optimal, _optimal_arguments, "optimal counts + multinomial sampling (CELS)"),
    **{name: baseline_method(baseline) for name, baseline in BASELINES.items()},
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sanitize")
    parser.add_argument("input", metavar="INPUT", help="the search log to sanitize")
    add_input_arguments(parser)
    add_option_arguments(parser, [o for o in MECHANISM_FLAGS if o.required])  # --epsilon, --delta
    add_option_arguments(parser, HOLDER_FLAGS)
    parser.add_argument("--method", choices=sorted(METHODS), default="optimal", help="release method (default optimal)")
    parser.add_argument("--seed", type=int, default=None, help="reproducible randomness: the release is then NOT private")
    parser.add_argument("--out", required=True, metavar="OUT", help="the sanitized log (same format as the input; a path ending in .parquet: Parquet)")
    parser.add_argument("--report", default=None, metavar="REPORT.json", help="the confidential operator report (JSON, mode 0600): privacy accounting, solver, sizes, utility, timings (default: under $CELS_REPORT_DIR or ~/.local/state/cels/reports, never beside OUT); the public release note goes to OUT.release-note.json")
    add_force_argument(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    for method in METHODS.values():
        if method.add_arguments is not None:
            method.add_arguments(parser)
    parser.set_defaults(func=run)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """How to read INPUT (docs/formats.md): the flags ``input_options`` reads."""
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--columns", default=None, help="tsv column mapping, e.g. user=1,query=2,url=4[,count=5]; parquet: column names, e.g. user=AnonID,query=Query,url=ClickURL")
    parser.add_argument("--no-header", action="store_true", help="the input has no header line")
    parser.add_argument("--delimiter", default="\t", type=delimiter, help="tsv field delimiter, one character (default tab; 'tab' or '\\t' for tab)")
    parser.add_argument("--lenient", action="store_true", help="skip bad lines (counted in the report) instead of failing")
    parser.add_argument("--encoding", default=ENCODING, help="the input's text encoding, e.g. latin-1 (default utf-8; bytes not valid in it are refused; outputs are UTF-8)")


def input_options(args: argparse.Namespace) -> LoadOptions:
    """How to read the input, as the flags describe it."""
    return LoadOptions(
        format=args.format,
        columns=log_format(args.format).parse_columns(args.columns) if args.columns else None,
        header=False if args.no_header else None,
        lenient=args.lenient,
        delimiter=args.delimiter,
        encoding=args.encoding,
    )


def load_input(args: argparse.Namespace) -> SearchLog:
    """The input log's histogram (what ``--lenient`` skipped goes to stderr)."""
    from cels.logs.readers import load_log

    log = load_log(args.input, input_options(args))
    tell_skipped(args.command, log.source)
    return log


def tell_skipped(command: str, source: dict) -> None:
    """One line on stderr when ``--lenient`` skipped lines of the input."""
    notice = lenient_notice(source)
    if notice is not None:
        print(f"cels {command}: {notice}", file=sys.stderr)


def report_path(args: argparse.Namespace) -> str:
    """The operator REPORT: ``--report``, else a new path under the operator report directory
    (decided once per run)."""
    if args.report is None:
        args.report = str(default_operator_path(args.out))
    return args.report


def write_release_and_reports(release: Release, out: str, report_path: str) -> None:
    """OUT, then its release note and the operator REPORT, each atomic; if a report cannot be
    written, OUT is removed again."""
    existed = os.path.exists(out)
    release.write(out)
    try:
        write_reports(release.report, out, report_path)
    except BaseException:
        if not existed:
            os.unlink(out)
        raise


def summary_line(report: dict) -> str:
    """One human line about a release (the optimal method's or a baseline's report)."""
    s, u, p = report.get("solver", {}), report.get("utility", {}), report.get("privacy", {})
    sizes = report.get("sizes", {})
    parts = [f"{report.get('method', 'optimal')}: users {sizes.get('users')}"]
    if "release" in report:
        from cels.mechanism.dp_release import TOP

        r = report["release"]
        return ", ".join([*parts, f"items {sizes['items']}", f"released {r['items']} at tau = {r['threshold']}",
                          f"recall of the top {TOP} {report['utility'][f'recall_top{TOP}']:.3f}", f"eps {p['epsilon']:g}, delta {p['delta']:g}",
                          "SEEDED, NOT PRIVATE: do not publish" if p.get("reproducible_seed") else "DP end to end"])  # fmt: skip
    if "pairs" in sizes:
        parts.append(f"pairs {sizes['pairs']}")
    if s:
        parts += [f"|O| {s['integer_total']}", f"LP bound {s['max_output_lp']:.1f}", f"integer ratio {s['integer_ratio']:.3f}"]
    if "kl" in u:
        parts.append(utility_words(u))
    for kind, per_kind in u.items():  # baselines: utility per released item type
        if isinstance(per_kind, dict) and "released" in per_kind:
            measured = f"recall {per_kind['recall']:.2e}" if "recall" in per_kind else "none in the log"
            parts.append(f"{kind}: {per_kind['released']} released, {measured}")
    if "bound" in p:  # the optimal method: b = min{eps/2 or eps, ln 1/(1-delta)}
        parts.append(f"b {p['b']:.4g} (eps {p['epsilon']:g}, delta {p['delta']:g}, bound {p['bound']}), {guarantee_word(p)}")
    elif p:
        parts.append(f"eps {p.get('epsilon'):g}, delta {p.get('delta', 0):g}, DP claim {p.get('dp_claim')}")
    return ", ".join(parts)


def guarantee_word(privacy: dict) -> str:
    """The summary line's word on the guarantee (the full sentences are in the report)."""
    word = "DP of the sampling given the counts, NOT end-to-end" + (" (noisy counts, no end-to-end bound)" if privacy.get("noise_epsilon") else "")
    return f"SEEDED, NOT PRIVATE: do not publish (with secret draws: {word})" if privacy.get("reproducible_seed") else word


def execute(args: argparse.Namespace) -> Release:
    """Check OUT and REPORT, load, run the chosen method, write OUT and REPORT; returns the release."""
    dp = release_kind(args.release) is DP_HISTOGRAM
    if dp and args.method != "optimal":
        raise ValueError(f"--release dp is its own method: leave out --method {args.method}")
    check_output_paths(
        {"--out": args.out, "release note": str(release_note_path(args.out)), "--report": report_path(args)}, inputs=(args.input,), force=args.force,
    )
    release = run_dp_histogram(args) if dp else METHODS[args.method].run(args)
    write_release_and_reports(release, args.out, report_path(args))
    return release


def run(args: argparse.Namespace) -> int:
    """Exit 0, or EXIT_EMPTY_RELEASE (3) with the reason when nothing was released."""
    report = execute(args).report
    print(summary_line(report))
    print(f"wrote {args.out}, its public release note {release_note_path(args.out)} and the confidential operator report {report_path(args)}", file=sys.stderr)
    if "guarantee" in report.get("privacy", {}):
        print("\n".join(privacy_notice(report["privacy"])), file=sys.stderr)
    reason = empty_release_reason(report)
    if reason is not None:
        print(f"cels sanitize: {reason}", file=sys.stderr)
        return EXIT_EMPTY_RELEASE
    return 0
