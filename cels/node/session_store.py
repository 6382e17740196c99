"""A node's unfinished sessions on disk, so that a session that a restart aborted can be run
again with the same keys (docs/deployment.md, "Resume after a node restart").

Under the node's state directory (``[node] state_dir``, mode 0700, made and checked at start-up),
per session (file names: the SHA-256 of its id):

- ``ID.json`` (0600, written atomically): the digest of the session's options
  (:meth:`cels.protocol.options.SessionOptions.digest`) and of the party's input
  (:func:`input_digest`; none on the solver), the node's draw root (its one secret: every key
  of the session derives from it, cels.crypto.streams.DrawKeys), whether it is seeded, the
  phase the node reached, and when the session was made;
- ``ID.received``: one JSON line per step message this node took: its sender, its identity
  (the step and its header fields: ids, rounds, hops, offsets; :func:`identity`) and the
  SHA-256 of its bytes;
- ``ID.hashes``: a party's universe hashes and union layers, which a re-run reads instead of
  computing them again (cels.node.hash_cache).

Written when the role is made (StartSession) and at each phase; removed when the session ends
with its output, or aborts for good (a refusal, a broken rule, a bad input); kept when it
aborts because a node or the controller went away (cels.protocol.aborts.RESUMABLE), or when
this node dies.  A re-run (``options.resume``) takes the kept draw root, so that this node sends
every message again byte for byte (docs/crypto.md, Randomness); it is refused if nothing is
kept, or if the options or the input changed (and the record goes: the session is over for
good).  A message taken again whose bytes differ from the first run's message of the same
identity is an equivocation: refused, and the session aborts for good.  Records older than
:data:`KEEP_DAYS` go at start-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cels.crypto.streams import DrawKeys
from cels.fileio import atomic_write_json
from cels.node.hash_cache import HashCache, SessionKey, cached
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, Refusal, step_name
from cels.protocol.wire import cels_pb2

log = logging.getLogger("cels.node")

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
KEEP_DAYS = 7.0
"""Days a session's keys are kept for a re-run; older records go when the node starts."""
SUFFIXES = (".json", ".received", ".hashes")
"""A kept session's files: its record, what it took, its hashes."""
HASH_CACHE = "hash cache"
"""The draw-key label of the MAC key of a session's kept hashes."""
UNCHECKED = frozenset({"abort", "step_report", "start_session"})
"""Session control, not a protocol step: never compared (a StepReport carries the run's timings)."""


@dataclass(frozen=True)
class Taken:
    """A step message as a kept session records it: its sender, identity, occurrence and SHA-256."""

    session_id: str
    sender: str
    identity: str
    occurrence: int
    sha256: str


class Equivocation(ValueError):
    """A peer sent, in a re-run, other bytes for a message it had sent in the first run."""


def input_digest(path: Path) -> str:
    """SHA-256 over the input's files (one file, or a dataset directory's files in name order):
    each one's path relative to ``path``, size and modification time in nanoseconds.  Not its
    bytes: a data lake's dataset is not read twice to start a session; an input rewritten with
    its size and time restored is not noticed.  A missing input has a digest too: its load fails
    the session, naming the file (cels.engine)."""
    if not path.exists():
        return hashlib.sha256(b"absent\n" + str(path).encode()).hexdigest()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(json.dumps([str(f.relative_to(path)) if f != path else f.name, st.st_size, st.st_mtime_ns]).encode() + b"\n")
    return h.hexdigest()


def identity(envelope: Envelope) -> str:
    """A step message's identity: its step and its header fields (every scalar field but bytes
    and text payloads of the step message: sum ids, rounds, hops, offsets), as canonical JSON."""
    step = envelope.WhichOneof("step")
    body = getattr(envelope, step)
    header = {f.name: v for f, v in body.ListFields() if not f.is_repeated and f.type not in (f.TYPE_BYTES, f.TYPE_MESSAGE)}
    return json.dumps([step, header], sort_keys=True)


