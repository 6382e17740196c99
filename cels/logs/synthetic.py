"""The embedded synthetic search log (``make demo``): AOL-shaped, generated from a seed.

Shape (numpy ``Generator(PCG64(seed))``; this is data generation, not cryptography):
- user activity is heavy-tailed: events per user = 1 + floor(Pareto(``activity_tail``) * 6),
  capped at ``max_events``;
- a user's first events (at most ``shared_cap``, and about ``shared_share`` of them) go to the
  shared vocabulary of ``pairs`` query-url pairs with Zipf(``zipf_exponent``) popularity,
  so popular pairs are held by many users with a small share each (releasable at epsilon = 1,
  delta = 0.01);
- the rest are the user's own pairs (each held a Geometric(1/2) number of times), which only
  that user holds and the mechanism suppresses -- the long tail of a real log.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import scipy.sparse as sp

from cels.logs.model import SearchLog
from cels.logs.writers import write_log

# Words for readable queries; a pair's url is built from its own words and index.
_WORDS = (
    "weather news map lyrics recipe cheap hotel flights games music movie free download "
    "school county bank jobs car insurance used sale home depot garden health diet dog "
    "cat pictures video online store coupons tax forms travel beach park city state "
    "football basketball baseball scores tickets concert radio tv show book library "
    "university college wedding dress shoes pizza restaurant menu phone number address "
    "lottery results horoscope credit card loan mortgage real estate rental apartment "
    "doctor hospital dental pharmacy furniture kitchen bathroom paint tools auto parts"
).split()


def _pair_names(rng: np.random.Generator, n: int, start: int) -> list[tuple[str, str]]:
    """``n`` AOL-like (query, url) pairs; urls are distinct through the pair index."""
    n_words = rng.integers(1, 4, size=n)
    picks = rng.integers(0, len(_WORDS), size=(n, 3))
    pairs = []
    for k in range(n):
        words = [_WORDS[w] for w in picks[k, : n_words[k]]]
        pairs.append((" ".join(words), f"http://www.{''.join(words)}{start + k}.com/"))
    return pairs


def synthetic_log(
    seed: int = 7,
    users: int = 2000,
    pairs: int = 3000,
    zipf_exponent: float = 1.1,
    activity_tail: float = 1.2,
    shared_share: float = 0.7,
    shared_cap: int = 50,
    max_events: int = 2000,
) -> SearchLog:
    """A deterministic AOL-shaped log (see the module docstring for its shape)."""
    if users < 2 or pairs < 1:
        raise ValueError("a synthetic log needs at least 2 users and 1 shared pair")
    rng = np.random.Generator(np.random.PCG64(seed))
    events = np.minimum(1 + np.floor(rng.pareto(activity_tail, size=users) * 6).astype(np.int64), max_events)
    n_shared = np.minimum(np.ceil(events * shared_share).astype(np.int64), shared_cap)
    n_own = events - n_shared

    popularity = 1.0 / np.arange(1, pairs + 1) ** zipf_exponent
    shared_pick = rng.choice(pairs, size=int(n_shared.sum()), p=popularity / popularity.sum())
    # A user holds each shared pair once (repeated draws merge), so no user dominates a pair.
    shared_user, shared_pick = np.divmod(np.unique(np.repeat(np.arange(users), n_shared) * pairs + shared_pick), pairs)

    # Own pairs: each own event re-finds the user's previous own pair with probability 1/2,
    # so an own pair is held Geometric(1/2) times; a user's first own event starts a new pair.
    own_user = np.repeat(np.arange(users), n_own)
    position = np.arange(len(own_user)) - np.repeat(np.cumsum(n_own) - n_own, n_own)
    new_pair = (position == 0) | (rng.random(len(own_user)) < 0.5)
    own_pick = pairs + np.cumsum(new_pair) - 1

    rows = np.concatenate((shared_user, own_user))
    cols = np.concatenate((shared_pick, own_pick))
    used, col_index = np.unique(cols, return_inverse=True)
    counts = sp.csr_matrix(
        (np.ones(len(rows), dtype=np.int64), (rows, col_index)), shape=(users, len(used)), dtype=np.int64
    )
    counts.sum_duplicates()
    names = _pair_names(rng, int(own_pick.max(initial=pairs - 1)) + 1, 0)
    user_ids = np.sort(rng.choice(np.arange(100, 100 + 500 * users), size=users, replace=False))
    source = {"format": "aol", "path": None, "synthetic": {"seed": seed, "users": users, "pairs": pairs}}
    return SearchLog([str(u) for u in user_ids.tolist()], [names[c] for c in used.tolist()], counts, source)


def write_synthetic(path: str | os.PathLike[str], seed: int = 7, users: int = 2000, **shape: Any) -> SearchLog:
    """Generate :func:`synthetic_log` and write it to ``path`` as AOL TSV; returns the log."""
    log = synthetic_log(seed=seed, users=users, **shape)
    write_log(log, path)
    return log
