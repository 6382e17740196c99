"""No extra leakage from a re-run (docs/security.md, "A session run twice"): two clusters of
real node processes with every draw replayed from one seed and every node's view recorded
(``--record-view``); for every phase of both releases, the first runs a session through, the
second runs the same session, SIGKILLs party-2 as it enters the phase, restarts it and resumes
the session.  Every node's recorded
view of the re-run holds, link by link, the very messages of the uninterrupted session (the
StartSession aside, which names each cluster's addresses, and the StepReports, which carry
each run's seconds); and the two releases are the same bytes.  ``make faults`` runs it."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from fault_harness import NODES, PARTIES, FaultCluster
from test_resume import DEADLINE, RELEASES, ended_everywhere, killed_in, resume

SEEDED = {"users": 300, "pairs": 300, "deadline": DEADLINE, "keep_state": True, "record_view": True}
UNCOMPARED = ("start_session", "step_report", "abort")


def views(root: Path, session: str) -> dict[str, Counter]:
    """Every node's recorded messages of ``session``: (direction, step) -> the SHA-256 of each,
    counted; a message its role refused is left out (one that came before its phase is
    refused and taken when it comes again: how often depends on the timing, not the data)."""
    out = {}
    for node in NODES:
        view = root / "views" / session / node
        notes = [json.loads(line) for line in (view / "view.jsonl").read_text().splitlines()]
        refused = {n["seq"] for n in notes if "refused" in n.get("note", {})}
        seen: Counter = Counter()
        for path in sorted((view / "messages").glob("*.pb")):
            number, direction, step = path.stem.split("-", 2)
            if step not in UNCOMPARED and int(number) not in refused:
                seen[(direction, step, hashlib.sha256(path.read_bytes()).hexdigest())] += 1
        out[node] = seen
    return out


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    from conftest import stop_and_count

    made = []
    try:
        for name in ("whole", "resumed"):
            seeded = {n: ["--seed", "5"] for n in NODES}
            cluster = FaultCluster(tmp_path_factory.mktemp(name), **SEEDED, extra=seeded)
            made.append(cluster)
            cluster.start()
        yield made
    finally:
        for cluster in made:
            stop_and_count(cluster)


@pytest.mark.faults_long
@pytest.mark.parametrize("release, phase", [(r, p) for r, (_, phases) in RELEASES.items() for p in phases])
def test_a_resumed_sessions_views_are_the_uninterrupted_sessions(clusters, tmp_path: Path, release: str, phase: str) -> None:
    whole, cut = clusters
    session = f"views-{release}-{phase}"
    options = dict(session_id=session, **RELEASES[release][0])
    whole.run(whole.options(**options), tmp_path / "whole", timeout=120)
    first = cut.options(**options)
    outcome = killed_in(cut, first, phase, tmp_path / "first")
    assert "aborted" in outcome, outcome
    ended_everywhere(cut, [n for n in NODES if n != PARTIES[1]], session, DEADLINE + 5)
    cut.restart(PARTIES[1])
    resume(cut, first, tmp_path / "resumed")

    expected, got = views(whole.root, session), views(cut.root, f"{session}.resume-1")
    for node in NODES:
        assert got[node] == expected[node], (node, got[node] - expected[node], expected[node] - got[node])
    assert sum(sum(c.values()) for c in expected.values()) > 20
    assert (tmp_path / "resumed" / "sanitized.tsv").read_bytes() == (tmp_path / "whole" / "sanitized.tsv").read_bytes()
