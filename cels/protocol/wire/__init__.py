"""The CELS wire schema: ``cels_pb2`` / ``cels_pb2_grpc`` are generated from
``protos/cels/protocol/wire/cels.proto``.

Regenerate with ``make proto``; ``tests/test_wire.py`` fails when the committed code and the
proto file drift apart.
"""
