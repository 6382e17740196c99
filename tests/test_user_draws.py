"""A party's draws over its users by draw bucket (cels.engine.user_draws) and the session keys
they come from (cels.crypto.streams.DrawKeys): the same draws for any split of the users, and
the releases' canonical order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from cels.crypto.streams import DrawKeys
from cels.logs import synthetic_log
from cels.logs.records import LogRecord
from cels.engine.interface import LoadResult
from cels.protocol.stages.results import UnionResult
from cels.protocol.stages.union import output_log, union_record
from cels.engine.user_draws import DRAW_BUCKETS, BucketDraws, buckets_of, draw_order, split_over_buckets, user_digests
from cels.engine.routines import encode_item


@pytest.fixture(scope="module")
def ordered():
    """A synthetic log's counts in draw order under replayed keys, and its buckets."""
    log = synthetic_log(seed=2, users=400, pairs=60)
    draws = DrawKeys.replay(9, "party-1")
    digests = user_digests(draws, log.users)
    order = draw_order(digests)
    return draws, sp.csr_matrix(log.counts[order], dtype=np.int64), buckets_of(digests[order])


def test_replayed_keys_repeat_and_fresh_or_other_holders_do_not() -> None:
    a, b = DrawKeys.replay(4, "party-1"), DrawKeys.replay(4, "party-1")
    assert a.seeded and not DrawKeys.fresh().seeded
    assert a.stream("x").integers(0, 2**62, 4).tolist() == b.stream("x").integers(0, 2**62, 4).tolist()
    draws = {tuple(k.indexed("x", i).integers(0, 2**62, 4)) for k in (a, DrawKeys.replay(4, "party-2"), DrawKeys.fresh()) for i in (0, 1)}
    assert len(draws) == 6
    assert a.secret("x") != a.secret("y") and len(a.secret("x")) == 32
    with pytest.raises(ValueError, match="replay seed must be an integer"):
        DrawKeys.replay(-1, "party-1")
    with pytest.raises(ValueError, match="stream index"):
        a.indexed("x", 2**64)


def test_poisson_draws_of_any_split_of_the_buckets_are_the_whole_party_draws(ordered) -> None:
    draws, counts, buckets = ordered
    rate = np.linspace(0.1, 3.0, counts.nnz)
    whole = BucketDraws(draws, buckets).poisson(counts, rate, stage=3)
    assert whole.sum() > 0
    for shards in (2, 3, 7):
        got = np.zeros_like(whole)
        for s in range(shards):
            rows = np.flatnonzero(buckets % shards == s)
            part = counts[rows]
            entries = np.concatenate([np.arange(counts.indptr[r], counts.indptr[r + 1]) for r in rows]) if len(rows) else np.zeros(0, int)
            got[entries] = BucketDraws(draws, buckets[rows]).poisson(part, rate[entries], stage=3)
        assert np.array_equal(got, whole), shards
    assert not np.array_equal(BucketDraws(draws, buckets).poisson(counts, rate, stage=4), whole)


def test_rows_out_of_draw_order_are_refused(ordered) -> None:
    draws, _, buckets = ordered
    with pytest.raises(ValueError, match="not in draw order"):
        BucketDraws(draws, buckets[::-1])


def test_pseudonyms_are_distinct_per_bucket_streams_and_carry_the_bucket(ordered) -> None:
    draws, counts, buckets = ordered
    user_draws = BucketDraws(draws, buckets)
    rows = np.arange(0, counts.shape[0], 2)
    names = user_draws.pseudonyms(rows)
    assert len(set(names)) == len(rows) and all(len(n) == 16 for n in names)
    assert [int(n, 16) >> (64 - 10) for n in names] == buckets[rows].tolist()
    half = rows[buckets[rows] % 2 == 0]  # a shard holding the even buckets names its users alike
    assert set(BucketDraws(draws, buckets[half]).pseudonyms(np.arange(len(half)))) <= set(names)


def test_the_paper_split_keeps_every_trial_and_follows_the_bucket_weights() -> None:
    """Trials of one pair split over 3 buckets weighted 1:2:5 (binomial tests, alpha 1e-6 each)."""
    totals = sp.csr_matrix(([1, 2, 5], ([0, 1, 2], [0, 0, 0])), shape=(DRAW_BUCKETS, 1))
    rng = DrawKeys.replay(1, "p").stream("paper split")
    runs, trials = 4000, 3
    got = np.array([split_over_buckets(np.array([trials]), totals, rng).toarray()[:3, 0] for _ in range(runs)])
    assert np.all(got.sum(axis=1) == trials)
    for b, weight in enumerate((1, 2, 5)):
        assert binomtest(int(got[:, b].sum()), runs * trials, weight / 8).pvalue > 1e-6


@settings(max_examples=300, deadline=None)
@given(*[st.text(st.characters(exclude_categories=("Cs",)))] * 3, st.integers(1, 2**62))
def test_an_encoded_record_is_compact_utf8_json_and_decodes_to_its_fields(user, query, url, count) -> None:
    """encode_item is json.dumps of the fields byte for byte (any text but lone surrogates,
    which no strictly decoded log holds: quotes, backslashes, control and non-ASCII
    characters), so pair ids hash alike on every party and a union record decodes to what
    was encoded."""
    record = encode_item(user, query, url, count)
    assert record == json.dumps([user, query, url, count], ensure_ascii=False, separators=(",", ":")).encode()
    assert union_record(record) == LogRecord(user, query, url, count)
    assert encode_item(query, url) == json.dumps([query, url], ensure_ascii=False, separators=(",", ":")).encode()


def test_the_release_order_is_a_function_of_the_records_alone() -> None:
    records = [encode_item(f"u{j % 7}", f"q{j % 5}", f"url{j % 3}", 1 + j % 4) for j in range(40)]
    records = list(dict.fromkeys(records))
    loaded = LoadResult(0, {"format": "aol"})
    first = output_log(UnionResult(tuple(records)), loaded)
    shuffled = output_log(UnionResult(tuple(np.random.default_rng(3).permutation(np.array(records, dtype=object)))), loaded)
    assert (first.users, first.pairs) == (shuffled.users, shuffled.pairs)
    assert (first.counts != shuffled.counts).nnz == 0
