"""The embedded synthetic search log (``make demo``): AOL-shaped, generated from a seed.

Shape (numpy ``Generator(PCG64(seed))``; this is data generation, not cryptography):
- user activity is heavy-tailed: events per user = 1 + floor(Pareto(:data:`ACTIVITY_TAIL`) * 6),
  capped at :data:`MAX_EVENTS`;
- a user's first events (at most :data:`SHARED_CAP`, and about :data:`SHARED_SHARE` of them) go to the
  shared vocabulary of ``pairs`` query-url pairs with Zipf(:data:`ZIPF_EXPONENT`) popularity,
  so popular pairs are held by many users with a small share each (releasable at epsilon = 1,
  delta = 0.01);
- the rest are the user's own pairs (each held a Geometric(1/2) number of times), which only
  that user holds and the mechanism suppresses -- the long tail of a real log.

:func:`synthetic_histogram` is the benchmarks' generator (``cels bench scale``): exactly the
requested number of distinct pairs, all numpy, written straight to the parties' histogram
files in chunks (4M pairs in seconds; no SearchLog of the whole input is ever built).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from cels.fileio import atomic_write
from cels.logs.formats import HISTOGRAM, HISTOGRAM_HEADER, PARQUET, log_format
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

ZIPF_EXPONENT = 1.1
"""Both generators: a pair's popularity falls as rank^-ZIPF_EXPONENT."""
ACTIVITY_TAIL = 1.2
"""Both generators: a user's activity is 1 + Pareto(ACTIVITY_TAIL) (scaled per generator)."""
SHARED_SHARE, SHARED_CAP, MAX_EVENTS = 0.7, 50, 2000
""":func:`synthetic_log`: the share of a user's events that go to the shared vocabulary, at most
SHARED_CAP of them, and a user's events at most."""
PAIRS_PER_USER, EXTRA_HOLDERS, ACTIVITY_CAP = 300.0, 0.045, 50.0
""":func:`synthetic_histogram`: distinct pairs per user, holdings beyond one per pair (per pair),
and a user's activity at most (fitted to the AOL slice)."""
COUNT_EXPONENT, MAX_COUNT = 3.0, 1000
""":func:`synthetic_histogram`: a holding's count is Zipf(COUNT_EXPONENT), at most MAX_COUNT."""


def _pair_names(rng: np.random.Generator, n: int, start: int) -> list[tuple[str, str]]:
    """``n`` AOL-like (query, url) pairs; urls are distinct through the pair index."""
    n_words = rng.integers(1, 4, size=n)
    picks = rng.integers(0, len(_WORDS), size=(n, 3))
    queries, hosts = _pair_texts(n_words, picks)
    return [(q, f"http://www.{h}{start + k}.com/") for k, (q, h) in enumerate(zip(queries, hosts))]


