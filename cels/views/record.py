"""Each node's view of a session: every message it receives and sends, recorded to disk.

A :class:`ViewRecorder` wraps one role (a PartyRole, SolverRole or any sub-protocol object with
``receive(sender, envelope)``): it forwards every call and records, per message, the
direction, peer, step, phase, wire size, a summary of the fields, whether this node can decode
the content and what it learns from it.  Files (never pickles)::

    DIR/<session>/<node>/view.jsonl           one JSON object per message, in order
    DIR/<session>/<node>/session.json         the session's public parameters (StartSession)
    DIR/<session>/<node>/messages/<seq>-<direction>-<step>.pb   the Envelope's wire bytes
    DIR/<session>/<node>/decoded/<seq>-<field>.npy   what the node decodes (allow_pickle=False)

A re-run of the session after a node restart (``cels run --resume``) is recorded beside it,
in ``DIR/<session>.resume-<k>/<node>`` (k = 1 for the first re-run of it on this node).

"Decodes" means what the node itself can read: plaintext steps (totals, shapes, solutions,
the output), and ciphertexts under a Paillier key this node holds -- P_0's NLP key (so P_0's
recorded view holds the decrypted AF blocks, AB and the permuted AT with its count row,
exactly what Algorithm 2 line 12 gives it) and P_1's secure-sum key.  The role hands its
keys over through ``view_keys()`` in its own process; they are never written.  A recorded solver view is
therefore as sensitive as the logs: it is what an honest-but-curious P_0 keeps.

Wiring: ``record_views(factory, DIR)`` wraps a role factory (``factory(options)``, as a
SessionHost calls it); ``record_hosts`` does it for hosts, and :func:`record_session` runs an
in-memory session with every node recorded and returns its roles.  :mod:`cels.views.read` reads the views back, :mod:`cels.views.draw` draws
them (``cels views DIR``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.json_format import MessageToDict

from cels.crypto import paillier
from cels.crypto.packing import decrypt
from cels.fileio import atomic_write, atomic_write_json
from cels.inprocess import InMemoryNetwork, abort_message, session_hosts, start_session
from cels.logs.model import SearchLog
from cels.protocol.options import SessionOptions
from cels.protocol.machines import SESSION_CHARGES
from cels.protocol.rolebase import phase_of
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, Role, step_name
from cels.protocol.wire import cels_pb2, codec
from cels.views.read import SESSION_FILE, VIEW_FILE

PLAINTEXT_STEPS = {
    "start_session": "the session's public parameters",
    "abort": "which node gave up, the kind of failure and the phase (no data)",
    "transcript_digest": "a SHA-256 of the verdicts another party applied (its own, unless the aggregator equivocated)",
    "step_report": "a node's seconds and bytes per phase",
    "sum_key": "a Paillier public key",
    "sum_result": "the summed vector (public by design)",
    "constraint_shape": "m_k, how many condition rows a party sends",
    "nlp_key": "P_0's public key, l and every party's m_k",
    "nlp_solution": "the solution x (permuted until every party has un-permuted it)",
    "union_result": "the union of the sampled records (the published output)",
    "dp_selection": "which of its own pairs' columns passed the threshold (a function of the release and its own pairs)",
    "dp_items": "the strings of a party's kept pairs (an empty one: a dummy id's)",
    "dp_release": "the released pairs with their noisy counts (the published output)",
}
"""Steps whose content every recipient reads in the clear."""


def _decrypt(keys: list[paillier.PrivateKey], msg: cels_pb2.EncryptedMatrix) -> np.ndarray | None:
    """The matrix in ``msg`` if one of ``keys`` opens it (a wrong key fails the slot checks)."""
    for key in keys:
        try:
            return decrypt(key, codec.matrix_of(msg, key.public_key))
        except ValueError:
            continue
    return None


def _summary(msg) -> dict:
    """Field summary of a step message: scalars as they are, sizes of ciphertext fields."""
    out: dict = {}
    for fd, value in msg.ListFields():
        name = fd.name
        if name == "session_id":
            continue
        if fd.message_type is not None and fd.message_type.name == "EncryptedMatrix":
            out[name] = {"rows": value.rows, "cols": value.cols, "ciphertexts": len(value.ciphertexts), "terms": value.terms}
        elif fd.message_type is not None and fd.message_type.name == "EncryptedRecord":
            out[name] = {"records": len(value), "chunks": sum(len(r.chunks) for r in value)}
        elif fd.message_type is not None and fd.message_type.name == "SessionConfig":
            out[name] = MessageToDict(value, preserving_proto_field_name=True)
        elif fd.message_type is not None:
            out[name] = {"bytes": value.ByteSize()}
        elif fd.type == fd.TYPE_BYTES:
            out[name] = {"count": len(value)} if fd.is_repeated else {"bytes": len(value)}
        elif fd.is_repeated:
            out[name] = list(value) if len(value) <= 16 else {"count": len(value)}
        else:
            out[name] = value
    return out


def _universe_learns(msg: cels_pb2.UniverseHop, node: str) -> str:
    if msg.owner == node:
        return "its own ids with every layer (their positions in the index)"
    return "another party's pair-set size and its hashed ids (equal ids = shared pairs)"


DECRYPTED = {
    "af": "a party's slack block A_k F_k",
    "ab": "AB",
    "at": "AT with the permuted count row",
    "partial": "the sum (= the sum_result it sends)",
}


def describe(role: object, direction: str, envelope: Envelope) -> tuple[dict, dict[str, np.ndarray], bool, str]:
    """(content summary, decoded arrays, decodable, what this node learns) for one message.

    Decoding happens before the role takes the message (P_0 drops its key once it has solved).
    """
    step = step_name(envelope)
    msg = getattr(envelope, step)
    content = _summary(msg)
    arrays: dict[str, np.ndarray] = {}
    if step == "sum_result":
        words = np.frombuffer(msg.words, dtype=f"<u{msg.word_bytes}") if msg.word_bytes in (1, 2, 4, 8) else None  # a masked sum's: one chunk
        arrays["values"] = np.asarray(msg.values if words is None else words, dtype=np.int64)
    elif step == "nlp_solution":
        arrays["x"] = np.asarray(msg.x, dtype=np.int64)
    if step in PLAINTEXT_STEPS:
        return content, arrays, True, PLAINTEXT_STEPS[step]
    if direction == "sent":
        return content, arrays, True, "(its own message)"
    keys = role.view_keys() if hasattr(role, "view_keys") else []
    for name in DECRYPTED:
        if name in msg.DESCRIPTOR.fields_by_name and msg.HasField(name):
            plain = _decrypt(keys, getattr(msg, name))
            if plain is not None:
                arrays[name] = plain
    if arrays:
        return content, arrays, True, "decrypts " + ", ".join(DECRYPTED[k] for k in arrays)
    if step == "universe_hop" and getattr(role, "dp", None) is not None:
        return content, arrays, False, "a party's complete padded set of hashed ids (which ids it shares with others)"
    if step == "universe_hop":
        return content, arrays, False, _universe_learns(msg, getattr(role, "name", ""))
    if step == "universe_index":
        return content, arrays, False, "the size of the union of all pairs and its own pairs' columns in it"
    if step == "masked_sum_share" and getattr(role, "dp", None) is not None:
        return content, arrays, False, "a party's noisy counts under pairwise masks; their sum: the noisy totals n + Z of every indexed id"
    if step == "masked_sum_share":
        return content, arrays, False, "other parties' vectors under pairwise masks (uniform without the seeds they share)"
    if step == "union_encrypt_hop":
        return content, arrays, False, "the owner and size of a party's sampled set (ciphertexts)"
    if step == "union_decrypt_hop":
        r = len(getattr(role, "parties", getattr(role, "ring", ())))
        if msg.hops == r - 1:
            return content, arrays, True, "after its own layer: the pooled, shuffled plaintext records (= the output)"
        return content, arrays, False, "the pooled record count (shuffled ciphertexts)"
    return content, arrays, False, "ciphertexts under a key it does not hold"


class ViewRecorder:
    """Wrap one role: record every message it receives and sends (see the module docstring).

    Attributes other than ``receive``/``begin``/``abort`` go to the wrapped role, so the
    recorder stands wherever the role does (in a SessionHost).
    """

    def __init__(self, role: object, directory: str | Path) -> None:
        self.role = role
        self.name = role.name
        session = getattr(role, "session_id", "session")
        self.root = Path(directory) / session / self.name
        if getattr(getattr(role, "options", None), "resume", False):  # a re-run's view beside the first run's
            self.root = next(root for k in itertools.count(1) if not (root := Path(directory) / f"{session}.resume-{k}" / self.name).exists())
        for made in (Path(directory), Path(directory) / session, self.root, self.root / "messages", self.root / "decoded"):
            made.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)  # a view holds what the node decoded: its operator's only
        self._seq = 0
        self._lock = threading.Lock()
        self._file = self.root / VIEW_FILE
        self._file.touch(mode=PRIVATE_FILE)
        options = getattr(role, "options", None)
        if options is not None:  # the StartSession parameters every node knows
            atomic_write_json(self.root / SESSION_FILE, MessageToDict(options.to_config(), preserving_proto_field_name=True), file_mode=PRIVATE_FILE)

    def __getattr__(self, name: str):
        return getattr(self.role, name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("phase_hook", "send_window"):  # the host's accounting hook and window belong to the wrapped role
            setattr(self.role, name, value)
        else:
            super().__setattr__(name, value)

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Record the message (decoded as this node can), pass it on, record what it sends.  Its
        number on the link (``Envelope.seq``) is the sending host's, added after its role made
        it: a view records the roles' messages, so it is left out on both sides."""
        seq = self._record("received", sender, _unnumbered(envelope))
        try:
            out = self.role.receive(sender, envelope)
        except ProtocolError as exc:
            self._note(seq, {"refused": f"{exc.code}: {exc}"})
            raise
        return self._sent(out)

    def begin(self) -> list[Outgoing]:
        return self._sent(self.role.begin())

    def abort(self, notice: cels_pb2.Abort, detail: str = "") -> list[Outgoing]:
        return self._sent(self.role.abort(notice, detail))

    def drained(self) -> list[Outgoing]:
        return self._sent(self.role.drained())

    def _sent(self, out: list[Outgoing]) -> list[Outgoing]:
        for recipient, envelope in out:
            self._record("sent", recipient, envelope)
        return out

    def _record(self, direction: str, peer: str, envelope: Envelope) -> int:
        data = envelope.SerializeToString()
        step = step_name(envelope)
        content, arrays, decodable, learns = describe(self.role, direction, envelope)
        with self._lock:
            seq = self._seq
            self._seq += 1
            stem = f"{seq:06d}"
            message = f"messages/{stem}-{direction}-{step}.pb"
            with atomic_write(self.root / message, "wb", file_mode=PRIVATE_FILE) as fh:
                fh.write(data)
            decoded = {}
            for name, array in arrays.items():
                decoded[name] = f"decoded/{stem}-{name}.npy"
                with atomic_write(self.root / decoded[name], "wb", file_mode=PRIVATE_FILE) as fh:
                    np.save(fh, array, allow_pickle=False)
            record = {
                "seq": seq,
                "time": time.time(),
                "session": envelope.session_id,
                "node": self.name,
                "kind": type(self.role).__name__,
                "direction": direction,
                "peer": peer,
                "step": step,
                "phase": phase_of(envelope, getattr(self.role, "charged", None) or SESSION_CHARGES["private"]),  # a bare sub-protocol (cels.attacks): the sampled release's
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "content": content,
                "decodable": decodable,
                "learns": learns,
                "decoded": decoded,
                "message": message,
            }
            with open(self._file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=float) + "\n")
        return seq

    def _note(self, seq: int, extra: dict) -> None:
        with self._lock, open(self._file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"seq": seq, "note": extra}) + "\n")


PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
"""A recorded view's modes (it holds decoded messages)."""


def _unnumbered(envelope: Envelope) -> Envelope:
    """The envelope as its sender's role made it, without the link number its host added."""
    if not envelope.seq:
        return envelope
    plain = Envelope()
    plain.CopyFrom(envelope)
    plain.seq = 0
    return plain


def record_views(factory: Callable, directory: str | Path) -> Callable:
    """Wrap a role factory so that every role it makes records its view under ``directory``."""
    return lambda *args, **kwargs: ViewRecorder(factory(*args, **kwargs), directory)


def record_hosts(hosts: dict, directory: str | Path) -> dict:
    """Make every SessionHost of ``hosts`` record the views of the roles it creates."""
    for node in hosts.values():
        host = getattr(node, "host", node)  # a SessionHost, or an in-memory node around one
        host.make_role = record_views(host.make_role, directory)
    return hosts


def record_session(logs: Sequence[SearchLog], options: SessionOptions, directory: str | Path, **role_options: Any) -> dict[str, Role]:
    """Run one session in memory (party k over ``logs[k]``; ``role_options`` go to every role)
    with every node's view recorded under ``directory``; returns the session's role on every
    node.  Raises RuntimeError naming the node and its reason if the session aborts."""
    roles = start_session(InMemoryNetwork(record_hosts(session_hosts(logs, options, **role_options), directory)), options)
    if (aborted := abort_message(roles)) is not None:
        raise RuntimeError(aborted)
    return roles
