"""Each node's view of a session: every message it receives and sends, recorded to disk.

A :class:`ViewRecorder` wraps one role (a PartyRole, SolverRole or any sub-protocol object with
``receive(sender, envelope)``): it forwards every call and records, per message, the
direction, peer, step, phase, wire size, a summary of the fields, whether this node can decode
the content and what it learns from it.  Files (never pickles)::

    DIR/<session>/<node>/view.jsonl           one JSON object per message, in order
    DIR/<session>/<node>/session.json         the session's public parameters (StartSession)
    DIR/<session>/<node>/messages/<seq>-<direction>-<step>.pb   the Envelope's wire bytes
    DIR/<session>/<node>/decoded/<seq>-<field>.npy   what the node decodes (allow_pickle=False)

"Decodes" means what the node itself can read: plaintext steps (totals, shapes, solutions,
the output), and ciphertexts under a Paillier key this node holds -- P_0's NLP key (so P_0's
recorded view holds the decrypted AF blocks, AB and the permuted AT with its count row,
exactly what Algorithm 2 line 12 gives it) and P_1's secure-sum key.  Private keys are read
from the wrapped role in its own process and are never written.  A recorded solver view is
therefore as sensitive as the logs: it is what an honest-but-curious P_0 keeps.

Wiring: ``record_views(factory, DIR)`` wraps a role factory (``factory(config)`` of
:mod:`cels.protocol.session` or ``factory(config, name)`` of the gRPC nodes);
``run_session(..., record_view=DIR)`` does it for every node of an in-memory session.
:func:`load_views`, :func:`summarise`, :func:`mermaid` and :func:`sequence_png` read them back
(``cels views DIR``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

from cels.crypto import paillier
from cels.fileio import atomic_write, atomic_write_json
from cels.protocol.rolebase import phase_of
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, step_name
from cels.protocol.wire import cels_pb2, codec

VIEW_FILE = "view.jsonl"
SESSION_FILE = "session.json"
PHASE_ORDER = ("control", "universe", "counts", "nlp", "sampling", "union")

PLAINTEXT_STEPS = {
    "start_session": "the session's public parameters",
    "abort": "why a node gave up",
    "step_report": "a node's seconds and bytes per phase",
    "sum_key": "a Paillier public key",
    "sum_result": "the summed vector (public by design)",
    "constraint_shape": "m_k, how many condition rows a party sends",
    "nlp_key": "P_0's public key, l and every party's m_k",
    "nlp_solution": "the solution x (permuted until every party has un-permuted it)",
    "union_result": "the union of the sampled records (the published output)",
}
"""Steps whose content every recipient reads in the clear."""


def _private_keys(role: object) -> list[paillier.PrivateKey]:
    """The Paillier private keys the wrapped role holds right now: P_0's NLP key while it is
    live, P_1's secure-sum key.  Read in the node's own process, used to record what the node
    can decrypt, never written."""
    keys = [getattr(role, "_private_key", None)]
    pair = getattr(role, "_sum_keypair", None)
    if pair is not None:
        keys.append(pair[1])
    return [k for k in keys if k is not None]


def _decrypt(keys: list[paillier.PrivateKey], msg: cels_pb2.EncryptedMatrix) -> np.ndarray | None:
    """The matrix in ``msg`` if one of ``keys`` opens it (a wrong key fails the slot checks)."""
    for key in keys:
        try:
            return paillier.decrypt(key, codec.matrix_of(msg, key.public_key))
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
        arrays["values"] = np.asarray(msg.values, dtype=np.int64)
    elif step == "nlp_solution":
        arrays["x"] = np.asarray(msg.x, dtype=np.int64)
    if step in PLAINTEXT_STEPS:
        return content, arrays, True, PLAINTEXT_STEPS[step]
    if direction == "sent":
        return content, arrays, True, "(its own message)"
    keys = _private_keys(role)
    for name in DECRYPTED:
        if name in msg.DESCRIPTOR.fields_by_name and msg.HasField(name):
            plain = _decrypt(keys, getattr(msg, name))
            if plain is not None:
                arrays[name] = plain
    if arrays:
        return content, arrays, True, "decrypts " + ", ".join(DECRYPTED[k] for k in arrays)
    if step == "universe_hop":
        return content, arrays, False, _universe_learns(msg, getattr(role, "name", ""))
    if step == "universe_index":
        return content, arrays, False, "the size of the union of all pairs (hashed ids)"
    if step == "union_encrypt_hop":
        return content, arrays, False, "the owner and size of a party's sampled set (ciphertexts)"
    if step == "union_decrypt_hop":
        r = len(getattr(role, "parties", getattr(role, "ring", ())))
        if msg.hops == r - 1:
            return content, arrays, True, "after its own layer: the pooled, shuffled plaintext records (= the output)"
        return content, arrays, False, "the pooled record count (shuffled ciphertexts)"
    return content, arrays, False, "ciphertexts under a key it does not hold"


@dataclass
class ViewEntry:
    """One recorded message of one node (a line of view.jsonl), with its files."""

    record: dict
    root: Path

    def __getitem__(self, key: str):
        return self.record[key]

    def get(self, key: str, default=None):
        return self.record.get(key, default)

    def envelope(self) -> Envelope:
        """The message as it crossed the wire (parsed from the .pb file)."""
        return Envelope.FromString((self.root / self.record["message"]).read_bytes())

    def array(self, name: str) -> np.ndarray:
        """A decoded array (``record["decoded"]`` names them)."""
        return np.load(self.root / self.record["decoded"][name], allow_pickle=False)


@dataclass
class NodeView:
    """The recorded view of one node in one session."""

    session: str
    node: str
    kind: str
    root: Path
    entries: list[ViewEntry] = field(default_factory=list)

    def config(self) -> cels_pb2.SessionConfig:
        """The session's public parameters as this node received them."""
        path = self.root / SESSION_FILE
        try:
            return ParseDict(json.loads(path.read_text(encoding="utf-8")), cels_pb2.SessionConfig())
        except (OSError, ValueError, ParseError) as exc:
            raise ValueError(f"{path}: no readable session parameters ({exc})") from None

    def find(self, direction: str, step: str) -> list[ViewEntry]:
        """The entries of one direction and step, in order."""
        return [e for e in self.entries if e["direction"] == direction and e["step"] == step]


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
        (self.root / "messages").mkdir(parents=True, exist_ok=True)
        (self.root / "decoded").mkdir(exist_ok=True)
        self._seq = 0
        self._lock = threading.Lock()
        self._file = self.root / VIEW_FILE
        self._file.touch()
        options = getattr(role, "options", None)
        if options is not None:  # the StartSession parameters every node knows
            atomic_write_json(self.root / SESSION_FILE, MessageToDict(options.to_config(), preserving_proto_field_name=True))

    def __getattr__(self, name: str):
        return getattr(self.role, name)

    def __setattr__(self, name: str, value) -> None:
        if name == "phase_hook":  # the host's accounting hook belongs to the wrapped role
            setattr(self.role, name, value)
        else:
            super().__setattr__(name, value)

    def receive(self, sender: str, envelope: Envelope) -> list[Outgoing]:
        """Record the message (decoded as this node can), pass it on, record what it sends."""
        seq = self._record("received", sender, envelope)
        try:
            out = self.role.receive(sender, envelope)
        except ProtocolError as exc:
            self._note(seq, {"refused": f"{exc.code}: {exc}"})
            raise
        return self._sent(out)

    def begin(self) -> list[Outgoing]:
        return self._sent(self.role.begin())

    def abort(self, reason: str) -> list[Outgoing]:
        return self._sent(self.role.abort(reason))

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
            with atomic_write(self.root / message, "wb") as fh:
                fh.write(data)
            decoded = {}
            for name, array in arrays.items():
                decoded[name] = f"decoded/{stem}-{name}.npy"
                with atomic_write(self.root / decoded[name], "wb") as fh:
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
                "phase": phase_of(envelope),
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


