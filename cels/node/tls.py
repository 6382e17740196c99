"""Mutual TLS: credentials from PEM files, channels pinned to a peer's name, peer identity."""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("cels.node")

DNS_REFRESH_MS = 1000
"""How soon a channel may look its peer's name up again after a failed connection: a peer
restarted at a new address (a recreated container, a rescheduled pod) is found before the
watchdog's probes declare it dead (cels.node.link.PROBE_TIMEOUT_MAX unreachable), not after gRPC's
default floor of 30 s between two lookups."""

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # a restarted peer is reached within ~2 s, not after gRPC's default backoff of up to 120 s
    # (issue 13 item 10: a channel that failed during the outage refused the next sessions)
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.dns_min_time_between_resolutions_ms", DNS_REFRESH_MS),
]

INSECURE_WARNING = "WARNING: --insecure: no TLS, peers are NOT authenticated and traffic is NOT encrypted (development only)"


def warn_insecure(who: str) -> None:
    """The loud warning every insecure node and client prints."""
    print(f"{who}: {INSECURE_WARNING}", file=sys.stderr, flush=True)
    log.warning("%s: %s", who, INSECURE_WARNING)


def server_credentials(ca: Path, cert: Path, key: Path) -> grpc.ServerCredentials:
    """Server side of mutual TLS: clients must present a certificate signed by ``ca``."""
    return grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())], root_certificates=ca.read_bytes(), require_client_auth=True
    )


def open_channel(address: str, peer: str, ca: Path | None, cert: Path | None, key: Path | None) -> grpc.Channel:
    """A channel to ``address`` that only accepts a server whose certificate names ``peer``.

    Without credentials (``ca`` is None) the channel is plaintext (``--insecure``).
    """
    if ca is None or cert is None or key is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(), private_key=key.read_bytes(), certificate_chain=cert.read_bytes()
    )
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", peer), ("grpc.default_authority", peer)]
    return grpc.secure_channel(address, credentials, options=options)


@dataclass(frozen=True)
class Identity:
    """Who a verified client certificate says the caller is: its one name, and whether it may
    also serve (a node: EKU serverAuth besides clientAuth; a controller needs clientAuth only)."""

    name: str
    serves: bool


def peer_identity(context: grpc.ServicerContext) -> Identity:
    """The identity of the client's certificate (gRPC has verified its chain to the CA).

    Raises ValueError (issue 13 item 12) for a certificate that is itself a CA, that lacks EKU
    clientAuth, that does not carry exactly one DNS SAN (a subject CN alone names nobody;
    several SANs would let one certificate pose as several nodes), or whose CN names another."""
    pem = context.auth_context().get("x509_pem_cert")
    if not pem:
        raise ValueError("no client certificate")
    return certificate_identity(pem[0])


@functools.lru_cache(maxsize=256)
def certificate_identity(pem: bytes) -> Identity:
    """:func:`peer_identity` of one PEM certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    extensions = {type(e.value): e.value for e in cert.extensions}
    basic = extensions.get(x509.BasicConstraints)
    if basic is not None and basic.ca:
        raise ValueError("the certificate is a CA (CA:TRUE); a node's certificate is a leaf")
    usages = set(extensions.get(x509.ExtendedKeyUsage, []))
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise ValueError("the certificate lacks extended key usage clientAuth")
    san = extensions.get(x509.SubjectAlternativeName)
    names = san.get_values_for_type(x509.DNSName) if san is not None else []
    if len(names) != 1:
        raise ValueError(f"a node's certificate names exactly one node in a DNS SAN; this one names {len(names)} (a subject CN alone names none)")
    cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if any(cn != names[0] for cn in cns):
        raise ValueError(f"the certificate's CN {cns[0][:40]!r} differs from its name {names[0]!r}")
    return Identity(names[0], ExtendedKeyUsageOID.SERVER_AUTH in usages)


def warn_insecure_keys(config) -> bool:
    """True (with a warning) if the node accepts Paillier keys below 2048 bits (paper reproduction)."""
    if config.min_key_bits >= 2048:
        return False
    print(
        f"{config.name}: WARNING: accepting Paillier keys of {config.min_key_bits} bits "
        "(below 2048: only to reproduce the paper's measurements)",
        file=sys.stderr,
        flush=True,
    )
    return True
