"""Paillier key sizes (docs/crypto.md, "Key sizes"): the default, the sizes called secure, the
paper's, and the smallest a test may ask for.  Apart from :mod:`.paillier` so that settings
and their flags can name them without loading the arithmetic."""

from __future__ import annotations

DEFAULT_KEY_BITS = 2048
SECURE_KEY_BITS = (2048, 3072)
PAPER_KEY_BITS = (512, 1024)
MIN_TEST_KEY_BITS = 128
