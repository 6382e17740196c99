"""Recorded views read back (:mod:`cels.views.record` writes them): entries, summaries per
phase, the session's message arrows and its Mermaid sequence diagram (``cels views DIR``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.json_format import ParseDict, ParseError

from cels.protocol.phases import WORK_PHASES, Phase
from cels.protocol.roles import Envelope
from cels.protocol.wire import cels_pb2

VIEW_FILE = "view.jsonl"
SESSION_FILE = "session.json"
PHASE_ORDER = (Phase.CONTROL, *WORK_PHASES[1:])
"""The order a view shows its messages in: session control, then the phases that send (the load sends none)."""

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
        first = next((a.label for a in ordered if a.phase == Phase.SAMPLING), None)
        stage = first.split("[", 1)[1] if first and "[" in first else None
        ordered = [a for a in ordered if a.phase != Phase.SAMPLING or stage is None or a.label.endswith(f"[{stage}")]
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
            note = phase + (" (first stage shown)" if phase == Phase.SAMPLING else "")
            lines.append(f"    Note over {alias[nodes[0]]},{alias[nodes[-1]]}: {note}")
        lines.append(f"    {alias[a.sender]}->>{alias[a.recipient]}: {a.label} ({_size(a.bytes)})")
    return "\n".join(lines) + "\n"


