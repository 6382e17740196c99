"""Sans-I/O protocol roles (CELS section 4.2).

Every role is a state machine for one session: ``receive(sender, envelope)`` takes a step
message and returns the messages to send as ``(recipient, envelope)`` pairs.  No sockets
inside: :mod:`cels.protocol.inmemory` delivers them in tests and benchmarks, and
``party_node`` / ``solver_node`` deliver them over gRPC.
"""
