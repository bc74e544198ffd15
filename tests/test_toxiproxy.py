"""chaos.toxiproxy: the real toxiproxy-python client and raw HTTP against the in-process server,
with every toxic measured on real traffic through a loopback echo server."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy

from chaos.toxiproxy import VERSION, ToxiproxyError, ToxiproxyServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SOCKET_TIMEOUT_S = 5.0


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
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer("127.0.0.1:0", seed=7) as started:
        yield started


@pytest.fixture
def toxiproxy(server: ToxiproxyServer) -> Iterator[Toxiproxy]:
    client = Toxiproxy()
    client.update_api_consumer(server.host, server.port)
    try:
        yield client
    finally:
        client.destroy_all()


@pytest.fixture
def proxy(toxiproxy: Toxiproxy, echo: str) -> Proxy:
    return toxiproxy.create(upstream=echo, name="echo")


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def _connect(proxy: Proxy) -> socket.socket:
    return socket.create_connection(_address(proxy.listen), timeout=SOCKET_TIMEOUT_S)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        piece = sock.recv(count - len(data))
        if not piece:
            break
        data += piece
    return data


def _recv_until_eof(sock: socket.socket) -> bytes:
    data = b""
    while piece := sock.recv(65536):
        data += piece
    return data


def _round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


def _api(server: ToxiproxyServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(server.url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=SOCKET_TIMEOUT_S) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            status, raw = error.code, error.read()
    return status, (json.loads(raw) if raw else None)


def _assert_error(answer: tuple[int, Any], status: int, fragment: str) -> None:
    assert answer[0] == status, answer
    assert answer[1]["status"] == status and fragment in answer[1]["error"], answer


def test_version_is_plain_text(toxiproxy: Toxiproxy) -> None:
    """GET /version answers the bare 2.1.x version string that the client returns raw."""
    assert toxiproxy.running()
    assert toxiproxy.version() == VERSION.encode() == b"2.1.4"


def test_create_list_show_destroy(toxiproxy: Toxiproxy, server: ToxiproxyServer, echo: str) -> None:
    """Creating returns 201 with the real port for port 0; the proxy is listed, shown and deleted."""
    body = {"name": "raw", "upstream": echo, "listen": "127.0.0.1:0"}
    status, created = _api(server, "POST", "/proxies", body)
    assert status == 201 and created["enabled"] is True and created["toxics"] == []
    assert _address(created["listen"])[1] != 0
    proxy = toxiproxy.create(upstream=echo, name="client")
    assert set(toxiproxy.proxies()) == {"raw", "client"}
    assert _api(server, "GET", "/proxies/client")[1]["listen"] == proxy.listen
    with _connect(proxy) as sock:
        assert _round_trip_s(sock) < 2.0
    assert proxy.destroy() is True
    _assert_error(_api(server, "GET", "/proxies/client"), 404, "proxy not found")


def test_latency_delays_both_streams_of_a_live_connection(proxy: Proxy) -> None:
    """A latency toxic added to a live connection delays each stream by ≈ its latency; removal restores."""
    with _connect(proxy) as sock:
        assert _round_trip_s(sock) < 0.45
        proxy.add_toxic(type="latency", attributes={"latency": 500})
        assert 0.48 <= _round_trip_s(sock) < 2.5
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 500, "jitter": 0})
        assert 0.98 <= _round_trip_s(sock) < 3.5
        assert set(proxy.toxics()) == {"latency_downstream", "latency_upstream"}
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("latency_upstream")
        assert _round_trip_s(sock) < 0.45


def test_timeout_drops_data_then_closes(proxy: Proxy) -> None:
    """timeout: no data gets through, and the connection is closed after the timeout."""
    proxy.add_toxic(type="timeout", attributes={"timeout": 500})
    with _connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"lost")
        assert _recv_until_eof(sock) == b""
        assert 0.45 <= time.monotonic() - started < 4.0


def test_timeout_zero_holds_until_removed(proxy: Proxy) -> None:
    """timeout 0 drops data without closing; once removed, the same connection carries data again."""
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with _connect(proxy) as sock:
        sock.sendall(b"lost")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(16)
        sock.settimeout(SOCKET_TIMEOUT_S)
        proxy.destroy_toxic("timeout_downstream")
        assert _round_trip_s(sock, b"found") < 2.0


def test_reset_peer_resets_the_client(proxy: Proxy) -> None:
    """reset_peer: data flows until the timeout, then the client sees ECONNRESET."""
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 1000})
    with _connect(proxy) as sock:
        started = time.monotonic()
        assert _round_trip_s(sock) < 0.9
        with pytest.raises(ConnectionResetError):
            sock.recv(16)
        assert 0.9 <= time.monotonic() - started < 5.0


def test_bandwidth_paces_the_transfer(proxy: Proxy) -> None:
    """bandwidth: 50 KB at 100 KB/s takes ≈ 0.5 s."""
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})
    payload = os.urandom(50_000)
    with _connect(proxy) as sock:
        elapsed_s = _round_trip_s(sock, payload)
    assert 0.45 <= elapsed_s < 3.0


def test_limit_data_passes_exact_bytes_then_eof(proxy: Proxy) -> None:
    """limit_data: exactly that many bytes get through, then the connection closes."""
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    first, second = os.urandom(600), os.urandom(600)
    with _connect(proxy) as sock:
        sock.sendall(first)
        assert _recv_exactly(sock, 600) == first
        sock.sendall(second)
        assert _recv_until_eof(sock) == second[:400]


def test_slicer_delivers_data_intact(proxy: Proxy) -> None:
    """slicer: data cut into small delayed slices arrives whole and in order."""
    proxy.add_toxic(type="slicer", attributes={"average_size": 100, "size_variation": 50, "delay": 50})
    payload = os.urandom(20_000)
    with _connect(proxy) as sock:
        assert _round_trip_s(sock, payload) < 5.0


def test_slicer_cuts_and_spaces_the_data(proxy: Proxy) -> None:
    """slicer: 10 KB in 1000-byte slices 20 ms apart takes ≥ 0.1 s (without the toxic, ≈ 0 s)."""
    proxy.add_toxic(type="slicer", attributes={"average_size": 1000, "size_variation": 0, "delay": 20_000})
    with _connect(proxy) as sock:
        elapsed_s = _round_trip_s(sock, os.urandom(10_000))
    assert 0.1 <= elapsed_s < 5.0  # ≥ 9 gaps per chunk the echo reply arrives in; allows up to 5 chunks


def test_slow_close_delays_the_close(proxy: Proxy) -> None:
    """slow_close: the client sees the upstream's close only after the delay."""
    proxy.add_toxic(type="slow_close", attributes={"delay": 500})
    with _connect(proxy) as sock:
        assert _round_trip_s(sock) < 2.0
        started = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes, the proxy holds the close back
        assert _recv_until_eof(sock) == b""
        assert 0.45 <= time.monotonic() - started < 4.0


