"""A party's ledger file and its key (cels.node.ledger keeps the budget; docs/site-rules.md,
"Privacy budget ledger").

The file is JSON, mode 0600, written atomically with its directory fsync'ed, under an
inter-process lock (``NAME.ledger.lock``).  Its entries form an append-only chain: each
carries the MAC of the one before (``prev``) and its own (``mac``), HMAC-SHA256 under a 32-byte
key the node made at its first start (``NAME.ledger.key``, 0600), and the file carries a MAC
of the whole.  Reading refuses (:class:`LedgerError`) an entry edited, dropped or reordered, a
digest recomputed without the key, a ledger missing while its key exists, and a key missing
while its ledger exists.  The running sessions' reservations are shown beside it
(:func:`reservations_path`).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cels.fileio import atomic_write, atomic_write_json

LEDGER_VERSION = 2
"""Version 2: MAC-chained entries; a version 1 file (an unkeyed SHA-256) is signed once when
its node first opens it with no key yet."""
PRIVATE = 0o600
KEY_BYTES = 32
ENTRY_FIELDS = {
    "session_id": str, "finished_at": (int, float), "epsilon": (int, float), "delta": (int, float),
    "noise_epsilon": (int, float), "epsilon_total": (int, float), "end_to_end": bool, "parties": list, "initiator": str,
}  # fmt: skip


class LedgerError(ValueError):
    """The ledger file is unreadable or corrupted (named, with what is wrong)."""


def digest(entries: list[dict[str, Any]]) -> str:
    """The unkeyed SHA-256 of a version 1 file's entries (read once, to sign them)."""
    return hashlib.sha256(canonical(entries)).hexdigest()


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def mac(key: bytes, obj: Any) -> str:
    """HMAC-SHA256 of ``obj``'s canonical JSON under the ledger key."""
    return hmac.new(key, canonical(obj), hashlib.sha256).hexdigest()


def key_path(path: Path) -> Path:
    """The default MAC key file of ledger ``path``: ``NAME.ledger.key`` beside it."""
    return path.with_name(f"{path.stem}.key")


def lock_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}.lock")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """The ledger's inter-process lock (flock on ``NAME.ledger.lock``): one writer at a time,
    in this process or another."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, PRIVATE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_key(path: Path, key_file: Path, create: bool) -> bytes | None:
    """The ledger's MAC key.  With ``create``, a node's first start (neither file there) makes
    one (0600); a key without its ledger, or a ledger without its key, is refused."""
    try:
        key = key_file.read_bytes()
    except FileNotFoundError:
        if path.exists() and file_version(path) != 1:
            raise LedgerError(f"ledger {path}: its MAC key {key_file} is missing; refusing to trust an unverifiable ledger") from None
        if not create:
            return None
        key = secrets.token_bytes(KEY_BYTES)
        with atomic_write(key_file, "wb", encoding=None, file_mode=PRIVATE) as fh:
            fh.write(key)
        return key
    except OSError as exc:
        raise LedgerError(f"ledger {path}: cannot read its key {key_file}: {exc}") from None
    if len(key) != KEY_BYTES:
        raise LedgerError(f"ledger {path}: its key {key_file} is {len(key)} bytes, not {KEY_BYTES}")
    if not path.exists():
        raise LedgerError(
            f"ledger {path} is missing but its key {key_file} exists (deleted?); refusing to start with the spent budget reset "
            "(a node that never recorded a session: remove the key too)"
        )
    return key


def file_version(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None


def write_entries(path: Path, key: bytes, entries: list[dict[str, Any]]) -> None:
    """The whole ledger, atomically, 0600, with its MAC (under :func:`locked`)."""
    atomic_write_json(path, {"version": LEDGER_VERSION, "sessions": entries, "mac": mac(key, {"version": LEDGER_VERSION, "sessions": entries})}, file_mode=PRIVATE)


def chained(key: bytes, entries: list[dict[str, Any]], entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` linked after ``entries``: the previous entry's MAC, then its own."""
    linked = {**entry, "prev": entries[-1]["mac"] if entries else ""}
    return {**linked, "mac": mac(key, linked)}


def read_entries(path: Path, key_file: Path | None = None) -> list[dict[str, Any]]:
    """The sessions in the ledger file ([] before the node's first start); LedgerError if it
    is corrupted, its chain or MAC fails, or it or its key is missing alone."""
    key = read_key(path, key_file or key_path(path), create=False)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LedgerError(f"ledger {path}: cannot read: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"ledger {path} is corrupted: not JSON ({exc}); refusing to guess the spent budget") from None
    if not isinstance(doc, dict) or doc.get("version") not in (1, LEDGER_VERSION) or not isinstance(doc.get("sessions"), list):
        raise LedgerError(f"ledger {path} is corrupted: expected {{version: {LEDGER_VERSION}, sessions: [...], mac}}")
    for i, entry in enumerate(doc["sessions"]):
        if not isinstance(entry, dict):
            raise LedgerError(f"ledger {path} is corrupted: session {i} is not an object")
        for field, kind in ENTRY_FIELDS.items():
            if not isinstance(entry.get(field), kind):
                raise LedgerError(f"ledger {path} is corrupted: session {i} field {field!r} is {entry.get(field)!r}")
    if doc["version"] == 1:
        if key is not None:
            raise LedgerError(f"ledger {path} is corrupted: an unkeyed version 1 file beside the key {key_file or key_path(path)} (replaced?)")
        if doc.get("sha256") != digest(doc["sessions"]):
            raise LedgerError(f"ledger {path} is corrupted: its sessions do not match their SHA-256 digest (edited or truncated?)")
        return doc["sessions"]
    if key is None or not hmac.compare_digest(str(doc.get("mac")), mac(key, {"version": LEDGER_VERSION, "sessions": doc["sessions"]})):
        raise LedgerError(f"ledger {path} is corrupted: its MAC does not match (edited, or entries dropped?)")
    prev = ""
    for i, entry in enumerate(doc["sessions"]):
        body = {k: v for k, v in entry.items() if k != "mac"}
        if entry.get("prev") != prev or not hmac.compare_digest(str(entry.get("mac")), mac(key, body)):
            raise LedgerError(f"ledger {path} is corrupted: session {i} breaks the chain of MACs")
        prev = entry["mac"]
    return doc["sessions"]


@dataclass(frozen=True)
class Reservation:
    """The cost a running session holds against the budget, and since when (seconds, wall clock)."""

    epsilon: float
    delta: float
    since: float


def reservations_path(path: Path) -> Path:
    """Where a node shows its running sessions' reservations: ``NAME.ledger.reserved.json``
    beside ``NAME.ledger.json``."""
    return path.with_name(f"{path.stem}.reserved.json")


def read_reservations(path: Path) -> tuple[dict[str, Reservation], int | None]:
    """The reservations a node wrote beside ledger ``path`` and that node's pid ({}, None:
    none written); LedgerError if the file is unreadable."""
    shown = reservations_path(path)
    try:
        doc = json.loads(shown.read_text(encoding="utf-8"))
        return {sid: Reservation(float(r["epsilon"]), float(r["delta"]), float(r["since"])) for sid, r in doc["reserved"].items()}, int(doc["pid"])
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"reservations {shown} are unreadable: {exc!r}") from None
