"""Safelog's external query pool Q_p, independent of the log (Zhang et al., "Query Pool Generation").

The paper samples n-grams of the COCA corpus.  Here the pool is drawn afresh for every release,
uniformly from the domain of 1- to ``max_n``-grams over the ``vocabulary`` most frequent English
words of the ``wordfreq`` package (its word list ships inside the package: nothing is
downloaded).  Uniform sampling gives every n-gram of the domain the same inclusion probability
p_g (Zhang et al.'s assumption); a query outside the domain has p_g = 0.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache


@lru_cache(maxsize=4)
def pool_words(vocabulary: int) -> tuple[str, ...]:
    """The ``vocabulary`` most frequent alphabetic English words (wordfreq's list, fixed order)."""
    from wordfreq import top_n_list  # a third of a second to import: only when a pool is drawn

    if vocabulary < 1:
        raise ValueError(f"the pool vocabulary must hold at least one word, not {vocabulary}")
    words = [w for w in top_n_list("en", 4 * vocabulary + 1000) if w.isascii() and w.isalpha()]
    if len(words) < vocabulary:
        raise ValueError(f"wordfreq offers only {len(words)} alphabetic English words, fewer than {vocabulary}")
    return tuple(words[:vocabulary])


def domain_size(vocabulary: int, max_n: int) -> int:
    """Number of distinct 1..max_n-grams: V + V^2 + ... + V^max_n."""
    return sum(vocabulary**n for n in range(1, max_n + 1))


def inclusion_probability(size: int, vocabulary: int, max_n: int) -> float:
    """p_g of a domain n-gram when ``size`` draws are made with replacement: 1 - (1 - 1/N)^size."""
    return -math.expm1(size * math.log1p(-1.0 / domain_size(vocabulary, max_n)))


def draw_query_pool(size: int, rng: random.Random, vocabulary: int = 5000, max_n: int = 3) -> set[str]:
    """``size`` uniform draws (with replacement) from the n-gram domain, as a set of queries."""
    if size < 0 or max_n < 1:
        raise ValueError("pool size must be >= 0 and max_n >= 1")
    words = pool_words(vocabulary)
    weights = [vocabulary**n for n in range(1, max_n + 1)]  # uniform over the whole domain
    lengths = rng.choices(range(1, max_n + 1), weights=weights, k=size)
    return {" ".join(rng.choice(words) for _ in range(n)) for n in lengths}