def test_toxicity_zero_never_applies(proxy: Proxy) -> None:
    """A toxic with toxicity 0 never applies to any connection."""
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 2000})
    for _ in range(5):
        with _connect(proxy) as sock:
            assert _round_trip_s(sock) < 1.0


def test_disable_closes_connections_and_refuses_new_ones(proxy: Proxy) -> None:
    """Disabling closes live connections and the listener; enabling listens again on the same port."""
    sock = _connect(proxy)
    with sock:
        assert _round_trip_s(sock) < 2.0
        with proxy.down():
            try:
                assert sock.recv(16) == b""
            except ConnectionResetError:
                pass
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(_address(proxy.listen), timeout=SOCKET_TIMEOUT_S).close()
    with _connect(proxy) as again:
        assert _round_trip_s(again) < 2.0


def test_reset_enables_proxies_and_removes_toxics(toxiproxy: Toxiproxy, proxy: Proxy) -> None:
    """POST /reset enables every proxy and removes every toxic."""
    proxy.add_toxic(type="latency", attributes={"latency": 2000})
    proxy.disable()
    assert toxiproxy.reset() is True
    shown = toxiproxy.get_proxy("echo")
    assert shown is not None and shown.enabled is True and shown.listen == proxy.listen
    assert proxy.toxics() == {}
    with _connect(proxy) as sock:
        assert _round_trip_s(sock) < 1.0


