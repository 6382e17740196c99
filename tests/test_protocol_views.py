"""Each party's view: what a party sends is ciphertext, permuted ciphertext, hashed ids or the
public values of the protocol (totals c, the shape m_k, the solution x, the output union) --
never a plaintext count, constraint row or record of its own.  Read from the recorded views
(cels.views) of one in-memory session."""

from __future__ import annotations

import pytest

from cels.crypto.ec_hash import hash_to_u
from cels.engine.routines import encode_item

PUBLIC_STEPS = {"sum_result", "nlp_solution", "union_result", "step_report", "start_session", "constraint_shape"}
CIPHER_STEPS = {
    "universe_hop", "universe_index", "sum_key", "sum_hop", "nlp_sum_hop", "nlp_permute_hop", "nlp_slack_block",
    "union_encrypt_hop", "union_decrypt_hop",
}


@pytest.fixture(scope="module")
def session(recorded_session):
    s = recorded_session
    assert s.roles["party-1"].finished
    sent = [(node, e) for node, view in s.views.items() for e in view.entries if e["direction"] == "sent"]
    return s.log, s.options, sent


def test_parties_send_only_ciphertexts_or_public_values(session) -> None:
    _log, config, sent = session
    parties = list(config.parties)
    for sender, entry in sent:
        step = entry["step"]
        if sender in parties:
            assert step in CIPHER_STEPS | PUBLIC_STEPS, step
        if step == "sum_result":
            assert sender == parties[0]  # only the key holder, and only the total
        if step == "constraint_shape":
            env = entry.envelope()
            assert {f.name for f, _ in env.constraint_shape.ListFields()} <= {"session_id", "party", "rows"}


def test_no_pair_or_record_travels_in_the_clear(session) -> None:
    log, config, sent = session
    words = {w.encode() for q, u in log.pairs for w in (q, u) if len(w) >= 6}
    unkeyed = {hash_to_u(encode_item(*pair)) for pair in log.pairs}
    assert len(words) > 10
    for sender, entry in sent:
        step = entry["step"]
        if step == "union_result":
            continue  # the published output
        env = entry.envelope()
        data = env.SerializeToString()
        assert not any(w in data for w in words), f"a query or url in clear in {step}"
        if step == "universe_hop":
            hop = env.universe_hop
            complete = sender == hop.owner and len(hop.applied) == len(config.parties)  # its complete set to P_1: union keys
            width = 16 if complete else 32
            assert len(hop.ids) % width == 0
            ids = [hop.ids[i : i + width] for i in range(0, len(hop.ids), width)]
            assert not unkeyed & set(ids) and not {u[:16] for u in unkeyed} & set(ids)
        if step == "universe_index":  # the index size and the recipient's own columns, no ids
            assert {f.name for f, _ in env.universe_index.ListFields()} <= {"session_id", "size", "columns", "first", "more"}


def test_every_forwarded_matrix_is_rerandomised(session) -> None:
    """No ciphertext of the NLP rings is ever sent twice (a later party cannot match them)."""
    _log, _config, sent = session
    ciphertexts = []
    for _sender, entry in sent:
        step = entry["step"]
        if step in ("nlp_sum_hop", "nlp_permute_hop", "nlp_slack_block", "sum_hop"):
            body = getattr(entry.envelope(), step)
            for field in ("at", "af", "ab", "partial"):
                if field in body.DESCRIPTOR.fields_by_name and body.HasField(field):
                    ciphertexts.extend(getattr(body, field).ciphertexts)
    assert ciphertexts and len(set(ciphertexts)) == len(ciphertexts)
