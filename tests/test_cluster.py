"""Real 3-node controller clusters on loopback (separate processes, real gRPC, real files).

Properties checked:
- a write sent to a follower commits and is visible on every node (forwarding, linearizable
  reads), and those reads add no entry to the log (ReadIndex);
- kill -9 of the leader elects a new one and loses no acknowledged write; a watch on the
  restarted node, opened before it has caught up, sends nothing older than its opening
  snapshot (its backlog is not replayed as news);
- a minority cannot commit or serve a linearizable read;
- a dead master is replaced automatically, by the election policy's order;
- the watch stream delivers role changes as they commit;
- the embedded-nameserver deployment serves routes;
- gRPC health checking and reflection answer;
- every node's applied-entry log agrees entry by entry (R1) and in state digest (R2).
"""

from __future__ import annotations

import json
import re

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mqmeta import tls
from mqmeta.errors import AlreadyExists, DeadlineExceeded, MqmetaError, Unavailable
from mqmeta.formats.jsonlines import parse_line
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import namesrv_pb2 as ns_pb
from mqmeta.pb import namesrv_pb2_grpc as ns_grpc
from mqmeta.pb.controller_pb2_grpc import ControllerServiceStub
from tests.support import FAST_LIVENESS, FakeBroker, topic_names, wait_for, wait_same_digest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def create_topics(client, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        client.call("CreateTopic", pb.TopicSpec(name=name, queue_count=2))
    return names


def test_write_through_follower_is_visible_on_every_node(cluster):
    follower = cluster.followers()[0]
    with cluster.client([follower]) as client:
        client.call("CreateTopic", pb.TopicSpec(name="ViaFollower", queue_count=3))
    for node in cluster.layout.controllers:
        # Each ListTopics is a linearizable read: no node can miss the committed write.
        assert "ViaFollower" in topic_names(cluster, node.id)
    # ...and such reads (ReadIndex, on the leader or asked of it) add no log entry.
    wait_same_digest(cluster, [n.id for n in cluster.layout.controllers])
    entries = {
        n.id: len(cluster.applied_log(n.id).read_text().splitlines()) for n in cluster.layout.controllers
    }
    for node in cluster.layout.controllers:
        for _ in range(5):
            assert "ViaFollower" in topic_names(cluster, node.id)
    assert entries == {
        n.id: len(cluster.applied_log(n.id).read_text().splitlines()) for n in cluster.layout.controllers
    }


def _watch_while_catching_up(cluster, node_id: str) -> list[pb.WatchEvent]:
    """Watches `node_id` from the moment its server answers (before its Raft log has been
    applied again: the backlog is applied after the subscription), then writes a marker
    topic; returns the events after the opening snapshot up to the marker's."""
    retry_fast = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 50)]
    with tls.channel(cluster.node(node_id).grpc, options=retry_fast) as channel:
        stream = ControllerServiceStub(channel).Watch(pb.WatchRequest(), timeout=20, wait_for_ready=True)
        try:
            snapshot = next(stream)
            assert snapshot.kind == "snapshot"
            with cluster.client() as client:
                client.call("CreateTopic", pb.TopicSpec(name="marker"))
            events = []
            for event in stream:
                assert event.index > snapshot.index, f"{event.kind} {event.name} at {event.index}"
                events.append(event)
                if event.name == "marker":
                    return events
            raise AssertionError("the stream ended before the marker topic")
        finally:
            stream.cancel()


def test_kill_leader_elects_new_leader_and_keeps_acknowledged_writes(cluster):
    with cluster.client() as client:
        client.call(  # a broker set: a watch opens with its snapshot
            "RegisterBroker",
            pb.RegisterBrokerRequest(
                cluster="C1", broker_name="bs", check_code="bs-0", address="127.0.0.1:1"
            ),
        )
        acked = create_topics(client, "before", 20)
    leader = cluster.leader_id()
    cluster.kill(leader)
    new_leader = cluster.leader_id(exclude=leader)
    assert new_leader != leader
    survivors = [n.id for n in cluster.layout.controllers if n.id != leader]
    with cluster.client(survivors) as client:
        acked += create_topics(client, "after", 5)
    for node in survivors:
        assert set(acked) <= topic_names(cluster, node)
    cluster.restart(leader)  # the old leader rejoins and catches up
    events = _watch_while_catching_up(cluster, leader)
    assert [(e.kind, e.name) for e in events] == [("topic", "marker")], "the backlog was replayed"
    cluster.wait_ready()
    assert set(acked) <= topic_names(cluster, leader)
    wait_same_digest(cluster, [n.id for n in cluster.layout.controllers])


