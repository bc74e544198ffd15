"""chaos.toxiproxy driven by the unchanged toxiproxy-python client as the chaos suite drives it,
with every toxic measured on real traffic through a loopback echo server; the server object, the
process and its command line. (Toxiproxy's own API and toxic tests, ported: test_toxiproxy_api.py
and test_toxiproxy_toxics.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mqmeta.chaos.toxiproxy import VERSION, ToxiproxyError, ToxiproxyServer
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy

from tests.support.fault_proxy import (
    SOCKET_TIMEOUT_S,
    address,
    connect,
    nothing_arrives,
    recv_exactly,
    recv_until_eof,
    round_trip_s,
)

pytest_plugins = ["tests.support.fault_proxy"]  # its fixtures: server, toxiproxy, echo
pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def proxy(toxiproxy: Toxiproxy, echo: str) -> Proxy:
    return toxiproxy.create(upstream=echo, name="echo")


def _connect(proxy: Proxy) -> socket.socket:
    return connect(proxy.listen)


def test_version_and_running(toxiproxy: Toxiproxy) -> None:
    """The client sees the server running; GET /version is Toxiproxy's JSON, which the client
    returns as it is (it reads the body raw)."""
    assert toxiproxy.running()
    assert json.loads(toxiproxy.version()) == {"version": VERSION}


def test_create_list_show_destroy(toxiproxy: Toxiproxy, echo: str) -> None:
    """The client creates a proxy on a free port, lists it, connects through it and deletes it."""
    proxy = toxiproxy.create(upstream=echo, name="client")
    assert address(proxy.listen)[1] != 0 and proxy.enabled is True
    assert set(toxiproxy.proxies()) == {"client"}
    shown = toxiproxy.get_proxy("client")
    assert shown is not None and shown.listen == proxy.listen and shown.upstream == echo
    with _connect(proxy) as sock:
        assert round_trip_s(sock) < 2.0
    assert proxy.destroy() is True
    assert toxiproxy.get_proxy("client") is None


def test_latency_delays_both_streams_of_a_live_connection(proxy: Proxy) -> None:
    """A latency toxic added to a live connection delays each stream by ≈ its latency; removal restores."""
    with _connect(proxy) as sock:
        assert round_trip_s(sock) < 0.45
        proxy.add_toxic(type="latency", attributes={"latency": 500})
        assert 0.48 <= round_trip_s(sock) < 2.5
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 500, "jitter": 0})
        assert 0.98 <= round_trip_s(sock) < 3.5
        assert set(proxy.toxics()) == {"latency_downstream", "latency_upstream"}
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("latency_upstream")
        assert round_trip_s(sock) < 0.45


def test_timeout_drops_data_then_closes(proxy: Proxy) -> None:
    """timeout: no data gets through, and the connection is closed after the timeout."""
    proxy.add_toxic(type="timeout", attributes={"timeout": 500})
    with _connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"lost")
        assert recv_until_eof(sock) == b""
        assert 0.45 <= time.monotonic() - started < 4.0


def test_timeout_zero_holds_until_removed_then_closes(proxy: Proxy) -> None:
    """timeout 0 drops data and keeps the connection open; removing the toxic closes it (as
    Toxiproxy does: a byte stream with a hole in it must not go on), and new connections work."""
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with _connect(proxy) as sock:
        sock.sendall(b"lost")
        assert nothing_arrives(sock, 0.5)
        proxy.destroy_toxic("timeout_downstream")
        try:
            assert sock.recv(16) == b""
        except ConnectionResetError:
            pass
    with _connect(proxy) as again:
        assert round_trip_s(again, b"found") < 2.0


def test_reset_peer_resets_after_the_first_data(proxy: Proxy) -> None:
    """reset_peer (downstream): the connection stays open while idle; the first reply from the
    server is dropped and the client sees ECONNRESET the timeout later."""
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 500})
    with _connect(proxy) as sock:
        assert nothing_arrives(sock, 0.7)  # longer than the timeout: not reset while idle
        started = time.monotonic()
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            sock.recv(16)
        assert 0.45 <= time.monotonic() - started < 4.0


def test_bandwidth_paces_the_transfer(proxy: Proxy) -> None:
    """bandwidth: 50 KB at 100 KB/s takes ≈ 0.5 s."""
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})
    payload = os.urandom(50_000)
    with _connect(proxy) as sock:
        elapsed_s = round_trip_s(sock, payload)
    assert 0.45 <= elapsed_s < 3.0


def test_limit_data_passes_exact_bytes_then_eof(proxy: Proxy) -> None:
    """limit_data: exactly that many bytes get through, then the connection closes."""
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    first, second = os.urandom(600), os.urandom(600)
    with _connect(proxy) as sock:
        sock.sendall(first)
        assert recv_exactly(sock, 600) == first
        sock.sendall(second)
        assert recv_until_eof(sock) == second[:400]


def test_slicer_delivers_data_intact(proxy: Proxy) -> None:
    """slicer: data cut into small delayed slices arrives whole and in order."""
    proxy.add_toxic(type="slicer", attributes={"average_size": 100, "size_variation": 50, "delay": 50})
    payload = os.urandom(20_000)
    with _connect(proxy) as sock:
        assert round_trip_s(sock, payload) < 5.0


def test_slicer_cuts_and_spaces_the_data(proxy: Proxy) -> None:
    """slicer: 10 KB in 1000-byte slices 20 ms apart takes ≥ 0.1 s (without the toxic, ≈ 0 s)."""
    proxy.add_toxic(type="slicer", attributes={"average_size": 1000, "size_variation": 0, "delay": 20_000})
    with _connect(proxy) as sock:
        elapsed_s = round_trip_s(sock, os.urandom(10_000))
    assert 0.1 <= elapsed_s < 5.0  # ≥ 9 gaps per chunk the echo reply arrives in; allows up to 5 chunks


def test_slow_close_delays_the_close(proxy: Proxy) -> None:
    """slow_close: the client sees the upstream's close only after the delay."""
    proxy.add_toxic(type="slow_close", attributes={"delay": 500})
    with _connect(proxy) as sock:
        assert round_trip_s(sock) < 2.0
        started = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes, the proxy holds the close back
        assert recv_until_eof(sock) == b""
        assert 0.45 <= time.monotonic() - started < 4.0


