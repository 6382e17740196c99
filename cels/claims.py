"""What a release promises, to whom: the one threat-model table and the privacy accounting.

Every report's ``privacy`` (``cels sanitize``, ``simulate``, ``run``), the console's privacy
lines, SECURITY.md and docs/security.md ("What each observer learns") state the same rows,
generated from :data:`LEARNS` (a test keeps the documents in step).

A guarantee names its observer.  What holds (docs/security.md, "End-to-end DP: what holds"):

- **against a recipient of the release**: the multinomial sampling is (eps, delta)-probabilistic
  DP *given the released counts* (CELS Theorem 2; EDBT Definition 2).  The counts themselves are
  computed from the data: without noise they are the exact optimum x; with ``--noise-epsilon``
  they are max(x + Lap(d/eps'), 0) *repaired* against the private conditions.  The repair, and
  the set of pairs that may be released at all, read the data without noise (a pair held by
  three users can be released; without one of them it never can), so no end-to-end bound is
  claimed on any path: the audit in tests/test_privacy_audit.py certifies the repaired
  release's loss far above eps + eps'.
- **against a partner organisation** (another party, the solver): no differential privacy;
  what each learns is exactly its cell of :data:`LEARNS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OBSERVERS = ("party", "solver", "recipient")
"""The columns of the threat-model table: each party, the solver node, a recipient of the release."""


@dataclass(frozen=True)
class Cell:
    """What one observer learns in one mode: a short phrase for the console, the full text."""

    short: str
    full: str


_RELEASE = "the release: the sampled records under fresh pseudonyms, hence every released pair's count"
_RECIPIENT_PLAIN = Cell(
    "the release; its sampling is (eps, delta)-PDP given its counts, the counts are the exact optimum (not DP)",
    f"{_RELEASE}. The sampling is (eps, delta)-probabilistic DP given those counts (CELS Theorem 2); the counts "
    "are the optimum x computed from the data without noise, so the release is not end-to-end DP",
)
_RECIPIENT_NOISY = Cell(
    "the release; its sampling is (eps, delta)-PDP given its counts, the counts are noisy but repaired "
    "from the data (no end-to-end bound)",
    f"{_RELEASE}. The sampling is (eps, delta)-probabilistic DP given those counts (CELS Theorem 2); the counts "
    "are max(x + Lap(d/eps'), 0) repaired against the private conditions, and the repair and the set of "
    "releasable pairs read the data without noise, so no end-to-end bound is claimed",
)
_UNIVERSE = (
    "the universe phase's hashed id sets (P_1, the assembler: every party's set with its owner and their "
    "overlaps; the others: set sizes and the union size); the totals c of the non-unique pairs and which "
    "pairs are unique"
)
_NOT_ROWS = "Not: another party's rows, loads, per-user or per-party counts, or records before the release"

LEARNS: dict[tuple[str, bool], dict[str, Cell]] = {
    ("single", False): {
        "party": Cell("the holder: its whole log", "the single data holder runs everything: its whole log"),
        "solver": Cell("no solver", "no solver node takes part"),
        "recipient": _RECIPIENT_PLAIN,
    },
    ("single", True): {
        "party": Cell("the holder: its whole log, x and the noise", "the single data holder runs everything: its whole log, x, the noise and the repaired counts"),
        "solver": Cell("no solver", "no solver node takes part"),
        "recipient": _RECIPIENT_NOISY,
    },
    ("private", False): {
        "party": Cell(
            "its own log, c, the unique pairs, the verdict bits and so the exact counts x",
            f"its own log; {_UNIVERSE}; the other parties' X25519 mask keys; every round's accepted bits and so "
            f"the exact counts x; the release. {_NOT_ROWS}",
        ),
        "solver": Cell(
            "c, the verdict bits and so the exact counts x",
            "the totals c of the non-unique pairs (by index); the number of rounds and proposals; every round's "
            "accepted bits (a sum of masked verdicts, not who vetoed) and so the exact counts x. Not: any row, load, "
            "per-party count or record",
        ),
        "recipient": _RECIPIENT_PLAIN,
    },
    ("private", True): {
        "party": Cell(
            "its own log, c, the unique pairs, the noise-free x, the noise total z and the released counts",
            f"its own log; {_UNIVERSE}; the other parties' X25519 mask keys; every round's accepted bits, so the "
            "noise-free first-pass counts x, the noise total z and the released counts: the noise protects no one "
            f"against a partner. {_NOT_ROWS}, nor another party's noise share",
        ),
        "solver": Cell(
            "c, the verdict bits, the noise-free x and the noise total z",
            "the totals c of the non-unique pairs (by index); the rounds and proposals; every round's accepted bits, "
            "so the noise-free first-pass counts x; the noise total z (it sums the masked shares) and the released "
            "counts. Not: any row, load, per-party count, single noise share or record",
        ),
        "recipient": _RECIPIENT_NOISY,
    },
    ("transformed", False): {
        "party": Cell(
            "its own log, c, the unique pairs, every party's number of rows and the counts x",
            f"its own log; {_UNIVERSE}; every party's number of constraint rows m_k and l; the counts x; the "
            f"release. {_NOT_ROWS}",
        ),
        "solver": Cell(
            "EVERY PARTY'S CONSTRAINT ROWS (it can rebuild them) and the counts x",
            "decrypts A(T|F|B) and can rebuild every party's constraint rows: every user's ln t_ij and, with c, "
            "the per-user counts c_ij of every non-unique pair (cels attack solver-reconstruction: 100 % of "
            "cells); the counts x",
        ),
        "recipient": _RECIPIENT_PLAIN,
    },
    ("transformed", True): {
        "party": Cell(
            "its own log, c, the unique pairs, every party's number of rows and the released counts",
            f"its own log; {_UNIVERSE}; every party's number of constraint rows m_k and l; the released counts "
            f"(the solver draws the noise: a party sees neither x nor z). {_NOT_ROWS}",
        ),
        "solver": Cell(
            "EVERY PARTY'S CONSTRAINT ROWS, x, the noise and the released counts",
            "decrypts A(T|F|B) and can rebuild every party's constraint rows: every user's ln t_ij and, with c, "
            "the per-user counts c_ij of every non-unique pair (cels attack solver-reconstruction: 100 % of "
            "cells); it draws the noise itself, so it holds x, z and the released counts",
        ),
        "recipient": _RECIPIENT_NOISY,
    },
    ("dp", True): {
        "party": Cell(
            "its own log, the padded id-set sizes and the index size (DP), which of its own items were kept, the release",
            "its own log; the hashed id sets it forwards in the universe phase, so every party's set size, padded with "
            "dummy ids so that it is DP; the index size (padded by the solver too) and its own items' columns in it; "
            "which of its own items were kept (the solver asks for their strings); the release. Not: any count, "
            "noisy or not, of an item it does not release; which of its items another party holds; another party's "
            "noise share. With its own t - 1 partners it still misses h = r - t shares, which add up to the full "
            "discrete Laplace",
        ),
        "solver": Cell(
            "the noisy totals n + Z of every indexed id, and which parties hold each (NOT DP)",
            "assembles the index: every party's complete set of hashed ids (linkable to no string), so how many and "
            "which parties hold each id (this overlap structure is NOT DP) and every party's padded set size; the "
            "noisy totals n + Z of every id (none noise-free: the r shares it does not know sum to NB(r/h) - NB(r/h)); "
            "the strings of the released items, and so which parties hold each released item. Not: any noise-free "
            "count, any noise share, any user or row",
        ),
        "recipient": Cell(
            "the release: (eps, delta)-DP end to end, one user's records at one organisation",
            "the release: items (query-url pairs; with --items, queries and query pairs too) with noisy distinct-user "
            "counts n + Z, those at or above the threshold tau. "
            "(eps, delta)-DP end to end for one user's records at one organisation: each user keeps at most Delta_k "
            "items of each kind, the noise is the sum of every party's share, the same noisy value is tested and "
            "released, and tau bounds the chance that an item held by a single user is released by delta'",
        ),
    },
}
"""(setting, noise on) -> observer -> what it learns; setting is "single" (``cels sanitize``),
"private" (the default solve), "transformed" (the paper's Algorithm 2) or "dp" (the DP
histogram, ``--release dp``, always noisy)."""

MODE_NAMES = {
    "single": "single holder", "private": "private solve", "transformed": "transformed solve (Algorithm 2)", "dp": "DP histogram",
}  # fmt: skip

TRANSFORMED_WARNING = (
    "WARNING: --solve transformed runs the paper's Algorithm 2: the solver node decrypts A(T|F|B) and can "
    "rebuild every party's constraint rows (cels attack solver-reconstruction); the default private solve "
    "does not reveal them"
)


def mode_name(setting: str, noise: bool) -> str:
    """The row's name, e.g. "private solve, noise on" (the DP histogram is always noisy)."""
    return MODE_NAMES[setting] if setting == "dp" else f"{MODE_NAMES[setting]}, noise {'on' if noise else 'off'}"


