"""deploy/kuberay/party-1.yaml: one party's own Ray cluster (KubeRay) and its party node as the
driver (docs/deployment.md, "A party on a Ray cluster").  The manifest parses, its party TOML
passes the node schema and names the head's service, and the cluster has one core per shard."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import yaml

from cels.node.process import MALLOC_THRESHOLDS
from cels.node.schemas import PARTY_SCHEMA, check_toml

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "kuberay" / "party-1.yaml"


def test_the_kuberay_manifest_is_one_partys_cluster_and_node() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}
    assert set(docs) == {"RayCluster", "ConfigMap", "Deployment"}
    namespaces = {d["metadata"]["namespace"] for d in docs.values()}
    assert namespaces == {"cels-party-1"}  # the party's own namespace: no other organisation shares it
    party = tomllib.loads(docs["ConfigMap"]["data"]["party.toml"])
    check_toml(party, "party.toml", PARTY_SCHEMA)  # raises naming the key if the example drifts from the schema
    cluster = docs["RayCluster"]
    assert party["engine"]["address"].startswith(f"{cluster['metadata']['name']}-head-svc.")
    workers = cluster["spec"]["workerGroupSpecs"][0]
    assert workers["replicas"] * int(workers["rayStartParams"]["num-cpus"]) == party["engine"]["shards"]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    env = {e["name"]: e["value"] for e in workers["template"]["spec"]["containers"][0]["env"]}
    assert env == {name: str(value) for name, (_, value) in MALLOC_THRESHOLDS.items()}  # as the node fixes its own
    assert docs["Deployment"]["spec"]["replicas"] == 1  # one node: the keys, the host, the rounds, the ledger