def test_toxicity_zero_never_applies(proxy: Proxy) -> None:
    """A toxic with toxicity 0 never applies to any connection."""
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 2000})
    for _ in range(5):
        with _connect(proxy) as sock:
            assert round_trip_s(sock) < 1.0


def test_disable_closes_connections_and_refuses_new_ones(proxy: Proxy) -> None:
    """Disabling closes live connections and the listener; enabling listens again on the same port."""
    sock = _connect(proxy)
    with sock:
        assert round_trip_s(sock) < 2.0
        with proxy.down():
            try:
                assert sock.recv(16) == b""
            except ConnectionResetError:
                pass
            with pytest.raises(ConnectionRefusedError):
                _connect(proxy).close()
    with _connect(proxy) as again:
        assert round_trip_s(again) < 2.0


def test_reset_enables_proxies_and_removes_toxics(toxiproxy: Toxiproxy, proxy: Proxy) -> None:
    """POST /reset enables every proxy and removes every toxic."""
    proxy.add_toxic(type="latency", attributes={"latency": 2000})
    proxy.disable()
    assert toxiproxy.reset() is True
    shown = toxiproxy.get_proxy("echo")
    assert shown is not None and shown.enabled is True and shown.listen == proxy.listen
    assert proxy.toxics() == {}
    with _connect(proxy) as sock:
        assert round_trip_s(sock) < 1.0


def test_client_populate(toxiproxy: Toxiproxy, echo: str) -> None:
    """The client's populate (its own create-if-missing loop) works against the server."""
    created = toxiproxy.populate([{"name": "c", "upstream": echo, "listen": "127.0.0.1:0"}])
    assert [p.name for p in created] == ["c"] and set(toxiproxy.proxies()) == {"c"}


def test_client_errors(proxy: Proxy, toxiproxy: Toxiproxy, echo: str) -> None:
    """The client's exceptions follow the statuses: 409 ProxyExists, 400 InvalidToxic, 404 NotFound."""
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo, name="echo")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", name="l2", stream="sideways")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="bogus")
    with pytest.raises(NotFound):
        proxy.destroy_toxic("nope")


def test_start_on_a_busy_or_bad_address_fails_clearly(server: ToxiproxyServer) -> None:
    """A second server on a busy address raises ToxiproxyError naming the address; so does a bad one."""
    with pytest.raises(ToxiproxyError, match="cannot listen on"):
        ToxiproxyServer(server.address).start()
    with pytest.raises(ToxiproxyError, match="invalid port"):
        ToxiproxyServer("127.0.0.1:http")


def test_command_line_serves_config_until_sigterm(tmp_path: Path, echo: str, server: ToxiproxyServer) -> None:
    """python -m mqmeta.chaos.toxiproxy on port 0 reports the port it bound, populates --config, serves,
    exits 0 on SIGTERM; it and mqmeta chaos toxiproxy exit 2 with one sentence on bad input."""
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "cfg", "listen": "127.0.0.1:0", "upstream": echo}]))
    command = [sys.executable, "-m", "mqmeta.chaos.toxiproxy"]
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
        with connect(listen) as sock:
            assert round_trip_s(sock) < 2.0
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
    bad_config.write_text(json.dumps([{"name": "x"}]))
    mqmeta = [sys.executable, "-m", "mqmeta.cli", "chaos", "toxiproxy", "--listen", "127.0.0.1:0"]
    for bad in (["--listen", "bogus"], ["--config", str(bad_config)]):  # the mqmeta entry point, too
        failed = subprocess.run([*mqmeta, *bad], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1, failed
        assert "Traceback" not in failed.stderr and failed.stderr.strip().endswith("."), failed
    assert "missing required field: upstream at proxy 1" in failed.stderr
