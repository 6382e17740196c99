"""CELS: collaborative search log sanitization (Hong et al.).

Layers, bottom up: ``cels.logs`` (formats), ``cels.crypto`` (primitives), ``cels.mechanism``
(the DP sampling mechanism and its solvers), ``cels.metrics``, ``cels.baselines``,
``cels.protocol`` (sans-I/O protocol roles), ``cels.cli``; ``party_node`` and
``solver_node`` adapt the protocol roles to gRPC.
"""

__version__ = "0.1.0"
