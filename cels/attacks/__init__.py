"""Runnable demonstrations of what the paper's protocol leaks (SECURITY.md, ``cels attack``).

* :mod:`cels.attacks.solver_reconstruction` -- P_0 rebuilds every constraint row and count
  from its recorded view, and links them to real pairs once the output is published.
* :mod:`cels.attacks.local_sampling` -- the paper's local sampling exceeds delta where the
  exact distributed multinomial is at it.
* :mod:`cels.attacks.union_origin` -- Algorithm 3 run literally tells the coordinator which
  party contributed every output record; the shuffled union does not.
"""