def test_minority_cannot_commit_or_read(cluster):
    leader = cluster.leader_id()
    lone = cluster.followers()[0]
    for node in cluster.layout.controllers:
        if node.id != lone:
            cluster.kill(node.id)
    with cluster.client([lone], timeout_s=3.0) as client:
        with pytest.raises((DeadlineExceeded, Unavailable)):
            client.call("CreateTopic", pb.TopicSpec(name="MinorityWrite", queue_count=1))
        with pytest.raises((DeadlineExceeded, Unavailable)):
            client.call("ListTopics", pb.ListTopicsRequest())
    cluster.start_node(leader)  # majority again
    with cluster.client([lone], timeout_s=20.0) as client:
        try:
            client.call("CreateTopic", pb.TopicSpec(name="MajorityWrite", queue_count=1))
        except AlreadyExists:
            pass  # an attempt timed out while the election finished, committed, and was retried
    assert "MajorityWrite" in topic_names(cluster, lone)


@pytest.fixture
def fast_liveness(cluster):
    with cluster.client() as client:
        client.call("UpdateConfig", pb.UpdateConfigRequest(values=FAST_LIVENESS))
    return cluster


def make_broker_set(cluster, offsets: list[int]) -> list[FakeBroker]:
    brokers = [FakeBroker(cluster.addresses, "broker-a", i + 1, max_offset=o) for i, o in enumerate(offsets)]
    for broker in brokers:
        broker.register()
        broker.start_heartbeats()
    with cluster.client() as client:
        first = client.call(
            "ElectMaster",
            pb.ElectMasterRequest(
                cluster="DefaultCluster",
                broker_name="broker-a",
                trigger=pb.ELECT_TRIGGER_BROKER,
                requester_broker_id=brokers[0].broker_id,
            ),
        )
        assert first.master_broker_id == brokers[0].broker_id  # first election: requester wins
        info = client.call(
            "AlterSyncStateSet",
            pb.AlterSyncStateSetRequest(
                cluster="DefaultCluster",
                broker_name="broker-a",
                master_broker_id=first.master_broker_id,
                master_epoch=first.master_epoch,
                sync_state_set_epoch=first.sync_state_set_epoch,
                new_sync_state_set=[b.broker_id for b in brokers],
            ),
        )
        assert sorted(info.sync_state_set) == sorted(b.broker_id for b in brokers)
    return brokers


def replica_info(cluster) -> pb.ReplicaInfo:
    with cluster.client() as client:
        return client.call(
            "GetReplicaInfo", pb.BrokerSetRef(cluster="DefaultCluster", broker_name="broker-a")
        )


def test_dead_master_is_replaced_by_the_most_advanced_in_sync_replica(fast_liveness):
    cluster = fast_liveness
    brokers = make_broker_set(cluster, offsets=[100, 50, 80])
    try:
        before = replica_info(cluster)
        assert before.master_broker_id == brokers[0].broker_id
        brokers[0].stop_heartbeats()  # the master goes silent
        info = wait_for(
            lambda: replica_info(cluster),
            6,
            "the controller to replace the silent master",
            until=lambda info: info.master_broker_id != before.master_broker_id,
        )
        assert info.master_broker_id == brokers[2].broker_id, "highest max_offset must win"
        assert info.master_epoch == before.master_epoch + 1
        assert list(info.sync_state_set) == [brokers[2].broker_id]
        alive = {r.broker_id: r.alive for r in info.replicas}
        assert alive[brokers[0].broker_id] is False and alive[brokers[2].broker_id] is True
    finally:
        for broker in brokers:
            broker.close()


