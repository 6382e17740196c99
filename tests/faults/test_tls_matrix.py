"""TLS refusal matrix (issue 13): who a node accepts as a peer, with real node processes.

The certificates are made here with ``cryptography``: a test CA that the nodes trust (its
proper node certificates are what the cluster runs with), and for each case a client identity
that must be refused, with the status code the case states:

- UNAVAILABLE: the TLS handshake fails (gRPC reports a connection it could not make): no
  client certificate, another CA, an expired or not-yet-valid certificate, a wrong EKU
  (serverAuth only; BoringSSL checks the client purpose), plaintext against a TLS port, and a
  server that is not the node the client pinned;
- UNAUTHENTICATED: the handshake succeeds (the CA signed it) but the certificate is no node
  identity (cels.certs.node_identity): CA:TRUE, a CN alone, two node names as SANs;
- PERMISSION_DENIED: a node identity the node does not expect (a name that is no peer) or an
  envelope whose ``sender`` is not the certificate's name (spoofing).

Each identity calls Signal (PROBE) and Deliver on party-1; a proper peer certificate gets OK /
FAILED_PRECONDITION (an unknown session) both before and after, so the node still serves.
The unit part checks :func:`cels.certs.node_identity` on the same certificates, and that
``cels certs`` issues exactly node certificates.  Count: ``tls_cases`` in the summary.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cels.certs import CertificateError, node_identity
from cels.node.framing import to_frames
from cels.node.tls import CHANNEL_OPTIONS, open_channel
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from fault_harness import CONTROLLER, FAULTS, NODES, PARTIES, FaultCluster

TARGET = PARTIES[0]
PEER = PARTIES[1]
NOW = datetime.datetime.now(datetime.timezone.utc)
BOTH = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
CALL_TIMEOUT = 10.0


class MatrixCA:
    """A CA made with ``cryptography``; :meth:`issue` signs a certificate with the given quirks."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = self._sign(self.name, self.key.public_key(), [x509.BasicConstraints(ca=True, path_length=None)], NOW)

    def _sign(self, subject: x509.Name, public_key, extensions: list, start: datetime.datetime, days: int = 30) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self.name).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - datetime.timedelta(minutes=5)).not_valid_after(start + datetime.timedelta(days=days))
        )  # fmt: skip
        for extension in extensions:
            builder = builder.add_extension(extension, critical=isinstance(extension, x509.BasicConstraints))
        return builder.sign(self.key, hashes.SHA256())

    def issue(self, cn: str | None, sans: list[str], *, ca: bool = False, usages=BOTH, start=NOW, days: int = 30) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
        extensions: list = [x509.BasicConstraints(ca=ca, path_length=None)]
        if sans:
            extensions.append(x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]))
        if usages:
            extensions.append(x509.ExtendedKeyUsage(list(usages)))
        return self._sign(subject, key.public_key(), extensions, start, days), key


@dataclass(frozen=True)
class Identity:
    """A client identity as files: CA to verify the server, certificate and key (None: none)."""

    ca: Path
    cert: Path | None
    key: Path | None


def write_identity(directory: Path, name: str, ca: MatrixCA, issued) -> Identity:
    cert, key = issued
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return Identity(directory / "ca.pem", directory / f"{name}.pem", directory / f"{name}.key")


CA = MatrixCA("CELS test CA")
OTHER_CA = MatrixCA("another CA")
WEEK = datetime.timedelta(days=7)
# case: (how the certificate is made, as which sender it delivers, the code, node_identity's refusal or None)
CASES = {
    "another CA": (lambda: OTHER_CA.issue(PEER, [PEER]), PEER, "UNAVAILABLE", None),
    "expired": (lambda: CA.issue(PEER, [PEER], start=NOW - 4 * WEEK, days=7), PEER, "UNAVAILABLE", None),
    "not yet valid": (lambda: CA.issue(PEER, [PEER], start=NOW + WEEK), PEER, "UNAVAILABLE", None),
    "wrong EKU (serverAuth only)": (lambda: CA.issue(PEER, [PEER], usages=(ExtendedKeyUsageOID.SERVER_AUTH,)), PEER, "UNAVAILABLE", "lacks clientAuth"),
    "CA:TRUE": (lambda: CA.issue(PEER, [PEER], ca=True), PEER, "UNAUTHENTICATED", "CA:TRUE"),
    "CN only": (lambda: CA.issue(PEER, []), PEER, "UNAUTHENTICATED", "no subject alternative name"),
    "two SANs": (lambda: CA.issue(PEER, [PEER, "solver"]), PEER, "UNAUTHENTICATED", "2 subject alternative names"),
    "no EKU": (lambda: CA.issue(PEER, [PEER], usages=()), PEER, "UNAUTHENTICATED", "lacks clientAuth and serverAuth"),
    "CN differs from SAN": (lambda: CA.issue("solver", [PEER]), PEER, "UNAUTHENTICATED", "differs from its name"),
    "wrong name (no node)": (lambda: CA.issue("mallory", ["mallory"]), "mallory", "PERMISSION_DENIED", None),
    "spoofed sender": (lambda: CA.issue(PEER, [PEER]), PARTIES[2], "PERMISSION_DENIED", None),
}


