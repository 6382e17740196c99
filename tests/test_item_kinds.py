"""The DP histogram's item kinds (docs/releases.md, "Item kinds"): queries and query pairs
next to query-url pairs, each kind with its own bound and share of epsilon, composed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cels.baselines.release import read_release
from cels.crypto.streams import DrawKeys
from cels.inprocess import run_session
from cels.logs import LoadOptions, LogFile, LogRecord, iter_records, split_records_by_user, write_records
from cels.mechanism.dp_histogram import delta_prime, pld_epsilon, release_accounting, share_beta, threshold
from cels.mechanism.dp_release import ITEM_CHOICE, bounded_by_kind, bounded_counts, json_array, sanitize_dp
from cels.mechanism.item_kinds import ItemKinds, checked_item, item_of, kind_of, kind_of_encoding
from cels.protocol.options import SessionOptions
from cels.protocol.stages.dp_release import release_threshold
from cels.engine.routines import encode_item

TEST_KEYS = {"key_bits": 512, "group_bits": 1024}


def events(popular: int = 60) -> list[LogRecord]:
    """A query ``popular`` users pose (half of them click the same url, the rest nothing), the
    transition "popular" -> "next" of every one of them, and a loner's query and pair."""
    out = []
    for j in range(popular):
        out.append(LogRecord(f"u{j}", "popular", "http://popular.example/" if j % 2 else None))
        out.append(LogRecord(f"u{j}", "next", None))
        out.append(LogRecord(f"u{j}", f"own {j}", f"http://own{j}.example/"))
    return out + [LogRecord("loner", "only mine", "http://loner.example/", 3)]


def test_the_kinds_and_their_bounds_are_parsed_and_a_bad_one_is_refused_in_one_line() -> None:
    kinds = ItemKinds.parse("pairs, queries:3,query-pairs", 2)
    assert kinds.text() == "pairs:2,queries:3,query-pairs:2" and kinds.total == 7
    assert kinds.epsilon_shares(1.4) == pytest.approx({"pairs": 0.4, "queries": 0.6, "query-pairs": 0.4})
    assert ItemKinds.parse("pairs", 5).only_pairs and not kinds.only_pairs
    for text, said in [("urls", "unknown item kind 'urls'"), ("queries,queries", "queries is given twice"),
                       ("queries:0", "Delta_0 = 0 must be at least 1"), ("queries:x", "bound 'x' is not an integer")]:  # fmt: skip
        with pytest.raises(ValueError) as err:
            ItemKinds.parse(text, 1)
        assert said in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="--items: unknown item kind"):
        SessionOptions.create(3, epsilon=1.0, delta=1e-6, release="dp", items="pairs,clicks", **TEST_KEYS)


strings = st.text(max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.tuples(strings, strings), st.tuples(st.just(1), strings), st.tuples(st.just(2), strings, strings)), st.tuples(strings, strings))
def test_the_encodings_of_different_kinds_never_meet(item, pair) -> None:
    """An item's encoding names its kind and decodes back to it; a pair's is the sampled
    release's id bytes, and no item's equals a dummy id's."""
    data = encode_item(*item)
    assert kind_of_encoding(data) == kind_of(item) and checked_item(json.loads(data)) == item
    assert data == json_array(*item)
    if kind_of(item).tag is not None:
        assert data != encode_item(*pair)
    assert data != encode_item("padding", item[-1], 0)


@pytest.mark.parametrize("fields", [["q"], [3, "q"], [True, "q"], [1, 2], [2, "a"], ["a", "b", "c"], "q", [1, "a", "b"]])
def test_a_decoded_id_that_is_no_kinds_item_is_refused(fields) -> None:
    with pytest.raises(ValueError, match="is no item of"):
        checked_item(fields)