def learns(setting: str, noise: bool) -> dict[str, str]:
    """The report's ``privacy.learns``: the mode, each observer's full cell and the console's line."""
    row = LEARNS[setting, noise]
    return {"mode": mode_name(setting, noise), **{o: row[o].full for o in OBSERVERS}, "line": learns_line(setting, noise)}


def learns_line(setting: str, noise: bool) -> str:
    """The console's one line for the mode that ran."""
    row = LEARNS[setting, noise]
    cells = "; ".join(f"{o}: {row[o].short}" for o in OBSERVERS if not (setting == "single" and o == "solver"))
    return f"learns ({mode_name(setting, noise)}): {cells}"


def learns_table() -> str:
    """The whole table in Markdown, as SECURITY.md and docs/security.md carry it."""
    head = "| mode | each party | the solver | a recipient of the release |\n| --- | --- | --- | --- |"
    rows = [
        f"| {mode_name(setting, noise)} | " + " | ".join(LEARNS[setting, noise][o].full for o in OBSERVERS) + " |"
        for (setting, noise) in LEARNS
    ]
    return "\n".join([head, *rows])


END_TO_END_WITHDRAWN = (
    "no end-to-end bound is claimed: the repair and the set of releasable pairs read the private data "
    "without noise (docs/security.md, 'End-to-end DP: what holds')"
)


