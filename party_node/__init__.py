"""party_node: gRPC adapter of the CELS party role (not yet implemented; see issue 4)."""