def test_the_histogram_counts_each_kinds_events_and_a_release_line_names_its_kind() -> None:
    log = ItemKinds.parse("pairs,queries,query-pairs", 1).histogram(
        [LogRecord("a", "q1", None), LogRecord("a", "q2", "http://x/", 2), LogRecord("b", "q1", "http://y/"), LogRecord("a", "q1", None)]
    )
    counts = {(user, item): int(log.counts[j, i]) for j, user in enumerate(log.users) for i, item in enumerate(log.pairs) if log.counts[j, i]}
    assert counts == {
        ("a", ("q2", "http://x/")): 2, ("a", (1, "q1")): 2, ("a", (1, "q2")): 2, ("a", (2, "q1", "q2")): 1, ("a", (2, "q2", "q1")): 1,
        ("b", ("q1", "http://y/")): 1, ("b", (1, "q1")): 1,
    }  # fmt: skip
    for item in log.pairs:
        released = kind_of(item).released_item(item, 7)
        assert item_of(released) == item and released.count == 7
    assert kind_of((2, "q1", "q2")).released_item((2, "q1", "q2"), 1).next_query == "q2"


def test_each_user_keeps_at_most_each_kinds_bound_and_pairs_alone_bound_as_before() -> None:
    kinds = ItemKinds.parse("pairs:1,queries:2,query-pairs:1", 1)
    log = kinds.histogram(events(40) + [LogRecord("u1", f"extra {k}", f"http://e{k}/") for k in range(6)])
    encoded = lambda cols: [json_array(*log.pairs[c]) for c in cols]  # noqa: E731
    bounded = bounded_by_kind(log.counts, log.users, encoded, b"k" * 32, kinds).tocsr()
    assert set(bounded.data.tolist()) == {1}
    for columns, bound in kinds.column_bounds(encoded(list(range(len(log.pairs))))):
        per_user = np.asarray(bounded[:, columns].sum(axis=1)).ravel()
        held = np.asarray((log.counts[:, columns] > 0).sum(axis=1)).ravel()
        assert np.array_equal(per_user, np.minimum(held, bound))  # every user keeps min(held, Delta_k) of the kind
    pairs = ItemKinds.parse("pairs:2", 1)
    assert (bounded_by_kind(log.counts, log.users, encoded, b"k" * 32, pairs) != bounded_counts(log.counts, log.users, encoded, b"k" * 32, 2)).nnz == 0


def test_the_kinds_compose_to_the_releases_epsilon_and_delta() -> None:
    """eps_k add up to eps; 1 - prod(1 - delta_k) = delta; tau is the single histogram's at
    Delta_0 = sum Delta_k (spec table: 169 at eps 1, delta 1e-6, Delta_0 10, beta 1.5); and
    dp-accounting's composition of the kinds' discrete Laplace mechanisms gives eps."""
    kinds = ItemKinds.parse("pairs:4,queries:6", 1)
    accounting = release_accounting(1.0, 1e-6, kinds, 0.1, 3, 1)
    parts = accounting["items"]
    assert sum(part["epsilon"] for part in parts.values()) == pytest.approx(1.0)
    assert 1 - np.prod([1 - part["delta"] for part in parts.values()]) == pytest.approx(1e-6, rel=1e-9)
    assert parts["pairs"]["delta"] == pytest.approx(1 - (1 - delta_prime(1e-6, 10)) ** 4, rel=1e-9)
    assert accounting["threshold"] == threshold(1.0, 1e-6, 10, share_beta(3, 1)) == 169
    options = SessionOptions.create(3, epsilon=1.0, delta=1e-6, release="dp", items="pairs:4,queries:6", **TEST_KEYS)
    assert release_threshold(options) == 169
    pytest.importorskip("dp_accounting")
    assert pld_epsilon([(parts[k]["epsilon"], parts[k]["max_items"]) for k in parts]) == pytest.approx(1.0, abs=1e-3)


def write_shares(tmp_path: Path, records: list[LogRecord], parties: int = 3) -> list[LogFile]:
    files = []
    for k, share in enumerate(split_records_by_user(records, parties)):
        write_records(share, tmp_path / f"party-{k}.tsv")
        files.append(LogFile(tmp_path / f"party-{k}.tsv", LoadOptions(format="aol")))
    return files


