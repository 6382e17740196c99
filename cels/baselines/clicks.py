"""Click release of Korolova et al. and Safelog: noisy counts for candidate URLs of released queries.

Korolova et al. publish ``<q, u, #clicks + Lap(b_c)>`` for the top URLs *the search engine
shows* for a released query q: a candidate set that does not depend on the private log.  Here
the candidate set is one of

``navigational`` (default, data-independent)
    one guessed URL per released query, ``http://www.<query without spaces>.com/`` (a query
    that already names a host, e.g. ``myspace.com``, keeps its suffix).  It is a fixed function
    of the released (already private) query, so the DP claim holds; it finds the clicks of
    navigational queries (google, ebay, ...), the bulk of a search log's clicks.
``file:PATH`` (data-independent when the file is)
    a TSV ``query<TAB>url`` of candidates from outside the private log, e.g. a search engine's
    result lists or another period's log.  Queries are normalised like the log's.
``log-top:N`` (DATA-DEPENDENT, reported with ``dp_claim: false``)
    the N most clicked URLs of the query in the private log; which URLs appear leaks who
    clicked them, so the output is not differentially private.
``none``
    no clicks are released (and the click term leaves the privacy accounting).

Released click rows are those with noisy count > 0 (post-processing).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable

from cels.baselines.release import ReleasedItem
from cels.baselines.sampling import noisy
from cels.logs.records import LogError, normalise_query

CANDIDATE_HELP = (
    "click candidate URLs: navigational (default, data-independent), file:PATH, "
    "log-top:N (data-dependent, no DP claim) or none"
)
_HOST_JUNK = re.compile(r"[^a-z0-9.\-]")


def navigational_url(query: str) -> str | None:
    """``http://www.<host>/`` guessed from the query text alone; None when nothing is left."""
    host = _HOST_JUNK.sub("", query.lower().replace(" ", "")).strip(".-")
    if host.startswith("www."):
        host = host[4:]
    if not host:
        return None
    if "." not in host:
        host += ".com"
    return f"http://www.{host}/"


def load_candidate_file(path: str) -> dict[str, list[str]]:
    """``query<TAB>url`` lines (no header) -> query -> urls in file order."""
    candidates: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise LogError(path, number, None, f"expected query<TAB>url, got {len(fields)} field(s)")
            query, url = normalise_query(fields[0]), fields[1].strip()
            if not query:
                raise LogError(path, number, "query", "empty query")
            if not url:
                raise LogError(path, number, "url", "empty url")
            urls = candidates.setdefault(query, [])
            if url not in urls:
                urls.append(url)
    return candidates


def parse_candidates(spec: str) -> tuple[str, str | int | None]:
    """``navigational`` | ``none`` | ``file:PATH`` | ``log-top:N`` -> (kind, argument)."""
    if spec in ("navigational", "none"):
        return spec, None
    kind, sep, arg = spec.partition(":")
    if sep and kind == "file" and arg:
        return kind, arg
    if sep and kind == "log-top":
        try:
            n = int(arg)
        except ValueError:
            n = 0
        if n >= 1:
            return kind, n
    raise ValueError(f"click candidates {spec!r}: use navigational, none, file:PATH or log-top:N (N >= 1)")


def click_candidates(spec: str, queries: Iterable[str], log_clicks: Counter) -> tuple[dict[str, list[str]], bool]:
    """Candidate URLs per released query, and whether the choice keeps the DP claim."""
    kind, arg = parse_candidates(spec)
    queries = list(queries)
    if kind == "none":
        return {}, True
    if kind == "navigational":
        guesses = {q: navigational_url(q) for q in queries}
        return {q: [u] for q, u in guesses.items() if u}, True
    if kind == "file":
        table = load_candidate_file(str(arg))
        return {q: table[q] for q in queries if q in table}, True
    by_query: dict[str, Counter] = {}
    for (query, url), clicks in log_clicks.items():
        by_query.setdefault(query, Counter())[url] = clicks
    wanted = set(queries)
    return {q: [u for u, _ in c.most_common(int(arg))] for q, c in by_query.items() if q in wanted}, False


def release_clicks(
    candidates: dict[str, list[str]], clicks: Counter, scale: float, rng: random.Random
) -> list[ReleasedItem]:
    """``<q, u, clicks(q, u) + Lap(scale)>`` for every candidate; rows with noisy count <= 0 are dropped."""
    released = []
    for query, urls in candidates.items():
        for url in urls:
            count = noisy(clicks.get((query, url), 0), scale, rng)
            if count > 0:
                released.append(ReleasedItem("click", query, url, None, count))
    return released