def record_views(factory: Callable, directory: str | Path) -> Callable:
    """Wrap a role factory so that every role it makes records its view under ``directory``."""
    return lambda *args, **kwargs: ViewRecorder(factory(*args, **kwargs), directory)


def record_hosts(hosts: dict, directory: str | Path) -> dict:
    """Make every SessionHost of ``hosts`` record the views of the roles it creates."""
    for node in hosts.values():
        host = getattr(node, "host", node)  # a SessionHost, or an in-memory node around one
        host.make_role = record_views(host.make_role, directory)
    return hosts


# -- reading views back ----------------------------------------------------------------------


def load_node_view(root: str | Path) -> NodeView:
    """One node's recorded view (``root`` holds view.jsonl); notes are merged into entries."""
    root = Path(root)
    entries: dict[int, ViewEntry] = {}
    with open(root / VIEW_FILE, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
                seq = rec["seq"]
            except (ValueError, KeyError) as exc:
                raise ValueError(f"{root / VIEW_FILE}, line {lineno}: not a view record ({exc})") from None
            if "note" in rec:
                if seq not in entries:
                    raise ValueError(f"{root / VIEW_FILE}, line {lineno}, field seq: note for unknown message {seq}")
                entries[seq].record.update(rec["note"])
            else:
                entries[seq] = ViewEntry(rec, root)
    ordered = [entries[s] for s in sorted(entries)]
    kind = ordered[0]["kind"] if ordered else "unknown"
    return NodeView(session=root.parent.name, node=root.name, kind=kind, root=root, entries=ordered)


def load_views(directory: str | Path) -> dict[str, dict[str, NodeView]]:
    """Every recorded view under ``directory``: {session: {node: NodeView}}."""
    out: dict[str, dict[str, NodeView]] = defaultdict(dict)
    for path in sorted(Path(directory).rglob(VIEW_FILE)):
        view = load_node_view(path.parent)
        out[view.session][view.node] = view
    if not out:
        raise ValueError(f"{directory}: no recorded views ({VIEW_FILE}) found")
    return dict(out)


def _phase_key(phase: str) -> int:
    return PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER)


