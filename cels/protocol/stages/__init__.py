"""A party's session as phase machines (CELS section 4.2; docs/protocol.md, "How a session lives").

One sub-machine per phase, each built from the frozen result of the phase before it and
reporting its own: :mod:`.universe` (the log's load and the commutative-hash ring, P_1's
index), :mod:`.counts` (the counts and unique-pair secure sums, the constraint rows),
:mod:`.solve` (phase 3's interface: :mod:`.private` or the paper's :mod:`.transformed`),
:mod:`.sampling` and :mod:`.union`.  :mod:`.sums` runs the session's secure sums, and
:mod:`.results` holds every result.  cels.protocol.party composes them.
"""
