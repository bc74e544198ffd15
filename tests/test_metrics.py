"""Prometheus metrics of real processes (`--metrics-listen`, given by the cluster layout).

Properties checked (one cluster for the module: 3 controllers, a nameserver, a broker set
of 3): every process answers on its metrics address; the master's metrics agree with its
admin API (role, master epoch, max and confirm offset, SyncStateSet size) and count
exactly the messages and Send calls made to it, the bytes its slaves fetched (over the HA
stream) and the messages pulled back through the native Pull; the leader's liveness
gauges show the 3 brokers alive; exactly one controller reports
mqmeta_controller_is_leader 1, the one the cluster names leader, and after it is killed
exactly one other does; the sample Grafana dashboard queries only metrics that are served.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.broker_client import Consumer, Producer
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for, wait_in_sync
from tests.support.prometheus import scrape

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

BATCHES = 10
BATCH = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("metrics"), broker_sets=1, replicas=3)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        yield cluster
    finally:
        cluster.stop()


def test_every_process_serves_metrics(cluster):
    addresses = [n.metrics for n in cluster.layout.controllers] + [b.metrics for b in cluster.layout.brokers]
    addresses.append(cluster.layout.namesrv_metrics)
    assert all(addresses), cluster.layout
    for address in addresses:
        assert scrape(address), f"nothing served at {address}"
    assert ("mqmeta_namesrv_route_queries_total", ()) in scrape(cluster.layout.namesrv_metrics)


def test_the_master_metrics_agree_with_its_admin_api(cluster):
    master = wait_in_sync(cluster, 3)
    metrics_address = cluster.broker(master).metrics
    before = scrape(metrics_address)
    producer = Producer(cluster.namesrv)
    try:
        for i in range(BATCHES):
            producer.send("Orders", [f"m-{i}-{k}".encode() for k in range(BATCH)])
    finally:
        producer.close()
    status = cluster.broker_status(master)
    assert status.role == "MASTER"
    samples = wait_for(
        lambda: scrape(metrics_address),
        10,
        "the master's metrics to show its admin API's confirm offset",
        until=lambda s: (
            s[("mqmeta_broker_confirm_offset", ())] == cluster.broker_status(master).confirm_offset
        ),
    )
    status = cluster.broker_status(master)
    assert samples[("mqmeta_broker_role", (("role", "MASTER"),))] == 1
    assert samples[("mqmeta_broker_role", (("role", "SLAVE"),))] == 0
    assert samples[("mqmeta_broker_master_epoch", ())] == status.master_epoch
    assert samples[("mqmeta_broker_max_offset", ())] == status.max_offset
    assert samples[("mqmeta_broker_sync_state_set_size", ())] == len(status.sync_state_set) == 3
    sent = samples[("mqmeta_broker_messages_in_total", ())] - before[("mqmeta_broker_messages_in_total", ())]
    calls = (
        samples[("mqmeta_broker_send_seconds_count", ())] - before[("mqmeta_broker_send_seconds_count", ())]
    )
    assert (sent, calls) == (BATCHES * BATCH, BATCHES)
    # Both slaves fetched every byte appended (over the HA stream, counted as gRPC fetches are).
    appended = status.max_offset - before[("mqmeta_broker_max_offset", ())]
    replicated = wait_for(
        lambda: (
            scrape(metrics_address)[("mqmeta_broker_replicated_bytes_out_total", ())]
            - before[("mqmeta_broker_replicated_bytes_out_total", ())]
        ),
        10,
        "the master's replicated bytes to count both slaves' copies",
        until=lambda served: served >= 2 * appended,
    )
    assert replicated >= 2 * appended > 0
    consumer = Consumer(cluster.namesrv, "Orders", "metrics-reader")
    try:
        pulled: list = []
        wait_for(
            lambda: pulled.extend(consumer.poll()) or len(pulled),
            10,
            "the messages back through the native Pull",
            until=lambda count: count >= BATCHES * BATCH,
        )
    finally:
        consumer.close()
    delivered = scrape(metrics_address)
    out = (
        delivered[("mqmeta_broker_messages_out_total", ())] - before[("mqmeta_broker_messages_out_total", ())]
    )
    out_bytes = (
        delivered[("mqmeta_broker_bytes_out_total", ())] - before[("mqmeta_broker_bytes_out_total", ())]
    )
    assert (out, out_bytes) == (len(pulled), sum(len(m.body) for m in pulled))
    lags = {labels: v for (name, labels), v in samples.items() if name == "mqmeta_broker_slave_lag_bytes"}
    assert len(lags) == 2, lags
    slave = next(b for b in cluster.layout.brokers if b.name != master)
    assert scrape(slave.metrics)[("mqmeta_broker_role", (("role", "SLAVE"),))] == 1


def leaders(cluster: Cluster) -> list[str]:
    return [
        n.id
        for n in cluster.layout.controllers
        if cluster.is_running(n.id) and scrape(n.metrics)[("mqmeta_controller_is_leader", ())] == 1
    ]


def test_exactly_one_controller_reports_leader_and_it_moves(cluster):
    leader = cluster.leader_id()
    assert leaders(cluster) == [leader]
    samples = scrape(cluster.node(leader).metrics)
    alive = {labels: v for (name, labels), v in samples.items() if name == "mqmeta_controller_broker_alive"}
    assert sorted(alive.values()) == [1, 1, 1], alive
    assert samples[("mqmeta_controller_applied_index", ())] > 0
    assert samples[("mqmeta_controller_writes_total", ())] > 0
    cluster.kill(leader)
    try:
        new = wait_for(
            lambda: leaders(cluster),
            15,
            "exactly one other controller reporting is_leader 1",
            until=lambda found: len(found) == 1 and found[0] != leader,
        )
        assert new == [cluster.leader_id(exclude=leader)]
    finally:
        cluster.start_node(leader)
        address = cluster.node(leader).metrics
        wait_for(lambda: scrape(address), 20, f"{leader} serving metrics again", retry_on=(OSError,))


def test_the_sample_dashboard_names_only_served_metrics(cluster):
    """deploy/grafana-mqmeta.json queries metrics that the processes serve (the tiered ones
    appear once a master has committed a tiered checkpoint)."""
    dashboard = json.loads((Path(__file__).parent.parent / "deploy" / "grafana-mqmeta.json").read_text())
    wanted = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"mqmeta_[a-z_]+", target["expr"])
    }
    addresses = [n.metrics for n in cluster.layout.controllers if cluster.is_running(n.id)]
    addresses += [b.metrics for b in cluster.layout.brokers]
    served = {name.removesuffix("_bucket") for a in addresses for name, _ in scrape(a)}
    served |= {name + "_bucket" for name in served}
    missing = sorted(n for n in wanted - served if "tiered" not in n)
    assert not missing, f"the dashboard queries metrics nobody serves: {missing}"