def summarise(view: NodeView) -> list[dict]:
    """Per phase: messages and bytes received and sent, steps it decodes, what it learns."""
    rows: dict[str, dict] = {}
    for e in view.entries:
        row = rows.setdefault(
            e["phase"],
            {"phase": e["phase"], "received": 0, "received_bytes": 0, "sent": 0, "sent_bytes": 0,
             "decodes": [], "cannot_decode": [], "learns": []},
        )  # fmt: skip
        row[e["direction"]] += 1
        row[f"{e['direction']}_bytes"] += e["bytes"]
        if e["direction"] != "received":
            continue
        target = row["decodes"] if e["decodable"] else row["cannot_decode"]
        if e["step"] not in target:
            target.append(e["step"])
        if e["learns"] not in row["learns"]:
            row["learns"].append(e["learns"])
    return [rows[p] for p in sorted(rows, key=_phase_key)]


def summary_markdown(views: dict[str, NodeView]) -> str:
    """One table per node of a session (Markdown)."""
    parts = []
    for node in sorted(views, key=_node_key):
        view = views[node]
        parts.append(f"### {node} ({view.kind})\n")
        parts.append("| phase | received (msgs / bytes) | sent (msgs / bytes) | decodes | cannot decode | learns |")
        parts.append("| --- | --- | --- | --- | --- | --- |")
        for row in summarise(view):
            parts.append(
                f"| {row['phase']} | {row['received']} / {row['received_bytes']:,} | {row['sent']} / {row['sent_bytes']:,} "
                f"| {', '.join(row['decodes']) or '-'} | {', '.join(row['cannot_decode']) or '-'} "
                f"| {'; '.join(row['learns']) or '-'} |"
            )
        parts.append("")
    return "\n".join(parts)


def _node_key(node: str) -> tuple:
    head, _, tail = node.rpartition("-")
    return (head == "" or not tail.isdigit(), head, int(tail) if tail.isdigit() else 0, node)


@dataclass(frozen=True)
class Arrow:
    """One message of the sequence diagram."""

    sender: str
    recipient: str
    step: str
    phase: str
    bytes: int
    time: float
    label: str


