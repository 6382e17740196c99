"""A party node's privacy budget ledger: every session it released data in, and a budget.

Each session a party takes part in spends privacy of its users: (eps, delta) for the sampling
and, with noise on the counts, eps' (CELS section 3.3).  The ledger keeps one
entry per session that finished with output and composes them by **basic composition**: k
releases that are (eps_i, delta_i)-DP are together (sum eps_i, sum delta_i)-DP (the bad
events' probabilities add up by the union bound; outside them the probability ratios
multiply).  A session's eps is eps + eps' with noise on the counts, else eps alone.  What the
sum bounds is each session's sampling given its counts: no session's counts are DP, with or
without noise (README, "What is promised"); the ledger counts the sessions without noise.
The entries' field ``end_to_end`` (kept for the file format) says whether a session had noise.

A budget (``[ledger]`` budget_epsilon / budget_delta over window_days) makes the node refuse,
when a session is opened (StartSession, before any work), a session that would take the
window's total above it: the role factory raises a Refusal, which the node turns into
FAILED_PRECONDITION with the numbers in its log and its controller's error, and an Abort
(REFUSED, "privacy budget exceeded") without them for the initiator.  Running sessions are
reserved against the budget until they end, however they end: recorded when this node's part
is done with output, released (:meth:`Ledger.release`, the node's end-of-session hook) when
the session is aborted, refused, expired or dropped.  The reservations are also written,
atomically, to a file beside the ledger (:func:`reservations_path`) for ``cels ledger``; a
node starting empties it.

The ledger fails closed (docs/site-rules.md, "Privacy budget ledger").  The file is JSON,
mode 0600, written atomically with its directory fsync'ed, under an inter-process lock
(``NAME.ledger.lock``).  Its entries form an append-only chain: each carries the MAC of the
one before (``prev``) and its own (``mac``), HMAC-SHA256 under a 32-byte key the node made at
its first start (``NAME.ledger.key``, 0600, or ``[ledger] key``), and the file carries a MAC
of the whole.  So an entry edited, dropped or reordered, or a digest recomputed without the
key, is refused loudly (the node does not start, ``cels ledger`` exits 2, a running node
refuses the next session) rather than read as a smaller spend; so is a ledger that is missing
while its key exists, or a key that is missing while its ledger exists.  What a key alone
cannot show is a rollback of both files to an earlier copy: keep them where only the node's
operator writes.  A session is charged when the party's data for the release leaves it
(its release kind's ``charged_from``: cels.protocol.releases), not when its part finishes, so an abort after that point still
counts.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cels.fileio import atomic_write_json
from cels.node.ledger_file import (
    PRIVATE, LedgerError, Reservation, chained, file_version, key_path, locked, read_entries, read_key, read_reservations,
    reservations_path, write_entries,
)
from cels.node.settings import POSITIVE
from cels.settings import add_arguments, given, setting
from cels.workers import process_alive
from cels.protocol.options import SessionOptions
from cels.protocol.phases import WORK_PHASES, Phase
from cels.protocol.roles import Refusal
from cels.protocol.releases import DP_HISTOGRAM

COMPOSITION = "basic composition: (sum of eps_i, sum of delta_i) over the sessions in the window"


@dataclass(frozen=True)
class LedgerPolicy:
    """Where the ledger lives and the budget it enforces (None: no limit)."""

    path: Path = setting(table="ledger", key="path", flag="--ledger", path=True, metavar="FILE", schema={"type": "string"},
                         help="the ledger file", shown="NAME.ledger.json beside --config; none without either")
    budget_epsilon: float | None = setting(None, table="ledger", key="budget_epsilon", flag="--budget-epsilon", metavar="E", schema=POSITIVE,
                                           help="refuse a session that takes the window's total epsilon above E")
    budget_delta: float | None = setting(None, table="ledger", key="budget_delta", flag="--budget-delta", metavar="D", schema=POSITIVE,
                                         help="refuse a session that takes the window's total delta above D")
    window_days: float | None = setting(None, table="ledger", key="window_days", flag="--budget-window-days", metavar="DAYS", schema=POSITIVE,
                                        help="sessions older than DAYS no longer count", shown="all")
    key: Path | None = setting(None, table="ledger", key="key", flag="--ledger-key", path=True, metavar="FILE", schema={"type": "string"},
                               help="the ledger's MAC key, made at the node's first start", shown="NAME.ledger.key beside the ledger")
    """The MAC key's file (default :func:`key_path` beside the ledger)."""

    def __post_init__(self) -> None:
        for name in ("budget_epsilon", "budget_delta", "window_days"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"[ledger] {name} must be positive, not {value}")
            object.__setattr__(self, name, None if value is None else float(value))

    @property
    def key_file(self) -> Path:
        return self.key if self.key is not None else key_path(self.path)


