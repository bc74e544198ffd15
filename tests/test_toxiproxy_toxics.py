"""The fault proxy's toxics and data path behave as Toxiproxy's: Shopify/toxiproxy's
toxics/*_test.go (latency, bandwidth, timeout, reset_peer, slicer, limit_data, toxic_test.go for
noop and the chain), link_test.go and proxy_test.go turned into Python, over real loopback sockets
through our server, toxics set over HTTP. Timings allow for Python on a shared machine: a toxic
never acts early, and acts within TIMING_SLACK_S of when Toxiproxy's test expects it.
"""

from __future__ import annotations

import os
import random
import select
import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from mqmeta.chaos.toxiproxy import ToxiproxyServer, datapath
from mqmeta.chaos.toxiproxy.datapath import slice_bounds
from toxiproxy import Toxiproxy

from tests.support.fault_proxy import (
    Established,
    Upstream,
    api,
    connect,
    nothing_arrives,
    recv_exactly,
    recv_until_eof,
)

pytest_plugins = ["tests.support.fault_proxy"]  # its fixtures: server, toxiproxy, upstream, established
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("toxiproxy"),
]  # every proxy deleted after each test

TIMING_SLACK_S = 0.1  # Toxiproxy's tests allow 10 ms; Python on 2 shared cores needs more
EARLY_S = 0.005  # timer granularity: a delay may end this much before its nominal time
MESSAGE = b"hello world " + b"a" * 32 * 1024 + b"\n"  # latency_test.go's message


def _toxic(server: ToxiproxyServer, proxy: str, **body: object) -> dict:
    answer = api(server, "POST", f"/proxies/{proxy}/toxics", body)
    assert answer.status == 200, answer
    return answer.body


def _remove(server: ToxiproxyServer, proxy: str, toxic: str) -> None:
    assert api(server, "DELETE", f"/proxies/{proxy}/toxics/{toxic}").status == 204


def _assert_about(elapsed_s: float, expected_s: float) -> None:
    assert expected_s - EARLY_S <= elapsed_s <= expected_s + TIMING_SLACK_S, (elapsed_s, expected_s)


