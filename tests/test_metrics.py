"""Utility measures: hand-computed values, dict/array equivalence, edge cases."""

from __future__ import annotations

import math
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cels import metrics


def test_kl_matches_cels_eq2_by_hand():
    c, x = np.array([2, 1, 1]), np.array([1, 0, 3])
    p = np.array([0.5, 0.25, 0.25])
    expected = sum(p[i] * math.log(p[i] * (4 + 3) / (x[i] + 1)) for i in range(3))
    assert metrics.kl_divergence(c, x) == pytest.approx(expected)


def test_kl_is_small_for_proportional_output_and_ignores_zero_input_items():
    c = np.array([100, 50, 50, 0])
    assert metrics.kl_divergence(c, 10 * c) < metrics.kl_divergence(c, np.array([0, 0, 2000, 7]))
    assert metrics.kl_divergence(c, 10 * c) == pytest.approx(metrics.kl_divergence(c[:3], 10 * c[:3]))


def test_dict_and_array_inputs_agree():
    cd = {"a": 5, "b": 3, "c": 1, "z": 0}
    xd = {"a": 2, "c": 1, "extra": 9}
    ca, xa = np.array([5, 3, 1]), np.array([2, 0, 1])
    assert metrics.kl_divergence(cd, xd) == pytest.approx(metrics.kl_divergence(ca, xa))
    assert metrics.recall(cd, xd) == pytest.approx(2 / 3)
    assert metrics.top_j(cd, xd, 2) == metrics.top_j(ca, xa, 2)
    with pytest.raises(TypeError):
        metrics.recall(cd, xa)


def test_frequent_precision_recall_and_support_distance():
    c = np.array([50, 30, 15, 5])  # supports .5 .3 .15 .05
    x = np.array([10, 0, 9, 1])  # supports .5 0 .45 .05
    pr = metrics.frequent_precision_recall(c, x, 0.1)
    assert (pr["input_frequent"], pr["output_frequent"]) == (3, 2)
    assert pr["precision"] == 1.0 and pr["recall"] == pytest.approx(2 / 3)
    assert metrics.support_distance(c, x, 0.1) == pytest.approx(0 + 0.3 + 0.3)
    assert metrics.frequent_precision_recall(c, np.zeros(4), 0.1)["precision"] is None


def test_top_j_coverage_and_l1():
    c = np.array([40, 30, 20, 10])
    x = np.array([4, 0, 2, 4])
    top = metrics.top_j(c, x, 2)
    assert top["coverage"] == 0.5
    assert top["l1"] == pytest.approx((abs(0.4 - 0.4) + abs(0.3 - 0.0)) / 2)
    with pytest.raises(ValueError):
        metrics.top_j(c, x, 0)


def test_diff_ratio():
    np.testing.assert_allclose(metrics.diff_ratio(np.array([1, 3]), np.array([1, 1])), [1.0, 1 / 3])


def test_utility_report_keys():
    rep = metrics.utility_report(np.array([5, 3, 2]), np.array([1, 1, 0]), support=0.2, top=2)
    assert set(rep) == {"kl", "recall", "frequent", "support_distance", "top_2"}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=1, max_size=60),
    st.integers(1, 9), st.integers(1, 12), st.sampled_from([0.01, 0.05, 0.2]),
)
def test_the_measures_in_chunks_equal_the_measures_whole(items, chunk, j, support) -> None:
    """The array measures pass over the items CHUNK at a time (bounded memory at the
    initiator's node): any chunk size gives what one pass gives, ties in top-j included
    (many equal small counts)."""
    c = np.array([ci for ci, _ in items], dtype=np.int64)
    x = np.array([xi for _, xi in items], dtype=np.int64)
    if not c.any():
        return
    whole = metrics.utility_report(c, x, support=support, top=j)
    with patch.object(metrics, "CHUNK", chunk):
        parts = metrics.utility_report(c, x, support=support, top=j)
    assert parts["frequent"] == whole["frequent"] and parts["recall"] == whole["recall"]
    assert parts[f"top_{j}"]["j"] == whole[f"top_{j}"]["j"] and parts[f"top_{j}"]["coverage"] == whole[f"top_{j}"]["coverage"]
    for key in ("kl", "support_distance"):
        assert parts[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12)
    for key in ("l1", "kl"):
        assert parts[f"top_{j}"][key] == pytest.approx(whole[f"top_{j}"][key], rel=1e-12, abs=1e-12)
    keep = c > 0  # the top j by count, ties to the earlier items, as one stable sort of the whole gives
    top = np.argsort(-c[keep], kind="stable")[:j]
    assert parts[f"top_{j}"]["coverage"] == np.count_nonzero(x[keep][top] > 0) / len(top)