def add_ledger_arguments(parser: argparse.ArgumentParser) -> None:
    """A party's privacy budget ledger (cels.node.ledger); the flags override ``[ledger]``."""
    add_arguments(parser.add_argument_group("privacy budget ledger"), LedgerPolicy)


def ledger_policy(args: argparse.Namespace, name: str, table: dict[str, Any]) -> LedgerPolicy | None:
    """The ledger of party ``name``: flags over the ``[ledger]`` table; None without a file to
    keep it in (neither --ledger, nor [ledger] path, nor --config)."""
    base = args.config.resolve().parent if args.config else Path.cwd()
    values = given(LedgerPolicy, args, {"ledger": table}, base)
    if "path" not in values and args.config is not None:
        values["path"] = base / f"{name}.ledger.json"
    if "path" not in values:
        if values.get("budget_epsilon") is not None or values.get("budget_delta") is not None:
            raise ValueError("a privacy budget needs a ledger file (--ledger or --config)")
        return None
    return LedgerPolicy(**values)


def totals(entries: list[dict[str, Any]], window_days: float | None, now: float) -> dict[str, Any]:
    """Composed spend of the sessions in the window (all sessions without a window)."""
    since = now - window_days * 86400 if window_days else None
    inside = [e for e in entries if since is None or e["finished_at"] >= since]
    return {
        "sessions": len(inside),
        "epsilon": sum(e["epsilon_total"] for e in inside),
        "delta": sum(e["delta"] for e in inside),
        "without_end_to_end": sum(not e["end_to_end"] for e in inside),
        "dp_sessions": sum(e.get("guarantee") == DP_HISTOGRAM.guarantee for e in inside),
        "since": iso(since) if since is not None else None,
    }


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


