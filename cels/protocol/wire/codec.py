"""Paillier values and the session vocabulary (phases, session states) <-> their proto messages
(the primitives in cels.crypto know no protobuf; cels.protocol.phases knows no wire).

Ciphertexts and moduli travel as big-endian bytes of fixed width; parsing validates what the
primitives need (key size policy, packing fits the key, ciphertexts in Z*_{N^2}) and, where
the receiver knows it, that the packing is the one the session implies; it raises ValueError
(CiphertextError / KeySizeError) naming the field for a malformed message.
"""

from __future__ import annotations

from dataclasses import fields

from cels.crypto.paillier import CiphertextError, PublicKey
from cels.crypto.packing import EncryptedMatrix, Packing
from cels.protocol.phases import Phase, SessionState
from cels.protocol.wire import cels_pb2


def public_key_message(key: PublicKey) -> cels_pb2.PaillierPublicKey:
    return cels_pb2.PaillierPublicKey(n=key.modulus_bytes(), hs=key.hs_bytes())


def public_key_of(msg: cels_pb2.PaillierPublicKey, *, allow_insecure_key_bits: bool = False) -> PublicKey:
    return PublicKey.from_bytes(msg.n, msg.hs, allow_insecure_key_bits=allow_insecure_key_bits)


def packing_message(packing: Packing) -> cels_pb2.Packing:
    return cels_pb2.Packing(
        slot_bits=packing.slot_bits,
        slots=packing.slots,
        scale_bits=packing.scale_bits,
        offset=packing.offset_bytes(),
        summands=packing.summands,
    )


def packing_of(msg: cels_pb2.Packing) -> Packing:
    return Packing(msg.slot_bits, msg.slots, msg.scale_bits, int.from_bytes(msg.offset, "big"), msg.summands)


def matrix_message(matrix: EncryptedMatrix) -> cels_pb2.EncryptedMatrix:
    return cels_pb2.EncryptedMatrix(
        rows=matrix.rows,
        cols=matrix.cols,
        packing=packing_message(matrix.packing),
        ciphertexts=matrix.ciphertext_bytes(),
        terms=matrix.terms,
    )


def matrix_of(msg: cels_pb2.EncryptedMatrix, public_key: PublicKey, packing: Packing | None = None) -> EncryptedMatrix:
    """The encrypted matrix of ``msg``; with ``packing``, its packing must be exactly that one."""
    received = packing_of(msg.packing)
    if packing is not None:
        check_packing(received, packing)
    return EncryptedMatrix.from_bytes(public_key, msg.rows, msg.cols, received, msg.terms, list(msg.ciphertexts))


def check_packing(received: Packing, expected: Packing) -> None:
    """Raise CiphertextError naming the first ``packing.<field>`` that differs from ``expected``."""
    for field in fields(Packing):
        got, want = getattr(received, field.name), getattr(expected, field.name)
        if got != want:
            raise CiphertextError(f"packing.{field.name} is {got}, the session implies {want}")


WIRE_PHASES: dict[Phase, int] = {phase: cels_pb2.Phase.Value(f"PHASE_{phase.name}") for phase in Phase}
"""Every Phase -> the wire's ``Phase`` (the proto enum mirrors cels.protocol.phases)."""
WIRE_STATES: dict[SessionState, int] = {state: cels_pb2.SessionState.State.Value(state.name) for state in SessionState}
"""Every SessionState -> the wire's ``SessionState.State``."""
_PHASE_OF = {value: phase for phase, value in WIRE_PHASES.items()}
_STATE_OF = {value: state for state, value in WIRE_STATES.items()}


def phase_to_wire(phase: Phase | None) -> int:
    """A phase (or its value) as the wire carries it (None: PHASE_UNSPECIFIED, not known)."""
    return cels_pb2.PHASE_UNSPECIFIED if phase is None else WIRE_PHASES[Phase(phase)]


def phase_from_wire(value: int) -> Phase | None:
    """The wire's phase; None for PHASE_UNSPECIFIED or a value this version does not know."""
    return _PHASE_OF.get(value)


def phase_label(value: int) -> str:
    """The wire's phase as reports and logs name it ("" when not known)."""
    phase = phase_from_wire(value)
    return "" if phase is None else phase.value


def state_to_wire(state: SessionState) -> int:
    return WIRE_STATES[state]


def state_from_wire(value: int) -> SessionState:
    """The wire's session state; a value this version does not know reads as UNKNOWN."""
    return _STATE_OF.get(value, SessionState.UNKNOWN)


def table_message(report: dict) -> cels_pb2.Table:
    """A report (str keys; int, float, str, bool, None, list, dict and numpy scalars or arrays
    as values) as a typed :class:`Table`, its key order kept."""
    return cels_pb2.Table(entries=[cels_pb2.Entry(key=str(k), value=_value_message(v)) for k, v in report.items()])


def table_of(table: cels_pb2.Table) -> dict:
    """The report a :class:`Table` holds (the inverse of :func:`table_message`)."""
    return {entry.key: _value_of(entry.value) for entry in table.entries}


def _value_message(value) -> cels_pb2.Value:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        value = value.tolist()
    if value is None:
        return cels_pb2.Value(null=True)
    if isinstance(value, bool):
        return cels_pb2.Value(flag=value)
    if isinstance(value, int):
        return cels_pb2.Value(integer=value)
    if isinstance(value, float):
        return cels_pb2.Value(number=value)
    if isinstance(value, str):
        return cels_pb2.Value(text=value)
    if isinstance(value, dict):
        return cels_pb2.Value(table=table_message(value))
    if isinstance(value, (list, tuple)):
        return cels_pb2.Value(list=cels_pb2.ValueList(items=[_value_message(v) for v in value]))
    raise TypeError(f"a report value cannot be a {type(value).__name__}")


def _value_of(value: cels_pb2.Value):
    kind = value.WhichOneof("kind")
    if kind == "table":
        return table_of(value.table)
    if kind == "list":
        return [_value_of(v) for v in value.list.items]
    return None if kind in (None, "null") else getattr(value, kind)