def test_a_session_releases_queries_and_query_pairs_from_each_partys_events(tmp_path) -> None:
    """Three parties' event files, each user within its bounds (2 pairs, 3 queries, 2
    transitions): the popular query (200 users), its transition (200) and its pair (100 users)
    pass tau = 59 (eps 2, Delta_0 = 7, beta 1.5); the loner's items do not."""
    items = "pairs:2,queries:3,query-pairs:2"
    options = SessionOptions.create(3, epsilon=2.0, delta=1e-6, release="dp", items=items, **TEST_KEYS)
    release, report = run_session(write_shares(tmp_path, events(200)), options, allow_insecure_key_bits=True, seed=4)
    kept = {item_of(i): i.count for i in release.items}
    assert release.threshold == threshold(2.0, 1e-6, 7, share_beta(3, 1)) == 59
    assert {(1, "popular"), (2, "popular", "next"), ("popular", "http://popular.example/")} <= set(kept)
    assert not {(1, "only mine"), ("only mine", "http://loner.example/")} & set(kept)
    assert all(count >= release.threshold for count in kept.values())
    assert set(report["privacy"]["items"]) == {"pairs", "queries", "query-pairs"} and report["privacy"]["max_items_per_user"] == 7


def test_kinds_other_than_pairs_need_the_partys_log_file() -> None:
    options = SessionOptions.create(3, epsilon=1.0, delta=1e-6, release="dp", items="queries", **TEST_KEYS)
    log = ItemKinds.parse("pairs", 1).histogram(events())
    with pytest.raises(Exception, match="counts the log's events in order"):
        run_session(log.split_by_user(3), options, allow_insecure_key_bits=True, seed=4)


def test_the_single_holders_release_of_queries_matches_the_primitive(tmp_path, capsys) -> None:
    """``cels sanitize --release dp --items queries:2,pairs`` writes query and click lines, the
    same as sanitize_dp over the kinds' histogram with the same draws; the note carries each
    kind's part."""
    from cels.cli import main

    source = tmp_path / "events.tsv"
    write_records(events(200), source)
    out = tmp_path / "dp.tsv"
    assert main(["sanitize", str(source), "--format", "aol", "--release", "dp", "--items", "queries:2,pairs", "--out", str(out), "--seed", "2",
                 "--epsilon", "1", "--delta", "1e-6",
                 "--report", str(tmp_path / "r.json")]) == 0  # fmt: skip
    items = read_release(out)
    kinds = ItemKinds.parse("queries:2,pairs", 1)
    log = kinds.histogram(iter_records(source, LoadOptions(format="aol")))
    want, _, _ = sanitize_dp(log, 1.0, 1e-6, kinds, DrawKeys.replay(2, "holder"))
    assert items == list(want.items) and {i.kind for i in items} == {"query", "click"}
    note = json.loads(Path(f"{out}.release-note.json").read_text())["privacy"]
    assert note["items"]["queries"]["max_items"] == 2 and note["threshold"] == threshold(1.0, 1e-6, 3)
    assert main(["sanitize", str(source), "--format", "aol", "--release", "dp", "--items", "urls", "--out", str(tmp_path / "x.tsv"),
                 "--epsilon", "1", "--delta", "1e-6"]) == 2
    assert "unknown item kind 'urls'" in capsys.readouterr().err and not (tmp_path / "x.tsv").exists()
    assert ITEM_CHOICE  # the same label draws the choice at a party and at one holder


def test_simulate_gives_each_party_its_events_and_releases_queries(tmp_path) -> None:
    """``cels simulate --release dp --items pairs,queries``: every party node reads its share of
    the events (split by user, in order) and the release has query lines; the console names
    each kind's bound and share of epsilon."""
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "cels"), "simulate", "--parties", "3", "--out", str(out), "--release", "dp", "--items", "pairs,queries",
         "--epsilon", "2", "--key-bits", "512", "--synthetic-users", "600", "--seed", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    items = read_release(out / "dp-histogram.tsv")
    assert {i.kind for i in items} == {"click", "query"} and all(i.count >= 17 for i in items)  # tau at eps 2, Delta_0 2, beta 1.5
    assert "1 query-url pair and 1 query (epsilon 1 and 1, composed)" in done.stdout + done.stderr
