"""The worked example of EDBT Fig. 1 / CELS Fig. 1 (known answers worked by hand, asserted in tests/test_mechanism_conditions.py)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from cels.logs.model import SearchLog

FIGURE1_PAIRS = [
    ("pregnancy test", "medicinenet.com"),
    ("book", "amazon.com"),
    ("google", "google.com"),
    ("diabetes medicine", "walmart.com"),
    ("car price", "kbb.com"),
]
FIGURE1_COUNTS = [
    [2, 3, 15, 0, 0],  # user 081
    [0, 0, 7, 0, 2],  # user 082
    [0, 1, 17, 1, 5],  # user 083
]


def figure1_log() -> SearchLog:
    """Users 081-083 and their pair counts; totals: pregnancy 2, book 4, google 39, diabetes 1, car 7."""
    counts = sp.csr_matrix(np.array(FIGURE1_COUNTS, dtype=np.int64))
    return SearchLog(["081", "082", "083"], list(FIGURE1_PAIRS), counts, {"format": "aol"})
