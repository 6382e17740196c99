"""A re-run after a node restart, the host's part (docs/deployment.md, "Resume after a node restart").

Every message of a session is a function of its nodes' keys and inputs (docs/crypto.md,
Randomness), and a node that keeps its sessions (cels.node.session_store) records every step
message its role took, in the order it took them.  A re-run (``options.resume``) therefore
goes on from where each node was, not from the start:

1. As it begins, each node tells every other node how many of that node's step messages it
   took in earlier runs (:class:`cels_pb2.ResumeFrom`), and begins its role.
2. It replays its record (:meth:`ResumeSteps.replay`, a batch per host call): its role takes
   again, in the same order, every message it took, and makes again every message it made.
   No peer is waited for: a node's replay is its own computation (its hashes read back).
3. Every step message is numbered on its link (``Envelope.seq``, in every run).  Of what its
   role makes for a peer, replayed or new, those numbered up to the ``taken`` of the peer's
   ResumeFrom are dropped, the rest sent (:class:`cels.protocol.hosted.Resend`); until that
   ResumeFrom is in, they wait.  A peer's step message that comes while this node replays
   waits for the replay (the driver holds it back).

So each node takes each step message of the session once, over all its runs, and sends again
only what its peers never took: nothing is seen twice, and the re-run's views are the
uninterrupted session's.  A message numbered as one taken before is refused if it is that
message, and is an equivocation if it is not: the session ends for good (PROTOCOL_ERROR, naming
the sender).  A record that does not replay (the role refuses a message of it) ends it for good too.
"""

from __future__ import annotations

import hashlib

from cels.protocol.aborts import PROTOCOL_ERROR
from cels.protocol.hosted import HOST_STEPS, Effects, HostedSession, Rerun, Resend
from cels.protocol.roles import Envelope, Outgoing, ProtocolError, fail
from cels.protocol.wire import cels_pb2

REPLAY_BATCH = 64
"""Recorded messages a node takes again per host call (peers' ResumeFroms get in between)."""


class ResumeSteps:
    """The host's re-run steps (module docstring); part of cels.protocol.host.SessionHost."""

    def _forget_earlier_run(self, session_id: str) -> None:
        """A re-run is made: the earlier run's end and its Abort notices are moot here."""
        self.ended.pop(session_id, None)
        self.forewarned.pop(session_id, None)

    def _rerun(self, session: HostedSession) -> None:
        """A session is made: a re-run on a node that keeps its sessions gets what it replays, and its filter."""
        if session.options.resume and self.record is not None:
            peers = [n for n in session.options.nodes if n != self.name]
            session.rerun = Rerun(self.record(session.options.session_id), Resend(peers))

    def _begun(self, session: HostedSession, now: float) -> Effects:
        """Begin the role; a re-run first tells every peer what it took of theirs."""
        rerun, effects = session.rerun, Effects()
        if rerun is not None and not rerun.announced:
            rerun.announced = True
            sid = session.options.session_id
            effects.messages += [
                (peer, Envelope(session_id=sid, sender=self.name, resume_from=cels_pb2.ResumeFrom(session_id=sid, taken=rerun.earlier.taken(peer))))
                for peer in rerun.resend.skip
            ]
        return effects.extend(self._call(session, session.role.begin, now))

    def _numbered(self, session: HostedSession, messages: list[Outgoing]) -> list[Outgoing]:
        """Each step message numbered on its link (``Envelope.seq``); a re-run's filtered."""
        for recipient, envelope in messages:
            if envelope.WhichOneof("step") not in HOST_STEPS:
                session.made[recipient] = envelope.seq = session.made.get(recipient, 0) + 1
        return session.rerun.resend.passed(messages) if session.rerun is not None else messages

    def _rerun_step(self, session: HostedSession, sender: str, envelope: Envelope, step: str, now: float) -> Effects | None:
        """A peer's ResumeFrom (what waited for it goes); in a re-run, a step message refused
        while this node replays (its driver holds it back until then), or one numbered as a
        message it took before: refused if it is that message, else an equivocation, which
        ends the session for good; None: anything else, for the host."""
        sid, rerun = session.options.session_id, session.rerun
        if step == "resume_from":
            if rerun is None:
                raise fail(f"{self.name}: resume_from from {sender!r}, but session {sid!r} is not a re-run")
            return Effects(messages=rerun.resend.told(sender, envelope.resume_from.taken))
        if rerun is None or step == "abort":
            return None
        if self.replaying(sid):
            raise fail(f"{self.name}: session {sid!r} still replays its record; {step} from {sender!r} waits")
        if 0 < envelope.seq <= rerun.earlier.taken(sender):
            if hashlib.sha256(envelope.SerializeToString(deterministic=True)).digest() == rerun.earlier.digests[sender][envelope.seq - 1]:
                raise fail(f"{self.name}: {step} #{envelope.seq} from {sender!r} was taken in an earlier run of session {sid!r}")
            detail = f"{sender} sent other bytes for its message #{envelope.seq} ({step}) than in an earlier run"
            self._deferred.extend(self.abort(sid, sender, PROTOCOL_ERROR, "a peer sent another message for a step taken before", now, detail))
            raise ProtocolError(ProtocolError.INVALID_ARGUMENT, f"{self.name}: {detail}", self.state(sid)[1])
        return None

    def replay_due(self, session_id: str) -> bool:
        """Whether a re-run has begun and still replays (the driver calls :meth:`replay` until not)."""
        session = self.sessions.get(session_id)
        return self.replaying(session_id) and session.rerun.announced

    def replaying(self, session_id: str) -> bool:
        """Whether a live session still replays its record (a peer's step message waits)."""
        session = self.sessions.get(session_id)
        return session is not None and session.rerun is not None and not session.rerun.replayed

    def replay(self, session_id: str, now: float) -> Effects:
        """The next :data:`REPLAY_BATCH` recorded messages taken again (each a role call, its
        Streams made whole); once the record is over, the session is live."""
        session = self.sessions.get(session_id)
        if not self.replay_due(session_id):
            return Effects()
        effects = Effects()
        for _ in range(REPLAY_BATCH):
            taken = next(session.rerun.earlier.messages, None)
            if taken is None:
                session.rerun.replayed = True
                break
            sender, envelope = taken
            try:
                effects.extend(self._call(session, lambda: session.role.receive(sender, envelope), now))
                while self.pending(session_id):  # its Streams made whole, as far as they can be made now
                    more = self.drained(session_id, now)
                    effects.extend(more)
                    if not more.messages:
                        break
            except ProtocolError as exc:
                return effects.extend(self.abort(session_id, self.name, PROTOCOL_ERROR, "its record of the session does not replay", now, str(exc)))
            if session_id not in self.sessions:  # the replay ended the session (its role failed)
                break
        return effects
