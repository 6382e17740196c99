"""What every release tells its operator besides the summary: which privacy guarantee holds
(docs/mechanism.md, "What is promised"), why a release came out empty, and which lines
``--lenient`` skipped."""

from __future__ import annotations

import math
from typing import Any

from cels.claims import items_words
from cels.protocol.releases import report_kind

EXIT_EMPTY_RELEASE = 3
"""Exit code of a run whose release is empty (|O| = 0); its output and report are written."""


def privacy_notice(privacy: dict[str, Any]) -> list[str]:
    """Lines for stderr after every release of the optimal method or the protocol: the
    guarantee against recipients and against partners, what each observer learned in the mode
    that ran (one line), and what delta means here (cels.claims)."""
    lines = ["privacy: THIS RUN IS NOT PRIVATE: its draws were replayed from --seed; do not publish its release."] if privacy.get("reproducible_seed") else []
    lines += [f"privacy, in plain words: {sentence}." for sentence in privacy.get("plain", [])]
    lines += [f"privacy: against recipients: {privacy['against_recipients']}.", f"privacy: against partners: {privacy['against_partners']}."]
    if "line" in privacy.get("learns", {}):
        lines.append(f"privacy: {privacy['learns']['line']}.")
    if "delta_meaning" in privacy:
        lines.append(f"privacy: {privacy['delta_meaning']}.")
    return lines


def utility_words(utility: dict[str, Any]) -> str:
    """KL and recall with what each measures and which way is good (CELS eq. 2; cels.metrics)."""
    return (
        f"KL {utility['kl']:.4f} (how far the released pair frequencies are from the input's, CELS eq. 2: 0 is the same, "
        f"lower is better), recall {utility['recall']:.4f} (the share of the input's distinct pairs that the release holds: 1 is all)"
    )


def empty_release_reason(report: dict[str, Any]) -> str | None:
    """None if the release holds a record, else why it is empty: b, the LP bound |O_max| and
    which flag would change it.  Both |O_max| and the per-pair bounds u_i = b / max_j ln t_ij
    are linear in b (EDBT section 4.2), so b / max u_i is the smallest b at which one record
    of some pair fits (``max_pair_bound``, single holder), and b / |O_max| a lower bound of it."""
    solver, p = report.get("solver") or {}, report.get("privacy") or {}
    if report_kind(report).end_to_end:
        return empty_dp_reason(report)
    if not solver:
        return empty_baseline_reason(report)
    if int(solver.get("integer_total", 0)) > 0:
        return None
    b, lp = float(p["b"]), float(solver.get("max_output_lp", 0.0))
    eps_term = p["epsilon"] / 2 if p.get("bound", "cels") == "cels" else p["epsilon"]
    delta_term = math.log(1 / (1 - p["delta"]))
    min_count = p.get("min_count") or (report.get("params") or {}).get("min_count")
    binding = "delta" if delta_term <= eps_term else "epsilon"
    head = (
        f"EMPTY RELEASE: |O| = 0. b = min{{{'eps/2' if p.get('bound', 'cels') == 'cels' else 'eps'} = {eps_term:.4g}, "
        f"ln 1/(1-delta) = {delta_term:.4g}}} = {b:.4g} (set by {binding}), LP bound |O_max| = {lp:.4g}"
    )
    pair_bound = solver.get("max_pair_bound")
    if lp <= 0:
        return f"{head}: no pair is held by two or more users after cleaning; lower --min-count or add data"
    if lp < 1 or (pair_bound is not None and pair_bound < 1):
        # u_i and |O_max| are linear in b: one record of the best pair needs b * 1 / max u_i
        bound, name = (pair_bound, "largest per-pair bound max u_i") if pair_bound is not None and pair_bound < 1 else (lp, "LP bound")
        need = b / bound
        needs = []
        if delta_term < need:
            needs.append(f"--delta >= {1 - math.exp(-need):.4g}")
        if eps_term < need:
            needs.append(f"--epsilon >= {need * (2 if p.get('bound', 'cels') == 'cels' else 1):.4g}")
        return (
            f"{head}, {name} {bound:.4g} < 1: no record fits the privacy conditions. It grows linearly with b; "
            f"one record needs b >= {need:.4g}: {' and '.join(needs)}"
            + (f" (or a lower --min-count than {min_count})" if min_count else "")
        )
    if float(solver.get("output_size", lp)) < 1:
        return f"{head}, but the requested |O| = {solver['output_size']:.4g} < 1: raise --output-size"
    return f"{head} >= 1, but no integer solution was found: raise --time-limit or try --integer greedy"


def empty_dp_reason(report: dict[str, Any]) -> str | None:
    """None if the DP histogram holds an item, else why not: no noisy count reached tau."""
    p = report["privacy"]
    if (report.get("release") or {}).get("items", 1):
        return None
    fewer = any(int(part["max_items"]) > 1 for part in p["items"].values())
    return (
        f"EMPTY RELEASE: no item's noisy distinct-user count reached the threshold tau = {p['threshold']} at eps {p['epsilon']:g}, "
        f"delta {p['delta']:g}, {items_words(p['items'])} a user; an item needs about tau users who keep it: raise epsilon or delta, "
        + ("keep fewer items a user (max_items_per_user), " if fewer else "")
        + "or add users who share items (docs/releases.md)"
    )


def empty_baseline_reason(report: dict[str, Any]) -> str | None:
    """None if a baseline released an item (a report's ``utility`` per item type), else why
    not: no item's noisy count passed the baseline's threshold at this epsilon and delta."""
    kinds = {kind: u for kind, u in (report.get("utility") or {}).items() if isinstance(u, dict) and "released" in u}
    if not kinds or any(int(u["released"]) for u in kinds.values()):
        return None
    p = report.get("privacy") or {}
    held = ", ".join(f"0 of the {u['items_in_log']:,} {kind} items in the log" if "items_in_log" in u else f"0 {kind} items" for kind, u in kinds.items())
    return (
        f"EMPTY RELEASE: {report.get('method', 'the baseline')} released nothing ({held}) at eps {p.get('epsilon', 0):g}, "
        f"delta {p.get('delta', 0):g}: no item's noisy count passed its threshold; raise --epsilon or --delta, "
        "or see the method's own flags (docs/baselines.md)"
    )


SKIPPED_SHOWN = 3
"""Bad lines a ``--lenient`` notice names by file:line:field."""


def lenient_notice(source: dict[str, Any]) -> str | None:
    """One line for stderr when ``--lenient`` skipped lines: how many, and where the first were
    (file:line:field); None when it skipped none."""
    skipped = int(source.get("skipped_lines", 0))
    if not skipped:
        return None
    where = source.get("skipped_at", [])[:SKIPPED_SHOWN]
    more = ", ..." if skipped > len(where) else ""
    first = source.get("skipped_examples", ["?"])[0]
    return f"--lenient skipped {skipped} bad line{'s' if skipped > 1 else ''}: {', '.join(where)}{more} (the first: {first})"
