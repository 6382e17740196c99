"""The development CA: one certificate per node, naming it, signed by the CA; keys private."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cels.certs import make_dev_certs, node_names
from cels.node.tls import certificate_identity
from cels.cli import main


def test_node_names() -> None:
    assert node_names(3) == ["solver", "party-1", "party-2", "party-3", "controller-solver", "controller-party-1", "controller-party-2", "controller-party-3"]
    with pytest.raises(ValueError, match="at least 2 parties"):
        node_names(1)


def test_every_certificate_names_its_node_and_chains_to_the_ca(tmp_path) -> None:
    certs = make_dev_certs(tmp_path, node_names(2))
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for name, paths in certs.items():
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName) == [name]
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
        identity = certificate_identity(paths.cert.read_bytes())  # a leaf, one DNS SAN (issue 13 item 12)
        assert (identity.name, identity.serves) == (name, True)
        key = serialization.load_pem_private_key(paths.key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert key.public_key().public_numbers() == cert.public_key().public_numbers()
        assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600


def test_two_runs_make_different_cas(tmp_path) -> None:
    make_dev_certs(tmp_path / "a", ["solver"])
    make_dev_certs(tmp_path / "b", ["solver"])
    assert (tmp_path / "a" / "ca.pem").read_bytes() != (tmp_path / "b" / "ca.pem").read_bytes()
    other_ca = x509.load_pem_x509_certificate((tmp_path / "b" / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "a" / "solver.pem").read_bytes())
    with pytest.raises(Exception):
        cert.verify_directly_issued_by(other_ca)


def test_cels_certs_command(tmp_path, capsys) -> None:
    assert main(["certs", "--out", str(tmp_path / "c"), "--parties", "4"]) == 0
    names = {p.name for p in (tmp_path / "c").iterdir()}
    assert names == {"ca.pem"} | {f"{n}.{ext}" for n in node_names(4) for ext in ("pem", "key")}
    assert "party-4" in capsys.readouterr().out
    for name in node_names(4):
        assert certificate_identity((tmp_path / "c" / f"{name}.pem").read_bytes()).name == name
    assert main(["certs", "--out", str(tmp_path / "d"), "--parties", "1"]) == 2
