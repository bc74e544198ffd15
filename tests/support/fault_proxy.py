"""What the fault-proxy tests share: a server per module, raw HTTP, loopback upstreams, sockets.

The Toxiproxy tests these files port use a few helpers of their own (testhelper.NewUpstream,
WithEchoProxy, WithEstablishedProxy, AssertProxyUp); these are their Python counterparts. The
test modules load this one as a pytest plugin for its fixtures (PYTEST_DONT_REWRITE: it is imported
before pytest could rewrite its asserts).
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from mqmeta.chaos.toxiproxy import ToxiproxyServer
from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

SOCKET_TIMEOUT_S = 5.0


# --- the server and its API ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer("127.0.0.1:0", seed=7) as started:
        yield started


@pytest.fixture
def toxiproxy(server: ToxiproxyServer) -> Iterator[Toxiproxy]:
    """The unchanged toxiproxy-python client; every proxy is deleted after the test."""
    client = Toxiproxy()
    client.update_api_consumer(server.host, server.port)
    try:
        yield client
    finally:
        client.destroy_all()


@dataclass
class Answer:
    status: int
    body: Any  # parsed JSON, or the text when it is not JSON, or None when empty
    headers: http.client.HTTPMessage


def api(
    server: ToxiproxyServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> Answer:
    """One raw HTTP request (a dict or list body is sent as JSON, bytes as they are)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(server.host, server.port, timeout=SOCKET_TIMEOUT_S)
    try:
        if chunked:
            pieces = [data[i : i + 7] for i in range(0, len(data or b""), 7)]
            connection.request(method, path, body=iter(pieces), headers=headers or {}, encode_chunked=True)
        else:
            connection.request(method, path, body=data, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode()
    return Answer(response.status, parsed, response.headers)


def assert_error(answer: Answer, status: int, message: str) -> None:
    """Toxiproxy's error body: {"error": message, "status": status}, the message word for word."""
    assert answer.status == status, answer
    assert answer.body["error"] == message and answer.body["status"] == status, answer


# --- upstreams ----------------------------------------------------------------------------------


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with self.request as sock:
            try:
                while data := sock.recv(65536):
                    sock.sendall(data)
            except OSError:
                pass


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """host:port of a loopback server that echoes every byte back."""
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Upstream:
    """A listener whose accepted connections the test holds (Toxiproxy's testhelper.NewUpstream)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(SOCKET_TIMEOUT_S)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def accept(self) -> socket.socket:
        sock, _ = self.listener.accept()
        sock.settimeout(SOCKET_TIMEOUT_S)
        return sock

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    held = Upstream()
    try:
        yield held
    finally:
        held.close()


@dataclass
class Established:
    """A client connected through a proxy and the upstream's side of that connection."""

    proxy: Proxy
    client: socket.socket
    server: socket.socket


@pytest.fixture
def established(toxiproxy: Toxiproxy, upstream: Upstream) -> Iterator[Established]:
    """Toxiproxy's WithEstablishedProxy: a proxy "test" with a connection known to carry data."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    client = connect(proxy.listen)
    server = upstream.accept()
    try:
        for source, destination in ((client, server), (server, client)):
            source.sendall(b"foobar")
            assert recv_exactly(destination, 6) == b"foobar"
        yield Established(proxy, client, server)
    finally:
        client.close()
        server.close()


# --- sockets ------------------------------------------------------------------------------------


def address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def connect(listen: str) -> socket.socket:
    return socket.create_connection(address(listen), timeout=SOCKET_TIMEOUT_S)


def is_up(listen: str) -> bool:
    """Toxiproxy's AssertProxyUp: something accepts connections there."""
    try:
        socket.create_connection(address(listen), timeout=SOCKET_TIMEOUT_S).close()
    except ConnectionRefusedError:
        return False
    return True


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        piece = sock.recv(count - len(data))
        if not piece:
            break
        data += piece
    return data


def recv_until_eof(sock: socket.socket) -> bytes:
    data = b""
    while piece := sock.recv(65536):
        data += piece
    return data


def nothing_arrives(sock: socket.socket, within_s: float) -> bool:
    """True when the socket stays open and silent for within_s (no data, no EOF)."""
    sock.settimeout(within_s)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(SOCKET_TIMEOUT_S)
    return False


def round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started
