"""TLS on the remoting listeners, with the process's certificate, as its gRPC ports have it.

Properties checked:
- the real C++ client (rocketmq-client-python 2.0.0 over librocketmq.so, its SSL switch and
  tls.client.* property file) speaks TLS to a listener with our certificates, verifying the
  server's and presenting its own (mutual TLS): its first request arrives whole;
- a TLS nameserver (one `mqmeta namesrv --embed-controller` process with the local CA's
  certificates, client certificates required) answers a TLS client with a certificate, and
  serves no plaintext request and no client without a certificate.
"""

from __future__ import annotations

import socket
import ssl
import threading

import pytest
from mqmeta.cluster.certs import ensure_local_certs

from mqmeta.codec import remoting as codec
from tests.support import wait_for
from tests.support.remoting_clients import client
from tests.support.remoting_namesrv import remoting_namesrv

pytestmark = pytest.mark.timeout(120)


def _read(sock) -> codec.Command:
    prefix = _exactly(sock, 4)
    return codec.decode_frame(_exactly(sock, codec.frame_length(prefix)))


def _exactly(sock, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return ensure_local_certs(tmp_path_factory.mktemp("certs"))


def _client_context(certs, with_certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.check_hostname = False
    if with_certificate:
        context.load_cert_chain(certs.client_cert, certs.client_key)
    return context


def test_the_cpp_client_speaks_mutual_tls(tmp_path, certs):
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.node_cert, certs.node_key)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(cafile=str(certs.ca))
    captured: list = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"

        def capture() -> None:
            raw, _ = listener.accept()
            with server.wrap_socket(raw, server_side=True) as connection:
                captured.append((connection.getpeercert(), _read(connection)))

        threading.Thread(target=capture, daemon=True).start()
        properties = tmp_path / "tls.properties"
        lines = [
            f"tls.client.certPath={certs.client_cert}",
            f"tls.client.keyPath={certs.client_key}",
            f"tls.client.trustCertPath={certs.ca}",
            "tls.client.authServer=true",
        ]
        properties.write_text("\n".join(lines) + "\n")
        rocketmq = client("rocketmq-client-python", tmp_path / "home")
        producer = rocketmq.stream(
            tmp_path / "out.jsonl", "produce-tls", address, "TlsTopic", str(properties)
        )
        try:
            wait_for(lambda: captured, 30, "the client's first request over TLS")
        finally:
            producer.kill()
            producer.wait()
    ((peer, request),) = captured
    assert peer, "the client presented no certificate"
    assert request.code == codec.GET_ROUTEINFO_BY_TOPIC and request.ext["topic"] == "TlsTopic"


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory, certs):
    root = tmp_path_factory.mktemp("tls")
    with remoting_namesrv(root, certs.server_flags()) as remoting:
        yield remoting


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_tls_nameserver_serves_tls_clients_with_certificates_only(namesrv, certs):
    route = codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 3, ext={"topic": "Nope"})
    with _client_context(certs).wrap_socket(_connect(namesrv)) as sock:
        sock.sendall(codec.encode(route))
        answer = _read(sock)
    assert answer.code == codec.TOPIC_NOT_EXIST and answer.opaque == 3
    with _connect(namesrv) as plain:
        plain.sendall(codec.encode(route))
        with pytest.raises((ConnectionError, OSError)):
            _read(plain)  # not TLS: the handshake fails and the connection closes, unanswered
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with _client_context(certs, with_certificate=False).wrap_socket(_connect(namesrv)) as sock:
            sock.sendall(codec.encode(route))
            _read(sock)  # no client certificate: refused
