"""A development CA and one certificate per node (``cels certs --out DIR --parties R``).

Each node is identified by the name in its certificate (subject CN and a DNS SAN): ``solver``,
``party-1`` .. ``party-R`` and ``controller`` (the ``cels run`` client).  Keys are ECDSA P-256
from the OS CSPRNG (``cryptography``); private keys are written with mode 0600.  For
development and tests only: a deployment brings certificates from its own CA.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cels.fileio import atomic_write

SOLVER = "solver"
CONTROLLER = "controller"


def party_name(k: int) -> str:
    """The name of party P_k (1-based)."""
    return f"party-{k}"


def node_names(parties: int) -> list[str]:
    """Every identity of a deployment with ``parties`` parties."""
    if parties < 2:
        raise ValueError(f"a CELS session needs at least 2 parties, not {parties}")
    return [SOLVER, *(party_name(k) for k in range(1, parties + 1)), CONTROLLER]


@dataclass(frozen=True)
class NodeCert:
    """Where one node's credentials are: the CA certificate, its certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "CELS dev"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with atomic_write(path, mode="wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    with atomic_write(path, mode="wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))


def make_dev_certs(out: str | os.PathLike[str], names: list[str], days: int = 30) -> dict[str, NodeCert]:
    """Write ``ca.pem`` and ``NAME.pem`` / ``NAME.key`` for every name into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("CELS development CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(out / "ca.pem", ca_cert)
    result: dict[str, NodeCert] = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(out / f"{name}.key", key)
        _write_cert(out / f"{name}.pem", cert)
        result[name] = NodeCert(out / "ca.pem", out / f"{name}.pem", out / f"{name}.key")
    return result