class Ledger:
    """One party node's ledger (thread-safe).  :meth:`admit` is the node's one hook."""

    def __init__(self, policy: LedgerPolicy | None, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._reserved: dict[str, Reservation] = {}

    @classmethod
    def open(cls, policy: LedgerPolicy | None) -> Ledger:
        """A node's ledger, its file read once now (a corrupted file stops the node at start-up);
        the reservations a previous node process left are emptied (they ended with it)."""
        ledger = cls(policy)
        if policy is not None:
            try:
                with ledger._lock, locked(policy.path):
                    ledger._entries(create=True)
                    ledger._show_reserved()
            except OSError as exc:
                raise LedgerError(f"ledger {policy.path}: cannot write beside it: {exc}") from None
        return ledger

    def _entries(self, create: bool = False) -> tuple[list[dict[str, Any]], bytes | None]:
        """The ledger's entries and its key (read once); with ``create``, its key and empty file
        made at a node's first start, or a version 1 file signed when no key exists yet (under
        both locks)."""
        p = self.policy
        assert p is not None
        if create and not p.key_file.exists() and p.path.exists() and file_version(p.path) == 1:
            entries = read_entries(p.path, p.key_file)
            key = read_key(p.path, p.key_file, create=True)
            assert key is not None
            signed: list[dict[str, Any]] = []
            for entry in entries:
                signed.append(chained(key, signed, {k: v for k, v in entry.items() if k not in ("prev", "mac")}))
            write_entries(p.path, key, signed)
            return signed, key
        key = read_key(p.path, p.key_file, create=create)
        if key is not None and not p.path.exists():
            write_entries(p.path, key, [])
        return read_entries(p.path, p.key_file), key

    def admit(self, options: SessionOptions, make_role: Callable[[], Any]) -> Any:
        """Refuse the session (ValueError with the numbers) if it would exceed the budget, else
        reserve its cost, build the role and return it wrapped: the session is recorded when the
        role is done with output; the node calls :meth:`release` when the session ends.  A re-run
        (``options.resume``) of a session charged in its first run is neither checked nor charged
        again: it sends the same bytes (docs/deployment.md, "Resume after a node restart")."""
        if self.policy is None:
            return make_role()
        eps, delta, noise = options.release_kind.spends(options)
        with self._lock, locked(self.policy.path):
            entries = self._entries(create=True)[0]
            used = next((e for e in entries if e["session_id"] == options.session_id), None)
            if options.resume and used is not None:  # a re-run of a session charged in its first run: not again
                return make_role()
            if used is not None or options.session_id in self._reserved:  # a replayed id: kept across restarts here
                when = f"finished {datetime.fromtimestamp(used['finished_at'], tz=timezone.utc):%Y-%m-%d %H:%M:%S} UTC" if used else "running"
                raise Refusal("the session id is taken", f"ledger {self.policy.path}: session {options.session_id} was charged already ({when})")
            spent = totals(entries, self.policy.window_days, self.clock())
            self._check(options.session_id, spent, eps + noise, delta)
            self._reserved[options.session_id] = Reservation(eps + noise, delta, self.clock())
            self._show_reserved()
        try:
            role = make_role()
        except BaseException:
            self.release(options.session_id)
            raise
        return ChargedRole(role, lambda: self.record(options), options.release_kind.charged_from)

    def reserved(self) -> dict[str, Reservation]:
        """The running sessions' reservations, by session id."""
        with self._lock:
            return dict(self._reserved)

    def release(self, session_id: str) -> bool:
        """The session ended (aborted, refused, expired, or done): drop its reservation.  True
        if it held one; a second call, or one after :meth:`record`, changes nothing."""
        with self._lock:
            held = self._reserved.pop(session_id, None) is not None
            if held:
                self._show_reserved()
        return held

    def _show_reserved(self) -> None:
        """Write the reservations beside the ledger (``cels ledger`` reads them); under the lock."""
        assert self.policy is not None
        reserved = {sid: r.__dict__ for sid, r in self._reserved.items()}
        atomic_write_json(reservations_path(self.policy.path), {"pid": os.getpid(), "reserved": reserved}, file_mode=PRIVATE)

    def _check(self, session_id: str, spent: dict, eps: float, delta: float) -> None:
        p = self.policy
        assert p is not None
        window = f"per {p.window_days:g} days" if p.window_days else "in total"
        running = sorted(self._reserved)
        for name, budget, used, held, cost in (
            ("epsilon", p.budget_epsilon, spent["epsilon"], sum(r.epsilon for r in self._reserved.values()), eps),
            ("delta", p.budget_delta, spent["delta"], sum(r.delta for r in self._reserved.values()), delta),
        ):
            if budget is not None and used + held + cost > budget + 1e-12:
                raise Refusal(
                    "privacy budget exceeded",
                    f"privacy budget exceeded: session {session_id} needs {name} {cost:g}, but {spent['sessions']} "
                    f"session(s) in the window spent {used:g}"
                    + (f" and running ones reserve {held:g} ({', '.join(running)})" if held else "")
                    + f" of the budget {budget:g} {window} ({COMPOSITION}; ledger {p.path})"
                )

    def record(self, options: SessionOptions) -> None:
        """Append a finished session (atomically: the file is complete or unchanged)."""
        assert self.policy is not None
        eps, delta, noise = options.release_kind.spends(options)
        entry = {
            "session_id": options.session_id,
            "finished_at": self.clock(),
            "epsilon": eps,
            "delta": delta,
            "noise_epsilon": noise,
            "epsilon_total": eps + noise,
            "end_to_end": noise > 0 or options.release_kind.end_to_end,
            "guarantee": options.release_kind.guarantee,
            "parties": list(options.parties),
            "initiator": options.initiator,
        }
        with self._lock, locked(self.policy.path):
            entries, key = self._entries(create=True)
            assert key is not None
            write_entries(self.policy.path, key, [*entries, chained(key, entries, entry)])
            if self._reserved.pop(options.session_id, None) is not None:
                self._show_reserved()


class ChargedRole:
    """A role (cels.protocol.roles.Role) that calls ``on_done`` once, the first time it has
    reached phase ``charged_from`` (its data for the release has left it) or is finished, not
    aborted; every other attribute is the role's, and the host's ``phase_hook`` is set on the role."""

    def __init__(self, role: Any, on_done: Callable[[], None], charged_from: Phase) -> None:
        object.__setattr__(self, "_role", role)
        object.__setattr__(self, "_on_done", on_done)
        object.__setattr__(self, "_recorded", False)
        object.__setattr__(self, "_charged_from", WORK_PHASES.index(charged_from))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._role, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._role, name, value)

    def _after(self, out: Any) -> Any:
        phase = getattr(self._role, "phase", None)
        left = phase in WORK_PHASES and WORK_PHASES.index(phase) >= self._charged_from
        if not self._recorded and self._role.aborted is None and (left or self._role.finished):
            object.__setattr__(self, "_recorded", True)
            self._on_done()
        return out

    def receive(self, sender: str, envelope: Any) -> Any:
        return self._after(self._role.receive(sender, envelope))

    def begin(self) -> Any:
        return self._after(self._role.begin())


