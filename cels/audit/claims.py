"""Which privacy claims the audits back (docs/security.md, "End-to-end DP: what holds").

Held, and audited (cels.audit.audits): the multinomial sampling given x is (eps, delta)-
probabilistic DP when x meets every condition (CELS Theorem 2); x + discrete Laplace(d / eps'),
centrally or as the sum of r Polya shares, is eps'-DP when x moves by at most d in L1.

Withdrawn: end-to-end (eps + eps', delta)-DP for the release with the repair
(``add_noise_and_repair``, the private mode's noise pass).  The repair reads the conditions of the
data again: a pair held by users j and k in D is unique to k in D' = D minus j, so it is no
variable of D' and its released count is 0 there whatever the noise, while under D it is >= 1
with probability about 1/(1 + e^(-eps'/d)); and the caps x_i <= b / max_j ln t_ij move with the
data.  Outputs possible under D are impossible under D': no eps is finite.
"""

from __future__ import annotations


def repair_is_dp() -> bool:
    """Whether noise + repair is claimed to be DP end to end: it is not (module docstring; the
    audit tests/test_privacy_audit.py certifies the violation and checks this stays False)."""
    return False
