"""A party's local work on its own Ray cluster (docs/ray.md, "A party on a Ray cluster"): the
engine ``kind = "ray"``.  Its modules: :mod:`.cluster` (start or join the cluster, warm the
workers, :class:`~.cluster.RayEngine`), :mod:`.shards` (placement, the user-shard actors, the
warm pool, the sampler), :mod:`.work` (the pair-work tasks and :class:`~.work.RayWork`),
:mod:`.log_shards` (the log on its shards), :mod:`.common`, :mod:`.trust` and :mod:`.reaper`.

The gRPC node is the Ray driver and the only endpoint other nodes talk to; the cluster is
the party's own, inside its trust boundary (its workers see the party's universe key, the root
of its session's draw keys, its users' counts and its constraint rows), never shared with
another party.

- The log -- its rows, capped, split by user over P log shards (draw bucket mod P), read
  where it lives if it is a Parquet dataset -- and what runs over its rows for the universe
  and the counts (the index, the sums' vectors, the unique pairs, the users' counts over the
  active pairs) and the output records' names: cels.engine.ray.log_shards.
- Pair work -- hashing the own pair ids into the group (the curve, or Pohlig-Hellman's
  group) and applying the party's key, and the party's layer on a peer's ids (CELS section
  4.2, docs/protocol.md "Universe") -- runs as stateless tasks over chunks of
  :data:`CHUNK_IDS` ids (a forwarded chunk finer on a larger cluster: :func:`layer_task_ids`),
  at most ``max_in_flight`` at once (``ray.wait``).  A task gets the
  key as raw bytes (:func:`key_material`) and rebuilds it: no key object is pickled.  The own
  ids go from the log shards to the tasks through the object store.
- Per-user work -- the private solve's verdicts (cels.mechanism.greedy) -- runs on P user-shard
  actors, for a round whose proposals touch more than :data:`NODE_WALK_NONZEROS` of the
  party's constraint rows (a smaller round is walked on the node, which holds the rows); row
  j's shard is its user's draw bucket mod P (cels.engine.user_draws: HMAC-SHA256 under a
  per-session key).  The party's verdict on proposal q depends on which
  earlier proposals the *party* accepted, so a plain OR of the shards' own walks would differ
  (a shard would add a proposal another shard rejects): the shards walk the proposals again
  against the OR of their rejections until it is settled (:meth:`RayWork.verdicts`), and the
  result is the same bitmap as in one process for any P.
- The sampling's draws -- each stage's Poisson draws of the exact mode, the paper mode's
  multinomial trials -- run on the same P :class:`UserShard` actors, which hold their users'
  counts over the active pairs from the sampling on (one actor for both phases, so a node's
  Ray instance keeps 2P actor processes, not 3P: docs/ray.md, "Where Ray's CPU
  goes"); every draw comes from the stream of the user's draw bucket
  (cels.engine.user_draws), so the shards draw what the party draws in one process, for
  any P.

Faults (docs/ray.md, "Faults of the engine"): a pair-work or reader task whose worker
dies is run again (:data:`TASK_RETRIES`; it is stateless, so the ids are the same).  A
user-shard actor that dies is re-created from the rows the node placed and the round is walked
again from its starting loads (the round is a function of rows, loads and proposals), at most
:data:`SHARD_RESTARTS` times a session; past that, once a task has no retry left, or when a
log shard is lost (it holds the only copy of its users' rows in the session: reading them
again would keep a second copy of the log in the object store), the session aborts with
LOCAL_FAILURE and the generic reason :data:`WORKER_LOST` (the node's log has which worker and
why).

The node starts its shard actors (P of each kind) and warms its task workers once, when it
starts, not per session (:class:`ShardPool`, docs/ray.md "Warm shards"): a session
borrows the idle actors and hands them back, reset, when it ends.

P_1's sorted union of the complete id sets (the index) is split by key range over the log
shards (cels.engine.variable_index.RangedIndex).

What stays in the node's process: no row of the log and no union key but its own; every
user's draw bucket (the party's draw order), per own pair the log shard that hashes it, the
vectors over the index the protocol sends, the users' counts over the active pairs (the
constraint rows and the sampling's input) and the records.

What the workers used (:meth:`RayWork.usage`, in the node's per-session summary): every task
and shard reports its own process's peak RSS, and every task its CPU seconds, because
the workers may run on other machines than the node (``cels bench scale --engine ray``).
"""
