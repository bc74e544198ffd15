"""A broker's Prometheus metrics (`--metrics-listen`): role, offsets and replication read at
scrape time; send and fetch latencies and traffic counted on their paths (service.py for the
native service, rmq_service.py for apache.rocketmq.v2: one set of counters for both)."""

from __future__ import annotations

from collections.abc import Iterator

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.ha import Role
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mqmeta.clock import wall_ms
from mqmeta.metrics import Metrics, gauge, gauges

PREFIX = "mqmeta_broker_"
LAG_SERIES_MAX = 2000  # (group, topic, queue) series a scrape reports; past it, the largest backlogs


class BrokerMetrics:
    """What the data path records; the rest is read from the agent when scraped."""

    def __init__(self, agent: BrokerAgent) -> None:
        self.metrics = Metrics()
        self.send_seconds = self.metrics.histogram(
            PREFIX + "send_seconds", "a Send or RocketMQ 5 SendMessage call, append to acknowledgement"
        )
        self.fetch_seconds = self.metrics.histogram(PREFIX + "fetch_seconds", "a slave's HaFetch, as served")
        self.messages_in = self.metrics.counter(PREFIX + "messages_in", "messages acknowledged to producers")
        self.bytes_in = self.metrics.counter(
            PREFIX + "bytes_in", "message body bytes acknowledged to producers"
        )
        self.rocketmq_send_writes = self.metrics.counter(
            PREFIX + "rocketmq_send_writes",
            "commit-log writes of RocketMQ 5 plain sends (the sends that reach the master at once: one)",
        )
        self.bytes_out = self.metrics.counter(PREFIX + "replicated_bytes_out", "log bytes served to slaves")
        self.messages_out = self.metrics.counter(
            PREFIX + "messages_out",
            "messages delivered to consumers: native Pull and RocketMQ 5 (redeliveries included)",
        )
        self.delivered_bytes_out = self.metrics.counter(
            PREFIX + "bytes_out",
            "message body bytes delivered to consumers: native Pull and RocketMQ 5 (redeliveries included)",
        )
        self.metrics.on_scrape(lambda: _collect(agent))

    def serve(self, listen: str) -> None:
        self.metrics.serve(listen)

    def stop(self) -> None:
        self.metrics.stop()


def _collect(agent: BrokerAgent) -> Iterator[Metric]:
    yield from _scrub_metrics(agent)
    with agent.lock:
        view = agent.core.view()
        max_offset = agent.store.max_offset
        acked = agent.core.acked_offsets()
    roles = {role.value: 1.0 if view.role is role else 0.0 for role in Role}
    yield gauges(PREFIX + "role", "1 for the role this broker holds", "role", roles)
    yield gauge(PREFIX + "master_epoch", "the master epoch this broker follows or leads", view.master_epoch)
    yield gauge(PREFIX + "max_offset", "the end of the local commit log (bytes)", max_offset)
    yield gauge(PREFIX + "confirm_offset", "what the SyncStateSet durably holds (bytes)", view.confirm_offset)
    yield gauge(
        PREFIX + "sync_state_set_size",
        "members of the SyncStateSet, master included",
        len(view.sync_state_set),
    )
    lag = GaugeMetricFamily(
        PREFIX + "slave_lag_bytes",
        "master only: log bytes a slave has not acknowledged",
        labels=["slave_broker_id"],
    )
    for broker_id, offset in sorted(acked.items()):
        lag.add_metric([str(broker_id)], max(0, max_offset - offset))
    yield lag
    tiered = agent.tiered
    if tiered is not None:
        failures = CounterMetricFamily(
            PREFIX + "tiered_upload_failures",
            "tiered upload steps that failed, by reason (an errno such as enospc or eio when the "
            "tiered store's disk refused a write; an error class otherwise); each is retried",
            labels=["reason"],
        )
        for reason, count in sorted(tiered.failures.items()):
            failures.add_metric([reason], count)
        yield failures
    checkpoint = tiered.checkpoint if tiered is not None else None
    if checkpoint is not None and view.role is Role.MASTER:
        yield gauge(
            PREFIX + "tiered_uploaded_offset",
            "the committed tiered checkpoint (bytes)",
            checkpoint.uploaded_offset,
        )
        lag_bytes = max(0, view.confirm_offset - checkpoint.uploaded_offset)
        yield gauge(PREFIX + "tiered_lag_bytes", "confirmed bytes not yet in the tiered store", lag_bytes)
    if view.role is Role.MASTER:
        yield from _group_lag(agent, view.confirm_offset)


def _group_lag(agent: BrokerAgent, confirm: int) -> Iterator[Metric]:
    """Master only: each group's backlog per queue (status.queue_lag, as `group lag` shows)."""
    from mqmeta.broker_agent.status import queue_lag

    now = wall_ms()
    labels = ["group", "topic", "queue_id"]
    messages = GaugeMetricFamily(
        PREFIX + "group_backlog_messages",
        "messages of a queue a consumer group has not consumed",
        labels=labels,
    )
    seconds = GaugeMetricFamily(
        PREFIX + "group_backlog_seconds",
        "now minus the store time of the oldest message a group has not consumed (0: none)",
        labels=labels,
    )
    keys = agent.store.consumer_keys()
    lags = [queue_lag(agent.store, g, t, q, confirm, now) for g, t, q in keys]
    ranked = sorted(zip(keys, lags, strict=True), key=lambda pair: -pair[1].backlog)[:LAG_SERIES_MAX]
    for (group, topic, queue_id), lag in sorted(ranked, key=lambda pair: pair[0]):
        messages.add_metric([group, topic, str(queue_id)], lag.backlog)
        seconds.add_metric([group, topic, str(queue_id)], lag.backlog_ms / 1000)
    yield messages
    yield seconds


def _scrub_metrics(agent: BrokerAgent) -> Iterator[Metric]:
    """The background scrub (broker_agent/scrub.py), counted since the broker started."""
    stats = agent.scrub_stats
    counters = (
        ("scrub_bytes", "commit log bytes the background scrub checked", stats.bytes_scrubbed),
        ("scrub_passes", "passes of the background scrub over the whole commit log", stats.passes),
        (
            "corruptions_found",
            "corrupt records found in the local commit log (scrub, or opening the log)",
            stats.corruptions_found,
        ),
        (
            "corruption_repairs",
            "corrupt logs repaired: cut at the bad record to fetch the rest from the master again",
            stats.repairs,
        ),
    )
    for name, documentation, value in counters:
        yield CounterMetricFamily(PREFIX + name, documentation, value=value)