SEEDED_NONE = (
    "NONE: this run replayed every draw from an explicit --seed, so anyone who knows the seed can redo them; "
    "the release is NOT private and must not be published"
)
"""What a seeded run promises a recipient (its guarantee sentences say so first)."""


def delta_meaning(delta: float) -> str:
    """What delta promises in this mechanism (CELS eq. 4 / Theorem 2 condition 3; EDBT
    Definition 2, probabilistic DP after Goetz et al.)."""
    return (
        f"delta = {delta:g} bounds, for every user, the probability that the output holds at least one record "
        "sampled from that user's log (CELS eq. 4, Theorem 2 condition 3); for such outputs no epsilon bound is "
        "claimed. It is a per-user disclosure probability of probabilistic DP, not the negligible delta << 1/n "
        "of approximate DP"
    )


def privacy_accounting(
    *,
    epsilon: float,
    delta: float,
    b: float,
    bound: str,
    noise_epsilon: float | None,
    sensitivity: float | None,
    cap: int | None,
    setting: str,
    seeded: bool,
    preprocess: bool = False,
) -> dict[str, Any]:
    """The ``privacy`` of every release: the guarantee against recipients and against partners,
    what each observer learns in the mode that ran, and what delta means here."""
    noise = noise_epsilon is not None
    sampling = f"({epsilon:g}, {delta:g})-probabilistic DP of the multinomial sampling given the released counts (CELS Theorem 2)"
    if noise:
        counts = (
            f"the counts are max(x + Lap(d/eps'), 0) (eps' = {noise_epsilon:g}, d = {sensitivity:g}"
            + (", d bounded in L1 by App. C's preprocessing" if preprocess else ", d assumed")
            + f") repaired against the private conditions: {END_TO_END_WITHDRAWN}"
        )
    else:
        counts = "the counts are the optimum x computed from the data without noise: the release is NOT end-to-end DP"
    recipients = f"{sampling}; {counts}"
    if setting == "single":
        partners = "no partner organisation takes part (single data holder)"
    else:
        partners = (
            "no differential privacy against partner organisations: each party and the solver learn exactly "
            f"what privacy.learns says for the {mode_name(setting, noise)}"
        )
    not_private = []
    if setting == "transformed":
        not_private.append("the transformed solve lets the solver rebuild every party's constraint rows")
    if seeded:
        not_private.append("the draws come from an explicit --seed (reproducible, not secret)")
        recipients = f"{SEEDED_NONE}; with secret draws it would be: {recipients}"
    given = "counts with noise that are repaired against the private data" if noise else "counts computed exactly from the data"
    bottom = f"NOT differentially private end to end: the sampling is ({epsilon:g}, {delta:g})-probabilistic DP given {given}"
    return {
        "plain": sampled_plain(epsilon, delta, noise, setting, seeded),
        "epsilon": epsilon,
        "delta": delta,
        "b": b,
        "bound": bound,
        "noise_epsilon": noise_epsilon,
        "sensitivity": sensitivity,
        "cap": cap,
        "guarantee": f"{SEEDED_NONE}; with secret draws: {bottom}" if seeded else bottom,
        "against_recipients": recipients,
        "against_partners": partners,
        "learns": learns(setting, noise),
        "delta_meaning": delta_meaning(delta),
        "sampling_guarantee": sampling,
        "end_to_end": False,
        "reproducible_seed": seeded,
        "private": not not_private,
        "not_private_because": not_private,
    }