CLUSTER = {"users": 60, "pairs": 40}


def start_cluster(nodes: FaultCluster) -> None:
    """party-1 alone (enough to be refused by), running with the test CA's node certificates."""
    for name in (*NODES, CONTROLLER):
        write_identity(nodes.certs, name, CA, CA.issue(name, [name]))
    nodes.start_node(TARGET)
    nodes.wait_serving(TARGET)


def probe(session_id: str = "no-such-session") -> cels_pb2.SessionSignal:
    return cels_pb2.SessionSignal(session_id=session_id, kind=cels_pb2.SessionSignal.PROBE)


def hop(sender: str) -> list[cels_pb2.Frame]:
    result = cels_pb2.SumResult(session_id="no-such-session", sum_id="tls", values=[1])
    return to_frames(cels_pb2.Envelope(session_id="no-such-session", sender=sender, sum_result=result), 1)


def codes(channel: grpc.Channel, sender: str) -> tuple[str, str, str]:
    """(Signal's code, Deliver's code, the details of the last refusal) on ``channel``."""
    stub = cels_pb2_grpc.CelsNodeStub(channel)
    found, details = [], ""
    for call in (lambda: stub.Signal(probe(), timeout=CALL_TIMEOUT), lambda: stub.Deliver(iter(hop(sender)), timeout=CALL_TIMEOUT)):
        try:
            call()
            found.append("OK")
        except grpc.RpcError as exc:
            found.append(exc.code().name)
            details = exc.details() or ""
    return found[0], found[1], details


def assert_serves(cluster: FaultCluster) -> None:
    """A proper peer still gets its answers: the probe OK ("unknown"), a hop of an unknown
    session FAILED_PRECONDITION."""
    channel = cluster.channel(TARGET, PEER)
    assert cels_pb2_grpc.CelsNodeStub(channel).Signal(probe(), timeout=CALL_TIMEOUT).state == "unknown"
    assert codes(channel, PEER)[1] == "FAILED_PRECONDITION"


# -- unit: what a node certificate is ----------------------------------------------------------


@pytest.mark.parametrize("case", [c for c, spec in CASES.items() if spec[3] is not None])
def test_node_identity_refuses(case: str) -> None:
    cert, _ = CASES[case][0]()
    with pytest.raises(CertificateError, match=CASES[case][3]):
        node_identity(cert)


def test_node_identity_of_proper_certificates() -> None:
    assert node_identity(CA.issue(PEER, [PEER])[0]) == PEER
    assert node_identity(CA.issue(None, [PEER])[0]) == PEER  # a SAN without a CN is a name


# -- live: the matrix on a running node --------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_a_bad_client_identity_is_refused(cluster: FaultCluster, tmp_path: Path, case: str) -> None:
    make, sender, expected, _ = CASES[case]
    identity = write_identity(tmp_path, "client", OTHER_CA if case == "another CA" else CA, make())
    if case == "another CA":  # it trusts the right CA for the server, but presents another CA's certificate
        identity = Identity(cluster.certs / "ca.pem", identity.cert, identity.key)
    with open_channel(cluster.listen[TARGET], TARGET, identity.ca, identity.cert, identity.key) as channel:
        signal_code, deliver_code, details = codes(channel, sender)
    FAULTS.add("tls_cases")
    if case == "spoofed sender":  # the certificate is party-2's: it may probe, not send as party-3
        assert (signal_code, deliver_code) == ("OK", expected), details
        assert f"claims sender {PARTIES[2]!r} but the certificate names ['{PEER}']" in details
    else:
        assert (signal_code, deliver_code) == (expected, expected), (case, details)
    if expected == "UNAUTHENTICATED":
        assert f"{TARGET}: the client certificate is no node identity: " in details and CASES[case][3] in details, details
    assert_serves(cluster)


def test_no_client_certificate_is_unavailable(cluster: FaultCluster) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=(cluster.certs / "ca.pem").read_bytes())
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", TARGET)]
    with grpc.secure_channel(cluster.listen[TARGET], credentials, options=options) as channel:
        assert codes(channel, PEER)[:2] == ("UNAVAILABLE", "UNAVAILABLE")
    FAULTS.add("tls_cases")
    assert_serves(cluster)


def test_plaintext_is_unavailable(cluster: FaultCluster) -> None:
    with open_channel(cluster.listen[TARGET], TARGET, None, None, None) as channel:  # --insecure's channel
        assert codes(channel, PEER)[:2] == ("UNAVAILABLE", "UNAVAILABLE")
    FAULTS.add("tls_cases")
    assert_serves(cluster)


def test_a_server_that_is_not_the_pinned_node_is_unavailable(cluster: FaultCluster) -> None:
    """The client side: a proper certificate, but the server at that address is party-1, and
    the client expects the solver (its name is pinned, cels.node.tls.open_channel)."""
    certs = cluster.certs
    with open_channel(cluster.listen[TARGET], "solver", certs / "ca.pem", certs / f"{PEER}.pem", certs / f"{PEER}.key") as channel:
        assert codes(channel, PEER)[:2] == ("UNAVAILABLE", "UNAVAILABLE")
    FAULTS.add("tls_cases")
    assert_serves(cluster)
