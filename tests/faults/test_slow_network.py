"""Slow network (issue 13): every node behind a delay proxy on 127.0.0.1 (DELAY seconds each
way, BANDWIDTH bytes/s per connection and direction), its peers' addresses pointing at the
proxies; TLS passes through untouched.  A session with the default deadlines succeeds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cryptography import x509

from cels.protocol.options import DEFAULT_DEADLINE
from fault_harness import CONTROLLER, FAULTS, NODES, FaultCluster

pytestmark = pytest.mark.faults_long
DELAY, BANDWIDTH = 0.040, 2_000_000
CLUSTER = {"users": 300, "pairs": 200, "deadline": DEFAULT_DEADLINE, "proxies": True}


def test_certificate_names_do_not_depend_on_the_port(cluster: FaultCluster) -> None:
    """Each certificate names its node only (one DNS SAN, no IP address, no port): a peer
    reached through a proxy on another port is still verified by name."""
    for name in [*NODES, CONTROLLER]:
        cert = x509.load_pem_x509_certificate((cluster.certs / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [name]
        assert not san.get_values_for_type(x509.IPAddress)


def test_session_behind_delay_proxies_with_default_deadlines(cluster: FaultCluster, tmp_path: Path) -> None:
    for proxy in cluster.proxy.values():
        proxy.delay, proxy.bandwidth = DELAY, BANDWIDTH
    sent = {n: p.bytes for n, p in cluster.proxy.items()}
    options = cluster.options()
    assert options.deadline == DEFAULT_DEADLINE
    start = time.monotonic()
    report = cluster.run(options, tmp_path / "out", timeout=3 * DEFAULT_DEADLINE)
    seconds = time.monotonic() - start
    FAULTS.add("slow_network_sessions")
    FAULTS.resources.append({"test": "slow network", "delay_s": DELAY, "bandwidth_Bps": BANDWIDTH, "session_seconds": round(seconds, 1),
                             "proxied_bytes": {n: p.bytes - sent[n] for n, p in cluster.proxy.items()}})  # fmt: skip
    assert report["solver"]["integer_total"] >= 0
    # every node's peers reached it through its proxy only
    for name, proxy in cluster.proxy.items():
        assert proxy.bytes - sent[name] > 0, name
    # every protocol byte between the nodes crossed a proxy (TLS records on top)
    assert sum(p.bytes - sent[n] for n, p in cluster.proxy.items()) >= report["wire"]["bytes_total"]