class SessionStore:
    """The kept sessions of one node (``directory`` None: none kept, no re-run possible)."""

    def __init__(self, directory: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.directory, self.clock = directory, clock
        self._lock = threading.Lock()
        self._taken: dict[str, Counter] = {}  # session id -> how often each (sender, identity) was taken in this run
        self._first: dict[str, dict[tuple[str, str, int], str]] = {}  # a re-run: the first run's digests

    @classmethod
    def open(cls, directory: Path | None) -> SessionStore:
        """The node's state directory, made 0700 (refused if another user can read it); records
        older than :data:`KEEP_DAYS` removed."""
        store = cls(directory)
        if directory is None:
            return store
        directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        mode = stat.S_IMODE(directory.stat().st_mode)
        if mode & 0o077:
            raise ValueError(f"state directory {directory} is mode {mode:o}: others can read the sessions' keys (chmod 700 it)")
        for record in store.kept():
            if store.clock() - record["created_at"] > KEEP_DAYS * 86400:
                log.info("state %s: session %s is older than %g days: its keys go", directory, record["session_id"], KEEP_DAYS)
                store.forget(record["session_id"])
        return store

    # -- files ------------------------------------------------------------------------------
    def _path(self, session_id: str, suffix: str) -> Path:
        assert self.directory is not None
        return self.directory / (hashlib.sha256(session_id.encode()).hexdigest()[:32] + suffix)

    def _read(self, session_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(session_id, ".json").read_text())
        except FileNotFoundError:
            return None

    def kept(self) -> list[dict[str, Any]]:
        """Every kept session's record (its draw root included: for this node only)."""
        if self.directory is None:
            return []
        out = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("state %s: unreadable record %s (%s): left alone", self.directory, path.name, exc)
        return out

    def forget(self, session_id: str) -> None:
        """The session is over for good here: its keys, its received digests and its hashes go."""
        if self.directory is None:
            return
        with self._lock:
            self._taken.pop(session_id, None)
            self._first.pop(session_id, None)
            for suffix in SUFFIXES:
                self._path(session_id, suffix).unlink(missing_ok=True)

    # -- a session's life -------------------------------------------------------------------
    def draws(self, options: SessionOptions, digest: str | None, fresh: Callable[[], DrawKeys]) -> DrawKeys:
        """This node's draw keys for the session: ``fresh()`` kept for a first run (refused if
        the id's keys are kept already); for a re-run, the kept ones, if the options and the
        input (``digest``) are as they were (a Refusal otherwise, and the record goes)."""
        sid = options.session_id
        if not options.resume:
            if self.directory is not None and self._read(sid) is not None:  # a new session under a kept id: no
                raise Refusal("the session id is taken", f"session {sid}: its keys are kept for a re-run (cels run --resume)")
            draws = fresh()
            if self.directory is not None:
                record = {"session_id": sid, "options": options.digest(), "input": digest, "root": draws.root_bytes().hex(),
                          "seeded": draws.seeded, "phase": str(Phase.READY), "created_at": self.clock()}  # fmt: skip
                atomic_write_json(self._path(sid, ".json"), record, file_mode=PRIVATE_FILE)
                for suffix in SUFFIXES[1:]:  # a first run's: nothing of another session under its id
                    self._path(sid, suffix).unlink(missing_ok=True)
                with self._lock:
                    self._taken[sid], self._first[sid] = Counter(), {}
            return draws
        if self.directory is None:
            raise Refusal("no state kept to resume the session", f"session {sid}: this node keeps no session state (no [node] state_dir)")
        record = self._read(sid)
        if record is None:
            raise Refusal("no state kept to resume the session", f"session {sid}: nothing kept in {self.directory} (never here, ended for good, or older than {KEEP_DAYS:g} days)")
        for what, now in (("options", options.digest()), ("input", digest)):
            if record[what] != now:
                self.forget(sid)
                raise Refusal(f"the session's {what} changed since its first run", f"session {sid}: the {what} digest is {now}, was {record[what]}: the session is over for good here")
        first: dict[tuple[str, str, int], str] = {}
        seen: Counter = Counter()
        try:
            lines = self._path(sid, ".received").read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                sender, ident, sha = json.loads(line)
            except ValueError:  # a line cut by the node's death: the last one
                break
            first[(sender, ident, seen[(sender, ident)])] = sha
            seen[(sender, ident)] += 1
        with self._lock:
            self._taken[sid], self._first[sid] = Counter(), first
        log.info("state %s: session %s runs again with its kept keys (reached %s); %d message(s) of its first run to compare",
                 self.directory, sid, record["phase"], len(first))  # fmt: skip
        return DrawKeys(bytes.fromhex(record["root"]), seeded=record["seeded"])

    def keeping(self, options: SessionOptions, draws: DrawKeys) -> Callable[[SessionKey], SessionKey] | None:
        """What makes a party's universe and union keys keep their results for a re-run, and
        answer a re-run's calls from them (cels.node.hash_cache); None where the node keeps no session."""
        if self.directory is None:
            return None
        cache = HashCache(self._path(options.session_id, ".hashes"), draws.secret(HASH_CACHE))
        return lambda cipher: cached(cipher, cache)

    def check(self, sender: str, envelope: Envelope) -> Taken | None:
        """Raise :class:`Equivocation` if a re-run's message differs from the first run's of
        the same identity.  Nothing changes: the key returned goes to :meth:`taken` once the
        host took the message (None: a message no session here keeps)."""
        sid = envelope.session_id
        if sid not in self._taken or step_name(envelope) in UNCHECKED:
            return None
        ident = identity(envelope)
        key = Taken(sid, sender, ident, self._taken[sid][(sender, ident)], hashlib.sha256(envelope.SerializeToString(deterministic=True)).hexdigest())
        was = self._first.get(sid, {}).get((sender, ident, key.occurrence))
        if was is not None and was != key.sha256:
            raise Equivocation(f"{sender} sent other bytes for {step_name(envelope)} #{key.occurrence + 1} ({ident}) than in the session's first run")
        return key

    def taken(self, key: Taken | None) -> None:
        """The host took the message :meth:`check` saw: its digest is appended (for a later re-run's check)."""
        if key is None:
            return
        with self._lock:
            if key.session_id not in self._taken:  # the session ended meanwhile
                return
            self._taken[key.session_id][(key.sender, key.identity)] += 1
            with open(self._path(key.session_id, ".received"), "a", encoding="utf-8", opener=_private_opener) as fh:
                fh.write(json.dumps([key.sender, key.identity, key.sha256]) + "\n")

    def phase(self, session_id: str, phase: str) -> None:
        """The phase this node reached in a kept session (``cels status`` shows it)."""
        record = self._read(session_id) if self.directory is not None and session_id in self._taken else None
        if record is not None:
            record["phase"] = phase
            atomic_write_json(self._path(session_id, ".json"), record, file_mode=PRIVATE_FILE)

    def ended(self, session_id: str, resumable: bool) -> None:
        """The session ended here: kept for a re-run if ``resumable``, else forgotten."""
        with self._lock:
            self._taken.pop(session_id, None)
            self._first.pop(session_id, None)
        if not resumable:
            self.forget(session_id)


def list_resumable(status: cels_pb2.NodeStatus, store: SessionStore, running: Collection[str]) -> None:
    """``cels status``: the sessions whose keys ``store`` keeps and that do not run here, as
    outcome "resumable" with the phase the node reached (one already listed, aborted, changes)."""
    listed = {s.session_id: s for s in status.sessions}
    for record in store.kept():
        sid = record["session_id"]
        if sid in running:
            continue
        summary = listed.get(sid) or status.sessions.add(session_id=sid, phase=record["phase"], started_at=record["created_at"])
        summary.outcome = "resumable"


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, PRIVATE_FILE)
