"""Where a party's local work runs (docs/ray.md, "A party on a Ray cluster").

A party node picks its engine once, from its ``[engine]`` table or flags: ``local`` (the
default) runs the work in the node's process; ``ray`` starts or joins the party's own Ray
cluster once per node process.  Both give every session the same sharded work
(:class:`cels.engine.work.ShardedWork`) on a runtime of their own (cels.engine.runtime): one
shard in the node, or P shard actors and tasks on the cluster
(:class:`cels.engine.ray.work.RayWork`).  ``ray`` is an optional extra, imported only
here and only when asked for.  The protocol (cels.protocol) never sees a backend: its phase
machines talk to a :class:`cels.engine.interface.PartyWork`, and this package imports nothing
of the protocol.  Each name is imported from its module on first
use (:mod:`cels.lazy`): the settings' flags load no engine.
"""

from cels.lazy import lazy_exports

SOURCES = {"Engine": "interface", "open_engine": "interface", "EngineOptions": "options", "InProcessEngine": "inprocess"}
__all__ = sorted(SOURCES)
__getattr__ = lazy_exports(__name__, SOURCES)
