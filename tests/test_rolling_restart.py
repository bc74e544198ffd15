"""A rolling restart of every process under a produce loop: no failed send, nothing lost.

Property checked, with real processes (3 controllers, a nameserver, a broker set of 3):
while a producer that retries keeps sending, each process in turn gets SIGTERM, exits
with status 0, is started again and is back in service before the next one (the
controllers one by one, the leader last; the nameserver; the slaves, then the master);
no send fails and every acknowledged message is consumable exactly once per queue offset.
"""

from __future__ import annotations

import signal

import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.ready import wait_ready

from mqmeta.pb import controller_pb2 as pb
from tests.support import consume_all, wait_for, wait_in_sync
from tests.support.producing import FLAGS, ProduceLoop, check_no_loss

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]

EXIT_TIMEOUT_S = 10.0
ACKED_BETWEEN_RESTARTS_MIN = 20


def restart_gracefully(cluster: Cluster, name: str, start) -> None:
    process = cluster.supervisor.children[name]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=EXIT_TIMEOUT_S) == 0, f"{name} did not exit cleanly"
    start(name)


def keeps_acknowledging(loop: ProduceLoop, what: str) -> None:
    done = len(loop.acked)
    wait_for(
        lambda: len(loop.acked),
        20,
        f"{ACKED_BETWEEN_RESTARTS_MIN} acknowledged sends after {what}",
        until=lambda acked: acked >= done + ACKED_BETWEEN_RESTARTS_MIN,
    )


def test_rolling_restart_of_every_process_fails_no_send(tmp_path):
    with Cluster(tmp_path / "c", broker_sets=1, replicas=3, broker_flags=FLAGS).start() as cluster:
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        wait_in_sync(cluster, 3)
        loop = ProduceLoop(cluster, "r")
        loop.start()
        try:
            keeps_acknowledging(loop, "the start")
            leader = cluster.leader_id()
            for node in [n.id for n in cluster.layout.controllers if n.id != leader] + [leader]:
                restart_gracefully(cluster, node, cluster.start_node)
                cluster.wait_ready()
                cluster.leader_id()
                keeps_acknowledging(loop, f"restarting controller {node}")
            restart_gracefully(cluster, "namesrv", lambda _name: cluster.start_namesrv())
            wait_ready(cluster.addresses, cluster.layout.namesrv)
            keeps_acknowledging(loop, "restarting the nameserver")
            master = wait_in_sync(cluster, 3)
            slaves = [b.name for b in cluster.layout.brokers if b.name != master]
            for broker in [*slaves, master]:
                restart_gracefully(cluster, broker, cluster.start_broker)
                wait_in_sync(cluster, 3)
                keeps_acknowledging(loop, f"restarting broker {broker}")
        finally:
            loop.stop()
        assert loop.unknown == [], f"{len(loop.unknown)} sends failed during the rolling restart"
        check_no_loss(loop.acked, consume_all(cluster, "g-rolling", [v.encode() for v in loop.acked]))