def show(policy: LedgerPolicy, now: float | None = None) -> str:
    """``cels ledger``: every session, the composed totals in the window, the budget left."""
    now = time.time() if now is None else now
    entries = read_entries(policy.path, policy.key_file)
    lines = [f"ledger {policy.path}: {len(entries)} session(s); {COMPOSITION}"]
    for e in entries:
        if e.get("guarantee") == DP_HISTOGRAM.guarantee:
            noise = " (DP histogram, end to end: a party's view)"
        else:
            noise = f" + eps' {e['noise_epsilon']:g} (noisy counts)" if e["end_to_end"] else " (no noise on the counts)"
        lines.append(f"  {iso(e['finished_at'])}  {e['session_id']}  eps {e['epsilon']:g}{noise}  delta {e['delta']:g}  "
                     f"parties {','.join(e['parties'])}")  # fmt: skip
    t = totals(entries, policy.window_days, now)
    window = f"since {t['since']} ({policy.window_days:g} days)" if policy.window_days else "all sessions"
    lines.append(f"total {window}: {t['sessions']} session(s), eps {t['epsilon']:g}, delta {t['delta']:g}"
                 + (f"; {t['without_end_to_end']} without noise on the counts" if t["without_end_to_end"] else "")
                 + (f"; {t['dp_sessions']} DP histogram(s), DP end to end" if t["dp_sessions"] else ""))  # fmt: skip
    reserved, pid = read_reservations(policy.path)
    if reserved and pid is not None and not process_alive(pid):
        lines.append(f"reserved: none (the node process {pid} that reserved {len(reserved)} session(s) is gone; its reservations ended with it)")
        reserved = {}
    else:
        lines.append(f"reserved by {len(reserved)} running session(s)" + (f" of node process {pid}:" if reserved else ""))
        for sid, r in sorted(reserved.items(), key=lambda item: item[1].since):
            lines.append(f"  {sid}  eps {r.epsilon:g}  delta {r.delta:g}  for {max(0.0, now - r.since):.0f} s")
    budget = []
    for name, limit, spent, held in (
        ("eps", policy.budget_epsilon, t["epsilon"], sum(r.epsilon for r in reserved.values())),
        ("delta", policy.budget_delta, t["delta"], sum(r.delta for r in reserved.values())),
    ):
        if limit is not None:
            budget.append(f"{name} {limit:g} (spent {spent:g}, reserved {held:g}, {limit - spent - held:g} left)")
    lines.append(f"budget: {', '.join(budget)}" if budget else "budget: none (the node records but refuses nothing)")
    return "\n".join(lines)
