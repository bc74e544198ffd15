"""Prometheus text over HTTP (`--metrics-listen HOST:PORT`), one registry per process.

Each process builds a Metrics: histograms and counters that its hot paths update, and
gauges read from its state at scrape time (a `collect` callback yielding metric
families), so nothing is computed between scrapes. prometheus-client serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mqmeta.validate import parse_addresses

# Seconds: a local send or fetch takes ~1-100 ms; Raft applies take microseconds to ms.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


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


class _Callback(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()


class Metrics:
    """A process's registry; `serve` starts the HTTP endpoint (no-op without an address)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: Any = None

    def histogram(self, name: str, documentation: str) -> Histogram:
        return Histogram(name, documentation, registry=self.registry, buckets=LATENCY_BUCKETS_S)

    def counter(self, name: str, documentation: str) -> Counter:
        return Counter(name, documentation, registry=self.registry)

    def on_scrape(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_Callback(collect))

    def serve(self, listen: str) -> None:
        if not listen:
            return
        host, _, port = parse_addresses(listen, "--metrics-listen address")[0].rpartition(":")
        self._server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
