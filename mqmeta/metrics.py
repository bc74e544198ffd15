"""Prometheus text over HTTP (`--metrics-listen HOST:PORT`), one registry per process.

Each process builds a Metrics: histograms and counters that its hot paths update, and
gauges read from its state at scrape time (a `collect` callback yielding metric
families), so nothing is computed between scrapes.

The metric types, the text format (version 0.0.4) and the HTTP endpoint are this module's
own, written to give what prometheus-client gave (the same families, samples, names and
number formatting; the tests parse it with prometheus-client's parser): importing
prometheus-client brought its exposition module's HTTP server, URL client, WSGI server
and the email package, 2.5 MB of every server's memory for an endpoint that answers one
GET. The replicator's worker still uses prometheus-client (replicator/metrics.py).
"""

from __future__ import annotations

import bisect
import gzip
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

# Seconds: a local send or fetch takes ~1-100 ms; Raft applies take microseconds to ms.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_BYTES_MAX = 8192  # a scrape's request line and headers
REQUEST_TIMEOUT_S = 5.0  # a client that sends nothing is dropped after this
CONNECTIONS_MAX = 8  # scrapes answered at once; more are closed at once
ACCEPT_POLL_S = 0.5  # how soon stop() ends the accepting thread
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


# Metric families (prometheus-client's data model: what registries collect) -------------------


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Metric:
    """One family: its name, help text, type and samples."""

    def __init__(self, name: str, documentation: str, kind: str, labels: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        self.name = name
        self.documentation = documentation
        self.type = kind
        self._labelnames = tuple(labels)
        self.samples: list[Sample] = []

    def _add(self, suffix: str, labels: Sequence[str], value: float) -> None:
        if len(labels) != len(self._labelnames):
            raise ValueError(f"{self.name}: {len(labels)} label values for {list(self._labelnames)}")
        self.samples.append(
            Sample(self.name + suffix, dict(zip(self._labelnames, labels, strict=True)), float(value))
        )


class GaugeMetricFamily(Metric):
    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, documentation, "gauge", labels or ())
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self._add("", labels, value)


class CounterMetricFamily(Metric):
    """A counter read at scrape time; its samples are NAME_total (the name given without)."""

    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] | None = None
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", labels or ())
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self._add("_total", labels, value)


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


# Counters and histograms updated on the data path ----------------------------------------------


class Counter:
    """A counter without labels: NAME_total and NAME_created (seconds since the epoch)."""

    def __init__(self, name: str, documentation: str) -> None:
        self._family = (name.removesuffix("_total"), documentation)
        Metric(*self._family, "counter")  # checks the name
        self._lock = threading.Lock()
        self._value = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        with self._lock:
            self._value += amount

    def collect(self) -> Iterator[Metric]:
        family = Metric(*self._family, "counter")
        family._add("_total", [], self._value)
        family._add("_created", [], self._created)
        yield family


class Histogram:
    """A histogram without labels: NAME_bucket{le} (cumulative), NAME_count, NAME_sum, NAME_created."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds != [float(b) for b in buckets] or len(set(bounds)) != len(bounds):
            raise ValueError("histogram buckets must be in increasing order")
        self._bounds = bounds if bounds and math.isinf(bounds[-1]) else [*bounds, math.inf]
        self._family = (name, documentation)
        Metric(name, documentation, "histogram")  # checks the name
        self._lock = threading.Lock()
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        index = bisect.bisect_left(self._bounds, amount)  # the first bound >= amount
        with self._lock:
            self._counts[min(index, len(self._counts) - 1)] += 1
            self._sum += amount

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = Metric(*self._family, "histogram")
        name, cumulative = family.name, 0
        for bound, count in zip(self._bounds, counts, strict=True):
            cumulative += count
            family.samples.append(Sample(name + "_bucket", {"le": _number(bound)}, float(cumulative)))
        family._add("_count", [], cumulative)
        family._add("_sum", [], total)
        family._add("_created", [], self._created)
        yield family


class Registry:
    """Collectors in the order registered; collect() yields every family."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()

    def register(self, collector: Collector) -> None:
        with self._lock:
            self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()


# The text format ---------------------------------------------------------------------------------


