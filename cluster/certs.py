"""A local CA and certificates for `mqmeta local up --tls` (and tests), made with cryptography.

DIR/tls/ holds ca.pem and its key ca.key (kept so that more identities can be issued
later: `issue_certificate`), node.pem/node.key (every server of the cluster: 127.0.0.1
and localhost, usable as a server and as a client, since brokers and nameservers dial
each other with it; subject CN `mqmeta node`), client.pem/client.key (CLI users and
client libraries; CN `mqmeta client`) and admin.pem/admin.key (an operator; CN
`mqmeta admin`). The CNs are the identities `local up --auth` puts on the allow list
(LOCAL_CERT_IDENTITIES). Key files are written with mode 0600; an existing set is
reused, so a restart on the same DIR keeps the same CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_VALIDITY_DAYS = 365
KEY_FILE_MODE = 0o600
NODE_CN, CLIENT_CN, ADMIN_CN = "mqmeta node", "mqmeta client", "mqmeta admin"
# (name, role, certificate CN) of the allow list's certificate lines for `local up --tls --auth`:
# the cluster's own processes and the operator's certificate are admins (brokers register
# with no token file), the client certificate reads (and produces and consumes).
LOCAL_CERT_IDENTITIES = (
    ("nodes", "admin", NODE_CN),
    ("admin", "admin", ADMIN_CN),
    ("clients", "read", CLIENT_CN),
)


@dataclass(frozen=True)
class LocalCerts:
    ca: Path
    node_cert: Path
    node_key: Path
    client_cert: Path
    client_key: Path
    admin_cert: Path
    admin_key: Path

    def server_flags(self) -> list[str]:
        """Flags of every cluster process: serve with node.pem, require client certificates
        of this CA (mutual TLS), and dial each other trusting the CA with node.pem as identity."""
        return [
            *("--tls-cert", str(self.node_cert), "--tls-key", str(self.node_key)),
            *("--tls-ca", str(self.ca), "--tls-client-ca", str(self.ca)),
        ]

    def client_flags(self) -> list[str]:
        return [
            *("--tls-ca", str(self.ca), "--tls-cert", str(self.client_cert)),
            *("--tls-key", str(self.client_key)),
        ]


def ensure_local_certs(directory: Path, name: str = "mqmeta local CA") -> LocalCerts:
    """The CA and certificates in `directory`, made when absent (all of them anew when one
    is missing: a set from before ca.key and admin.pem existed is replaced)."""
    certs = LocalCerts(
        ca=directory / "ca.pem",
        node_cert=directory / "node.pem",
        node_key=directory / "node.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        admin_cert=directory / "admin.pem",
        admin_key=directory / "admin.key",
    )
    paths = (certs.ca, directory / "ca.key", certs.node_cert, certs.node_key, certs.client_cert)
    if all(p.exists() for p in (*paths, certs.client_key, certs.admin_cert, certs.admin_key)):
        return certs
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / "ca.key", ca_key)
    _write_cert(certs.ca, ca_cert)
    _issue(certs.node_cert, certs.node_key, NODE_CN, ca_cert, ca_key, server=True)
    _issue(certs.client_cert, certs.client_key, CLIENT_CN, ca_cert, ca_key, server=False)
    _issue(certs.admin_cert, certs.admin_key, ADMIN_CN, ca_cert, ca_key, server=False)
    return certs


def issue_certificate(directory: Path, stem: str, common_name: str) -> tuple[Path, Path]:
    """A client certificate DIR/STEM.pem (and STEM.key) with subject CN `common_name`,
    signed by the CA of `directory` (made by ensure_local_certs)."""
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    _issue(cert_path, key_path, common_name, ca_cert, ca_key, server=False)
    return cert_path, key_path


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a little clock skew between hosts
        .not_valid_after(now + datetime.timedelta(days=CERT_VALIDITY_DAYS))
    )


def _issue(cert_path: Path, key_path: Path, common_name: str, ca_cert, ca_key, server: bool) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    _write_key(key_path, key)
    _write_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_private(path, data)


def _write_cert(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class LocalTokens:
    auth_file: Path  # the servers' allow list: NAME ROLE TOKEN (and NAME ROLE cn:CN) lines
    admin_token: Path
    read_token: Path


def ensure_local_tokens(directory: Path, certificates: bool = False) -> LocalTokens:
    """Random bearer tokens for `local up --auth` (made when absent; every file mode 0600),
    and the allow list DIR/tokens written anew each time: the two tokens, and with
    `certificates` (mutual TLS) the lines of LOCAL_CERT_IDENTITIES."""
    import secrets

    tokens = LocalTokens(directory / "tokens", directory / "admin.token", directory / "read.token")
    directory.mkdir(parents=True, exist_ok=True)
    for path in (tokens.admin_token, tokens.read_token):
        if not path.exists():
            _write_private(path, f"{secrets.token_urlsafe(32)}\n".encode())
    admin, reader = (p.read_text().strip() for p in (tokens.admin_token, tokens.read_token))
    lines = [f"operator admin {admin}", f"viewer read {reader}"]
    if certificates:
        lines += [f"{name} {role} cn:{common_name}" for name, role, common_name in LOCAL_CERT_IDENTITIES]
    _write_private(tokens.auth_file, ("\n".join(lines) + "\n").encode())
    return tokens


def _write_private(path: Path, data: bytes) -> None:
    """Created 0600: never readable by others, not even for a moment (chmod: an existing
    file keeps its mode through O_CREAT)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_FILE_MODE)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.chmod(path, KEY_FILE_MODE)
