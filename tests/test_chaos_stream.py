"""The chaos suite's network carries the HA stream: real controller, nameserver and broker
processes, each dialling through its dial map (chaos/net.py ProxiedNetwork, an in-process
Toxiproxy-compatible server).

Properties checked:
- under the proxied network the slave fetches over the HA stream (its master's HA status
  says `streamed`), through the fault proxy of the stream's link;
- a partition between slave and master (ProxiedNetwork.cut: gRPC and stream links, both
  ways) stops the slave's replication while the master goes on taking sends; healed, the
  slave streams again and catches up.
A slave that reached the stream without its proxy would go on replicating through the cut.
"""

from __future__ import annotations

import grpc
import pytest
from mqmeta.chaos.net import ProxiedNetwork
from mqmeta.chaos.toxiproxy import ToxiproxyServer
from mqmeta.cluster.harness import Cluster

from mqmeta.broker_client import Producer
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for, wait_in_sync
from tests.support.sampling import sample_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

TIMEOUT_S = 20.0
CUT_WINDOW_S = 1.5  # a slave fetches within its 100 ms long poll: nothing may arrive in 15 of them
# Acknowledged by the master alone while the slave is cut off (no wait for the SyncStateSet).
FLAGS = ["--no-all-ack"]


def _offsets(cluster: Cluster, master: str, slave: str) -> tuple[int, int]:
    return cluster.broker_status(master).max_offset, cluster.broker_status(slave).max_offset


def _streamed(cluster: Cluster, master: str) -> list[bool]:
    return [s.streamed for s in cluster.broker_status(master).slaves]


def test_the_slave_streams_through_its_proxy_and_a_partition_stops_it(tmp_path):
    with (
        ToxiproxyServer("127.0.0.1:0") as toxiproxy,
        Cluster(tmp_path / "c", count=1, broker_sets=1, replicas=2, broker_flags=FLAGS) as cluster,
    ):
        network = ProxiedNetwork(cluster, toxiproxy.url)
        network.create()
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=2))
        master = wait_in_sync(cluster, 2)
        slave = next(b.name for b in cluster.layout.brokers if b.name != master)
        wait_for(
            lambda: _streamed(cluster, master),
            TIMEOUT_S,
            "the slave fetching over the HA stream",
            until=lambda streamed: streamed == [True],
        )
        producer = Producer(cluster.namesrv)
        try:
            producer.send("Orders", [b"before"])
            end, _ = wait_for(
                lambda: _offsets(cluster, master, slave),
                TIMEOUT_S,
                "the slave holding the master's log",
                until=lambda ends: ends[0] == ends[1] > 0,
            )

            assert network.cut([(slave, master)]) == 4, "gRPC and HA stream, both ways"
            producer.send("Orders", [b"during"] * 5)
            assert cluster.broker_status(master).max_offset > end
            for _ in sample_for(CUT_WINDOW_S, 0.1, samples_min=5):
                assert cluster.broker_status(slave).max_offset == end, "replicated through the partition"

            network.heal()
            wait_for(
                lambda: _offsets(cluster, master, slave),
                TIMEOUT_S,
                "the slave caught up after the heal",
                until=lambda ends: ends[0] == ends[1] > end,
                retry_on=(grpc.RpcError,),
            )
            wait_for(
                lambda: _streamed(cluster, master),
                TIMEOUT_S,
                "the slave streaming again after the heal",
                until=lambda streamed: streamed == [True],
            )
        finally:
            producer.close()
