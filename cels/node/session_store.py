"""A node's unfinished sessions on disk, so that a session that a restart aborted can be run
again with the same keys (docs/deployment.md, "Resume after a node restart").

Under the node's state directory (``[node] state_dir``, mode 0700, made and checked at start-up),
per session (file names: the SHA-256 of its id):

- ``ID.json`` (0600, written atomically): the digest of the session's options
  (:meth:`cels.protocol.options.SessionOptions.digest`) and of the party's input
  (:func:`input_digest`; none on the solver), the node's draw root (its one secret: every key
  of the session derives from it, cels.crypto.streams.DrawKeys), whether it is seeded, the
  phase the node reached, when the session was made, and whether it can run again
  (``replayable``: not with ``solve = "transformed"``, whose Paillier sums are not replayed);
- ``ID.inbound``: every step message this node's role took, in the order it took them, with
  its sender (length-prefixed: :data:`HEADER`), which a re-run replays (cels.protocol.resume);
- ``ID.hashes``: a party's universe hashes and union layers, which a re-run reads instead of
  computing them again (cels.node.hash_cache);
- ``ID.log``: a party's loaded log (0600, written atomically once it is loaded), which a re-run
  reads instead of parsing the input again (cels.logs.snapshot).

Written when the role is made (StartSession) and at each phase; removed when the session ends
with its output, or aborts for good (a refusal, a broken rule, a bad input); kept when it
aborts because a node or the controller went away (cels.protocol.aborts.RESUMABLE), or when
this node dies.  A session that cannot run again keeps its record while it runs (its id is
taken) and nothing else: it goes when the session ends, however it ends, or at the next
start-up if the node died in it.  A re-run (``options.resume``) takes the kept draw root, so that this node makes
every message again byte for byte (docs/crypto.md, Randomness), and replays what it took
(:meth:`SessionStore.record`); it is refused if nothing is kept, or if the options or the input
changed (and the record goes: the session is over for good).  Records older than
:data:`KEEP_DAYS` go at start-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from cels.crypto.streams import DrawKeys
from cels.fileio import atomic_write_json
from cels.node.hash_cache import HashCache, SessionKey, cached
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.hosted import Recorded
from cels.protocol.roles import Envelope, Refusal
from cels.protocol.wire import cels_pb2

log = logging.getLogger("cels.node")

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
KEEP_DAYS = 7.0
"""Days a session's keys are kept for a re-run; older records go when the node starts."""
SUFFIXES = (".json", ".inbound", ".hashes", ".log")
"""A kept session's files: its record, what it took, its hashes, its party's loaded log."""
HASH_CACHE = "hash cache"
"""The draw-key label of the MAC key of a session's kept hashes."""
HEADER = struct.Struct(">HI")
"""Before each message of ``ID.inbound``: its sender's length (UTF-8 bytes), then its envelope's."""


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