def test_populate_creates_and_updates(toxiproxy: Toxiproxy, server: ToxiproxyServer, echo: str) -> None:
    """POST /populate creates new proxies and updates existing ones in place, answering 201."""
    status, answer = _api(
        server,
        "POST",
        "/populate",
        [
            {"name": "a", "listen": "127.0.0.1:0", "upstream": echo},
            {"name": "b", "upstream": echo, "enabled": False},
        ],
    )
    assert status == 201 and [p["name"] for p in answer["proxies"]] == ["a", "b"]
    listen_a = answer["proxies"][0]["listen"]
    with socket.create_connection(_address(listen_a), timeout=SOCKET_TIMEOUT_S) as sock:
        assert _round_trip_s(sock) < 2.0
    _api(server, "POST", "/proxies/a/toxics", {"type": "latency", "attributes": {"latency": 10}})
    update = [{"name": "a", "upstream": "127.0.0.1:9", "enabled": False}]
    status, answer = _api(server, "POST", "/populate", update)
    assert status == 201
    assert answer["proxies"][0] | {"toxics": []} == {
        "name": "a",
        "listen": listen_a,
        "upstream": "127.0.0.1:9",
        "enabled": False,
        "toxics": [],
    }
    assert len(answer["proxies"][0]["toxics"]) == 1  # an update keeps the toxics
    created = toxiproxy.populate([{"name": "c", "upstream": echo, "listen": "127.0.0.1:0"}])
    assert [p.name for p in created] == ["c"] and set(toxiproxy.proxies()) == {"a", "b", "c"}


def test_error_statuses(server: ToxiproxyServer, proxy: Proxy, toxiproxy: Toxiproxy, echo: str) -> None:
    """Bad input answers 400, unknown proxy or toxic 404, duplicates 409, each as {error, status}."""
    toxics = "/proxies/echo/toxics"

    def post(path: str, body: Any) -> tuple[int, Any]:
        return _api(server, "POST", path, body)

    _assert_error(post("/proxies", b"{nope"), 400, "bad request body")
    _assert_error(post("/proxies", {"name": "x"}), 400, "missing required field: upstream")
    _assert_error(post("/proxies", {"name": "x", "upstream": "nohost"}), 400, "upstream")
    _assert_error(post("/proxies", {"name": "echo", "upstream": echo}), 409, "proxy already exists")
    _assert_error(_api(server, "GET", "/proxies/nope"), 404, "proxy not found")
    _assert_error(post("/proxies/nope/toxics", {"type": "latency"}), 404, "proxy not found")
    _assert_error(_api(server, "GET", toxics + "/nope"), 404, "toxic not found")
    _assert_error(post(toxics, {"type": "latency", "stream": "sideways"}), 400, "stream was invalid")
    _assert_error(post(toxics, {"type": "bogus"}), 400, "invalid toxic type")
    _assert_error(post(toxics, {"type": "latency", "toxicity": 1.5}), 400, "toxicity")
    bad_attribute = {"type": "latency", "attributes": {"latency": "100"}}
    _assert_error(post(toxics, bad_attribute), 400, "attribute 'latency' must be a non-negative")
    _assert_error(post(toxics, {"type": "latency", "attributes": {"ms": 1}}), 400, "unknown attribute")
    assert post(toxics, {"type": "latency", "attributes": {"latency": 5}})[0] == 200
    _assert_error(post(toxics, {"type": "latency"}), 409, "toxic already exists")
    status, patched = _api(server, "PATCH", toxics + "/latency_downstream", {"attributes": {"jitter": 2}})
    assert status == 200 and patched["attributes"] == {"latency": 5, "jitter": 2}
    _assert_error(_api(server, "DELETE", "/proxies/echo/nope"), 404, "no such endpoint")
    _assert_error(_api(server, "PUT", "/proxies"), 405, "not allowed")
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo, name="echo")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", name="l2", stream="sideways")
    with pytest.raises(NotFound):
        proxy.destroy_toxic("nope")