def test_watch_stream_delivers_role_change(fast_liveness):
    cluster = fast_liveness
    brokers = make_broker_set(cluster, offsets=[10, 10, 10])
    follower = cluster.followers()[0]
    try:
        with cluster.client([follower]) as watcher:
            stream = watcher.watch(cluster="DefaultCluster", broker_name="broker-a", timeout_s=15)
            snapshot = next(stream)
            assert snapshot.kind == "snapshot"
            assert snapshot.replica_info.master_broker_id == brokers[0].broker_id
            with cluster.client() as admin:
                admin.call(
                    "ElectMaster",
                    pb.ElectMasterRequest(
                        cluster="DefaultCluster",
                        broker_name="broker-a",
                        trigger=pb.ELECT_TRIGGER_ADMIN,
                        preferred_broker_id=brokers[1].broker_id,
                    ),
                )
            # The stream ends (deadline 15 s) with an error; were it to end quietly, the
            # test must still fail, not skip its checks.
            role = next((event for event in stream if event.kind == "role"), None)
            stream.cancel()
            assert role is not None, "the watch stream ended without a role event"
            assert role.replica_info.master_broker_id == brokers[1].broker_id
            assert role.replica_info.master_epoch == snapshot.replica_info.master_epoch + 1
    finally:
        for broker in brokers:
            broker.close()


def test_embedded_nameserver_serves_routes(cluster_factory):
    cluster = cluster_factory(embedded=True).start()
    broker = FakeBroker(cluster.addresses, "broker-a", 1)
    try:
        broker.register()
        broker.elect_self()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Routed", queue_count=4))
        for address in cluster.layout.namesrv:
            with grpc.insecure_channel(address) as channel:
                route = ns_grpc.NameServerStub(channel).QueryRoute(
                    ns_pb.QueryRouteRequest(topic="Routed"), timeout=5
                )
                assert [q.write_queue_count for q in route.queues] == [4]
                assert route.brokers[0].master_address == broker.address
                assert route.brokers[0].master_epoch == 1
                with pytest.raises(grpc.RpcError) as missing:
                    ns_grpc.NameServerStub(channel).QueryRoute(
                        ns_pb.QueryRouteRequest(topic="NoSuchTopic"), timeout=5
                    )
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        broker.close()


def test_health_and_reflection_answer(cluster):
    address = cluster.layout.controllers[0].grpc
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="mqmeta.v1.ControllerService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        services = {s.name for r in replies for s in r.list_services_response.service}
    assert "mqmeta.v1.ControllerService" in services
    assert "grpc.health.v1.Health" in services


def test_applied_entry_logs_agree_across_nodes(cluster):
    with cluster.client() as client:
        create_topics(client, "audit", 15)
        client.call("UpdateConfig", pb.UpdateConfigRequest(values={"default_queue_count": "4"}))
    wait_same_digest(cluster, [n.id for n in cluster.layout.controllers])
    by_node = {}
    for node in cluster.layout.controllers:
        lines = cluster.applied_log(node.id).read_text().splitlines()
        records = [parse_line(line, node.id) for line in lines]  # checks every crc32
        by_node[node.id] = {r["index"]: (r["term"], r["command_digest"], r["state_digest"]) for r in records}
    reference = by_node[cluster.layout.controllers[0].id]
    assert len(reference) >= 16
    for node_id, entries in by_node.items():
        assert entries == reference, f"{node_id} disagrees with the first node"