def arrows(views: dict[str, NodeView], fold_sampling: bool = True) -> list[Arrow]:
    """Every message of a session once, in send order (from the sender's view if recorded,
    else the recipient's).  ``fold_sampling`` keeps only the first sampling stage's sum."""
    seen: dict[tuple, Arrow] = {}
    for view in views.values():
        for e in view.entries:
            if e["direction"] == "sent":
                sender, recipient = view.node, e["peer"]
            elif e["peer"] not in views:
                sender, recipient = e["peer"], view.node
            else:
                continue
            label = e["step"]
            sum_id = e["content"].get("sum_id")
            if sum_id:
                label += f" [{sum_id}]"
            key = (sender, recipient, e["sha256"])
            seen.setdefault(key, Arrow(sender, recipient, e["step"], e["phase"], e["bytes"], e["time"], label))
    ordered = sorted(seen.values(), key=lambda a: a.time)
    if fold_sampling:
        first = next((a.label for a in ordered if a.phase == "sampling"), None)
        stage = first.split("[", 1)[1] if first and "[" in first else None
        ordered = [a for a in ordered if a.phase != "sampling" or stage is None or a.label.endswith(f"[{stage}")]
    return ordered


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _participants(views: dict[str, NodeView], drawn: Iterable[Arrow]) -> list[str]:
    names = set(views) | {a.sender for a in drawn} | {a.recipient for a in drawn}
    return sorted(names, key=_node_key)


def mermaid(views: dict[str, NodeView]) -> str:
    """A Mermaid ``sequenceDiagram`` of one session (phases as notes)."""
    drawn = arrows(views)
    nodes = _participants(views, drawn)
    alias = {n: f"N{i}" for i, n in enumerate(nodes)}
    lines = ["sequenceDiagram"] + [f"    participant {alias[n]} as {n}" for n in nodes]
    phase = None
    for a in drawn:
        if a.phase != phase:
            phase = a.phase
            note = phase + (" (first stage shown)" if phase == "sampling" else "")
            lines.append(f"    Note over {alias[nodes[0]]},{alias[nodes[-1]]}: {note}")
        lines.append(f"    {alias[a.sender]}->>{alias[a.recipient]}: {a.label} ({_size(a.bytes)})")
    return "\n".join(lines) + "\n"


def sequence_png(views: dict[str, NodeView], path: str | Path) -> None:
    """The same sequence diagram drawn with matplotlib (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = arrows(views)
    nodes = _participants(views, drawn)
    x = {n: i for i, n in enumerate(nodes)}
    height = 1.2 + 0.24 * (len(drawn) + 2)
    fig, ax = plt.subplots(figsize=(2.2 * len(nodes) + 2.5, height))
    top, bottom = 0.5, -(len(drawn) + 0.5)
    for n in nodes:
        ax.plot([x[n], x[n]], [bottom, top], color="0.6", lw=0.8, zorder=1)
        ax.text(x[n], top + 0.3, n, ha="center", va="bottom", fontsize=9, weight="bold")
    colours = dict(zip(PHASE_ORDER, ("0.9", "#dbe9f6", "#e3f1dc", "#fbe5d6", "#efe3f3", "#fff2cc")))
    start, phase = 0, None
    for i, a in enumerate([*drawn, None]):
        if a is None or a.phase != phase:
            if phase is not None:
                ax.axhspan(-(i - 0.5), -(start - 0.5), color=colours.get(phase, "0.95"), zorder=0)
                ax.text(-0.6, -(start + i - 1) / 2, phase, ha="right", va="center", fontsize=8, style="italic")
            if a is not None:
                start, phase = i, a.phase
        if a is None:
            break
        ax.annotate("", xy=(x[a.recipient], -i), xytext=(x[a.sender], -i),
                    arrowprops={"arrowstyle": "->", "lw": 0.8}, zorder=2)  # fmt: skip
        ax.text((x[a.sender] + x[a.recipient]) / 2, -i + 0.08, f"{a.label} ({_size(a.bytes)})", ha="center",
                va="bottom", fontsize=6)  # fmt: skip
    ax.set_xlim(-1.8, len(nodes) - 0.4)
    ax.set_ylim(bottom - 0.2, top + 1.0)
    ax.axis("off")
    fig.tight_layout()
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