def sampled_plain(epsilon: float, delta: float, noise: bool, setting: str, seeded: bool) -> list[str]:
    """A sampled release's guarantee in one plain sentence per observer (the exact terms are in
    the other ``privacy`` keys and docs/security.md)."""
    if seeded:
        return ["this run replayed its draws from --seed: it is NOT private and must not be published"]
    counts = "noisy counts repaired against the data" if noise else "exact counts of the data"
    plain = [
        f"for any one user, with probability at least {1 - delta:g} the release is at most e^{epsilon:g} = {math.exp(epsilon):.3g} "
        f"times likelier with that user's log than without it; with probability up to {delta:g} it holds one of the user's "
        f"records and nothing is promised. This holds given the released counts, which are {counts}: the release is "
        "not differentially private end to end",
    ]
    if setting != "single":
        plain.append(
            "your partners and the solver node learn exact counts computed from every party's data (privacy.learns lists them), "
            "with no differential privacy; not another party's rows"
        )
    if setting == "transformed":
        plain.append("in the transformed solve the solver node can rebuild every party's rows: use it only to reproduce the paper")
    return plain


ITEM_WORDS = {"pairs": ("query-url pair", "query-url pairs"), "queries": ("query", "queries"), "query-pairs": ("query pair", "query pairs")}
"""What a DP histogram's item kinds are called in plain words, one and many (cels.mechanism.item_kinds)."""


def items_words(items: dict[str, dict[str, Any]]) -> str:
    """"3 query-url pairs" or "1 query-url pair and 2 queries (epsilon 0.333 and 0.667,
    composed)": each kind's bound, and with several kinds, its share of epsilon."""
    bounds = " and ".join(f"{part['max_items']} {ITEM_WORDS[kind][part['max_items'] != 1]}" for kind, part in items.items())
    if len(items) == 1:
        return bounds
    shares = " and ".join(f"{part['epsilon']:.3g}" for part in items.values())
    return f"{bounds} (epsilon {shares}, composed)"


def dp_release_accounting(accounting: dict[str, Any], *, parties: int, seeded: bool, single: bool = False) -> dict[str, Any]:
    """The ``privacy`` of a DP histogram (``--release dp``): ``accounting`` is
    cels.mechanism.dp_histogram.release_accounting's, per observer; ``single``: one holder
    (``cels sanitize --release dp``), no partner."""
    epsilon, delta = accounting["recipient"]
    recipients = (
        f"({epsilon:g}, {delta:g})-DP end to end for one user's records at one organisation (at most "
        f"{items_words(accounting['items'])} a user, threshold tau = {accounting['threshold']})"
    )
    if single:
        partners = "no partner organisation takes part (single data holder)"
    else:
        party_eps, party_delta = accounting["party"]
        partners = (
            f"each party, pooling up to t = {accounting['collusion']} of the {parties} parties (itself included): "
            f"({party_eps:g}, {party_delta:g})-DP (the release, and the padded set sizes); the solver: the noisy "
            "counts and which parties hold each hashed id, which is NOT DP (privacy.learns)"
        )
    not_private = ["the draws come from an explicit --seed (reproducible, not secret)"] if seeded else []
    if seeded:
        recipients = f"{SEEDED_NONE}; with secret draws it would be: {recipients}"
    plain = [
        f"a recipient cannot tell whether any one user's records at one organisation were in the input: every output is at most "
        f"e^{epsilon:g} = {math.exp(epsilon):.3g} times likelier one way than the other, except with probability {delta:g}",
    ]
    if not single:
        kinds = " and ".join(ITEM_WORDS[kind][1] for kind in accounting["items"])
        plain += [
            f"your partners learn the release and how many {kinds} each party holds, padded so that one user changes little; "
            "no count of an item that is not released",
            "the solver node learns which parties hold each hashed item (not which item it is, until it is released) and the noisy counts",
        ]
    if seeded:
        plain = ["this run replayed its draws from --seed: it is NOT private and must not be published"]
    return {
        "release": "dp",  # the DP release's name (cels.protocol.releases)
        "plain": plain,
        "epsilon": epsilon,
        "delta": delta,
        "unit": "one user's records at one organisation",
        "threshold": accounting["threshold"],
        "max_items_per_user": accounting["max_items"],
        "items": accounting["items"],
        "collusion": accounting["collusion"],
        "padding_epsilon": accounting["padding_epsilon"],
        "accounting": accounting,
        "guarantee": f"{SEEDED_NONE}; with secret draws: ({epsilon:g}, {delta:g})-DP end to end against recipients" if seeded
        else f"({epsilon:g}, {delta:g})-DP end to end against recipients, for one user's records at one organisation",
        "against_recipients": recipients,
        "against_partners": partners,
        "learns": learns("dp", True) if not single else {
            "mode": "single holder, DP histogram", "party": LEARNS["single", False]["party"].full,
            "recipient": LEARNS["dp", True]["recipient"].full, "line": f"learns (single holder): recipient: {LEARNS['dp', True]['recipient'].short}",
        },
        "end_to_end": not seeded,
        "reproducible_seed": seeded,
        "private": not not_private,
        "not_private_because": not_private,
    }
