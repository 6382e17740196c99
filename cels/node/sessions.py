"""A node's sessions: its SessionHost (cels.protocol.host) called under one lock, and what the
host returns acted on: events logged and counted, messages to each session's outbox (its
:class:`cels.node.link.SessionLink`), Abort notices sent on their own, the initiator's due
calls and events to its Run stream (cels.node.initiator).

gRPC keeps one sender's messages in order but not those of different senders: a message the
host refuses as out of order is retried whenever the host has taken another one, for at most
a reorder window (cels.node.link.hold_seconds), and only then refused.

A kept session's step messages are recorded as the host takes them (cels.node.session_store);
a re-run replays them, a batch per host call on a thread of its own, while a peer's step
message for it waits (cels.protocol.resume).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from cels.node.settings import NodeConfig
from cels.node.keys import NodeKeys
from cels.node.link import SessionLink, hold_seconds
from cels.node.peers import PeerClients
from cels.node.telemetry import NodeTelemetry
from cels.node.session_store import SessionStore
from cels.protocol.aborts import RESUMABLE, describe
from cels.protocol.hosted import ABORTED, DONE, HOST_STEPS, KEPT_STATES, Effects, Event, HostedSession
from cels.protocol.host import SessionHost
from cels.protocol.phases import Phase
from cels.protocol.roles import Envelope, ProtocolError, step_name
from cels.protocol.wire import cels_pb2

log = logging.getLogger("cels.node")

NOTICE_SECONDS = 5.0
"""Deadline of an Abort notice to a peer; a stopping node waits this long for its notices."""


class SessionDriver:
    """The sessions of node ``config.name``: the host, one link per live session, the notices."""

    def __init__(
        self, config: NodeConfig, host: SessionHost, peers: PeerClients, keys: NodeKeys, telemetry: NodeTelemetry,
        session_ended: Callable[[str], object] | None = None, store: SessionStore | None = None,
    ) -> None:
        """``session_ended(session_id)`` is called once when a session ends here, done or aborted;
        ``store`` keeps the unfinished sessions' keys and what they took (cels.node.session_store)."""
        self.config, self.host, self.peers, self.keys, self.telemetry = config, host, peers, keys, telemetry
        self.store = store if store is not None else SessionStore(None)
        self.session_ended = session_ended
        self.links: dict[str, SessionLink] = {}
        self.ended_links: OrderedDict[str, SessionLink] = OrderedDict()
        self.lock = threading.Lock()  # the host: one call at a time
        self.changed = threading.Condition(self.lock)
        self.notices: list[threading.Thread] = []  # Abort notices in flight
        self.replays: set[str] = set()  # re-runs whose record a thread replays
        telemetry.watch_outboxes(self.queued_bytes)

    def queued_bytes(self) -> int:
        """Bytes made and not yet sent, over every live session's outbox (``cels_outbox_bytes``)."""
        return sum(link.queued_bytes() for link in list(self.links.values()))

    def link(self, session_id: str) -> SessionLink | None:
        """The link of a live or recently ended session."""
        return self.links.get(session_id) or self.ended_links.get(session_id)

    def call(self, action: Callable[[float], Effects], session_id: str = "") -> Effects:
        """One host call under the lock; then act on its effects."""
        with self.lock:
            link = self.links.get(session_id)
            if link is not None:
                link.busy = True
            try:
                effects = action(time.monotonic())
            finally:
                if link is not None:
                    link.busy = False
                self.host.touch(session_id, time.monotonic())  # a long step is not a stall
                self.changed.notify_all()
            self._act(effects)
            if session_id not in self.replays and self.host.replay_due(session_id):
                self.replays.add(session_id)
                threading.Thread(target=self._replay, args=(session_id,), name=f"replay-{session_id}", daemon=True).start()
        return effects

    def _replay(self, session_id: str) -> None:
        """A re-run's record taken again, a batch per host call (the lock free in between)."""
        try:
            while self.host.replay_due(session_id):
                self.call(lambda now: self.host.replay(session_id, now), session_id)
        finally:
            self.replays.discard(session_id)

    def drained(self, session_id: str) -> None:
        """A session's link sent all it was given: its role's next window of a pending Stream
        (cels.protocol.roles.Stream), if one is; the host is not called otherwise."""
        if self.host.pending(session_id):
            self.call(lambda now: self.host.drained(session_id, now), session_id)

    def _act(self, effects: Effects) -> None:
        for event in effects.events:
            self._event(event)
        for recipient, envelope in effects.messages:
            link = self.links.get(envelope.session_id)
            if envelope.WhichOneof("step") == "abort" or link is None:
                notice = threading.Thread(target=self.peers.try_deliver, args=(recipient, envelope, NOTICE_SECONDS), daemon=True)
                notice.start()
                self.notices = [n for n in self.notices if n.is_alive()] + [notice]
            else:
                link.outbox.put((recipient, envelope))
        for due in effects.calls:  # the initiator's Run stream makes them
            link = self.links.get(due.session_id)
            if link is not None:
                link.events.put(due)

    def _event(self, event: Event) -> None:
        name, sid = self.config.name, event.session_id
        if event.kind == "created":
            self.links[sid] = SessionLink(self, self.host.hosted(sid).options)
            self.keys.session_started()
            self.telemetry.session_created(sid, self.links[sid].options.initiator, self.links[sid].options.to_config())
        elif event.kind in ("awaiting", "approved") and event.node == name:  # this node's operator decides
            log.warning("%s: session %s %s", name, sid, "awaits its operator's approval: cels approve / cels reject" if event.kind == "awaiting" else "approved by its operator")
            self.telemetry.session_awaiting(sid, event.kind == "awaiting")
        elif event.kind in ("awaiting", "approved"):  # the initiator: a party's operator
            log.info("%s: session %s: %s %s", name, sid, event.node, "awaits its operator's approval" if event.kind == "awaiting" else "approved")
        elif event.kind == "phase":
            if event.phase == Phase.FAILED:  # not "done": the phase did not complete (issue 41 finding 11)
                log.info("%s: session %s: %s ended after %.2f s: the session failed", name, sid, event.old, event.seconds)
            else:
                self.store.phase(sid, str(event.phase))  # the last phase reached, kept before the log says so
                log.info("%s: session %s: %s done in %.2f s, now %s", name, sid, event.old, event.seconds, event.phase)
            self.telemetry.session_phase(sid, event.old, event.phase, event.at)
        elif event.kind in (ABORTED, DONE):
            notice = event.abort
            self.store.ended(sid, resumable=notice is not None and notice.kind in RESUMABLE)
            self.telemetry.session_ended(sid, event.kind, notice.origin if notice else "", describe(notice) if notice else "")
            if notice is not None:  # one line: what the peers were told, then this node's own details
                log.warning("%s: session %s aborted: %s%s", name, sid, describe(notice), f"; {event.detail}" if event.detail else "")
            else:
                log.info("%s: session %s %s", name, sid, event.kind)
            if self.session_ended is not None:
                self.session_ended(sid)
            link = self.links.pop(sid, None)
            if link is not None:
                if event.kind == ABORTED:
                    link.aborted.set()
                link.stopped.set()
                link.outbox.put(None)
                self.keys.session_ended()
                link.final = link.snapshot()
                self.ended_links[sid] = link
                while len(self.ended_links) > KEPT_STATES:
                    self.ended_links.popitem(last=False)
        link = self.link(sid)
        if link is not None and link.options.initiator == name:
            link.events.put(event)

    def take(self, sender: str, envelope: Envelope) -> None:
        """Give an envelope to the host, holding back one refused as out of order (module doc)."""
        session = self.host.sessions.get(envelope.session_id)
        if session is not None and step_name(envelope) not in HOST_STEPS:  # a re-run's replay first
            with self.changed:
                self.changed.wait_for(lambda: not self.host.replaying(envelope.session_id), session.options.deadline)
        limit = time.monotonic() + hold_seconds(session.options.deadline) if session is not None else 0
        while True:
            try:
                self.call(lambda now: self._deliver(sender, envelope, now), envelope.session_id)
                return
            except ProtocolError as exc:
                if exc.code != ProtocolError.FAILED_PRECONDITION or step_name(envelope) in ("start_session", "abort") or time.monotonic() >= limit:
                    raise
                with self.changed:
                    self.changed.wait(limit - time.monotonic())

    def _deliver(self, sender: str, envelope: Envelope, now: float) -> Effects:
        effects = self.host.deliver(sender, envelope, now)
        step = step_name(envelope)
        if step not in HOST_STEPS:
            self.store.taken(sender, envelope)
        link = self.links.get(envelope.session_id)
        if step == "step_report" and link is not None:
            link.events.put(envelope.step_report)  # the initiator streams it, before its FINISH calls
        return effects

    def abort(self, session_id: str, origin: str, kind: int, reason: str, detail: str = "", unless: Callable[[HostedSession], bool] | None = None) -> None:
        """Abort the session naming ``origin`` (``kind``, generic ``reason``; ``detail`` for this
        node's log); not if ``unless(session)`` holds under the host lock."""

        def act(now: float) -> Effects:
            if unless is not None and session_id in self.host.sessions and unless(self.host.hosted(session_id)):
                return Effects()
            return self.host.abort(session_id, origin, kind, reason, now, detail)

        self.call(act, session_id)

    def adopt(self, session_id: str, notice: cels_pb2.Abort, detail: str = "") -> None:
        """Abort the session with an Abort another node made (a refusal's, a probe's)."""
        self.call(lambda now: self.host.adopt(session_id, notice, now, detail), session_id)

    def phase(self, session_id: str) -> Phase:
        """This node's phase in a session (the phase an abort it sees is reported in)."""
        return self.host.hosted(session_id).phase

    def expire(self) -> None:
        self.call(self.host.expire)

    def decide(self, session_id: str, approve: bool) -> None:
        """This node's operator approves or rejects a session that awaits it (``cels approve``)."""
        self.call(lambda now: self.host.decide(session_id, approve, now), session_id)

    def finish(self, session_id: str) -> None:
        """FINISH: the session ends here (the host refuses it unless this node's part is over);
        its final state is read once the outbox has sent its last messages, so that it counts them."""
        self.call(lambda now: self.host.finish(session_id, now), session_id)
        link = self.link(session_id)
        if link is not None:
            link.outbox.join()
            link.final = link.snapshot()

    def begin(self, session_id: str) -> None:
        """BEGIN's work (the log's load and the first hashes: seconds at scale), run off the
        Signal call so that the initiator's BEGINs start every party at once, not one after
        another.  A role failure aborts the session (host); a refusal here means it ended meanwhile."""
        try:
            self.call(lambda now: self.host.begin(session_id, now), session_id)
        except ProtocolError as exc:
            log.info("%s: session %s not begun: %s", self.config.name, session_id, exc)