def test_bad_requests_get_precise_statuses(cluster):
    cases = [
        ("CreateTopic", pb.TopicSpec(name="bad name!"), grpc.StatusCode.INVALID_ARGUMENT),
        ("CreateTopic", pb.TopicSpec(name="T", queue_count=-1), grpc.StatusCode.INVALID_ARGUMENT),
        (
            "GetReplicaInfo",
            pb.BrokerSetRef(cluster="DefaultCluster", broker_name="nope"),
            grpc.StatusCode.NOT_FOUND,
        ),
        ("GetTopicRoute", pb.NameRequest(name="Missing"), grpc.StatusCode.NOT_FOUND),
        (
            "UpdateConfig",
            pb.UpdateConfigRequest(values={"no_such_key": "1"}),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "AlterSyncStateSet",
            pb.AlterSyncStateSetRequest(
                cluster="DefaultCluster", broker_name="nope", master_broker_id=1, new_sync_state_set=[1]
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    leader = cluster.node(cluster.leader_id()).grpc
    with grpc.insecure_channel(leader) as channel:
        from mqmeta.pb import controller_pb2_grpc as pb_grpc

        stub = pb_grpc.ControllerServiceStub(channel)
        for method, request, status in cases:
            with pytest.raises(grpc.RpcError) as failure:
                getattr(stub, method)(request, timeout=5)
            assert failure.value.code() == status, (method, failure.value.details())
            assert failure.value.details(), "every error carries a message"


def test_follower_answers_not_leader_with_leader_address(cluster):
    leader = cluster.node(cluster.leader_id()).grpc
    follower = cluster.node(cluster.followers()[0]).grpc
    from mqmeta.pb import controller_pb2_grpc as pb_grpc

    with grpc.insecure_channel(follower) as channel:
        with pytest.raises(grpc.RpcError) as failure:
            pb_grpc.ControllerServiceStub(channel).Heartbeat(
                pb.HeartbeatRequest(cluster="DefaultCluster", broker_name="b", broker_id=1), timeout=5
            )
    trailing = dict(failure.value.trailing_metadata())
    assert trailing["mqmeta-error-code"] == "NOT_LEADER"
    assert trailing["mqmeta-leader"] == leader


def test_fenced_alter_sync_state_set_is_refused(fast_liveness):
    cluster = fast_liveness
    brokers = make_broker_set(cluster, offsets=[1, 1, 1])
    try:
        info = replica_info(cluster)
        with cluster.client() as client:
            with pytest.raises(MqmetaError) as stale:
                client.call(
                    "AlterSyncStateSet",
                    pb.AlterSyncStateSetRequest(
                        cluster="DefaultCluster",
                        broker_name="broker-a",
                        master_broker_id=info.master_broker_id,
                        master_epoch=info.master_epoch - 1,
                        sync_state_set_epoch=info.sync_state_set_epoch,
                        new_sync_state_set=[info.master_broker_id],
                    ),
                )
        assert stale.value.code == "FENCED_MASTER_EPOCH"
        assert json.dumps(list(replica_info(cluster).sync_state_set)) == json.dumps(
            list(info.sync_state_set)
        ), "a fenced call must change nothing"
    finally:
        for broker in brokers:
            broker.close()


def test_followers_never_truncate_entries_they_hold(cluster):
    """pysyncobj resends entries after every ack and followers truncate and rewrite them;
    a kill -9 in between would drop acknowledged entries. Our fix makes it not happen.

    A follower may still drop entries that really conflict: an election in the middle (a
    loaded machine delays heartbeats) leaves a deposed leader's uncommitted entries behind.
    So every drop a node logs must be of a term the committed entry at that index does not
    have; the bug would drop (and rewrite) the very entry that ends up committed."""
    from concurrent.futures import ThreadPoolExecutor

    def writer(worker: int) -> None:
        with cluster.client() as client:
            create_topics(client, f"burst{worker}-", 40)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(writer, range(8)))
    wait_same_digest(cluster, [n.id for n in cluster.layout.controllers])
    for node in cluster.layout.controllers:
        text = (cluster.root / "logs" / f"{node.id}.log").read_text()
        assert "truncating already-applied" not in text, f"{node.id} rewrote applied entries"
        records = [
            parse_line(line, node.id) for line in cluster.applied_log(node.id).read_text().splitlines()
        ]
        committed_term = {r["index"]: r["term"] for r in records}
        for index, term in re.findall(r"dropping \d+ entries from index (\d+) of term (\d+)", text):
            assert committed_term.get(int(index)) != int(term), (
                f"{node.id} truncated the entry at {index} of term {term}, which is the committed one"
            )


def test_write_batch_commits_each_write_independently(cluster):
    ops = [
        pb.WriteOp(create_topic=pb.TopicSpec(name="B1", queue_count=2)),
        pb.WriteOp(create_topic=pb.TopicSpec(name="B2", queue_count=3)),
        pb.WriteOp(create_topic=pb.TopicSpec(name="B1", queue_count=2)),  # duplicate
        pb.WriteOp(create_topic=pb.TopicSpec(name="bad name")),  # malformed
        pb.WriteOp(
            create_group=pb.GroupSpec(
                name="G1", subscriptions=[pb.Subscription(topic="B1", expression="TagA || TagB")]
            )
        ),
        pb.WriteOp(delete_topic="B2"),
        pb.WriteOp(update_config=pb.UpdateConfigRequest(values={"default_queue_count": "3"})),
    ]
    with cluster.client() as client:
        results = client.call("Write", pb.WriteBatch(writes=ops)).results
        assert [r.error_code for r in results] == ["", "", "TOPIC_EXISTS", "INVALID_ARGUMENT", "", "", ""]
        assert results[1].topic.queue_count == 3 and results[5].deleted == "B2"
        assert results[3].message, "a failed write says why"
        assert results[6].config.values["default_queue_count"] == "3"
        names = {t.name for t in client.call("ListTopics", pb.ListTopicsRequest()).topics}
        assert names == {"B1"}
        # named: only those that exist, once each (a nameserver's copy reloads what changed)
        named = client.call("ListTopics", pb.ListTopicsRequest(names=["B2", "B1", "Nope", "B1"])).topics
        assert [(t.name, t.queue_count) for t in named] == [("B1", 2)]
        for bad_names, says in ((["bad name"], "is malformed"), (["T"] * 100_001, "at most 100,000")):
            with pytest.raises(MqmetaError) as refused:
                client.call("ListTopics", pb.ListTopicsRequest(names=bad_names))
            assert refused.value.code == "INVALID_ARGUMENT" and says in str(refused.value), refused.value
        for bad in (
            pb.WriteBatch(),
            pb.WriteBatch(writes=[pb.WriteOp()] * 1025),
            pb.WriteBatch(writes=[pb.WriteOp()]),
        ):
            with pytest.raises(MqmetaError) as refused:
                client.call("Write", bad)
            assert refused.value.code == "INVALID_ARGUMENT"


def test_heartbeat_stream_answers_in_order_refuses_like_the_unary_call_and_follows_the_leader(cluster):
    """HeartbeatStream: each request answered in order with what the unary call answers; a
    refused request ends the stream with the unary call's status (NOT_FOUND, INVALID_ARGUMENT,
    NOT_LEADER naming the leader); the client keeps one stream and, when its leader is killed,
    heartbeats reach the new leader on a new stream."""
    from mqmeta.pb import controller_pb2_grpc as pb_grpc

    broker = FakeBroker(cluster.addresses, "broker-s", 1)
    try:
        broker.register()
        broker.elect_self()

        def beat(
            broker_id: int = broker.broker_id, cluster_name: str = "DefaultCluster"
        ) -> pb.HeartbeatRequest:
            return pb.HeartbeatRequest(
                cluster=cluster_name, broker_name="broker-s", broker_id=broker_id, epoch=1
            )

        leader = cluster.node(cluster.leader_id()).grpc
        follower = cluster.node(cluster.followers()[0]).grpc
        with grpc.insecure_channel(leader) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            unary = stub.Heartbeat(beat(), timeout=5)
            assert unary.master_broker_id == broker.broker_id and unary.lease_ms > 0
            assert list(stub.HeartbeatStream(iter([beat()] * 3), timeout=5)) == [unary] * 3
            for requests, status in [
                ([beat(), beat(broker_id=99)], grpc.StatusCode.NOT_FOUND),
                ([beat(cluster_name="bad name!")], grpc.StatusCode.INVALID_ARGUMENT),
            ]:
                answered = []
                with pytest.raises(grpc.RpcError) as refused:
                    answered.extend(stub.HeartbeatStream(iter(requests), timeout=5))
                assert refused.value.code() == status, refused.value.details()
                assert refused.value.details(), "every error carries a message"
                assert answered == [unary] * (len(requests) - 1), "the requests before it are answered"
        with grpc.insecure_channel(follower) as channel:
            with pytest.raises(grpc.RpcError) as not_leader:
                list(pb_grpc.ControllerServiceStub(channel).HeartbeatStream(iter([beat()]), timeout=5))
        trailing = dict(not_leader.value.trailing_metadata())
        assert (trailing["mqmeta-error-code"], trailing["mqmeta-leader"]) == ("NOT_LEADER", leader)

        with cluster.client() as client:
            replies = [client.heartbeat(beat()) for _ in range(5)]
            call = client._heartbeat_call
            assert call is not None and not call.closed and call.target == leader, "one open stream"
            assert replies == [unary] * 5
            old = cluster.leader_id()
            cluster.kill(old)
            new_leader = cluster.node(cluster.leader_id(exclude=old)).grpc

            def beats_reach_the_new_leader() -> bool:
                try:
                    client.heartbeat(beat())
                except MqmetaError:
                    return False  # the old stream broke; the election may still run
                current = client._heartbeat_call
                return current is not None and not current.closed and current.target == new_leader

            wait_for(beats_reach_the_new_leader, 20, "heartbeats on a stream to the new leader")
            assert call.closed, "the stream to the killed leader was closed"
    finally:
        broker.close()
