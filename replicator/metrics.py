"""A worker's metrics in Prometheus text (`--metrics-listen HOST:PORT`), per task.

Read from the tasks' counters at each scrape (nothing is pushed). The delay is now minus
the source store time of the last copy the target acknowledged, and zero for a task
that has caught up: a quiet topic shows no lag (Kafka #14967 reported it as lagging).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from mqmeta.replicator.task import Task
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

LABELS = ["rule", "topic", "broker_name", "queue_id"]


class TaskCollector(Collector):
    def __init__(self, tasks: Callable[[], list[Task]]) -> None:
        self._tasks = tasks

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        replicated = CounterMetricFamily(
            "mqmeta_replicator_replicated", "Copies the target stored (duplicates not counted)", labels=LABELS
        )
        replicated_bytes = CounterMetricFamily(
            "mqmeta_replicator_replicated_bytes", "Body bytes of the copies the target stored", labels=LABELS
        )
        errors = CounterMetricFamily(
            "mqmeta_replicator_errors", "Failures the task recovered from by resuming", labels=LABELS
        )
        lag = GaugeMetricFamily(
            "mqmeta_replicator_lag_messages",
            "Source readable end minus the next offset to read",
            labels=LABELS,
        )
        delay = GaugeMetricFamily(
            "mqmeta_replicator_delay_ms", "Now minus the source store time of the last copy", labels=LABELS
        )
        last_sync = GaugeMetricFamily(
            "mqmeta_replicator_last_sync_ms",
            "When the task last stored a copy or found nothing new",
            labels=LABELS,
        )
        now_ms = int(time.time() * 1000)
        for task in self._tasks():
            key, stats = task.key, task.stats
            labels = [key.rule, key.topic, key.broker_name, str(key.queue_id)]
            replicated.add_metric(labels, stats.replicated)
            replicated_bytes.add_metric(labels, stats.replicated_bytes)
            errors.add_metric(labels, stats.errors)
            lag.add_metric(labels, stats.lag_messages)
            caught_up = stats.caught_up or not stats.last_store_ms
            delay.add_metric(labels, 0 if caught_up else max(0, now_ms - stats.last_store_ms))
            last_sync.add_metric(labels, stats.last_sync_ms)
        yield from (replicated, replicated_bytes, errors, lag, delay, last_sync)


def serve_metrics(address: str, tasks: Callable[[], list[Task]]) -> str:
    """Serves the tasks' metrics on HOST:PORT (port 0: the system picks); the address bound."""
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TaskCollector(tasks))
    server, _ = start_http_server(int(port), host, registry=registry)
    return f"{host}:{server.server_port}"
