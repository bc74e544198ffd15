"""TLS for every gRPC server and channel of a process: the one place that decides credentials.

A process is configured once at startup (`configure`, from its `--tls-*` flags); then every
server (`add_port`, used by rpc.build_server and rpc.AsyncServer) and every channel
(`channel`) takes its credentials from here, so no part can forget them.
Without a configuration everything stays plaintext, as before.

- `--tls-cert/--tls-key`: this process's certificate: what its servers present, and its
  identity when it dials a server that wants mutual TLS.
- `--tls-ca`: the CA this process trusts when it dials (setting it turns channels to TLS).
- `--tls-client-ca`: its servers require a client certificate signed by this CA (mutual TLS);
  a verified client certificate's subject CN is then an identity for mqmeta.auth's allow list.

The Raft port is not gRPC and keeps its own password (--secret-file), not TLS.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqmeta.errors import InvalidArgument

if TYPE_CHECKING:
    import grpc

# Keys larger than this are not PEM files we made or expect; reading stops there.
PEM_FILE_BYTES_MAX = 1 << 20


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes, read and checked once (`load`)."""

    cert: bytes | None = None  # this process's certificate chain
    key: bytes | None = None
    ca: bytes | None = None  # trusted when dialing
    client_ca: bytes | None = None  # clients must present a certificate signed by it

    @property
    def serves_tls(self) -> bool:
        return self.cert is not None

    @property
    def dials_tls(self) -> bool:
        return self.ca is not None

    @property
    def mutual(self) -> bool:
        """Its servers require and verify client certificates: a peer's is an identity."""
        return self.client_ca is not None


_current: TlsConfig | None = None


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    """The TLS flags of one subcommand (every server and client takes the same four)."""
    group = parser.add_argument_group("TLS (gRPC)")
    group.add_argument("--tls-cert", type=Path, help="PEM certificate: served, and the client identity")
    group.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    group.add_argument("--tls-ca", type=Path, help="PEM CA certificate(s) to trust when dialing (TLS on)")
    group.add_argument(
        "--tls-client-ca", type=Path, help="servers require client certificates signed by this CA (mTLS)"
    )


def config_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The flags' configuration (None when no TLS flag is given); InvalidArgument for a bad file."""
    paths = {name: getattr(args, f"tls_{name}", None) for name in ("cert", "key", "ca", "client_ca")}
    if all(path is None for path in paths.values()):
        return None
    return load(**paths)


def load(
    cert: Path | None = None, key: Path | None = None, ca: Path | None = None, client_ca: Path | None = None
) -> TlsConfig:
    """Reads and checks the files: each must be PEM, and the key must match the certificate."""
    if (cert is None) != (key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together: give both or neither")
    if client_ca is not None and cert is None:
        raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key (the server's certificate)")
    config = TlsConfig(
        cert=_read_certificates(cert, "--tls-cert") if cert else None,
        key=_read_key(key, cert) if key and cert else None,
        ca=_read_certificates(ca, "--tls-ca") if ca else None,
        client_ca=_read_certificates(client_ca, "--tls-client-ca") if client_ca else None,
    )
    return config


def _read(path: Path, flag: str) -> bytes:
    try:
        with path.open("rb") as file:
            return file.read(PEM_FILE_BYTES_MAX)
    except OSError as error:
        raise InvalidArgument(f"{flag} {path}: cannot read it ({error.strerror})") from None


def _read_certificates(path: Path, flag: str) -> bytes:
    from cryptography import x509

    data = _read(path, flag)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise InvalidArgument(f"{flag} {path} is not a PEM certificate") from None
    return data


def _read_key(path: Path, cert_path: Path) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _read(path, "--tls-key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise InvalidArgument(f"--tls-key {path} is not an unencrypted PEM private key") from None
    certificate = x509.load_pem_x509_certificates(_read(cert_path, "--tls-cert"))[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != certificate.public_key().public_bytes(
        encoding, public
    ):
        raise InvalidArgument(f"--tls-key {path} does not match the certificate {cert_path}")
    return data


def configure(config: TlsConfig | None) -> None:
    """Sets this process's TLS (None: plaintext). Called once at startup, before any server
    or channel exists."""
    global _current
    _current = config


def current() -> TlsConfig | None:
    return _current


def add_port(server: Any, address: str) -> int:
    """Binds `address` on a grpc.Server or grpc.aio.Server, with TLS when configured; the
    bound port (0 when it cannot listen: gRPC's own convention, which grpcio 1.85 keeps
    for some failures and replaces by a RuntimeError for others, e.g. a port in use)."""
    import grpc  # here, not at the top: the CLI's parser imports this module

    config = _current
    try:
        if config is None or not config.serves_tls:
            return int(server.add_insecure_port(address))
        assert config.cert is not None and config.key is not None
        credentials = grpc.ssl_server_credentials(
            [(config.key, config.cert)],
            root_certificates=config.client_ca,
            require_client_auth=config.client_ca is not None,
        )
        return int(server.add_secure_port(address, credentials))
    except RuntimeError:  # "Failed to bind to address ..."
        return 0


def channel_credentials(config: TlsConfig) -> grpc.ChannelCredentials:
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=config.ca, private_key=config.key, certificate_chain=config.cert
    )


def channel(target: str, options: Sequence[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A channel to `target`: TLS (with this process's certificate as its identity) when
    this process trusts a CA, plaintext otherwise."""
    import grpc

    from mqmeta import auth

    config = _current
    if config is None or not config.dials_tls:
        made = grpc.insecure_channel(target, options=options)
    else:
        made = grpc.secure_channel(target, channel_credentials(config), options=options)
    return auth.with_token(made)  # the bearer token of --token-file on every call


def aio_channel(target: str, options: Sequence[tuple[str, Any]] | None = None) -> Any:
    """An asyncio channel to `target`, TLS as `channel` decides. No token is added: the one
    caller, the nameservers' RocketMQ 5 proxy, forwards each client's own metadata."""
    import grpc

    config = _current
    if config is None or not config.dials_tls:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, channel_credentials(config), options=options)


def flags_of(paths: dict[str, Path]) -> list[str]:
    """Command-line flags for child processes, from {"cert": path, "key": ..., ...}."""
    flags: list[str] = []
    for name, path in paths.items():
        flags += [f"--tls-{name.replace('_', '-')}", str(path)]
    return flags


def explain_refusal(details: str) -> str:
    """A hint for a connection that failed in a way TLS explains (empty otherwise): a
    plaintext client of a TLS server, a CA that did not sign the server's certificate, a
    missing or untrusted client certificate."""
    lowered = details.lower()
    config = _current
    if "certificate_verify_failed" in lowered or "handshake failed" in lowered:
        return "the server's certificate is not signed by the CA of --tls-ca, or the server does not use TLS"
    if "socket closed" not in lowered and "connection reset" not in lowered:
        return ""
    if config is None or not config.dials_tls:
        return "the server may want TLS: pass --tls-ca (and --tls-cert/--tls-key for mutual TLS)"
    if config.cert is None:
        return "the server may want a client certificate (mutual TLS): pass --tls-cert and --tls-key"
    return "the server may not trust this client's certificate (--tls-cert), or may not use TLS"
