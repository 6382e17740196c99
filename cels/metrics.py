"""Utility measures of a release against its input (docs/mechanism.md; CELS eq. 2, EDBT section 5).

Every function takes plain count vectors (aligned numpy arrays) or dicts keyed by item, so
the baselines (which may release counts per query only) use the same code.  With dicts, the
universe is the input's items with a positive count; released items outside it are ignored.

- KL (CELS eq. 2): sum_i (c_i/|D|) ln((c_i/|D|) (|O| + n) / (x_i + 1)).
- Recall of distinct pairs: |{i: x_i > 0}| / |{i: c_i > 0}|.
- EDBT eq. 8: precision / recall of frequent pairs (support c_i/|D| >= s) and the F-UMP sum of
  support distances; eq. 9 DiffRatio of user-pair triplets.
- ZEALOUS 6.2: top-j coverage, average L1 distance and KL of the relative frequencies on the
  top-j input items.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Counts = np.ndarray | Mapping


def aligned(input_counts: Counts, output_counts: Counts) -> tuple[np.ndarray, np.ndarray]:
    """(c, x) as float arrays over the input universe (items with c_i > 0)."""
    if isinstance(input_counts, Mapping) != isinstance(output_counts, Mapping):
        raise TypeError("pass both counts as dicts or both as arrays")
    if isinstance(input_counts, Mapping):
        items = [k for k, v in input_counts.items() if v > 0]
        c = np.array([input_counts[k] for k in items], dtype=np.float64)
        x = np.array([output_counts.get(k, 0) for k in items], dtype=np.float64)
        return c, x
    c = np.asarray(input_counts, dtype=np.float64)
    x = np.asarray(output_counts, dtype=np.float64)
    if c.shape != x.shape:
        raise ValueError(f"input counts {c.shape} and output counts {x.shape} are not aligned")
    keep = c > 0
    return c[keep], x[keep]


def kl_divergence(input_counts: Counts, output_counts: Counts) -> float:
    """CELS eq. 2 (x_i -> x_i + 1, |O| -> |O| + n, n = number of input items)."""
    c, x = aligned(input_counts, output_counts)
    if len(c) == 0:
        raise ValueError("KL divergence of an empty input")
    p = c / c.sum()
    return float(np.sum(p * np.log(p * (x.sum() + len(c)) / (x + 1.0))))


def recall(input_counts: Counts, output_counts: Counts) -> float:
    """Fraction of the input's distinct items that appear in the output."""
    c, x = aligned(input_counts, output_counts)
    return float(np.count_nonzero(x > 0) / len(c)) if len(c) else 0.0


def frequent_items(counts: np.ndarray, support: float) -> np.ndarray:
    """Boolean mask of the items with relative support counts_i / sum >= s (EDBT 5.2)."""
    total = counts.sum()
    return counts / total >= support if total > 0 else np.zeros(len(counts), dtype=bool)


def frequent_precision_recall(input_counts: Counts, output_counts: Counts, support: float) -> dict:
    """EDBT eq. 8: precision |S0 ∩ S|/|S|, recall |S0 ∩ S|/|S0| (None when a set is empty)."""
    c, x = aligned(input_counts, output_counts)
    s0, s = frequent_items(c, support), frequent_items(x, support)
    both = int(np.count_nonzero(s0 & s))
    return {
        "support": support,
        "input_frequent": int(s0.sum()),
        "output_frequent": int(s.sum()),
        "precision": both / int(s.sum()) if s.any() else None,
        "recall": both / int(s0.sum()) if s0.any() else None,
    }


def support_distance(input_counts: Counts, output_counts: Counts, support: float) -> float:
    """F-UMP objective: sum over input-frequent items of |x_i/|O| - c_i/|D||."""
    c, x = aligned(input_counts, output_counts)
    freq = frequent_items(c, support)
    total = x.sum()
    out = x / total if total > 0 else np.zeros_like(x)
    return float(np.abs(out[freq] - c[freq] / c.sum()).sum())


def diff_ratio(input_triplets: np.ndarray, output_triplets: np.ndarray) -> np.ndarray:
    """EDBT eq. 9 per input triplet (user, pair) with c > 0: |x/|O| - c/|D|| / (c/|D|)."""
    c, x = aligned(input_triplets, output_triplets)
    total = x.sum()
    p = c / c.sum()
    q = x / total if total > 0 else np.zeros_like(x)
    return np.abs(q - p) / p


def top_j(input_counts: Counts, output_counts: Counts, j: int) -> dict:
    """ZEALOUS 6.2 on the top-j input items: coverage (fraction released), average L1 distance
    of relative frequencies (over the whole log) and KL of the top-j distributions (add-one
    smoothed as CELS eq. 2)."""
    if j < 1:
        raise ValueError("j must be positive")
    c, x = aligned(input_counts, output_counts)
    top = np.argsort(-c, kind="stable")[:j]
    total_x = x.sum()
    rel_c, rel_x = c / c.sum(), (x / total_x if total_x > 0 else np.zeros_like(x))
    return {
        "j": int(len(top)),
        "coverage": float(np.count_nonzero(x[top] > 0) / len(top)),
        "l1": float(np.abs(rel_c[top] - rel_x[top]).mean()),
        "kl": kl_divergence(c[top], x[top]),
    }


def utility_report(input_counts: Counts, output_counts: Counts, *, support: float, top: int = 100) -> dict:
    """All measures at once (what ``cels sanitize`` puts under ``utility``)."""
    return {
        "kl": kl_divergence(input_counts, output_counts),
        "recall": recall(input_counts, output_counts),
        "frequent": frequent_precision_recall(input_counts, output_counts, support),
        "support_distance": support_distance(input_counts, output_counts, support),
        f"top_{top}": top_j(input_counts, output_counts, top),
    }
