"""A controller node's Prometheus metrics (`--metrics-listen`): read from the node at scrape
time, except the apply latency and the write count, which the Raft apply path records."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mqmeta.controller.operations import ControllerOperations

from mqmeta.metrics import Metrics, gauge

if TYPE_CHECKING:
    from prometheus_client import Counter
    from prometheus_client.core import GaugeMetricFamily, Metric

PREFIX = "mqmeta_controller_"


def controller_metrics(core: ControllerOperations, serving: bool = True) -> tuple[Metrics, Counter]:
    """A node's metrics and the counter its call stream counts its calls on; `serving=False`
    for a node without `--metrics-listen`: nothing recorded or imported."""
    metrics = Metrics(serving)
    call_stream_calls = metrics.counter(
        PREFIX + "call_stream_calls", "unary calls served over the call stream (not as gRPC calls)"
    )
    apply_seconds = metrics.histogram(PREFIX + "apply_seconds", "time to apply one Raft entry (a batch)")
    writes = metrics.counter(PREFIX + "writes", "commands applied from the Raft log")

    def applied(seconds: float, commands: int) -> None:
        apply_seconds.observe(seconds)
        writes.inc(commands)

    core.raft.on_applied = applied
    metrics.on_scrape(lambda: _collect(core))
    return metrics, call_stream_calls


def namesrv_metrics(serving: bool = True) -> tuple[Metrics, Counter]:
    """A standalone nameserver's metrics and the route-query counter its handlers count on."""
    metrics = Metrics(serving)
    routes = metrics.counter(
        "mqmeta_namesrv_route_queries", "route queries answered (QueryRoute, GetTopicRoute)"
    )
    return metrics, routes


def _collect(core: ControllerOperations) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    raft = core.raft
    leader = raft.is_leader()
    yield gauge(PREFIX + "is_leader", "1 on the Raft leader, 0 elsewhere", 1.0 if leader else 0.0)
    yield gauge(PREFIX + "term", "the Raft term this node is in", raft.raftCurrentTerm)
    yield gauge(PREFIX + "commit_index", "the Raft commit index this node knows", raft.raftCommitIndex)
    yield gauge(PREFIX + "applied_index", "the last Raft entry this node applied", raft.raftLastApplied)
    yield gauge(
        PREFIX + "leader_terms",
        "how often this node became leader (sum over nodes: leader changes)",
        raft.leader_terms,
    )
    yield from _repair_metrics(core)
    yield from _collector_metrics()
    yield (
        _liveness(core)
        if leader
        else GaugeMetricFamily(
            PREFIX + "broker_alive",
            "1 while a broker heartbeats within dead-after (leader only)",
            labels=["cluster", "broker_name", "broker_id"],
        )
    )


def _liveness(core: ControllerOperations) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(
        PREFIX + "broker_alive",
        "1 while a broker heartbeats within dead-after (leader only)",
        labels=["cluster", "broker_name", "broker_id"],
    )
    for bs in core.state.broker_sets():
        ids = sorted(int(i) for i in bs["replicas"])
        alive = core.alive_ids(bs["cluster"], bs["broker_name"])
        for broker_id in ids:
            family.add_metric(
                [bs["cluster"], bs["broker_name"], str(broker_id)], 1.0 if str(broker_id) in alive else 0.0
            )
    return family


def _collector_metrics() -> Iterator[Metric]:
    """The process's garbage collector (controller/gc_pauses.py): a frozen count that only
    grows on a node that leads for long is what its full passes no longer examine."""
    from prometheus_client.core import CounterMetricFamily

    yield gauge(
        PREFIX + "gc_frozen_objects",
        "objects the garbage collector no longer examines: frozen after a full pass, until a thaw",
        float(gc.get_freeze_count()),
    )
    yield CounterMetricFamily(
        PREFIX + "gc_full_passes",
        "full (generation 2) garbage-collection passes of this process",
        value=gc.get_stats()[2]["collections"],
    )


def _repair_metrics(core: ControllerOperations) -> Iterator[Metric]:
    """The Raft log and snapshot scrub and repair (controller/repair.py)."""
    from prometheus_client.core import CounterMetricFamily

    stats = core.raft.repair_stats
    yield CounterMetricFamily(
        PREFIX + "raft_scrubs",
        "passes of the background scrub over the Raft log and snapshot",
        value=stats.scrubs,
    )
    yield CounterMetricFamily(
        PREFIX + "raft_corruptions_found",
        "times the Raft log or snapshot was found damaged (at start, or by the scrub)",
        value=stats.corruptions_found,
    )
    yield CounterMetricFamily(
        PREFIX + "raft_repairs",
        "times a damaged Raft log and snapshot were discarded to re-join from the others",
        value=stats.repairs,
    )
    yield gauge(
        PREFIX + "raft_catching_up",
        "1 while this node, after discarding a damaged log, may not vote yet",
        1.0 if core.raft.catching_up() else 0.0,
    )