def _closed_or_reset(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _reset(sock: socket.socket) -> bool:
    try:
        sock.recv(1000)
    except ConnectionResetError:
        return True
    return False


# --- latency (latency_test.go) --------------------------------------------------------------------


def _through_upstream(toxiproxy: Toxiproxy, upstream: Upstream) -> tuple[socket.socket, socket.socket]:
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    client = connect(proxy.listen)
    return client, upstream.accept()


@pytest.mark.parametrize(
    "up_ms, down_ms",
    [(100, 0), (0, 100), (100, 100), (500, 100), (100, 500), (0, 0)],
    ids=["Upstream", "Downstream", "FullstreamEven", "FullstreamBiasUp", "FullstreamBiasDown", "Zero"],
)
def test_latency_per_stream(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream, up_ms: int, down_ms: int
) -> None:
    """TestUpstreamLatency ... TestZeroLatency (DoLatencyTest): the server reads a 32 KB message
    after the upstream latency, the client reads the echo after the downstream latency."""
    client, held = _through_upstream(toxiproxy, upstream)
    with client, held:
        if up_ms:
            _toxic(
                server,
                "test",
                name="latency_up",
                type="latency",
                stream="upstream",
                attributes={"latency": up_ms},
            )
        if down_ms:
            _toxic(
                server,
                "test",
                name="latency_down",
                type="latency",
                stream="downstream",
                attributes={"latency": down_ms},
            )
        started = time.monotonic()
        client.sendall(MESSAGE)
        assert recv_exactly(held, len(MESSAGE)) == MESSAGE
        _assert_about(time.monotonic() - started, up_ms / 1000)
        echoed = time.monotonic()
        held.sendall(MESSAGE)
        assert recv_exactly(client, len(MESSAGE)) == MESSAGE
        _assert_about(time.monotonic() - echoed, down_ms / 1000)
        _assert_about(time.monotonic() - started, (up_ms + down_ms) / 1000)


def test_two_latency_toxics_add_up(server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    """TestTwoLatencyToxics: two 500 ms latency toxics on one stream delay it 1000 ms."""
    client, held = _through_upstream(toxiproxy, upstream)
    with client, held:
        for index in range(2):
            _toxic(
                server,
                "test",
                name=f"latency_{index}",
                type="latency",
                stream="upstream",
                attributes={"latency": 500},
            )
        started = time.monotonic()
        client.sendall(MESSAGE)
        assert recv_exactly(held, len(MESSAGE)) == MESSAGE
        _assert_about(time.monotonic() - started, 1.0)


def test_latency_jitter_stays_in_its_range(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """latency.go: each chunk is delayed latency ± jitter (here 100 ± 50 ms, the chaos suite's
    random-delay): never less than latency - jitter, about latency on the middle, and the delay
    really varies from chunk to chunk."""
    client, held = _through_upstream(toxiproxy, upstream)
    with client, held:
        _toxic(server, "test", type="latency", stream="upstream", attributes={"latency": 100, "jitter": 50})
        delays = []
        for _ in range(12):
            started = time.monotonic()
            client.sendall(b"x")
            assert held.recv(1) == b"x"
            delays.append(time.monotonic() - started)
        delays.sort()
        assert delays[0] >= 0.05 - EARLY_S, delays
        assert statistics.median(delays) <= 0.1 + TIMING_SLACK_S, delays
        assert delays[-1] - delays[0] >= 0.02, delays  # twelve uniform draws within 20 ms: p < 1e-6


def test_removing_a_latency_toxic_releases_what_it_holds(
    server: ToxiproxyServer, established: Established
) -> None:
    """latency.go (interrupted: "don't drop any data on the floor"): data held by a 5 s latency
    toxic passes as soon as the toxic is removed, and the next data passes at once."""
    _toxic(server, "test", type="latency", stream="upstream", attributes={"latency": 5000})
    established.client.sendall(b"held")
    assert nothing_arrives(established.server, 0.2)
    started = time.monotonic()
    _remove(server, "test", "latency_upstream")
    assert recv_exactly(established.server, 4) == b"held"
    established.client.sendall(b"free")
    assert recv_exactly(established.server, 4) == b"free"
    assert time.monotonic() - started < 1.0


def test_latency_toxic_close_race(server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    """TestLatencyToxicCloseRace: adding a latency toxic, connecting, writing, closing and removing
    it, over and over, leaves the proxy serving."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    for _ in range(50):
        _toxic(server, "test", type="latency", stream="upstream", attributes={"latency": 10})
        with connect(proxy.listen) as client:
            client.sendall(b"hello")
        upstream.accept().close()
        _remove(server, "test", "latency_upstream")
    with connect(proxy.listen) as client, upstream.accept() as held:
        client.sendall(b"still")
        assert recv_exactly(held, 5) == b"still"


class _Source:
    """An upstream that streams until its client goes (testhelper.NewUpstream + a writer loop)."""

    BLOCK = b"hello world " * 20_000  # 240 KB

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._stream, args=(sock,), daemon=True).start()

    def _stream(self, sock: socket.socket) -> None:
        deadline = time.monotonic() + 10.0  # bounded even if a client never leaves
        with sock:
            try:
                while time.monotonic() < deadline:
                    sock.sendall(self.BLOCK)
            except OSError:
                pass

    def close(self) -> None:
        # A close alone leaves a thread blocked in accept() there (Linux does not wake it);
        # shutdown() does, and the accepting thread ends before the next test.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(timeout=5.0)
        assert not self.thread.is_alive(), "the upstream's accepting thread did not end"


THROUGHPUT_WARMUP_S = 0.25  # the latency fills up (100 ms) before the window opens
THROUGHPUT_WINDOW_S = 0.4
THROUGHPUT_BYTES_MAX = 256 * 1024 * 1024  # per window
THROUGHPUT_ROUNDS_MAX = 6  # rounds stop at the first that meets both floors


def _throughput_bytes_per_s(listen: str) -> float:
    buffer = bytearray(1 << 20)
    with connect(listen) as sock:
        opened = time.monotonic()
        while time.monotonic() - opened < THROUGHPUT_WARMUP_S:
            assert sock.recv_into(buffer)
        started, count = time.monotonic(), 0
        while time.monotonic() - started < THROUGHPUT_WINDOW_S and count < THROUGHPUT_BYTES_MAX:
            received = sock.recv_into(buffer)
            assert received
            count += received
        return count / (time.monotonic() - started)


def test_latency_keeps_at_least_half_the_throughput(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestLatencyToxicBandwidth, and issue 15's bar: a stream under a 100 ms latency toxic moves
    at least half of what the same proxy moves without it. Each round measures both back to back;
    the rounds stop once both floors were met (at most THROUGHPUT_ROUNDS_MAX), so that a burst of load
    from elsewhere on the machine does not decide: CI saw best rounds of 0.49 and 0.50 on a loaded
    2-core machine (a latency that caps the stream, as a per-chunk queue did at 6 MB/s, fails
    every round)."""
    source = _Source()
    try:
        proxy = toxiproxy.create(upstream=source.address, name="test")
        rounds = []
        for _ in range(THROUGHPUT_ROUNDS_MAX):
            plain = _throughput_bytes_per_s(proxy.listen)
            _toxic(server, "test", type="latency", attributes={"latency": 100})
            rounds.append((plain, _throughput_bytes_per_s(proxy.listen)))
            _remove(server, "test", "latency_downstream")
            if _meets_the_floors(rounds):
                break
        assert _meets_the_floors(rounds), rounds
    finally:
        source.close()


def _meets_the_floors(rounds: list[tuple[float, float]]) -> bool:
    """A round moved half of the same proxy's plain throughput, and one Toxiproxy's own floor
    of 100 MB/s."""
    best_ratio = max(delayed / plain for plain, delayed in rounds)
    return best_ratio >= 0.5 and max(delayed for _, delayed in rounds) >= 100e6


# --- bandwidth (bandwidth_test.go) ----------------------------------------------------------------


def test_bandwidth_paces_the_stream(server: ToxiproxyServer, established: Established) -> None:
    """TestBandwidthToxic: 480 KB upstream at 1000 KB/s takes 480 ms."""
    _toxic(server, "test", type="bandwidth", stream="upstream", attributes={"rate": 1000})
    payload = b"hello world " * 40_000
    sender = threading.Thread(target=established.client.sendall, args=(payload,), daemon=True)
    started = time.monotonic()
    sender.start()
    assert recv_exactly(established.server, len(payload)) == payload
    _assert_about(time.monotonic() - started, 0.48)
    sender.join(5)


def test_bandwidth_rate_zero_passes_nothing_until_removed(
    server: ToxiproxyServer, established: Established
) -> None:
    """bandwidth.go with rate 0, and TestRemoveToxicWithBrokenConnection: nothing passes (either
    stream) while the toxics are there; removing them does not hang, and what they held arrives."""
    for stream in ("upstream", "downstream"):
        _toxic(server, "test", type="bandwidth", stream=stream, attributes={"rate": 0})
    established.client.sendall(b"up")
    established.server.sendall(b"down")
    assert nothing_arrives(established.server, 0.3) and nothing_arrives(established.client, 0.05)
    started = time.monotonic()
    _remove(server, "test", "bandwidth_upstream")
    _remove(server, "test", "bandwidth_downstream")
    assert time.monotonic() - started < 1.0
    assert recv_exactly(established.server, 2) == b"up" and recv_exactly(established.client, 4) == b"down"


def test_a_held_stream_is_read_no_further_than_its_bound(
    server: ToxiproxyServer, established: Established, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data path is bounded: while a toxic holds a stream (bandwidth 0), the proxy reads at
    most PIPE_BUFFER_BYTES_MAX of it (here lowered to 1 MiB), then TCP pushes back on the sender;
    what passes once the toxic goes is every byte, in order."""
    monkeypatch.setattr(datapath, "PIPE_BUFFER_BYTES_MAX", 1 << 20)
    monkeypatch.setattr(datapath, "PIPE_RESUME_BYTES", 1 << 19)
    _toxic(server, "test", type="bandwidth", stream="upstream", attributes={"rate": 0})
    block, sent = os.urandom(64 * 1024), bytearray()
    established.client.setblocking(False)
    stalled_since = time.monotonic()
    while time.monotonic() - stalled_since < 0.3 and len(sent) < 256 * 1024 * 1024:
        try:
            sent += block[: established.client.send(block)]
            stalled_since = time.monotonic()
        except BlockingIOError:  # wait (bounded) until the socket takes bytes again
            select.select([], [established.client], [], 0.01)
    assert len(sent) < 64 * 1024 * 1024, len(sent)  # 1 MiB in the proxy plus the kernels' buffers
    _remove(server, "test", "bandwidth_upstream")
    assert recv_exactly(established.server, len(sent)) == sent


# --- timeout (timeout_test.go, link_test.go TestToxicity) -----------------------------------------


def test_timeout_toxic_does_not_cause_hang(server: ToxiproxyServer, established: Established) -> None:
    """TestTimeoutToxicDoesNotCauseHang: with a latency and a timeout 0 toxic upstream, data is
    held; removing the latency toxic answers within a second."""
    _toxic(server, "test", name="might_block", type="latency", stream="upstream", attributes={"latency": 10})
    _toxic(server, "test", name="timeout", type="timeout", stream="upstream", attributes={"timeout": 0})
    for _ in range(5):
        established.client.sendall(b"hello")
    assert nothing_arrives(established.server, 0.2)
    started = time.monotonic()
    _remove(server, "test", "might_block")
    assert time.monotonic() - started < 1.0


def test_removing_a_timeout_toxic_closes_the_connection(
    server: ToxiproxyServer, established: Established
) -> None:
    """TestTimeoutToxicClosesConnectionOnRemove: removing a timeout toxic closes the connection on
    both sides (no silent gap in the byte stream: the dropped data is never followed by more)."""
    _toxic(server, "test", name="to_delete", type="timeout", stream="upstream", attributes={"timeout": 0})
    established.client.sendall(b"dropped")
    assert nothing_arrives(established.server, 0.1)
    _remove(server, "test", "to_delete")
    assert _closed_or_reset(established.client) and _closed_or_reset(established.server)


def test_timeout_closes_after_its_time(server: ToxiproxyServer, established: Established) -> None:
    """timeout.go: data is dropped and the connection closed `timeout` after the toxic reached it."""
    started = time.monotonic()
    _toxic(server, "test", type="timeout", attributes={"timeout": 300})
    established.server.sendall(b"lost")
    assert recv_until_eof(established.client) == b""
    _assert_about(time.monotonic() - started, 0.3)


def test_toxicity_zero_then_one(server: ToxiproxyServer, established: Established) -> None:
    """TestToxicity: a timeout toxic with toxicity 0 lets data through; updated to toxicity 1 and
    a 100 ms timeout, it closes the connection within 150 ms."""
    _toxic(server, "test", name="timeout1", type="timeout", toxicity=0, attributes={"timeout": 0})
    established.server.sendall(b"*")
    assert established.client.recv(2) == b"*"
    started = time.monotonic()
    api(server, "PATCH", "/proxies/test/toxics/timeout1", {"toxicity": 1, "attributes": {"timeout": 100}})
    established.server.sendall(b"*")
    assert recv_until_eof(established.client) == b""
    assert time.monotonic() - started <= 0.15 + TIMING_SLACK_S


# --- reset_peer (reset_peer_test.go) --------------------------------------------------------------


@pytest.mark.parametrize(
    "stream, timeout_ms",
    [("upstream", 0), ("upstream", 100), ("downstream", 100)],
    ids=["NoTimeout", "WithTimeout", "WithTimeoutDownstream"],
)
def test_reset_peer(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream, stream: str, timeout_ms: int
) -> None:
    """TestResetToxicNoTimeout, TestResetToxicWithTimeout, TestResetToxicWithTimeoutDownstream: a
    client that sends a line (echoed by the server) sees ECONNRESET about `timeout` after the
    data reached the toxic, then EOF."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    _toxic(
        server, "test", name="resettcp", type="reset_peer", stream=stream, attributes={"timeout": timeout_ms}
    )
    started = time.monotonic()
    with connect(proxy.listen) as client, upstream.accept() as held:
        client.sendall(b"reset toxic payload\n")
        if stream == "downstream":
            assert recv_exactly(held, 20) == b"reset toxic payload\n"
            held.sendall(b"reset toxic payload\n")
        assert _reset(client)
        _assert_about(time.monotonic() - started, timeout_ms / 1000)
        assert client.recv(1000) == b""


def test_reset_peer_acts_on_data_not_at_connect(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """reset_peer.go: the reset comes after data reaches the toxic: with timeout 0, connections
    open and stay open while idle; with a timeout, an idle connection outlives it."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    _toxic(server, "test", type="reset_peer", stream="upstream", attributes={"timeout": 0})
    clients = [connect(proxy.listen) for _ in range(5)]
    helds = [upstream.accept() for _ in clients]
    try:
        assert all(nothing_arrives(client, 0.05) for client in clients)
        clients[0].sendall(b"data")
        assert _reset(clients[0])
    finally:
        for sock in clients + helds:
            sock.close()
    _remove(server, "test", "reset_peer_upstream")
    _toxic(server, "test", type="reset_peer", stream="upstream", attributes={"timeout": 200})
    with connect(proxy.listen) as client, upstream.accept():
        assert nothing_arrives(client, 0.4)  # idle twice the timeout: not reset
        started = time.monotonic()
        client.sendall(b"data")
        assert _reset(client)
        _assert_about(time.monotonic() - started, 0.2)


# --- slicer (slicer_test.go) ----------------------------------------------------------------------


def test_slicer_cuts_as_toxiproxy_does() -> None:
    """TestSlicerToxic (the cutting itself): 480 KB with average 1024 ± 512 bytes makes 240..720
    pieces, none larger than 1536 bytes, none empty, covering the data in order."""
    for seed in range(5):
        bounds = list(slice_bounds(480_000, 1024, 512, random.Random(seed)))
        assert 240 <= len(bounds) <= 720, len(bounds)
        assert bounds[0][0] == 0 and bounds[-1][1] == 480_000
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(0 < end - start <= 1536 for start, end in bounds)


def test_slicer_sends_every_piece_apart(server: ToxiproxyServer, established: Established) -> None:
    """TestSlicerToxicZeroSizeVariation: average size 1 cuts 24 bytes into 24 one-byte pieces, each
    sent `delay` after the previous (here 20 ms, so each arrives on its own)."""
    _toxic(server, "test", type="slicer", stream="upstream", attributes={"average_size": 1, "delay": 20_000})
    data = b"hello world " * 2
    established.client.sendall(data)
    reads = [established.server.recv(100) for _ in range(len(data))]
    assert b"".join(reads) == data and all(len(read) == 1 for read in reads)


def test_slicer_delivers_large_data_intact(server: ToxiproxyServer, established: Established) -> None:
    """TestSlicerToxic over a socket: 480 KB in ~1 KB slices 10 µs apart arrives whole and in order."""
    _toxic(
        server,
        "test",
        type="slicer",
        stream="upstream",
        attributes={"average_size": 1024, "size_variation": 512, "delay": 10},
    )
    data = os.urandom(480_000)
    sender = threading.Thread(target=established.client.sendall, args=(data,), daemon=True)
    sender.start()
    assert recv_exactly(established.server, len(data)) == data
    sender.join(5)


def test_slicer_with_default_attributes(server: ToxiproxyServer, established: Established) -> None:
    """A slicer toxic with no attributes is accepted (as by Toxiproxy) and data still arrives
    (Toxiproxy recurses without end here; we cut into 1-byte pieces)."""
    toxic = _toxic(server, "test", type="slicer")
    assert toxic["attributes"] == {"average_size": 0, "size_variation": 0, "delay": 0}
    established.server.sendall(b"x" * 64)
    assert recv_exactly(established.client, 64) == b"x" * 64


# --- limit_data (limit_data_test.go) --------------------------------------------------------------


@pytest.mark.parametrize(
    "chunks, passed, closes",
    [
        ([50], 50, False),  # TestLimitDataToxicChunkSmallerThanLimit
        ([100], 100, True),  # TestLimitDataToxicChunkLengthMatchesLimit
        ([150], 100, True),  # TestLimitDataToxicChunkBiggerThanLimit
        ([25, 25, 25, 25], 100, True),  # TestLimitDataToxicMultipleChunksMatchThanLimit
        ([90, 20], 100, True),  # TestLimitDataToxicSecondChunkWouldOverflowLimit
    ],
    ids=["Smaller", "Matches", "Bigger", "MultipleChunks", "SecondOverflows"],
)
def test_limit_data(
    server: ToxiproxyServer, established: Established, chunks: list[int], passed: int, closes: bool
) -> None:
    """limit_data_test.go: exactly `bytes` bytes get through, chunk by chunk; the connection
    closes once they have, and stays open before."""
    _toxic(server, "test", type="limit_data", stream="upstream", attributes={"bytes": 100})
    data = os.urandom(sum(chunks))
    received, offset = b"", 0
    for size in chunks:
        established.client.sendall(data[offset : offset + size])
        offset += size
        received += recv_exactly(established.server, min(size, passed - len(received)))
    assert received == data[:passed]
    if closes:
        assert recv_until_eof(established.server) == b"" and _closed_or_reset(established.client)
    else:
        assert nothing_arrives(established.server, 0.1)


def test_limit_data_zero_acts_on_data(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """TestLimitDataToxicLimitIsSetToZero: bytes 0 downstream lets nothing through to the client,
    but closes only at data: the connection opens, and the request reaches the server."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    _toxic(server, "test", type="limit_data", attributes={"bytes": 0})
    with connect(proxy.listen) as client, upstream.accept() as held:
        assert nothing_arrives(client, 0.1)
        client.sendall(b"request")
        assert recv_exactly(held, 7) == b"request"
        held.sendall(b"answer")
        assert recv_until_eof(client) == b""


def test_limit_data_keeps_its_count_across_an_update(
    server: ToxiproxyServer, established: Established
) -> None:
    """TestLimitDataToxicMayBeRestarted: 90 bytes pass; after an update of the toxic, 20 more give
    10, then the connection closes."""
    _toxic(server, "test", type="limit_data", stream="upstream", attributes={"bytes": 100})
    first, second = os.urandom(90), os.urandom(20)
    established.client.sendall(first)
    assert recv_exactly(established.server, 90) == first
    api(server, "PATCH", "/proxies/test/toxics/limit_data_upstream", {"attributes": {"bytes": 100}})
    established.client.sendall(second)
    assert recv_until_eof(established.server) == second[:10]


# --- the chain: noop, persistence, no data dropped (toxic_test.go, link_test.go, proxy_test.go) ---


def _echo_once(established: Established, message: bytes = b"hello world\n") -> None:
    """toxic_test.go's AssertEchoResponse: a line each way over the same connection."""
    established.client.sendall(message)
    assert recv_exactly(established.server, len(message)) == message
    established.server.sendall(message)
    assert recv_exactly(established.client, len(message)) == message


def test_noop_toxics_and_resets_keep_connections(server: ToxiproxyServer, established: Established) -> None:
    """TestPersistentConnections: with noop toxics on both streams, then after each of two resets,
    the same connection carries data both ways."""
    _toxic(server, "test", name="noop_up", type="noop", stream="upstream")
    _toxic(server, "test", name="noop_down", type="noop", stream="downstream")
    _echo_once(established)
    for _ in range(2):
        assert api(server, "POST", "/reset").status == 204
        _echo_once(established)


def test_toxics_added_and_removed_while_data_flows(server: ToxiproxyServer, established: Established) -> None:
    """TestToxicAddRemove: toxics added and removed over and over do not disturb an exchange."""
    stop = threading.Event()

    def churn() -> None:
        enabled = False
        while not stop.is_set():
            if enabled:
                _toxic(server, "test", name="noop_up", type="noop", stream="upstream")
                _remove(server, "test", "noop_down")
            else:
                api(server, "DELETE", "/proxies/test/toxics/noop_up")
                _toxic(server, "test", name="noop_down", type="noop", stream="downstream")
            enabled = not enabled

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        for _ in range(100):
            _echo_once(established)
    finally:
        stop.set()
        churner.join(10)


def test_no_data_dropped_while_a_latency_toxic_comes_and_goes(
    server: ToxiproxyServer, established: Established
) -> None:
    """TestNoDataDropped: 65535 two-byte counters sent while a 1000 ms latency toxic is added and
    removed over and over arrive complete and in order, then the end of the stream."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            _toxic(server, "test", type="latency", attributes={"latency": 1000}, stream="upstream")
            _remove(server, "test", "latency_upstream")

    def send() -> None:
        for start in range(0, 65535, 4096):
            established.client.sendall(
                b"".join(struct.pack(">H", i) for i in range(start, min(start + 4096, 65535)))
            )
        established.client.shutdown(socket.SHUT_WR)

    threads = [threading.Thread(target=churn, daemon=True), threading.Thread(target=send, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        established.server.settimeout(10)
        received = recv_until_eof(established.server)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert received == b"".join(struct.pack(">H", i) for i in range(65535))


def test_data_arrives_whole_and_in_order(toxiproxy: Toxiproxy, upstream: Upstream) -> None:
    """TestProxySimpleMessage, TestProxyBigMessage, TestProxyTwoPartMessage: what a client writes
    before closing arrives at the server whole, in order, followed by the end of the stream."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    for parts in ([b"hello world"], [os.urandom(32 * 1024).hex().encode()], [b"hello world", b"hello world"]):
        with connect(proxy.listen) as client, upstream.accept() as held:
            for part in parts:
                client.sendall(part)
            client.close()
            held.settimeout(5)
            assert recv_until_eof(held) == b"".join(parts)


def test_proxy_adds_little_latency(established: Established) -> None:
    """TestProxyLatency: without toxics an exchange through the proxy takes little time (Toxiproxy
    asks < 300 µs per hop in Go; we ask < 5 ms on average for Python on a shared machine)."""
    started = time.monotonic()
    for _ in range(100):
        _echo_once(established)
    assert (time.monotonic() - started) / 200 < 0.005


@pytest.fixture
def many_established(toxiproxy: Toxiproxy, upstream: Upstream) -> Iterator[list[Established]]:
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    pairs = []
    try:
        for _ in range(3):
            client = connect(proxy.listen)
            pairs.append(Established(proxy, client, upstream.accept()))
        yield pairs
    finally:
        for pair in pairs:
            pair.client.close()
            pair.server.close()


def test_timeout_removal_closes_every_connection_of_the_proxy(
    server: ToxiproxyServer, many_established: list[Established]
) -> None:
    """link.go RemoveToxic + TimeoutToxic.Cleanup: removing a timeout toxic closes every connection
    of its proxy, those its toxicity spared included; a reset does the same."""
    _toxic(server, "test", type="timeout", toxicity=0, attributes={"timeout": 0})
    _echo_once(many_established[0])
    assert api(server, "POST", "/reset").status == 204
    assert all(_closed_or_reset(pair.client) for pair in many_established)
