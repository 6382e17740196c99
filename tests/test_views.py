"""Recorded views (cels.views, ``cels views``): they parse back, hold what each node
can decode and nothing of another party in a party's view, and give the per-role tables and
the sequence diagram.  One in-memory session, test-size keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from cels.protocol.phases import Phase
from cels.cli import main
from cels.logs import synthetic_log
from cels.protocol.roles import ProtocolError
from cels.protocol.party import PartyRole
from cels.protocol.options import SessionOptions
from cels.views import PHASE_ORDER, load_views, mermaid, record_views, summarise
from cels.protocol.wire import cels_pb2


@pytest.fixture(scope="module")
def recorded(recorded_session):
    s = recorded_session
    return s.root, s.options, s.logs, s.roles[s.options.initiator].output, s.views


def test_every_message_is_recorded_once_on_each_side(recorded) -> None:
    _root, config, _logs, _output, views = recorded
    assert set(views) == {"party-1", "party-2", "party-3", "solver"}
    sent = sorted((n, e["peer"], e["sha256"]) for n, v in views.items() for e in v.entries if e["direction"] == "sent")
    received = sorted((e["peer"], n, e["sha256"]) for n, v in views.items() for e in v.entries if e["direction"] == "received")
    assert sent == received  # every node is recorded: each message appears as sent and as received
    for view in views.values():
        for e in view.entries:
            env = e.envelope()  # the raw bytes parse back to the recorded step
            assert env.WhichOneof("step") == e["step"] and env.session_id == config.session_id
            assert len(env.SerializeToString()) == e["bytes"]
            assert e["phase"] in PHASE_ORDER


def test_the_solver_view_holds_what_it_decrypts(recorded) -> None:
    _root, config, logs, _output, views = recorded
    solver = views["solver"]
    at = solver.find("received", "nlp_permute_hop")[0].array("at")
    counts = sp.vstack([log.counts for log in logs]).tocsr()
    totals = np.asarray(counts.sum(axis=0)).ravel()
    active = (totals > 0) & (counts.max(axis=0).toarray().ravel() < totals)  # no unique pairs
    # the decrypted count row is c over the NLP's variables, in permuted order
    assert sorted(np.rint(at[-1]).astype(int)) == sorted(totals[active])
    blocks = solver.find("received", "nlp_slack_block")
    shapes = list(solver.find("sent", "nlp_key")[0].envelope().nlp_key.shape_rows)
    assert sorted(b.array("af").shape[1] for b in blocks) == sorted(m for m in shapes if m)
    assert all(e["decodable"] for e in solver.entries if e["direction"] == "received")


def test_no_party_view_holds_another_partys_plaintext(recorded) -> None:
    """A party decodes only public values: no other party's count vector, pair or record
    before the published union, and none of P_0's matrices."""
    _root, config, logs, output, views = recorded
    parties = list(config.parties)
    for k, party in enumerate(parties):
        view = views[party]
        others = [logs[j] for j in range(len(parties)) if j != k]
        own_pairs = {p for p, t in zip(logs[k].pairs, logs[k].pair_totals()) if t > 0}
        foreign = {w.encode() for log in others for p, t in zip(log.pairs, log.pair_totals()) if t > 0 and p not in own_pairs for w in p if len(w) >= 6}
        assert foreign
        decoded = [e.array(n) for e in view.entries for n in e["decoded"]]
        assert not {n for e in view.entries for n in e["decoded"]} & {"at", "af", "ab"}
        for log in others:
            vector = np.asarray(log.counts.sum(axis=0)).ravel()
            assert not any(a.size == vector.size and np.array_equal(a.ravel(), vector) for a in decoded)
        for e in view.entries:
            if e["step"] != "union_result" and not (e["step"] == "union_decrypt_hop" and e["decodable"]):
                data = (e.root / e["message"]).read_bytes()
                assert not any(w in data for w in foreign), (party, e["step"])


def test_refused_messages_are_noted_and_node_factories_wrap(tmp_path) -> None:
    config = SessionOptions.create(2, epsilon=8.0, delta=0.9, key_bits=256, group_bits=1024)
    log = synthetic_log(seed=1, users=10)
    factory = record_views(lambda options: PartyRole("party-2", options, log, allow_insecure_key_bits=True), tmp_path)
    role = factory(config)
    assert role.phase == Phase.READY and role.name == "party-2"  # attributes reach the role
    stray = cels_pb2.Envelope(session_id=config.session_id, sender="party-1", universe_index=cels_pb2.UniverseIndex())
    with pytest.raises(ProtocolError):
        role.receive("party-1", stray)
    view = load_views(tmp_path)[config.session_id]["party-2"]
    assert view.entries[0]["refused"].startswith("failed_precondition")
    assert view.config().session_id == config.session_id


def test_summary_and_sequence_diagram(recorded, tmp_path, capsys) -> None:
    root, config, _logs, _output, views = recorded
    rows = {r["phase"]: r for r in summarise(views["solver"])}
    assert rows["nlp"]["decodes"] and not rows["nlp"]["cannot_decode"]
    text = mermaid(views)
    assert text.startswith("sequenceDiagram") and "nlp_permute_hop" in text and "union_result" in text
    assert main(["views", str(root), "--out", str(tmp_path)]) == 0
    out = tmp_path / config.session_id
    assert (out / "sequence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sequence.mmd").read_text() == text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["solver"]["kind"] == "SolverRole"
    assert "### party-1" in capsys.readouterr().out


def test_a_recorded_view_is_its_operators_only(recorded) -> None:
    """A view holds what its node decoded (issue 40, finding 6: the dumps were 0644): every
    directory 0700, every file 0600."""
    root = recorded[0]
    modes = {path: path.stat().st_mode & 0o777 for path in root.rglob("*") if "sequence" not in path.name}  # `cels views` drawings aside
    assert modes and all(mode == (0o700 if path.is_dir() else 0o600) for path, mode in modes.items()), {
        str(p.relative_to(root)): oct(m) for p, m in modes.items() if m not in (0o700, 0o600)
    }
