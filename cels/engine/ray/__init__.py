"""A party's work on its own Ray cluster (docs/ray.md, "A party on a Ray cluster"): the engine
``kind = "ray"``.  It runs the same sharded work as the in-process engine
(cels.engine.work.ShardedWork over cels.engine.sharded_log), on P shards instead of one, with
its calls on the cluster: :mod:`.runtime` (each shard an actor, each pair-work or reader task a
Ray task, Ray's errors as the engine's), :mod:`.actors` (the shard kinds' actor classes, their
placement group, the node's warm pool), :mod:`.work` (:class:`~.work.RayWork`: the work on
the runtime, and what its workers used), :mod:`.cluster` (start or join the cluster, warm the
workers, :class:`~.cluster.RayEngine`), :mod:`.trust`, :mod:`.tls` and :mod:`.reaper`.

The gRPC node is the Ray driver and the only endpoint other nodes talk to; the cluster is
the party's own, inside its trust boundary (its workers see the party's universe key, the root
of its session's draw keys, its users' counts and its constraint rows), never shared with
another party.

Faults (docs/ray.md, "Faults of the engine"): a pair-work or reader task whose worker dies is
run again (cels.engine.ray.runtime.TASK_RETRIES; it is stateless, so the ids are the same).  A
user-shard actor that dies is re-created from what the node placed
(cels.engine.work.SHARD_RESTARTS times a session); past that, once a task has no retry left,
or when a log shard is lost (it holds the only copy of its users' rows in the session), the
session aborts with LOCAL_FAILURE and the generic reason "engine worker lost" (the node's
log has which worker and why).

What stays in the node's process: no row of the log and no union key but its own; every
user's draw bucket (the party's draw order), the vectors over the index the protocol sends,
the users' counts over the active pairs (the constraint rows and the sampling's input) and
the records.
"""
