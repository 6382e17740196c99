"""TLS refusal matrix (issue 13): what a node answers a caller whose credentials are not a node's.

The nodes run with certificates from a CA this module holds (cels.certs.DevCA), so that it can
also issue the odd certificates a careless or hostile CA operator might.  Every case calls
Signal(PROBE) on party-2 (Deliver for the spoofed sender) and states the status code:

- refused in the TLS handshake (gRPC's verification against the node's CA, which also checks
  that a client certificate allows clientAuth): UNAVAILABLE;
- a verified certificate that is no node identity (issue 13 item 12: a CA, a node without
  serverAuth, no EKU, a CN alone, two names, a CN naming another than the SAN):
  UNAUTHENTICATED, from cels.node.tls.peer_identity;
- a node identity the node does not expect, or a message whose ``sender`` is not the
  certificate's name: PERMISSION_DENIED.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cels.certs import DevCA
from cels.node.framing import to_frames
from cels.node.tls import CHANNEL_OPTIONS, certificate_identity
from cels.protocol.wire import cels_pb2, cels_pb2_grpc
from conftest import stop_and_count
from fault_harness import CONTROLLER, FAULTS, NODES, PARTIES, SOLVER, FaultCluster

TARGET = PARTIES[1]
CALL_DEADLINE = 10.0
BOTH = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
DAY = datetime.timedelta(days=1)


@pytest.fixture(scope="module")
def ca() -> DevCA:
    return DevCA.create()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, ca: DevCA):
    nodes = FaultCluster(tmp_path_factory.mktemp("tls"), users=60, pairs=40)
    ca.write(nodes.certs, [*NODES, CONTROLLER])  # the nodes trust this module's CA
    try:
        nodes.start()
        yield nodes
    finally:
        stop_and_count(nodes)


def certificate(ca: DevCA, *, cn: str = "party-1", sans: list[str] | None = ("party-1",), usages=BOTH, is_ca: bool = False,
                valid: tuple[datetime.timedelta, datetime.timedelta] = (-DAY, DAY)) -> tuple[bytes, bytes]:  # fmt: skip
    """(certificate PEM, key PEM) signed by ``ca`` with the given oddities."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + valid[0])
        .not_valid_after(now + valid[1])
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in sans]), critical=False)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def tls_channel(cluster: FaultCluster, root: bytes, pair: tuple[bytes, bytes] | None, server_name: str = TARGET) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=pair[1] if pair else None, certificate_chain=pair[0] if pair else None)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name), ("grpc.default_authority", server_name)]
    return grpc.secure_channel(cluster.listen[TARGET], credentials, options=options)


def probe(channel: grpc.Channel) -> cels_pb2.SessionState:
    request = cels_pb2.SessionSignal(session_id="tls-matrix", kind=cels_pb2.SessionSignal.PROBE)
    return cels_pb2_grpc.CelsNodeStub(channel).Signal(request, timeout=CALL_DEADLINE)


def spoofed_delivery(channel: grpc.Channel) -> None:
    envelope = cels_pb2.Envelope(session_id="tls-matrix", sender=PARTIES[2], abort=cels_pb2.Abort(session_id="tls-matrix", reason="spoof"))
    cels_pb2_grpc.CelsNodeStub(channel).Deliver(iter(to_frames(envelope, 1)), timeout=CALL_DEADLINE)


def cases(cluster: FaultCluster, ca: DevCA) -> dict[str, tuple[grpc.StatusCode, Callable[[], object]]]:
    """case -> (the status code it gets, the call)."""
    root = ca.cert.public_bytes(serialization.Encoding.PEM)
    stranger = DevCA.create()
    secure = lambda pair, server=TARGET: lambda: probe(tls_channel(cluster, root, pair, server))  # noqa: E731
    return {
        "no client certificate": (grpc.StatusCode.UNAVAILABLE, secure(None)),
        "another CA": (grpc.StatusCode.UNAVAILABLE, lambda: probe(tls_channel(cluster, root, certificate(stranger)))),
        "expired": (grpc.StatusCode.UNAVAILABLE, secure(certificate(ca, valid=(-2 * DAY, -DAY)))),
        "not yet valid": (grpc.StatusCode.UNAVAILABLE, secure(certificate(ca, valid=(DAY, 2 * DAY)))),
        "plaintext": (grpc.StatusCode.UNAVAILABLE, lambda: probe(grpc.insecure_channel(cluster.listen[TARGET]))),
        "server is not the node dialled": (grpc.StatusCode.UNAVAILABLE, secure(certificate(ca), server=SOLVER)),
        "a name that is no node": (grpc.StatusCode.PERMISSION_DENIED, secure(certificate(ca, cn="mallory", sans=["mallory"]))),
        "wrong EKU (serverAuth only)": (grpc.StatusCode.UNAVAILABLE, secure(certificate(ca, usages=[ExtendedKeyUsageOID.SERVER_AUTH]))),
        "no serverAuth for a node": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, usages=[ExtendedKeyUsageOID.CLIENT_AUTH]))),
        "a CA certificate (CA:TRUE)": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, is_ca=True))),
        "CN alone, no SAN": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, sans=None))),
        "two node names": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, sans=["party-1", "solver"]))),
        "CN differs from the SAN": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, cn="solver", sans=["party-1"]))),
        "no EKU at all": (grpc.StatusCode.UNAUTHENTICATED, secure(certificate(ca, usages=[]))),
        "spoofed sender": (grpc.StatusCode.PERMISSION_DENIED, lambda: spoofed_delivery(tls_channel(cluster, root, certificate(ca)))),
    }


CASES = [
    "no client certificate", "another CA", "expired", "not yet valid", "plaintext", "server is not the node dialled",
    "a name that is no node", "wrong EKU (serverAuth only)", "no serverAuth for a node", "a CA certificate (CA:TRUE)",
    "CN alone, no SAN", "two node names", "CN differs from the SAN", "no EKU at all", "spoofed sender",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_refused_with_the_stated_code(cluster: FaultCluster, ca: DevCA, case: str) -> None:
    code, call = cases(cluster, ca)[case]
    with pytest.raises(grpc.RpcError) as refused:
        call()
    FAULTS.add("tls_cases")
    assert refused.value.code() == code, f"{case}: {refused.value.code().name}: {refused.value.details()}"


def test_a_node_certificate_is_accepted_and_the_node_serves(cluster: FaultCluster, ca: DevCA, tmp_path) -> None:
    root = ca.cert.public_bytes(serialization.Encoding.PEM)
    assert probe(tls_channel(cluster, root, certificate(ca))).state == cels_pb2.SessionState.UNKNOWN
    assert cluster.run(cluster.options(), tmp_path / "out")["solver"]["integer_total"] >= 0


def test_what_cels_certs_issues_is_a_node_identity(ca: DevCA) -> None:
    cert, _key = ca.issue("party-7")
    identity = certificate_identity(cert.public_bytes(serialization.Encoding.PEM))
    assert (identity.name, identity.serves) == ("party-7", True)
    with pytest.raises(ValueError, match="names 2"):
        certificate_identity(certificate(ca, sans=["party-1", "solver"])[0])
    with pytest.raises(ValueError, match="CN 'solver' differs from its name 'party-1'"):
        certificate_identity(certificate(ca, cn="solver", sans=["party-1"])[0])
