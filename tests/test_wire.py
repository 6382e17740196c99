"""The committed generated code matches protos/ and round-trips messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from cels.protocol.wire import cels_pb2
from cels.protocol.wire.generate import GENERATED, generated_in_tempdir

WIRE = Path(__file__).resolve().parent.parent / "cels" / "protocol" / "wire"


def test_generated_code_is_in_step_with_proto() -> None:
    fresh = generated_in_tempdir()
    for name in GENERATED:
        assert (WIRE / name).read_bytes() == fresh[name], f"{name} is stale: run `make proto`"


def test_every_step_message_carries_a_session_id() -> None:
    envelope = cels_pb2.Envelope.DESCRIPTOR
    steps = envelope.oneofs_by_name["step"].fields
    assert len(steps) >= 15
    for field in steps:
        assert "session_id" in field.message_type.fields_by_name or field.message_type.name == "StartSession", field.name


def test_envelope_round_trip() -> None:
    msg = cels_pb2.Envelope(session_id="s1", sender="party-1", sum_result=cels_pb2.SumResult(session_id="s1", sum_id="counts", values=[-3, 0, 7]))
    back = cels_pb2.Envelope.FromString(msg.SerializeToString())
    assert back.WhichOneof("step") == "sum_result"
    assert list(back.sum_result.values) == [-3, 0, 7]


def test_a_report_crosses_the_wire_as_a_typed_table_with_its_types_and_order() -> None:
    """NlpSolution's solver report and the Run stream's session report are protobuf Tables, not
    JSON in strings (issue 24): ints stay ints, floats floats, None None, the key order kept."""
    import numpy as np

    from cels.protocol.wire.codec import table_message, table_of

    report = {"integer_total": 46, "ratio": 0.5, "whole": 2.0, "mode": "private", "ok": True, "gap": None,
              "noise": {"scale": 5.0, "total_before": np.int64(36)}, "list": [1, "a", [2.5]], "array": np.array([3, 4])}  # fmt: skip
    back = table_of(cels_pb2.Table.FromString(table_message(report).SerializeToString()))
    assert back == {**report, "noise": {"scale": 5.0, "total_before": 36}, "array": [3, 4]}
    assert list(back) == list(report) and type(back["integer_total"]) is int and type(back["whole"]) is float
    with pytest.raises(TypeError, match="cannot be a set"):
        table_message({"bad": {1}})