def _number(value: float) -> str:
    """Go's formatting, as Prometheus writes numbers (prometheus-client's floatToGoString)."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _sample_line(sample: Sample) -> str:
    labels = ""
    if sample.labels:
        pairs = (f'{k}="{_escape(v, quote=True)}"' for k, v in sorted(sample.labels.items()))
        labels = "{" + ",".join(pairs) + "}"
    return f"{sample.name}{labels} {_number(sample.value)}\n"


def _escape(text: str, quote: bool = False) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quote else text


def text(registry: Registry) -> bytes:
    """Every family of `registry` in the Prometheus text format 0.0.4; a family's _created
    samples follow it as a gauge family of their own (as prometheus-client writes them)."""
    lines: list[str] = []
    for metric in registry.collect():
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        lines.append(f"# HELP {name} {_escape(metric.documentation)}\n# TYPE {name} {metric.type}\n")
        created = [s for s in metric.samples if s.name == metric.name + "_created"]
        lines.extend(_sample_line(s) for s in metric.samples if s.name != metric.name + "_created")
        if created:
            lines.append(f"# HELP {metric.name}_created {_escape(metric.documentation)}\n")
            lines.append(f"# TYPE {metric.name}_created gauge\n")
            lines.extend(_sample_line(s) for s in created)
    return "".join(lines).encode()


# Building and serving -----------------------------------------------------------------------------


def gauge(
    name: str, documentation: str, value: float, labels: dict[str, str] | None = None
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=sorted(labels or {}))
    family.add_metric([(labels or {})[k] for k in sorted(labels or {})], value)
    return family


def gauges(name: str, documentation: str, label: str, values: dict[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class _Callback:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()


class Metrics:
    """A process's registry; `serve` starts the HTTP endpoint (no-op without an address)."""

    def __init__(self) -> None:
        self.registry = Registry()
        self._server: MetricsServer | None = None

    def histogram(self, name: str, documentation: str) -> Histogram:
        histogram = Histogram(name, documentation, LATENCY_BUCKETS_S)
        self.registry.register(histogram)
        return histogram

    def counter(self, name: str, documentation: str) -> Counter:
        counter = Counter(name, documentation)
        self.registry.register(counter)
        return counter

    def on_scrape(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_Callback(collect))

    def serve(self, listen: str) -> None:
        if not listen:
            return
        host, _, port = parse_addresses(listen, "--metrics-listen address")[0].rpartition(":")
        self._server = MetricsServer(host.strip("[]"), int(port), lambda: text(self.registry))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


class MetricsServer:
    """HTTP/1.0 on a listening socket: GET or HEAD of any path answers the text (gzipped when
    the client accepts gzip), anything else 405, a request that is not HTTP 400. One thread
    accepts; each connection gets a thread of its own, at most CONNECTIONS_MAX at once, and
    REQUEST_TIMEOUT_S to send its request."""

    def __init__(self, host: str, port: int, render: Callable[[], bytes]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family)
        self._socket.settimeout(ACCEPT_POLL_S)
        self._render = render
        self._slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=ACCEPT_POLL_S * 4)
        self._socket.close()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                connection.close()  # a scraper retries; a flood holds no thread
                continue
            threading.Thread(
                target=self._answer, args=(connection,), name="metrics-http-request", daemon=True
            ).start()

    def _answer(self, connection: socket.socket) -> None:
        try:
            with connection:
                connection.settimeout(REQUEST_TIMEOUT_S)
                status, headers, body = self._response(_read_request(connection))
                head = f"HTTP/1.0 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                connection.sendall(head.encode() + b"\r\n" + body)
        except OSError:
            pass  # the client went away or sent nothing in time
        except Exception:  # a collector's bug: logged, this scrape fails, the server goes on
            log.exception("metrics: a scrape failed")
        finally:
            self._slots.release()

    def _response(self, request: tuple[str, dict[str, str]] | None) -> tuple[str, dict[str, str], bytes]:
        if request is None:
            return "400 Bad Request", {"Content-Length": "0"}, b""
        method, headers = request
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"Allow": "GET, HEAD", "Content-Length": "0"}, b""
        body = self._render()
        answer = {"Content-Type": CONTENT_TYPE}
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            answer["Content-Encoding"] = "gzip"
        answer["Content-Length"] = str(len(body))
        return "200 OK", answer, b"" if method == "HEAD" else body


def _read_request(connection: socket.socket) -> tuple[str, dict[str, str]] | None:
    """(method, lower-cased headers) of one HTTP request, or None when it is not one."""
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > REQUEST_BYTES_MAX:
            return None
        chunk = connection.recv(4096)
        if not chunk:
            return None
        data += chunk
    end = data.find(b"\r\n\r\n") if b"\r\n\r\n" in data else data.find(b"\n\n")
    if end > REQUEST_BYTES_MAX:
        return None
    lines = data[:end].split(b"\n")
    words = lines[0].decode("latin-1").split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        return None
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.decode("latin-1").partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return words[0], headers
