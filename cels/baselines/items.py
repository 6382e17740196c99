"""Per-user views of a log in log order, as the baselines need them.

* a *query event* is one record (``count`` copies of it): ``M(q)`` counts them (Korolova et al.,
  Safelog); in the AOL layout every row is one click, so a query clicked twice counts twice;
* a *click* is a record with a url (``count`` copies);
* *keywords* are the whitespace-separated words of the queries;
* a *query pair* is two consecutive distinct queries of a user (runs of one query collapse).

Items are keyed ``(kind, query, url, next_query)`` like :class:`ReleasedItem`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice

from tqdm import tqdm

from cels.logs.records import LogRecord

ItemKey = tuple[str, str, str | None, str | None]
ITEM_KINDS = ("keyword", "query", "click", "query_pair")


def user_histories(records: Iterable[LogRecord]) -> dict[str, list[LogRecord]]:
    """Records grouped by user, users in order of first appearance, each history in log order."""
    histories: dict[str, list[LogRecord]] = {}
    for rec in records:
        histories.setdefault(rec.user, []).append(rec)
    return histories


def query_events(history: list[LogRecord]) -> Iterator[str]:
    """The user's query events in log order (a record counts ``count`` times)."""
    for rec in history:
        for _ in range(rec.count):
            yield rec.query


def click_events(history: list[LogRecord]) -> Iterator[tuple[str, str]]:
    """The user's (query, url) clicks in log order (a record counts ``count`` times)."""
    for rec in history:
        if rec.url is not None:
            for _ in range(rec.count):
                yield rec.query, rec.url


def query_sequence(queries: Iterable[str]) -> list[str]:
    """Queries with runs of the same query collapsed (the sequence query pairs are read from)."""
    sequence: list[str] = []
    for query in queries:
        if not sequence or sequence[-1] != query:
            sequence.append(query)
    return sequence


def item_stream(history: list[LogRecord], kind: str) -> Iterator[ItemKey]:
    """All items of ``kind`` in the user's history, in log order, with repetitions."""
    if kind == "query":
        for query in query_events(history):
            yield ("query", query, None, None)
    elif kind == "click":
        for query, url in click_events(history):
            yield ("click", query, url, None)
    elif kind == "keyword":
        for query in query_events(history):
            for word in query.split():
                yield ("keyword", word, None, None)
    elif kind == "query_pair":
        sequence = query_sequence(query_events(history))
        for first, second in zip(sequence, sequence[1:]):
            yield ("query_pair", first, None, second)
    else:
        raise ValueError(f"unknown item kind {kind!r}; choose from {', '.join(ITEM_KINDS)}")


def distinct_items(history: list[LogRecord], kind: str) -> list[ItemKey]:
    """The user's distinct items of ``kind`` in order of first occurrence (ZEALOUS step 1)."""
    return list(dict.fromkeys(item_stream(history, kind)))


def item_totals(histories: dict[str, list[LogRecord]], kind: str) -> Counter[ItemKey]:
    """True total occurrences of every item of ``kind`` in the whole log (the utility reference)."""
    totals: Counter[ItemKey] = Counter()
    for history in histories.values():
        totals.update(item_stream(history, kind))
    return totals


def limit_user_activity(
    histories: dict[str, list[LogRecord]],
    queries_per_user: int,
    clicks_per_user: int,
    keep: set[str] | None = None,
) -> tuple[Counter[str], Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """Keep each user's first ``queries_per_user`` query events and first ``clicks_per_user`` clicks.

    Returns M(q), the click counts of (q, u) and the counts of transitions (consecutive distinct
    kept queries of a user: at most queries_per_user - 1 per user).  ``keep`` restricts the log to
    those queries first (Safelog's pre-filter).
    """
    if queries_per_user < 1 or clicks_per_user < 0:
        raise ValueError("a user activity limit must be at least 1 query and 0 clicks")
    queries: Counter[str] = Counter()
    clicks: Counter[tuple[str, str]] = Counter()
    transitions: Counter[tuple[str, str]] = Counter()
    for history in tqdm(histories.values(), desc="limit user activity", unit="user", disable=None, leave=False):
        if keep is not None:
            history = [rec for rec in history if rec.query in keep]
        kept = list(islice(query_events(history), queries_per_user))
        queries.update(kept)
        sequence = query_sequence(kept)
        transitions.update(zip(sequence, sequence[1:]))
        clicks.update(islice(click_events(history), clicks_per_user))
    return queries, clicks, transitions
