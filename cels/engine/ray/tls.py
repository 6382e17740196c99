"""TLS for a party's Ray cluster (docs/ray.md, "TLS for a cluster across machines"):
``cels ray-tls``.

Ray's gRPC channels check a peer's certificate against the address they dial, and Ray dials
its processes by IP address (measured with Ray 2.60: a head whose certificate names only its
host name, or only ``localhost``, never finishes ``ray start``).  So every Ray process needs a
certificate of its own host, naming the addresses Ray may advertise for it, and those are known
only where it runs (a container's or a pod's address).  The party keeps a Ray CA of its own
(``ca.pem``, ``ca.key``: in the cluster's trust boundary, never another party's); each Ray
host, as it starts, issues itself a certificate from it.  The party node, a client of the
cluster only (``ray://``), needs a client certificate of that CA, which names no address.
"""

from __future__ import annotations

import socket
from pathlib import Path

from cryptography import x509

from cels.certs import DevCA, write_cert, write_key

LOOPBACK_NAMES = ("localhost",)


def host_addresses() -> list[str]:
    """The IPv4 addresses Ray may advertise for this host: loopback, the address of the
    default route (what Ray itself picks: ``node_ip_address_from_perspective``) and those of
    the host name."""
    found = ["127.0.0.1"]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet leaves (UDP connect only picks a route)
        found.append(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    try:
        found += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return list(dict.fromkeys(found))


def write_ray_tls(ca_dir: Path, out: Path, name: str, client: bool = False, days: int = 30) -> list[str]:
    """The party's Ray CA in ``ca_dir`` (made, 0700 / key 0600, if it has none), and ``name``'s
    certificate from it in ``out``: ``tls.pem``, ``tls.key`` (0600) and ``ca.pem``, what
    ``RAY_TLS_SERVER_CERT``, ``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT`` name.  A host's
    (``client`` False) names ``name``, ``localhost`` and the host name, and every address of
    :func:`host_addresses`; a client's names ``name`` only.  Returns the names and addresses it names."""
    if (ca_dir / "ca.key").is_file():
        ca = DevCA.load(ca_dir)
    else:
        ca = DevCA.create(days)
        ca.keep(ca_dir)
    addresses = [] if client else host_addresses()
    also = [] if client else [*LOOPBACK_NAMES, socket.gethostname()]
    cert, key = ca.issue(name, days, addresses=addresses, also=also)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_key(out / "tls.key", key)
    write_cert(out / "tls.pem", cert)
    write_cert(out / "ca.pem", ca.cert)
    return [str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]
