"""Local Sanitization (CELS 6.4): per-party conditions, |O| shares, the united output."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from cels.baselines.local import local_sanitize, output_shares, pair_counts, union_logs
from cels.logs import SearchLog, synthetic_log
from cels.mechanism.conditions import build_conditions, privacy_bound
from cels.mechanism.sanitize import SanitizeParams, sanitize
from cels.mechanism.solvers import feasible
from cels.mechanism.examples import FIGURE1_PAIRS, figure1_log
from cels.mechanism.solvers import max_output_lp

EPS, DELTA = 2.0, 0.5  # b = min(1, ln 2) = ln 2


def params(**kw) -> SanitizeParams:
    return SanitizeParams(epsilon=EPS, delta=DELTA, integer="greedy", keep_user_ids=True, seed=3, **kw)


@pytest.fixture(scope="module")
def log() -> SearchLog:
    return synthetic_log(seed=11, users=400, pairs=60)


@pytest.fixture(scope="module")
def parties(log: SearchLog) -> list[SearchLog]:
    return log.split_by_user(4, seed=5)


@pytest.fixture(scope="module")
def released(parties: list[SearchLog]) -> tuple[SearchLog, dict, float]:
    total = 40.0
    out, report = local_sanitize(parties, params(), total_output=total)
    return out, report, total


def test_each_party_output_satisfies_its_own_conditions(parties, released):
    out, _, _ = released
    b = privacy_bound(EPS, DELTA)
    owner = {u: k for k, party in enumerate(parties) for u in party.users}
    assert set(out.users) <= set(owner)  # keep_user_ids: every output user is a party's user
    released_somewhere = 0
    for k, party in enumerate(parties):
        rows = [j for j, u in enumerate(out.users) if owner[u] == k]
        mine = SearchLog([out.users[j] for j in rows], out.pairs, out.counts[rows].tocsr())
        x = pair_counts(mine, party.pairs)
        cond, var_pairs = build_conditions(party, b)
        outside = np.setdiff1d(np.arange(party.n_pairs), var_pairs)
        assert not x[outside].any()  # pairs unique within the party (or absent) are suppressed
        assert feasible(cond, x[var_pairs])  # Theorem 2 conditions on the party's own counts
        # sampled rows only name users of the party who hold the pair
        held = party.counts[[party.users.index(u) for u in mine.users]].toarray()
        sampled = mine.counts.toarray()
        cols = [party.pairs.index(p) for p in mine.pairs]
        assert np.all((sampled > 0) <= (held[:, cols] > 0))
        released_somewhere += int(x.sum())
    assert released_somewhere == out.size > 0


def test_output_shares_are_proportional_and_sum_to_total(parties, released):
    _, report, total = released
    sizes = np.array([p.size for p in parties])
    shares = output_shares(sizes, total)
    assert shares.sum() == pytest.approx(total)
    assert shares == pytest.approx(total * sizes / sizes.sum())
    reported = [p["output_share"] for p in report["party_reports"]]
    assert sum(reported) == pytest.approx(total)
    for entry in report["party_reports"]:
        # each party releases at most its share (floored by the integer step), and at most |𝕆_k|
        assert entry["output_records"] <= min(entry["output_share"], entry["max_output_lp"]) + 1e-9
        assert entry["share_clipped"] == (entry["output_share"] > entry["max_output_lp"])
    assert report["sizes"]["output_records"] == sum(p["output_records"] for p in report["party_reports"])


def test_union_schema(log, parties, released):
    out, report, _ = released
    assert isinstance(out, SearchLog) and out.counts.dtype == np.int64
    assert set(out.pairs) <= set(log.pairs)
    assert len(set(out.pairs)) == out.n_pairs and len(set(out.users)) == out.n_users
    assert out.source == log.source
    assert report["sizes"]["users"] == log.n_users and report["sizes"]["input_size"] == log.size
    assert report["method"] == "local" and report["parties"] == 4
    assert 0 <= report["utility"]["recall"] <= 1


def test_union_logs_merges_pairs_and_users():
    a = SearchLog(["u1", "u2"], [("q", "x"), ("r", "y")], sp.csr_matrix(np.array([[1, 0], [2, 3]], dtype=np.int64)))
    b = SearchLog(["u3", "u1"], [("r", "y"), ("s", "z")], sp.csr_matrix(np.array([[4, 0], [5, 6]], dtype=np.int64)))
    u = union_logs([a, b])
    assert u.users == ["u1", "u2", "u3"] and u.pairs == [("q", "x"), ("r", "y"), ("s", "z")]
    assert u.counts.toarray().tolist() == [[1, 5, 6], [2, 3, 0], [0, 4, 0]]
    assert pair_counts(u, [("s", "z"), ("zz", "none"), ("r", "y")]).tolist() == [6, 0, 12]


def test_one_party_equals_the_single_holder_mechanism(log):
    cond, _ = build_conditions(log, privacy_bound(EPS, DELTA))
    total = 0.5 * max_output_lp(cond)[0]
    out, _ = local_sanitize([log], params(), total_output=total)
    single, _ = sanitize(log, params(output_size=0.5), progress=False)
    assert np.array_equal(pair_counts(out, log.pairs), pair_counts(single, log.pairs))


def test_pair_split_across_parties_is_suppressed_by_ls_not_by_cels():
    """EDBT Fig. 1 with users 081, 082 at party 1 and 083 at party 2: book (081, 083) and car
    (082, 083) are unique within each party, so LS can release google only; CELS on the union
    releases all three at b >= 2.112964 (spec: D-UMP optimum 3)."""
    fig = figure1_log()
    parties = [fig.select_users(np.array([0, 1])), fig.select_users(np.array([2]))]
    p = SanitizeParams(epsilon=6.0, delta=0.95, objective="diversity", integer="mip", seed=1)  # b = ln 20
    out, report = local_sanitize(parties, p)
    assert set(out.pairs) <= {("google", "google.com")}
    assert report["party_reports"][1]["released"] is False  # one user: every pair is unique
    cels_out, _ = sanitize(fig, p, progress=False)
    assert set(cels_out.pairs) == {FIGURE1_PAIRS[1], FIGURE1_PAIRS[2], FIGURE1_PAIRS[4]}


def test_bad_input():
    with pytest.raises(ValueError, match="at least one party"):
        local_sanitize([], params())
    with pytest.raises(ValueError, match="non-negative"):
        output_shares([1, 2], -1.0)
