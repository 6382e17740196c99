"""deploy/grafana/cels-dashboard.json asks Prometheus only for metrics the nodes export, and has
a panel for each of them (docs/monitoring.md, "Prometheus and Grafana")."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cels.node.ledger import Ledger, LedgerPolicy
from cels.node.telemetry import CountingPool, NodeTelemetry

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "cels-dashboard.json"
PROMETHEUS_OWN = {"up"}
"""Series Prometheus itself makes for every target."""


def exported(tmp_path: Path) -> tuple[set[str], set[str]]:
    """(sample names, family names) a party node with a ledger and a budget exports."""
    telemetry = NodeTelemetry("party-1", "party", Ledger(LedgerPolicy(tmp_path / "l.json", budget_epsilon=2.0, budget_delta=1.0)))
    pool = CountingPool(2)
    telemetry.watch_pool(pool)
    telemetry.session_created("s", "party-1")
    telemetry.session_phase("s", "load", "universe")
    telemetry.frames_sent("party-2", "s", 10)
    telemetry.frames_received("party-2", "s", 10)
    families = list(telemetry.registry.collect())
    pool.shutdown()
    return {s.name for f in families for s in f.samples}, {f.name for f in families}


def test_every_expression_names_an_exported_metric(tmp_path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    samples, families = exported(tmp_path)
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    assert exprs and all(panel["targets"] for panel in doc["panels"])
    named = {name for expr in exprs for name in re.findall(r"\b(cels_[a-z_]+|up)\b", expr)}
    assert named - PROMETHEUS_OWN <= samples, sorted(named - PROMETHEUS_OWN - samples)
    # and every family the nodes export has a panel (a counter's family is named without _total)
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in named}
    assert families <= shown, sorted(families - shown)


def test_the_check_sees_a_misspelt_metric(tmp_path) -> None:
    samples, _ = exported(tmp_path)
    assert "cels_session_total" not in samples and "cels_sessions_total" in samples
