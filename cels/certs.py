"""Node identities: what a node certificate is (:func:`node_identity`), and a development CA
with one certificate per node (``cels certs --out DIR --parties R``).

Each node is identified by the one name in its certificate (its only SAN, a DNS name, equal to
the subject CN): ``solver``, ``party-1`` .. ``party-R`` and ``controller`` (the ``cels run``
client); the certificate is a leaf (CA:FALSE) for TLS client and server auth (docs/security.md,
"Who a node accepts as a peer").  Keys are ECDSA P-256 from the OS CSPRNG (``cryptography``);
private keys are written with mode 0600.  The development CA is for development and tests
only: a deployment brings certificates from its own CA, issued by the same rules.
"""

from __future__ import annotations

import datetime
import functools
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


class CertificateError(ValueError):
    """A certificate that is no node identity (:func:`node_identity` says why)."""


NODE_USAGES = {ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth", ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth"}


def node_identity(cert: x509.Certificate) -> str:
    """The one node name ``cert`` carries; CertificateError unless it is a node certificate:
    a leaf (BasicConstraints CA:FALSE or absent), extended key usage clientAuth and serverAuth,
    exactly one subject alternative name, a DNS name, and a subject CN (if any) equal to it."""
    try:
        constraints = _extension(cert, x509.BasicConstraints)
        usages = _extension(cert, x509.ExtendedKeyUsage) or []
        sans = list(_extension(cert, x509.SubjectAlternativeName) or [])
        cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    except ValueError as exc:
        raise CertificateError(f"its extensions do not parse: {exc}") from None
    if constraints is not None and constraints.ca:
        raise CertificateError("it is a CA certificate (CA:TRUE), not a leaf")
    missing = [label for oid, label in NODE_USAGES.items() if oid not in usages]
    if missing:
        raise CertificateError(f"its extended key usage lacks {' and '.join(missing)}")
    if not sans:
        raise CertificateError(f"it has no subject alternative name (a CN alone, {cns[:1]}, names no node)")
    if len(sans) != 1 or not isinstance(sans[0], x509.DNSName):
        shown = [str(getattr(san, "value", san))[:64] for san in sans[:4]]
        raise CertificateError(f"it has {len(sans)} subject alternative names {shown}; a node has exactly one, a DNS name")
    name = sans[0].value
    if any(cn != name for cn in cns):
        raise CertificateError(f"its CN {cns[0][:64]!r} differs from its name {name[:64]!r}")
    return name


def _extension(cert: x509.Certificate, kind: type[x509.ExtensionType]) -> x509.ExtensionType | None:
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


@functools.lru_cache(maxsize=256)
def pem_identity(pem: bytes) -> str:
    """:func:`node_identity` of a PEM certificate (cached: a node sees its peers' certificates
    on every call)."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertificateError(f"not a PEM certificate: {exc}") from None
    return node_identity(cert)


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
