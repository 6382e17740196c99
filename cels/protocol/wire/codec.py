"""Paillier values <-> their proto messages (the primitives in cels.crypto know no protobuf).

Ciphertexts and moduli travel as big-endian bytes of fixed width; parsing validates what the
primitives need (key size policy, packing fits the key, ciphertexts in Z*_{N^2}) and, where
the receiver knows it, that the packing is the one the session implies; it raises ValueError
(CiphertextError / KeySizeError) naming the field for a malformed message.
"""

from __future__ import annotations

from dataclasses import fields

from cels.crypto.paillier import CiphertextError, EncryptedMatrix, Packing, PublicKey
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
