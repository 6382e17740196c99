"""Utility of a baseline's release against the log's true counts (the measures of docs/mechanism.md).

The reference domain is the log's items of one kind (true total occurrences c_i); a released
item's noisy count is its x_i (0 when not released).  Released items that are not in the log
(Safelog pool queries, guessed click URLs nobody clicked) are counted separately.
"""

from __future__ import annotations

from collections import Counter

from cels.baselines.items import ItemKey, item_totals
from cels.baselines.release import ReleasedItem
from cels.logs.records import LogRecord
from cels.metrics import kl_divergence, recall, top_j

TOP_J = 100


def item_utility(released: list[ReleasedItem], totals: Counter[ItemKey]) -> dict:
    """KL (CELS eq. 2), recall of distinct items and the top-100 measures of one item kind."""
    noisy = {item.key: item.count for item in released}
    report = {
        "items_in_log": len(totals),
        "released": len(released),
        "released_not_in_log": sum(1 for k in noisy if k not in totals),
    }
    if totals:
        report.update(kl=kl_divergence(totals, noisy), recall=recall(totals, noisy))
        report[f"top_{TOP_J}"] = top_j(totals, noisy, TOP_J)
    return report


def utility_by_kind(items: list[ReleasedItem], histories: dict[str, list[LogRecord]], kinds: tuple[str, ...]) -> dict:
    """:func:`item_utility` for each kind in ``kinds``."""
    return {kind: item_utility([i for i in items if i.kind == kind], item_totals(histories, kind)) for kind in kinds}
