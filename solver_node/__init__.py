"""solver_node: gRPC adapter of the CELS solver role (not yet implemented; see issue 4)."""
