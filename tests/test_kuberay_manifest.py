"""deploy/kuberay/party-1.yaml: one party's own Ray cluster (KubeRay) and its party node as the
driver (docs/ray.md, "A party on a Ray cluster").  The manifest parses, its party TOML
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
    assert set(docs) == {"RayCluster", "ConfigMap", "Deployment", "NetworkPolicy"}
    namespaces = {d["metadata"]["namespace"] for d in docs.values()}
    assert namespaces == {"cels-party-1"}  # the party's own namespace: no other organisation shares it
    party = tomllib.loads(docs["ConfigMap"]["data"]["party.toml"])
    check_toml(party, "party.toml", PARTY_SCHEMA)  # raises naming the key if the example drifts from the schema
    cluster = docs["RayCluster"]
    assert party["engine"]["address"].startswith(f"{cluster['metadata']['name']}-head-svc.")
    workers = cluster["spec"]["workerGroupSpecs"][0]
    assert workers["replicas"] * int(workers["rayStartParams"]["num-cpus"]) == party["engine"]["shards"]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    env = {e["name"]: e.get("value") for e in workers["template"]["spec"]["containers"][0]["env"]}
    assert {name: str(value) for name, (_, value) in MALLOC_THRESHOLDS.items()}.items() <= env.items()  # as the node fixes its own
    containers = {
        "head": cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0],
        "worker": workers["template"]["spec"]["containers"][0],
        "party node": docs["Deployment"]["spec"]["template"]["spec"]["containers"][0],
    }
    # token authentication on every Ray process (KubeRay's authOptions from the party's secret), the driver's too
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": "cels-party-1-ray-token"}
    driver = {e["name"]: e for e in containers["party node"]["env"]}
    assert driver["RAY_AUTH_MODE"]["value"] == "token"
    assert driver["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "cels-party-1-ray-token", "key": "auth_token"}  # the key KubeRay reads
    for who, container in containers.items():  # TLS on every Ray process and the driver
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_USE_TLS"]["value"] == "1", who
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/ray-tls"}, who
    # Ray dials its processes by address: every Ray pod issues itself a certificate naming its
    # own, from the party's Ray CA, before Ray starts (one shared certificate cannot name them
    # all: tests/test_ray_trust.py); the driver, a client, has a client certificate of that CA
    pods = {"head": cluster["spec"]["headGroupSpec"]["template"]["spec"], "worker": workers["template"]["spec"]}
    for who, pod in pods.items():
        (init,) = pod["initContainers"]
        assert init["command"] == ["cels", "ray-tls", "--ca", "/ray-ca", "--name", f"ray-{who}", "--out", "/ray-tls"], who
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["ray-ca"]["secret"]["secretName"] == "cels-party-1-ray-ca" and volumes["ray-tls"]["emptyDir"] == {"medium": "Memory"}, who
        assert pod["securityContext"]["fsGroup"] == 1000, who  # the image's cels user reads the secret
    node_pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in node_pod["volumes"]}["ray-tls"]["secret"]["secretName"] == "cels-party-1-ray-client"
    assert "cels-party-1-ray-tls" not in MANIFEST.read_text()
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]} and policy["ingress"] == [{"from": [{"podSelector": {}}]}]
    assert docs["Deployment"]["spec"]["replicas"] == 1  # one node: the keys, the host, the rounds, the ledger
