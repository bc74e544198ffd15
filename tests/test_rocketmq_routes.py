"""RocketMQ 5 routes over two broker sets: direct routes, and an acknowledgement batch
that spans both sets through the proxy.

One cluster for the module: one controller, two broker sets of one replica each, the
nameserver as the proxy (`--rocketmq-routes proxy`, the default) and a second nameserver
with `--rocketmq-routes direct`.

Properties checked:
- direct routes: QueryRoute names each broker set's master as its queues' endpoints (not a
  nameserver), and the unchanged official client sends there, receives and acknowledges;
- through the proxy, one AckMessage whose entries name both sets: each set's entries reach
  that set's master (only the master that leased a message accepts its handle), every good
  entry is acknowledged (none is delivered again after its invisible time), a stale handle
  in the batch gets the INVALID_RECEIPT_HANDLE a single ack of it gets (and its message
  comes back), and the answer's entries follow the request's order.
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.layout import namesrv_command
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.ready import wait_ready

from mqmeta.errors import AlreadyExists
from mqmeta.pb import controller_pb2 as cpb
from tests.support import wait_for
from tests.support.rmq_client import client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

rmq = client()
from google.protobuf.duration_pb2 import Duration  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as rdef  # noqa: E402  (after client(): its HOME)
from rocketmq.grpc_protocol import service_pb2 as rsvc  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as rsvc_grpc  # noqa: E402

SETS = ("broker-a", "broker-b")
TOPIC = "Spread"  # one queue per broker set, for the ack batch
DIRECT_TOPIC = "Straight"  # the same, for the direct routes' test
INVISIBLE_S = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("rmqroutes"), count=1, broker_sets=2, replicas=1)
    reserved = PortReservation.pick(1)
    c.direct = reserved.addresses[0]
    c.start()
    try:
        reserved.release()  # the direct nameserver binds it now
        command = namesrv_command(c.layout) + ["--rocketmq-routes", "direct"]
        command[command.index("--listen") + 1] = c.direct
        for flag in ("--metrics-listen", "--remoting-listen", "--remoting-proxy", "--console-listen"):
            if flag in command:
                del command[command.index(flag) : command.index(flag) + 2]
        c.supervisor.start("namesrv-direct", command, c.process_env("namesrv-direct"))
        wait_ready(c.addresses, [c.direct])
        for name in SETS:
            c.master_of(name)
        with c.client() as admin:
            for topic in (TOPIC, DIRECT_TOPIC):
                try:
                    admin.call("CreateTopic", cpb.TopicSpec(name=topic, queue_count=1))
                except AlreadyExists:
                    pass
        yield c
    finally:
        c.stop()


def masters(cluster: Cluster) -> dict[str, str]:
    """Broker set -> its master's gRPC address."""
    return {name: cluster.broker(cluster.master_of(name)).grpc for name in SETS}


def metadata() -> list[tuple[str, str]]:
    return [("x-mq-client-id", f"routes-{uuid.uuid4().hex[:6]}")]


def test_direct_routes_name_the_masters_and_the_official_client_uses_them(cluster):
    addresses = masters(cluster)
    with grpc.insecure_channel(cluster.direct) as channel:
        answer = rsvc_grpc.MessagingServiceStub(channel).QueryRoute(
            rsvc.QueryRouteRequest(topic=rdef.Resource(name=DIRECT_TOPIC)), metadata=metadata(), timeout=5
        )
    assert answer.status.code == rdef.OK
    named = {
        q.broker.name: [f"{a.host}:{a.port}" for a in q.broker.endpoints.addresses]
        for q in answer.message_queues
    }
    assert named == {name: [address] for name, address in addresses.items()}

    config = rmq.ClientConfiguration(cluster.direct, rmq.Credentials(), request_timeout=3)
    producer = rmq.Producer(config, (DIRECT_TOPIC,))
    consumer = rmq.SimpleConsumer(
        config, f"g{uuid.uuid4().hex[:6]}", {DIRECT_TOPIC: rmq.FilterExpression()}, 1
    )
    started = []
    try:
        for c in (producer, consumer):
            c.startup()
            started.append(c)
        sent = {}
        for i in range(4):  # round-robin over the two sets' queues
            m = rmq.Message()
            m.topic, m.body = DIRECT_TOPIC, f"direct-{i}".encode()
            receipt = producer.send(m)
            sent[m.body] = str(receipt.message_queue.endpoints)
        assert set(sent.values()) <= set(addresses.values()) and len(set(sent.values())) == 2, sent

        received: dict[bytes, str] = {}

        def take() -> bool:
            for m in consumer.receive(16, 10):
                consumer.ack(m)
                received[m.body] = str(m.endpoints)
            return set(sent) <= set(received)

        wait_for(take, 30, "every message sent through direct routes received and acknowledged")
        assert set(received.values()) <= set(addresses.values()), received
    finally:
        for c in started:
            c.shutdown()


