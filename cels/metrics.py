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


CHUNK = 1 << 16
"""Items per pass of the array measures: over a log's whole index (millions of pairs, at the
initiator's node) they hold a few vectors of this many floats (half a MiB each), never a float
copy of the index.  At 1 << 20 the measures' temporaries took 57 MB over a 4M-pair index."""


def aligned(input_counts: Counts, output_counts: Counts) -> tuple[np.ndarray, np.ndarray]:
    """(c, x) over the same items: dicts as float arrays over the input universe (items with
    c_i > 0); arrays as given (checked aligned; the measures skip c_i = 0 chunk by chunk)."""
    if isinstance(input_counts, Mapping) != isinstance(output_counts, Mapping):
        raise TypeError("pass both counts as dicts or both as arrays")
    if isinstance(input_counts, Mapping):
        items = [k for k, v in input_counts.items() if v > 0]
        c = np.array([input_counts[k] for k in items], dtype=np.float64)
        x = np.array([output_counts.get(k, 0) for k in items], dtype=np.float64)
        return c, x
    c, x = np.asarray(input_counts), np.asarray(output_counts)
    if c.shape != x.shape:
        raise ValueError(f"input counts {c.shape} and output counts {x.shape} are not aligned")
    return c, x


def item_chunks(c: np.ndarray, x: np.ndarray):
    """(c, x) as floats, :data:`CHUNK` items at a time, only the items with c_i > 0."""
    for lo in range(0, len(c), CHUNK):
        cc, xx = np.asarray(c[lo : lo + CHUNK], dtype=np.float64), np.asarray(x[lo : lo + CHUNK], dtype=np.float64)
        keep = cc > 0
        yield cc[keep], xx[keep]


def log_sizes(c: np.ndarray, x: np.ndarray) -> tuple[float, float, int]:
    """|D| = sum c_i, |O| = sum x_i and n, over the items with c_i > 0."""
    sums = [(cc.sum(), xx.sum(), len(cc)) for cc, xx in item_chunks(c, x)]
    return float(sum(s[0] for s in sums)), float(sum(s[1] for s in sums)), int(sum(s[2] for s in sums))


def kl_divergence(input_counts: Counts, output_counts: Counts) -> float:
    """CELS eq. 2 (x_i -> x_i + 1, |O| -> |O| + n, n = number of input items)."""
    c, x = aligned(input_counts, output_counts)
    total_c, total_x, n = log_sizes(c, x)
    if n == 0:
        raise ValueError("KL divergence of an empty input")
    scale = total_x + n
    return float(sum(np.sum((cc / total_c) * np.log((cc / total_c) * scale / (xx + 1.0))) for cc, xx in item_chunks(c, x)))


def recall(input_counts: Counts, output_counts: Counts) -> float:
    """Fraction of the input's distinct items that appear in the output."""
    c, x = aligned(input_counts, output_counts)
    counted = [(np.count_nonzero(xx > 0), len(cc)) for cc, xx in item_chunks(c, x)]
    n = sum(k for _, k in counted)
    return float(sum(k for k, _ in counted) / n) if n else 0.0


def frequent_items(counts: np.ndarray, support: float, total: float | None = None) -> np.ndarray:
    """Boolean mask of the items with relative support counts_i / sum >= s (EDBT 5.2);
    ``total``: the sum, if ``counts`` is a part of the items."""
    total = counts.sum() if total is None else total
    return counts / total >= support if total > 0 else np.zeros(len(counts), dtype=bool)


def frequent_precision_recall(input_counts: Counts, output_counts: Counts, support: float) -> dict:
    """EDBT eq. 8: precision |S0 ∩ S|/|S|, recall |S0 ∩ S|/|S0| (None when a set is empty)."""
    c, x = aligned(input_counts, output_counts)
    total_c, total_x, _ = log_sizes(c, x)
    s0 = s = both = 0
    for cc, xx in item_chunks(c, x):
        in_freq, out_freq = frequent_items(cc, support, total_c), frequent_items(xx, support, total_x)
        s0, s, both = s0 + int(in_freq.sum()), s + int(out_freq.sum()), both + int(np.count_nonzero(in_freq & out_freq))
    return {
        "support": support,
        "input_frequent": s0,
        "output_frequent": s,
        "precision": both / s if s else None,
        "recall": both / s0 if s0 else None,
    }


def support_distance(input_counts: Counts, output_counts: Counts, support: float) -> float:
    """F-UMP objective: sum over input-frequent items of |x_i/|O| - c_i/|D||."""
    c, x = aligned(input_counts, output_counts)
    total_c, total_x, _ = log_sizes(c, x)
    distance = 0.0
    for cc, xx in item_chunks(c, x):
        freq = frequent_items(cc, support, total_c)
        out = xx[freq] / total_x if total_x > 0 else np.zeros(int(freq.sum()))
        distance += float(np.abs(out - cc[freq] / total_c).sum())
    return distance


def diff_ratio(input_triplets: np.ndarray, output_triplets: np.ndarray) -> np.ndarray:
    """EDBT eq. 9 per input triplet (user, pair) with c > 0: |x/|O| - c/|D|| / (c/|D|)."""
    c, x = aligned(input_triplets, output_triplets)
    keep = np.asarray(c) > 0
    c, x = np.asarray(c, dtype=np.float64)[keep], np.asarray(x, dtype=np.float64)[keep]
    total = x.sum()
    p = c / c.sum()
    q = x / total if total > 0 else np.zeros_like(x)
    return np.abs(q - p) / p


def top_j(input_counts: Counts, output_counts: Counts, j: int) -> dict:
    """ZEALOUS 6.2 on the top-j input items: coverage (fraction released), average L1 distance
    of relative frequencies (over the whole log) and KL of the top-j distributions (add-one
    smoothed as CELS eq. 2).  Ties at the j-th count go to the earlier items."""
    if j < 1:
        raise ValueError("j must be positive")
    c, x = aligned(input_counts, output_counts)
    total_c, total_x, _ = log_sizes(c, x)
    best_c, best_x = np.zeros(0), np.zeros(0)  # the top j so far, in order (each chunk's after the earlier ones')
    for cc, xx in item_chunks(c, x):
        cand_c, cand_x = np.concatenate([best_c, cc]), np.concatenate([best_x, xx])
        keep = np.argsort(-cand_c, kind="stable")[:j]
        best_c, best_x = cand_c[keep], cand_x[keep]
    rel_x = best_x / total_x if total_x > 0 else np.zeros_like(best_x)
    return {
        "j": int(len(best_c)),
        "coverage": float(np.count_nonzero(best_x > 0) / len(best_c)),
        "l1": float(np.abs(best_c / total_c - rel_x).mean()),
        "kl": kl_divergence(best_c, best_x),
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
