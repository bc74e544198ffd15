"""Prometheus text over HTTP (`--metrics-listen HOST:PORT`), one registry per process.

Each process builds a Metrics: histograms and counters that its hot paths update, and
gauges read from its state at scrape time (a `collect` callback yielding metric
families), so nothing is computed between scrapes. prometheus-client serves them.

A process that serves no metrics (no `--metrics-listen`) builds `Metrics(serving=False)`:
its histograms and counters record nothing and prometheus-client is never imported (its
exposition module brings an HTTP server, a URL client, a WSGI server and the email
package: 2.5 MB of an idle controller's memory that nobody could read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from mqmeta.validate import parse_addresses

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric

# Seconds: a local send or fetch takes ~1-100 ms; Raft applies take microseconds to ms.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def gauge(
    name: str, documentation: str, value: float, labels: dict[str, str] | None = None
) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=sorted(labels or {}))
    family.add_metric([(labels or {})[k] for k in sorted(labels or {})], value)
    return family


def gauges(name: str, documentation: str, label: str, values: dict[str, float]) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class _Unrecorded:
    """A histogram or counter of a process that serves no metrics: records nothing."""

    def observe(self, amount: float) -> None:
        pass

    def inc(self, amount: float = 1) -> None:
        pass


UNRECORDED: Any = _Unrecorded()


class _Callback:  # a prometheus-client Collector (the registry calls collect)
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()


class Metrics:
    """A process's registry; `serve` starts the HTTP endpoint (no-op without an address).
    `serving=False`: a process that will serve none (nothing recorded, nothing imported)."""

    def __init__(self, serving: bool = True) -> None:
        self.registry: Any = None
        if serving:
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry()
        self._server: Any = None

    def histogram(self, name: str, documentation: str) -> Histogram:
        if self.registry is None:
            return UNRECORDED
        from prometheus_client import Histogram

        return Histogram(name, documentation, registry=self.registry, buckets=LATENCY_BUCKETS_S)

    def counter(self, name: str, documentation: str) -> Counter:
        if self.registry is None:
            return UNRECORDED
        from prometheus_client import Counter

        return Counter(name, documentation, registry=self.registry)

    def on_scrape(self, collect: Callable[[], Iterable[Metric]]) -> None:
        if self.registry is not None:
            self.registry.register(_Callback(collect))

    def serve(self, listen: str) -> None:
        if not listen:
            return
        if self.registry is None:
            raise ValueError("serve() on a Metrics built with serving=False")
        from prometheus_client import start_http_server

        host, _, port = parse_addresses(listen, "--metrics-listen address")[0].rpartition(":")
        self._server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