def test_an_ack_batch_across_two_broker_sets(cluster):
    group = rdef.Resource(name=f"g{uuid.uuid4().hex[:6]}")
    topic = rdef.Resource(name=TOPIC)
    for name, address in masters(cluster).items():  # two messages in each set, sent to its master
        with grpc.insecure_channel(address) as channel:
            stub = rsvc_grpc.MessagingServiceStub(channel)
            for i in range(2):
                _send(stub, f"{name}-{i}".encode())

    with grpc.insecure_channel(cluster.namesrv) as channel:  # the proxy from here on
        proxy = rsvc_grpc.MessagingServiceStub(channel)
        (a1, a2), (b1, b2) = (_take(proxy, group, name, 2) for name in SETS)
        renewed = proxy.ChangeInvisibleDuration(
            rsvc.ChangeInvisibleDurationRequest(
                group=group,
                topic=topic,
                receipt_handle=b2.system_properties.receipt_handle,
                invisible_duration=Duration(seconds=INVISIBLE_S),
                message_id=b2.system_properties.message_id,
            ),
            metadata=metadata(),
            timeout=5,
        )
        assert renewed.status.code == rdef.OK  # b2's first handle is stale from now on

        batch = [a1, b1, b2, a2]  # the sets interleaved, the stale handle among them
        answer = proxy.AckMessage(_ack_request(group, batch), metadata=metadata(), timeout=5)
        assert [e.receipt_handle for e in answer.entries] == [
            m.system_properties.receipt_handle for m in batch
        ]
        codes = [e.status.code for e in answer.entries]
        assert codes == [rdef.OK, rdef.OK, rdef.INVALID_RECEIPT_HANDLE, rdef.OK], answer
        assert answer.status.code == rdef.MULTIPLE_RESULTS
        single = proxy.AckMessage(_ack_request(group, [b2]), metadata=metadata(), timeout=5)
        assert single.status.code == answer.entries[2].status.code == rdef.INVALID_RECEIPT_HANDLE
        assert single.entries[0].status.message == answer.entries[2].status.message

        # b2 (its ack refused) comes back after its invisible time; the acknowledged never do.
        # (b1's lease ended before b2's renewed one, a1's and a2's before b1's: had their acks
        # been lost, they would be here first.)
        (again,) = wait_for(lambda: _receive(proxy, group, "broker-b", 2), 15, "b2 delivered again")
        assert again.body == b2.body and again.system_properties.delivery_attempt == 2
        assert _receive(proxy, group, "broker-a", 2) == []


def _send(stub, body: bytes) -> None:
    message = rdef.Message(
        topic=rdef.Resource(name=TOPIC),
        body=body,
        system_properties=rdef.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), message_type=rdef.NORMAL, body_encoding=rdef.IDENTITY
        ),
    )
    answer = stub.SendMessage(rsvc.SendMessageRequest(messages=[message]), metadata=metadata(), timeout=5)
    assert answer.status.code == rdef.OK, answer


def _take(proxy, group, broker_name: str, count: int) -> list:
    got: list = []

    def more() -> bool:
        got.extend(_receive(proxy, group, broker_name, count - len(got)))
        return len(got) >= count

    wait_for(more, 15, f"{count} messages of {broker_name}")
    return got


def _receive(proxy, group, broker_name: str, count: int, poll_s: int = 0) -> list:
    """Up to `count` messages of `broker_name`'s queue of TOPIC, leased for INVISIBLE_S."""
    request = rsvc.ReceiveMessageRequest(
        group=group,
        message_queue=rdef.MessageQueue(
            topic=rdef.Resource(name=TOPIC), id=0, broker=rdef.Broker(name=broker_name)
        ),
        filter_expression=rdef.FilterExpression(type=rdef.TAG, expression="*"),
        batch_size=count,
        invisible_duration=Duration(seconds=INVISIBLE_S),
        long_polling_timeout=Duration(seconds=poll_s),
    )
    answers = list(proxy.ReceiveMessage(request, metadata=metadata(), timeout=poll_s + 5))
    assert answers[0].status.code in (rdef.OK, rdef.MESSAGE_NOT_FOUND), answers[0]
    return [a.message for a in answers if a.HasField("message")]


def _ack_request(group, messages: list) -> rsvc.AckMessageRequest:
    return rsvc.AckMessageRequest(
        group=group,
        topic=rdef.Resource(name=TOPIC),
        entries=[
            rsvc.AckMessageEntry(
                message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle
            )
            for m in messages
        ],
    )
