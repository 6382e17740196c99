"""Mutual TLS: credentials from PEM files, channels pinned to a peer's name, peer identity."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import grpc

from cels.certs import CertificateError, pem_identity

log = logging.getLogger("cels.node")

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
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


def peer_name(context: grpc.ServicerContext) -> str:
    """The one node name of the client's verified certificate (cels.certs.node_identity);
    CertificateError if the certificate is no node identity."""
    pem = context.auth_context().get("x509_pem_cert")
    if not pem:
        raise CertificateError("the client presented no certificate")
    return pem_identity(pem[0])


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
