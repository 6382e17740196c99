"""gRPC adapters shared by ``party_node`` and ``solver_node``.

A node serves the ``CelsNode`` service (protos/cels/protocol/wire/cels.proto) over mutual TLS
and runs one sans-I/O role (:mod:`cels.protocol.roles`) per session: it knows nothing of the
protocol's phases, only how to deliver envelopes (framed well under gRPC's 4 MB limit), whom to
trust (the node name in a peer's certificate), and when to give up (deadlines, a watchdog that
aborts a session whose peer disappears or that stops making progress).
"""
