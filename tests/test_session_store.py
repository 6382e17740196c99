"""A node's kept session keys (cels.node.session_store; docs/deployment.md, "Resume after a
node restart"): private files, the same keys for a re-run, refusals when the options or the
input changed, and the record of what a session took, read back in order for its replay."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat

import pytest

from cels.crypto.streams import DrawKeys
from cels.node.session_store import KEEP_DAYS, SessionStore, input_digest, list_resumable
from cels.protocol.options import SessionOptions
from cels.protocol.roles import Refusal
from cels.protocol.wire import cels_pb2

OPTIONS = SessionOptions.create(3, session_id="s/1", epsilon=1.0, delta=0.4)
RESUMED = dataclasses.replace(OPTIONS, resume=True)


def hop(values: list[int], sum_id: str = "counts", sender: str = "party-1", session_id: str = OPTIONS.session_id) -> cels_pb2.Envelope:
    words = b"".join(v.to_bytes(8, "little") for v in values)
    share = cels_pb2.MaskedSumShare(session_id=session_id, sum_id=sum_id, words=words)
    return cels_pb2.Envelope(session_id=session_id, sender=sender, masked_sum_share=share)


def test_a_first_run_keeps_its_root_privately_and_a_re_run_takes_it_back(tmp_path) -> None:
    store = SessionStore.open(tmp_path / "state")
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    first = store.draws(OPTIONS, "d1", DrawKeys.fresh)
    [record] = store.kept()
    assert (record["session_id"], record["phase"], record["seeded"]) == ("s/1", "ready", False)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (tmp_path / "state").iterdir())
    store.phase("s/1", "counts")
    store.ended("s/1", resumable=True)
    restarted = SessionStore.open(tmp_path / "state")  # the node came back
    assert restarted.kept()[0]["phase"] == "counts"
    again = restarted.draws(RESUMED, "d1", lambda: pytest.fail("a re-run draws no fresh keys"))
    assert again.root_bytes() == first.root_bytes() and not again.seeded
    restarted.ended("s/1", resumable=False)
    assert list((tmp_path / "state").iterdir()) == []


@pytest.mark.parametrize(
    ("options", "digest", "message"),
    [
        (dataclasses.replace(RESUMED, epsilon=2.0), "d1", "the session's options changed since its first run"),
        (RESUMED, "d2", "the session's input changed since its first run"),
    ],
)
def test_a_re_run_whose_options_or_input_changed_is_refused_for_good(tmp_path, options, digest, message) -> None:
    SessionStore.open(tmp_path).draws(OPTIONS, "d1", DrawKeys.fresh)
    store = SessionStore.open(tmp_path)
    with pytest.raises(Refusal) as refused:
        store.draws(options, digest, DrawKeys.fresh)
    assert refused.value.public == message
    assert store.kept() == []  # over for good: nothing to resume any more
    with pytest.raises(Refusal, match="nothing kept in"):
        store.draws(RESUMED, "d1", DrawKeys.fresh)


def test_a_node_without_a_state_directory_keeps_nothing_and_resumes_nothing(tmp_path) -> None:
    store = SessionStore.open(None)
    store.draws(OPTIONS, "d1", DrawKeys.fresh)
    assert store.kept() == []
    with pytest.raises(Refusal, match="no session state"):
        store.draws(RESUMED, "d1", DrawKeys.fresh)


def test_what_a_session_took_is_replayed_in_order_and_a_message_cut_by_death_is_dropped(tmp_path) -> None:
    store = SessionStore.open(tmp_path)
    store.draws(OPTIONS, None, DrawKeys.fresh)
    taken = [("party-1", hop([1, 2])), ("solver", hop([3], sender="solver")), ("party-1", hop([5], sum_id="unique"))]
    for sender, envelope in taken:
        store.taken(sender, envelope)
    store.taken("party-1", hop([9], session_id="another"))  # a session this node keeps nothing of
    store.ended(OPTIONS.session_id, resumable=True)
    [inbound] = tmp_path.glob("*.inbound")
    assert stat.S_IMODE(inbound.stat().st_mode) == 0o600
    whole = inbound.stat().st_size
    with open(inbound, "ab") as fh:  # the node died while writing the next one
        fh.write(b"\x00\x08party-")
    restarted = SessionStore.open(tmp_path)
    restarted.draws(RESUMED, None, DrawKeys.fresh)
    record = restarted.record(OPTIONS.session_id)
    assert (record.taken("party-1"), record.taken("solver"), record.taken("party-3")) == (2, 1, 0)
    assert inbound.stat().st_size == whole  # the cut message is gone: its sender sends it again
    restarted.taken("party-3", hop([7], sender="party-3"))  # the re-run's own, after what it replays
    assert [(s, e.SerializeToString()) for s, e in record.messages] == [(s, e.SerializeToString()) for s, e in taken]
    again = restarted.record(OPTIONS.session_id)
    assert (again.taken("party-1"), again.taken("solver"), again.taken("party-3")) == (2, 1, 1)
    assert again.digests["solver"] == [hashlib.sha256(taken[1][1].SerializeToString(deterministic=True)).digest()]


def test_an_open_state_directory_is_refused_and_old_records_go(tmp_path) -> None:
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    with pytest.raises(ValueError, match="others can read the sessions' keys"):
        SessionStore.open(tmp_path / "open")
    SessionStore.open(tmp_path / "kept").draws(OPTIONS, None, DrawKeys.fresh)
    later = SessionStore(tmp_path / "kept", clock=lambda: 1e12)
    assert len(later.kept()) == 1
    old = SessionStore.open.__func__(type("Late", (SessionStore,), {"__init__": lambda self, d: SessionStore.__init__(self, d, clock=lambda: 1e12)}), tmp_path / "kept")
    assert old.kept() == [] and KEEP_DAYS * 86400 < 1e12


def test_the_input_digest_follows_each_files_name_size_and_time(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.parquet").write_bytes(b"abc")
    first = input_digest(data)
    assert input_digest(data) == first
    os.utime(data / "a.parquet", ns=(1, 1))
    touched = input_digest(data)
    (data / "b.parquet").write_bytes(b"")
    assert len({first, touched, input_digest(data)}) == 3
    assert input_digest(data / "a.parquet") != input_digest(data)


def test_a_kept_session_id_is_taken_for_a_new_session(tmp_path) -> None:
    SessionStore.open(tmp_path).draws(OPTIONS, None, DrawKeys.fresh)
    with pytest.raises(Refusal) as refused:
        SessionStore.open(tmp_path).draws(OPTIONS, None, DrawKeys.fresh)  # the node restarted: the id is still kept
    assert refused.value.public == "the session id is taken"


def test_a_party_keeps_its_loaded_log_for_a_re_run_and_forgets_it_with_the_session(tmp_path) -> None:
    from cels.logs import LoadOptions, LogFile, synthetic_log, write_log

    store = SessionStore.open(tmp_path / "state")
    store.draws(OPTIONS, "d1", DrawKeys.fresh)
    source = synthetic_log(seed=3, users=40, pairs=60)
    path = tmp_path / "party-1.tsv"
    write_log(source, path)
    load = LogFile(path, LoadOptions(format="aol"), snapshot=store.snapshot(OPTIONS))
    first = load()
    assert stat.S_IMODE(load.snapshot.stat().st_mode) == 0o600
    path.write_text("")  # the re-run reads what the first run loaded, not the file
    again = load()
    assert (again.users, again.pairs, again.source) == (first.users, first.pairs, first.source)
    assert (again.counts != first.counts).nnz == 0 and again.counts.dtype == first.counts.dtype
    store.forget(OPTIONS.session_id)
    assert not load.snapshot.exists()


def test_a_kept_log_that_does_not_read_back_is_parsed_again_and_a_newline_in_a_name_keeps_none(tmp_path) -> None:
    from cels.logs.model import SearchLog
    from cels.logs.snapshot import read_snapshot, write_snapshot
    import scipy.sparse as sp

    kept = tmp_path / "s.log"
    log = SearchLog(["u1", "u2"], [("a b", "x.com"), ("", "y.com")], sp.csr_matrix([[1, 0], [2, 5]]), {"format": "aol"})
    assert write_snapshot(log, kept)
    back = read_snapshot(kept)
    assert (back.users, back.pairs, back.counts.toarray().tolist()) == (log.users, log.pairs, [[1, 0], [2, 5]])
    kept.write_bytes(kept.read_bytes()[:100])  # cut short: not a log
    assert read_snapshot(kept) is None
    assert read_snapshot(tmp_path / "absent.log") is None
    torn = SearchLog(["u\n1"], [("q", "x.com")], sp.csr_matrix([[1]]))
    assert not write_snapshot(torn, tmp_path / "t.log") and not (tmp_path / "t.log").exists()
    odd = SearchLog(["u1"], [("q", "x.com")], sp.csr_matrix([[1]]), {"path": tmp_path})  # a source JSON cannot hold
    assert not write_snapshot(odd, tmp_path / "o.log") and not (tmp_path / "o.log").exists()
    assert not write_snapshot(log, tmp_path / "absent" / "s.log")  # cannot be written: said, not raised


def test_a_session_that_cannot_run_again_keeps_neither_its_log_nor_its_hashes(tmp_path) -> None:
    """Algorithm 2's Paillier sums are not replayed (``replayable`` False): nothing only a
    re-run reads is written for such a session."""
    store = SessionStore.open(tmp_path / "state")
    transformed = SessionOptions.create(3, session_id="s/2", epsilon=1.0, delta=0.4, solve="transformed")
    assert not transformed.replayable and OPTIONS.replayable
    draws = store.draws(transformed, "d1", DrawKeys.fresh)
    assert store.snapshot(transformed) is None and store.keeping(transformed, draws) is None
    assert store.snapshot(OPTIONS) is not None and store.keeping(OPTIONS, draws) is not None
    assert SessionStore.open(None).snapshot(OPTIONS) is None


def test_a_session_that_cannot_run_again_takes_nothing_down_and_is_never_listed_resumable(tmp_path) -> None:
    """A transformed session's id is taken while it runs, but it records no message and no
    phase, goes when it ends (even on an abort that would keep another), and a record its dead
    node left goes at the next start-up instead of showing as "resumable"."""
    store = SessionStore.open(tmp_path)
    transformed = SessionOptions.create(3, session_id="s/2", epsilon=1.0, delta=0.4, solve="transformed")
    store.draws(transformed, "d1", DrawKeys.fresh)
    with pytest.raises(Refusal, match="runs here"):
        store.draws(transformed, "d1", DrawKeys.fresh)
    store.taken("party-1", hop([1, 2], session_id=transformed.session_id))
    store.phase(transformed.session_id, "universe")
    assert not list(tmp_path.glob("*.inbound"))
    assert [r["phase"] for r in store.kept()] == ["ready"]
    store.ended(transformed.session_id, resumable=True)  # aborted because a node went away
    assert store.kept() == []
    store.draws(OPTIONS, "d1", DrawKeys.fresh)
    store.draws(dataclasses.replace(transformed, session_id="s/3"), "d1", DrawKeys.fresh)  # then this node dies
    status = cels_pb2.NodeStatus()
    list_resumable(status, SessionStore.open(tmp_path), running=())
    assert [s.session_id for s in status.sessions] == [OPTIONS.session_id]
