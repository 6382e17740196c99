"""A development CA and one certificate per node (``cels certs --out DIR --parties R``).

Each node is identified by the name in its certificate (subject CN and a DNS SAN): ``solver``,
``party-1`` .. ``party-R`` and ``controller`` (the ``cels run`` client).  Keys are ECDSA P-256
from the OS CSPRNG (``cryptography``); private keys are written with mode 0600.  For
development and tests only: a deployment brings certificates from its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cels.fileio import atomic_write

SOLVER = "solver"
CONTROLLER_PREFIX = "controller-"


def party_name(k: int) -> str:
    """The name of party P_k (1-based)."""
    return f"party-{k}"


def controller_name(node: str) -> str:
    """The identity of the controller of ``node``'s organisation: the one certificate whose
    ``Run``, status details and report stream that node serves by default."""
    return CONTROLLER_PREFIX + node


def node_names(parties: int) -> list[str]:
    """Every identity of a deployment with ``parties`` parties: the nodes, then one controller
    per organisation (each node's own, :func:`controller_name`)."""
    if parties < 2:
        raise ValueError(f"a CELS session needs at least 2 parties, not {parties}")
    nodes = [SOLVER, *(party_name(k) for k in range(1, parties + 1))]
    return [*nodes, *(controller_name(n) for n in nodes)]


@dataclass(frozen=True)
class NodeCert:
    """Where one node's credentials are: the CA certificate, its certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "CELS dev"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """``key`` as unencrypted PKCS#8 PEM at ``path``, 0600 from its creation, atomically."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with atomic_write(path, mode="wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(pem)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    """``cert`` as PEM at ``path``, atomically."""
    with atomic_write(path, mode="wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class DevCA:
    """A development certificate authority: its certificate and key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, days: int = 30) -> DevCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name("CELS development CA")
        not_before, not_after = _validity(days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, directory: Path) -> DevCA:
        """The CA kept in ``directory`` (``ca.pem``, ``ca.key``: :meth:`keep`)."""
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / 'ca.key'} is not an EC key")
        return cls(cert, key)

    def keep(self, directory: Path) -> None:
        """``directory/ca.pem`` and ``directory/ca.key`` (0600), for a CA that issues later."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_key(directory / "ca.key", self.key)
        write_cert(directory / "ca.pem", self.cert)

    def issue(self, name: str, days: int = 30, addresses: Sequence[str] = (), also: Sequence[str] = ()) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A node's certificate: a leaf (CA:FALSE) naming ``name`` (CN and the first DNS SAN),
        for TLS server and client authentication -- what a node accepts as a peer
        (cels.node.tls.peer_identity); ``also``: more DNS names, ``addresses``: IP SANs (a Ray
        process's, which its peers reach by address: cels.engine.ray.tls)."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([name, *also])]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(addresses)]
        not_before, not_after = _validity(days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert, key

    def write(self, out: Path, names: list[str], days: int = 30) -> dict[str, NodeCert]:
        """``out/ca.pem`` and ``out/NAME.pem`` / ``out/NAME.key`` for every name."""
        out.mkdir(parents=True, exist_ok=True)
        write_cert(out / "ca.pem", self.cert)
        result: dict[str, NodeCert] = {}
        for name in names:
            cert, key = self.issue(name, days)
            write_key(out / f"{name}.key", key)
            write_cert(out / f"{name}.pem", cert)
            result[name] = NodeCert(out / "ca.pem", out / f"{name}.pem", out / f"{name}.key")
        return result


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def make_dev_certs(out: str | os.PathLike[str], names: list[str], days: int = 30) -> dict[str, NodeCert]:
    """Write ``ca.pem`` and ``NAME.pem`` / ``NAME.key`` for every name into ``out`` (a fresh CA
    whose key is not kept)."""
    return DevCA.create(days).write(Path(out), names, days)