def test_api_keeps_connections_alive_and_bounds_bodies(server: ToxiproxyServer, proxy: Proxy) -> None:
    """Several requests share one HTTP/1.1 connection; an oversized body answers 413."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=SOCKET_TIMEOUT_S)
    try:
        sockets = []
        for _ in range(3):
            connection.request("GET", "/proxies/echo")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["name"] == "echo"
            sockets.append(connection.sock)  # http.client drops the socket when the server closes
        assert sockets[0] is not None and sockets == [sockets[0]] * 3
    finally:
        connection.close()
    with socket.create_connection((server.host, server.port), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
        answer = _recv_until_eof(sock)  # answered before the body is sent, then closed
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"status": 413' in answer


def test_refused_upstream_closes_the_client(toxiproxy: Toxiproxy) -> None:
    """A proxy whose upstream refuses connections closes the client and keeps serving."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_upstream = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: refuses
        proxy = toxiproxy.create(upstream=dead_upstream, name="dead")
        with _connect(proxy) as sock:
            try:
                assert sock.recv(16) == b""
            except ConnectionResetError:
                pass
    assert toxiproxy.get_proxy("dead") is not None


def test_start_on_a_busy_port_fails_clearly(server: ToxiproxyServer) -> None:
    """A second server on a busy address raises ToxiproxyError naming the address."""
    with pytest.raises(ToxiproxyError, match="cannot listen on"):
        ToxiproxyServer(server.address).start()
    with pytest.raises(ToxiproxyError, match="listen port"):
        ToxiproxyServer("127.0.0.1:http")


def test_command_line_serves_config_until_sigterm(tmp_path: Path, echo: str, server: ToxiproxyServer) -> None:
    """python -m chaos.toxiproxy on port 0 reports the port it bound, populates --config, serves,
    exits 0 on SIGTERM; it and mqmeta chaos toxiproxy exit 2 with one sentence on bad input."""
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "cfg", "listen": "127.0.0.1:0", "upstream": echo}]))
    command = [sys.executable, "-m", "chaos.toxiproxy"]
    process = subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0", "--config", str(config)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), url
        with urllib.request.urlopen(f"{url}/proxies", timeout=SOCKET_TIMEOUT_S) as response:
            listen = json.loads(response.read())["cfg"]["listen"]
        with socket.create_connection(_address(listen), timeout=SOCKET_TIMEOUT_S) as sock:
            assert _round_trip_s(sock) < 2.0
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.communicate()
    missing_config = str(tmp_path / "missing.json")
    for bad in (["--listen", "127.0.0.1:99999"], ["--listen", server.address], ["--config", missing_config]):
        failed = subprocess.run([*command, *bad], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1, failed
    bad_config = tmp_path / "bad.json"
    bad_config.write_text(json.dumps([{"name": "x", "upstream": "nohost"}]))
    mqmeta = [sys.executable, "-m", "mqmeta.cli", "chaos", "toxiproxy", "--listen", "127.0.0.1:0"]
    for bad in (["--listen", "bogus"], ["--config", str(bad_config)]):  # the mqmeta entry point, too
        failed = subprocess.run([*mqmeta, *bad], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1, failed
        assert "Traceback" not in failed.stderr and failed.stderr.strip().endswith("."), failed
