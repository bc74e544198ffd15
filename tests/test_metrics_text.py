"""mqmeta/metrics.py's own metric types, text format and HTTP endpoint.

Properties checked:
- the text for counters, histograms and scrape-time families (labels with quotes,
  backslashes and newlines; NaN, infinities, large numbers) is byte for byte what
  prometheus-client's generate_latest writes for the same metrics (timestamps of
  creation aside), and prometheus-client's parser reads it back;
- the endpoint answers GET of any path with the text (gzipped when the client accepts
  gzip), HEAD without a body, other methods 405, a request that is not HTTP 400;
- a client that connects and sends nothing does not hold up a scrape; past
  CONNECTIONS_MAX connections at once, more are closed, and the server still answers
  once they are gone; stop() lets the port go.
"""

from __future__ import annotations

import gzip
import math
import re
import socket
import urllib.request

import pytest
from mqmeta.cluster.wait import wait_for
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as ClientCounter
from prometheus_client import Histogram as ClientHistogram
from prometheus_client.core import CounterMetricFamily as ClientCounterFamily
from prometheus_client.core import GaugeMetricFamily as ClientGaugeFamily
from prometheus_client.parser import text_string_to_metric_families

from mqmeta import metrics

pytestmark = pytest.mark.timeout(60)

OBSERVED = (0.0001, 0.0005, 0.003, 0.2, 7.0, 1234567.0)


def families(gauge_class, counter_class):
    gauge = gauge_class("t_lag", 'lag "quoted"', labels=["broker", "a"])
    gauge.add_metric(['v"1', "a\\b\nc"], 12_345_678.0)
    gauge.add_metric(["2", "z"], math.nan)
    yield gauge
    yield counter_class("t_failures_total", "failures", value=4)
    yield gauge_class("t_floor", "minus infinity", value=-math.inf)


class _Families:
    def __init__(self, gauge_class, counter_class) -> None:
        self.classes = (gauge_class, counter_class)

    def collect(self):
        return families(*self.classes)


def without_created(text: str) -> str:
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)


def test_the_text_is_prometheus_clients():
    client = CollectorRegistry()
    ours = metrics.Metrics()
    counters = (
        ClientCounter("t_writes", "writes\nwith \\ backslash", registry=client),
        ours.counter("t_writes", "writes\nwith \\ backslash"),
    )
    histograms = (
        ClientHistogram("t_apply_seconds", "apply", registry=client, buckets=metrics.LATENCY_BUCKETS_S),
        ours.histogram("t_apply_seconds", "apply"),
    )
    for value in OBSERVED:
        for histogram in histograms:
            histogram.observe(value)
    for counter in counters:
        counter.inc(3)
    client.register(_Families(ClientGaugeFamily, ClientCounterFamily))
    ours.on_scrape(lambda: families(metrics.GaugeMetricFamily, metrics.CounterMetricFamily))
    text = metrics.text(ours.registry).decode()
    assert without_created(text) == without_created(generate_latest(client).decode())
    parsed = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert parsed["t_apply_seconds_count"].value == len(OBSERVED)
    assert parsed["t_writes_total"].value == 3


@pytest.fixture
def server():
    served = metrics.Metrics()
    served.counter("t_scrapes", "a counter").inc()
    server = metrics.MetricsServer("127.0.0.1", 0, lambda: metrics.text(served.registry))
    yield server
    server.stop()


def http(port: int, request: bytes, timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_get_head_and_refusals(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"] == metrics.CONTENT_TYPE
        assert b"t_scrapes_total 1.0\n" in answer.read()
    zipped = http(server.port, b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
    head, _, body = zipped.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head and b"t_scrapes_total 1.0" in gzip.decompress(body)
    head, _, body = http(server.port, b"HEAD /metrics HTTP/1.0\r\n\r\n").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and body == b""
    assert http(server.port, b"POST /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405")
    assert http(server.port, b"hello\r\n\r\n").startswith(b"HTTP/1.0 400")
    assert http(server.port, b"GET / HTTP/1.0\r\n" + b"X: y\r\n" * 2000 + b"\r\n").startswith(b"HTTP/1.0 400")


def test_silent_clients_and_a_flood_do_not_stop_scrapes(server):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        assert b"t_scrapes_total" in http(server.port, b"GET / HTTP/1.0\r\n\r\n")
        flood = [
            socket.create_connection(("127.0.0.1", server.port), timeout=5)
            for _ in range(metrics.CONNECTIONS_MAX)
        ]
        try:
            closed = flood[-1].recv(1)  # past the bound: closed at once, nothing sent
            assert closed == b""
        finally:
            for connection in flood:
                connection.close()
    finally:
        silent.close()
    wait_for(
        lambda: b"t_scrapes_total" in http(server.port, b"GET / HTTP/1.0\r\n\r\n"),
        metrics.REQUEST_TIMEOUT_S + 5,
        "the server to answer again once the flood is gone",
    )


def test_stop_lets_the_port_go():
    server = metrics.MetricsServer("127.0.0.1", 0, lambda: b"")
    port = server.port
    server.stop()
    with socket.create_server(("127.0.0.1", port)):
        pass