def _pair_texts(n_words: np.ndarray, picks: np.ndarray) -> tuple[list[str], list[str]]:
    """Query ("w1 w2") and url host ("w1w2") of pairs whose first ``n_words`` of ``picks`` (rows
    of 3 word indices) are their words; each distinct word combination is joined once."""
    blank = len(_WORDS)
    words = np.where(np.arange(3) < np.asarray(n_words)[:, None], picks, blank)
    combos, which = np.unique(words[:, 0] * (blank + 1) ** 2 + words[:, 1] * (blank + 1) + words[:, 2], return_inverse=True)
    queries, hosts = [], []
    for code in combos.tolist():
        parts = [_WORDS[w] for w in (code // (blank + 1) ** 2, code // (blank + 1) % (blank + 1), code % (blank + 1)) if w < blank]
        queries.append(" ".join(parts))
        hosts.append("".join(parts))
    return [queries[k] for k in which.tolist()], [hosts[k] for k in which.tolist()]


def synthetic_log(seed: int = 7, users: int = 2000, pairs: int = 3000) -> SearchLog:
    """A deterministic AOL-shaped log (see the module docstring for its shape)."""
    if users < 2 or pairs < 1:
        raise ValueError("a synthetic log needs at least 2 users and 1 shared pair")
    rng = np.random.Generator(np.random.PCG64(seed))
    events = np.minimum(1 + np.floor(rng.pareto(ACTIVITY_TAIL, size=users) * 6).astype(np.int64), MAX_EVENTS)
    n_shared = np.minimum(np.ceil(events * SHARED_SHARE).astype(np.int64), SHARED_CAP)
    n_own = events - n_shared

    popularity = 1.0 / np.arange(1, pairs + 1) ** ZIPF_EXPONENT
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


def write_synthetic(path: str | os.PathLike[str], seed: int = 7, users: int = 2000, pairs: int = 3000) -> SearchLog:
    """Generate :func:`synthetic_log` and write it to ``path`` as AOL TSV; returns the log."""
    log = synthetic_log(seed=seed, users=users, pairs=pairs)
    write_log(log, path)
    return log


WRITE_CHUNK = 1 << 18
"""Histogram rows built and written at a time by :meth:`SyntheticHistogram.write_shares`."""


@dataclass(frozen=True)
class SyntheticHistogram:
    """An AOL-shaped input histogram {c_ij} (CELS section 2.1) with exactly ``pairs`` distinct
    query-url pairs, as arrays: entry k says that user ``user[k]`` holds pair ``pair[k]``
    ``count[k]`` times; entries are sorted by user, then pair, and no (user, pair) repeats."""

    seed: int
    users: int
    pairs: int
    user: np.ndarray
    pair: np.ndarray
    count: np.ndarray
    n_words: np.ndarray
    picks: np.ndarray

    @property
    def size(self) -> int:
        """|D|: the total count."""
        return int(self.count.sum())

    def shape(self) -> dict[str, int]:
        """Users, pairs, (user, pair) entries, |D| and the pairs held by two or more users."""
        holders = np.bincount(self.pair, minlength=self.pairs)
        return {
            "users": self.users, "pairs": self.pairs, "entries": len(self.pair), "size": self.size,
            "shared_pairs": int(np.count_nonzero(holders >= 2)),
        }  # fmt: skip

    def write_shares(self, directory: str | os.PathLike[str], parties: int, fmt: str = "histogram") -> list[Path]:
        """One file per party: user j goes to party j mod ``parties`` (as
        :meth:`SearchLog.split_by_user` without a seed); ``fmt`` "histogram" writes
        ``directory/party-K.tsv``, "parquet" ``directory/party-K.parquet`` (one row group per
        chunk; docs/formats.md, "Parquet").  Each file is written in chunks of WRITE_CHUNK
        rows, atomically."""
        if not 1 <= parties <= self.users:
            raise ValueError(f"cannot split {self.users} users into {parties} parties")
        target = log_format(fmt)
        if target not in (HISTOGRAM, PARQUET):
            raise ValueError(f"synthetic shares are written as histogram or parquet, not {fmt!r}")
        paths = []
        for k in range(parties):
            rows = np.flatnonzero(self.user % parties == k)
            chunks = (rows[start : start + WRITE_CHUNK] for start in range(0, len(rows), WRITE_CHUNK))
            path = Path(directory) / f"party-{k + 1}{target.release_suffix or '.tsv'}"
            if target is PARQUET:
                self._write_parquet(path, chunks)
            else:
                with atomic_write(path) as fh:
                    fh.write("\t".join(HISTOGRAM_HEADER) + "\n")
                    for chunk in chunks:
                        fh.write("".join(f"{u}\t{q}\t{url}\t{c}\n" for u, q, url, c in zip(*self._rows_fields(chunk))))
            paths.append(path)
        return paths

    def _write_parquet(self, path: Path, chunks) -> None:
        from cels.logs.parquet import PARQUET_COLUMNS, pyarrow_modules

        pa, _, pq = pyarrow_modules()
        schema = pa.schema([(PARQUET_COLUMNS[name], pa.int64() if name == "count" else pa.string()) for name in ("user", "query", "url", "count")])
        with atomic_write(path, mode="wb") as sink, pq.ParquetWriter(sink, schema) as writer:
            for chunk in chunks:
                writer.write_table(pa.Table.from_arrays([pa.array(column) for column in self._rows_fields(chunk)], schema=schema))

    def _rows_fields(self, rows: np.ndarray) -> tuple[list[str], list[str], list[str], list[int]]:
        """Users, queries, urls and counts of ``rows``."""
        pair = self.pair[rows]
        queries, hosts = _pair_texts(self.n_words[pair], self.picks[pair])
        urls = [f"http://www.{h}{i}.com/" for h, i in zip(hosts, pair.tolist())]
        return [str(u + 1) for u in self.user[rows].tolist()], queries, urls, self.count[rows].tolist()


def synthetic_histogram(pairs: int, seed: int = 7) -> SyntheticHistogram:
    """An AOL-shaped histogram with exactly ``pairs`` distinct pairs (numpy ``PCG64(seed)``).

    Shape, fitted to the AOL slice (500 users, 143,934 pairs, 150,347 entries, 98 % of pairs
    held by one user, 1.38 per entry on average):
    - ``round(pairs / PAIRS_PER_USER)`` users (at least 2) with heavy-tailed activity
      1 + Pareto(ACTIVITY_TAIL), capped at ACTIVITY_CAP;
    - every pair gets one holder, and ``EXTRA_HOLDERS * pairs`` more holdings go to pairs drawn
      with Zipf(ZIPF_EXPONENT) popularity over the pair ranks; each holding's user is drawn
      by activity (a user drawn twice for a pair holds it once, the counts added);
    - a holding's count is Zipf(COUNT_EXPONENT) (P(1) = 0.83, mean 1.37), capped at MAX_COUNT.
    Users that drew nothing are dropped, so ``users`` may be slightly below the target.
    """
    if pairs < 2:
        raise ValueError(f"a synthetic histogram needs at least 2 pairs, got {pairs}")
    rng = np.random.Generator(np.random.PCG64(seed))
    n_users = max(2, round(pairs / PAIRS_PER_USER))
    activity = np.minimum(1.0 + rng.pareto(ACTIVITY_TAIL, size=n_users), ACTIVITY_CAP)
    popularity = 1.0 / np.arange(1, pairs + 1, dtype=np.float64) ** ZIPF_EXPONENT
    extra = rng.choice(pairs, size=round(EXTRA_HOLDERS * pairs), p=popularity / popularity.sum())
    holding_pair = np.concatenate((np.arange(pairs, dtype=np.int64), extra))
    holding_user = rng.choice(n_users, size=len(holding_pair), p=activity / activity.sum())
    counts = np.minimum(rng.zipf(COUNT_EXPONENT, size=len(holding_pair)), MAX_COUNT)
    entries, which = np.unique(holding_user * pairs + holding_pair, return_inverse=True)
    count = np.bincount(which, weights=counts).astype(np.int64)
    held_by, user = np.unique(entries // pairs, return_inverse=True)
    n_words = rng.integers(1, 4, size=pairs).astype(np.int8)
    picks = rng.integers(0, len(_WORDS), size=(pairs, 3)).astype(np.int16)
    return SyntheticHistogram(seed, len(held_by), pairs, user.astype(np.int64), entries % pairs, count, n_words, picks)
