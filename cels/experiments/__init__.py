"""The paper's experiments (CELS section 6): one module per figure/table, shared helpers in
:mod:`cels.experiments.common`; run them with ``cels experiment NAME --out DIR``."""