class SessionStore:
    """The kept sessions of one node (``directory`` None: none kept, no re-run possible)."""

    def __init__(self, directory: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.directory, self.clock = directory, clock
        self._lock = threading.Lock()
        self._live: dict[str, bool] = {}  # the kept sessions running here -> whether they can run again (``replayable``)

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
            elif not record.get("replayable", True):  # its node died in it, and it cannot run again
                log.info("state %s: session %s cannot run again (solve = transformed): its keys go", directory, record["session_id"])
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
        """The session is over for good here: its keys, what it took and its hashes go."""
        if self.directory is None:
            return
        with self._lock:
            self._live.pop(session_id, None)
            for suffix in SUFFIXES:
                self._path(session_id, suffix).unlink(missing_ok=True)

    # -- a session's life -------------------------------------------------------------------
    def draws(self, options: SessionOptions, digest: str | None, fresh: Callable[[], DrawKeys]) -> DrawKeys:
        """This node's draw keys for the session: ``fresh()`` kept for a first run (refused if
        the id's keys are kept already); for a re-run, the kept ones, if the options and the
        input (``digest``) are as they were (a Refusal otherwise, and the record goes)."""
        sid = options.session_id
        if not options.resume:
            kept = self._read(sid) if self.directory is not None else None
            if kept is not None:  # a new session under a kept id: no
                why = "its keys are kept for a re-run (cels run --resume)" if kept.get("replayable", True) else "it runs here"
                raise Refusal("the session id is taken", f"session {sid}: {why}")
            draws = fresh()
            if self.directory is not None:
                record = {"session_id": sid, "options": options.digest(), "input": digest, "root": draws.root_bytes().hex(),
                          "seeded": draws.seeded, "phase": str(Phase.READY), "created_at": self.clock(), "replayable": options.replayable}  # fmt: skip
                atomic_write_json(self._path(sid, ".json"), record, file_mode=PRIVATE_FILE)
                for suffix in SUFFIXES[1:]:  # a first run's: nothing of another session under its id
                    self._path(sid, suffix).unlink(missing_ok=True)
                with self._lock:
                    self._live[sid] = options.replayable
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
        with self._lock:
            self._live[sid] = True  # a re-run: replayable (SessionOptions refuses resume otherwise)
        log.info("state %s: session %s runs again with its kept keys, from where this node was (%s)", self.directory, sid, record["phase"])
        return DrawKeys(bytes.fromhex(record["root"]), seeded=record["seeded"])

    def _rerun_path(self, options: SessionOptions, suffix: str) -> Path | None:
        """Where a party keeps what only a re-run reads; None where the node keeps no session, or
        the session cannot be run again (``options.replayable``: Algorithm 2's Paillier sums)."""
        return self._path(options.session_id, suffix) if self.directory is not None and options.replayable else None

    def keeping(self, options: SessionOptions, draws: DrawKeys) -> Callable[[SessionKey], SessionKey] | None:
        """What makes a party's universe and union keys keep their results for a re-run, and
        answer a re-run's calls from them (cels.node.hash_cache); None where nothing is kept for one."""
        path = self._rerun_path(options, ".hashes")
        if path is None:
            return None
        cache = HashCache(path, draws.secret(HASH_CACHE))
        return lambda cipher: cached(cipher, cache)

    def snapshot(self, options: SessionOptions) -> Path | None:
        """Where a party keeps its loaded log for the session's re-run (cels.logs.snapshot);
        None where nothing is kept for one."""
        return self._rerun_path(options, ".log")

    def taken(self, sender: str, envelope: Envelope) -> None:
        """This node's role took a step message of a kept session: appended to its record (one
        write, before the message's effects are sent: a re-run replays it, and its sender, told
        so by ResumeFrom, does not send it again)."""
        sid = envelope.session_id
        if not self._live.get(sid):  # not kept, or never replayed
            return
        name, body = sender.encode(), envelope.SerializeToString(deterministic=True)
        with self._lock, open(self._path(sid, ".inbound"), "ab", buffering=0, opener=_private_opener) as fh:
            fh.write(HEADER.pack(len(name), len(body)) + name + body)

    def record(self, session_id: str) -> Recorded:
        """What this node took in the session's earlier runs (cels.protocol.resume): per sender,
        each message's SHA-256, and the messages, read as they are replayed.  A message cut short by
        the node's death is cut off the file (its sender sends it again)."""
        path = self._path(session_id, ".inbound")
        digests: dict[str, list[bytes]] = {}
        end = 0
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                while end + HEADER.size <= size:
                    n, m = HEADER.unpack(fh.read(HEADER.size))
                    if end + HEADER.size + n + m > size:
                        break
                    sender = fh.read(n).decode()
                    digests.setdefault(sender, []).append(hashlib.sha256(fh.read(m)).digest())
                    end += HEADER.size + n + m
            if end < size:
                os.truncate(path, end)
        except FileNotFoundError:
            pass
        log.info("state %s: session %s replays %d message(s) it took", self.directory, session_id, sum(map(len, digests.values())))
        return Recorded(digests, _messages(path, end))

    def phase(self, session_id: str, phase: str) -> None:
        """The phase this node reached in a kept session (``cels status`` shows it)."""
        record = self._read(session_id) if self.directory is not None and self._live.get(session_id) else None
        if record is not None:
            record["phase"] = phase
            atomic_write_json(self._path(session_id, ".json"), record, file_mode=PRIVATE_FILE)

    def ended(self, session_id: str, resumable: bool) -> None:
        """The session ended here: kept for a re-run if ``resumable`` and it can run again
        (``replayable``), else forgotten."""
        with self._lock:
            replayable = self._live.pop(session_id, False)
        if not (resumable and replayable):
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


def _messages(path: Path, end: int) -> Iterator[tuple[str, Envelope]]:
    """(sender, envelope) of each message in ``path``'s first ``end`` bytes (:data:`HEADER`)."""
    if end == 0:
        return
    with open(path, "rb") as fh:
        while fh.tell() < end:
            n, m = HEADER.unpack(fh.read(HEADER.size))
            sender = fh.read(n).decode()
            yield sender, Envelope.FromString(fh.read(m))


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, PRIVATE_FILE)
