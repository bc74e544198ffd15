"""The unchanged official RocketMQ 5 Python client against real mqmeta processes (one
controller, a nameserver, a broker set of two replicas, shared by this module).

Properties checked:
- Producer: sync and async sends keep tag, keys and user properties; a SimpleConsumer
  with a tag filter receives exactly the matching messages, with delivery_attempt 1;
- an unacknowledged message comes back after its invisible time with delivery_attempt 2;
  ChangeInvisibleDuration returns a new handle that acknowledges it, and the old handle
  is refused with INVALID_RECEIPT_HANDLE;
- FIFO: at most one message per message group is in flight, and each group's messages
  arrive in the order they were sent;
- a delay message (delivery time in ms, as the 5.1.2 client writes it) is invisible until
  its time;
- transactions: a committed half message is delivered, a rolled-back one never is, and
  one left open is resolved by the producer's checker through the Telemetry stream;
- PushConsumer: queues are shared among the live members of a group (a second member
  joining takes some, and its leaving gives them back); a message its listener keeps
  failing is retried with the group's backoff and then moved to %DLQ%{group};
- sends that reach the master at once are written together (fewer commit-log writes than
  messages, each message counted);
- the master's metrics count the client's sends (messages and bytes in, send latency) and
  deliveries (messages and bytes out);
- Telemetry answers each Settings with OK and the merged settings on an open stream;
  Heartbeat and NotifyClientTermination are answered;
- error classes map to apache.rocketmq.v2 codes the official client retries (not master,
  lease, handoff, no controller leader -> HA_NOT_AVAILABLE) or reports as bad input, never
  INTERNAL_SERVER_ERROR; a send to a slave answers HA_NOT_AVAILABLE saying why;
- a SendMessage of several messages answers each in order (a bad one refused alone);
- bad input (unknown topic, oversize body, illegal delivery time, bad filter, bad receipt
  handle) gets its apache.rocketmq.v2 code and a message, never an internal error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.errors import AlreadyExists
from mqmeta.pb import controller_pb2 as cpb
from tests.support import wait_for
from tests.support.prometheus import delta, scrape
from tests.support.rmq_client import client, main_thread_on_client_loop

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

rmq = client()
from rocketmq.grpc_protocol import definition_pb2 as rdef  # noqa: E402  (after client(): its HOME)
from rocketmq.grpc_protocol import service_pb2 as rsvc  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as rsvc_grpc  # noqa: E402

TOPICS = {"Plain": "NORMAL", "Ordered": "FIFO", "Later": "DELAY", "Deals": "TRANSACTION", "Pushed": "NORMAL"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("rmq"), count=1, broker_sets=1, replicas=2)
    c.start()
    try:
        c.master_of("broker-a")
        with c.client() as admin:
            for name, kind in TOPICS.items():
                _create(admin, "CreateTopic", cpb.TopicSpec(name=name, queue_count=2, message_type=kind))
            _create(
                admin,
                "CreateGroup",
                cpb.GroupSpec(
                    name="failing", retry_max_times=2, retry_policy="FIXED", consume_from="FIRST_OFFSET"
                ),
            )
        yield c
    finally:
        c.stop()


def _create(admin, method: str, spec) -> None:
    try:
        admin.call(method, spec)
    except AlreadyExists:
        pass  # a retried call that had already gone through


def config(cluster: Cluster):
    return rmq.ClientConfiguration(cluster.namesrv, rmq.Credentials(), request_timeout=3)


def message(topic: str, body: str, tag: str = "", keys: tuple[str, ...] = (), **props: str):
    m = rmq.Message()
    m.topic = topic
    m.body = body.encode()
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys[0]  # the 5.1.2 setter takes one key at a time
        for key in keys[1:]:
            m.keys = key
    for key, value in props.items():
        m.add_property(key, value)
    return m


def started(kind, *args, **kwargs):
    c = kind(*args, **kwargs)
    c.startup()
    # The 5.1.2 client creates a later client's Telemetry stream on the calling thread, which
    # has no event loop once another module in this xdist worker ran asyncio.run() (CI,
    # 2026-12-04: the second push consumer "failed to receive initial settings"): the
    # client's own I/O loop becomes the main thread's (tests/support/rmq_client.py).
    main_thread_on_client_loop()
    return c


def receive_all(
    consumer, want: int, timeout_s: float = 20.0, invisible_s: int = 20, ack: bool = True
) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in consumer.receive(32, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def group() -> str:
    return f"g{uuid.uuid4().hex[:8]}"


def test_send_sync_async_and_receive_with_tag_filter(cluster):
    producer = started(rmq.Producer, config(cluster), ("Plain",))
    consumer = started(
        rmq.SimpleConsumer, config(cluster), group(), {"Plain": rmq.FilterExpression("A || C")}, 1
    )
    try:
        sent = []
        for i in range(6):
            m = message("Plain", f"sync-{i}", tag="ABC"[i % 3], keys=(f"k{i}", f"x{i}"), n=str(i))
            sent.append((producer.send(m).message_id, f"sync-{i}"))
        futures = [producer.send_async(message("Plain", f"async-{i}", tag="A", n=str(i))) for i in range(3)]
        sent += [(f.result(timeout=10).message_id, f"async-{i}") for i, f in enumerate(futures)]
        wanted = {mid: body for mid, body in sent if not body.startswith("sync") or int(body[-1]) % 3 != 1}
        got = receive_all(consumer, len(wanted))
        assert {m.message_id: m.body.decode() for m in got} == wanted
        for m in got:
            assert m.tag in ("A", "C") and m.delivery_attempt == 1 and not m.corrupted
            assert m.properties["n"] == m.body.decode().split("-")[1]
            if m.body.startswith(b"sync"):
                i = m.body.decode()[-1]
                assert m.keys == {f"k{i}", f"x{i}"}
        assert consumer.receive(32, 20) == []  # every match acknowledged, B filtered out
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_rocketmq_traffic_counts_in_the_brokers_metrics(cluster):
    """The master's messages/bytes in and send latency count each acknowledged SendMessage, as
    they count the native Send; messages/bytes out count each message ReceiveMessage delivers."""
    master = cluster.broker(cluster.master_of("broker-a"))
    tag = f"m{uuid.uuid4().hex[:6]}"
    producer = started(rmq.Producer, config(cluster), ("Plain",))
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Plain": rmq.FilterExpression(tag)}, 1)
    bodies = [f"metrics-{'x' * i}" for i in range(5)]
    try:
        before = scrape(master.metrics)
        for body in bodies:
            producer.send(message("Plain", body, tag=tag))
        sent = scrape(master.metrics)
        got = receive_all(consumer, len(bodies))
        after = scrape(master.metrics)
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert sorted(m.body.decode() for m in got) == sorted(bodies)
    size = sum(len(b) for b in bodies)
    assert delta(sent, before, "mqmeta_broker_messages_in_total") == len(bodies)
    assert delta(sent, before, "mqmeta_broker_bytes_in_total") == size
    assert delta(sent, before, "mqmeta_broker_send_seconds_count") == len(bodies)
    assert delta(after, sent, "mqmeta_broker_messages_out_total") == len(bodies)
    assert delta(after, sent, "mqmeta_broker_bytes_out_total") == size


def test_sends_reaching_the_master_at_once_are_written_together(cluster):
    """SendMessage calls that reach the master at once share one commit-log write
    (rmq_writes.py): 8 threads of a client given the master's own address (direct routes)
    send 64 messages; the master counts every message and fewer writes than messages."""
    master = cluster.broker(cluster.master_of("broker-a"))
    direct = rmq.ClientConfiguration(master.grpc, rmq.Credentials(), request_timeout=3)
    producer = started(rmq.Producer, direct, ("Plain",))
    try:
        producer.send(message("Plain", "warm-up"))  # routes and channel first
        before = scrape(master.metrics)
        with ThreadPoolExecutor(8) as pool:
            ids = list(
                pool.map(lambda i: producer.send(message("Plain", f"together-{i}")).message_id, range(64))
            )
        after = scrape(master.metrics)
    finally:
        producer.shutdown()
    assert len(set(ids)) == 64
    assert delta(after, before, "mqmeta_broker_messages_in_total") == 64
    writes = delta(after, before, "mqmeta_broker_rocketmq_send_writes_total")
    assert 1 <= writes < 64, f"{writes:.0f} writes for 64 concurrent sends"


def test_a_simple_consumer_gets_a_waiting_message_whichever_queue_it_names(cluster):
    """RocketMQ's proxy pops from every queue of the broker: a SimpleConsumer's receive that
    names a drained queue gets the message waiting in another one, at once. (Without it,
    about 3 receives in 4 here name an empty queue and come back empty after the poll.)"""
    with cluster.client() as admin:
        _create(admin, "CreateTopic", cpb.TopicSpec(name="Wide", queue_count=4))
    producer = started(rmq.Producer, config(cluster), ("Wide",))
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Wide": rmq.FilterExpression()}, 1)
    try:
        for i in range(8):
            producer.send(message("Wide", f"w-{i}"))
            got = consumer.receive(32, 20)
            assert [m.body for m in got] == [f"w-{i}".encode()], f"receive {i} got {got}"
            consumer.ack(got[0])
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_invisible_time_redelivery_and_change_invisible_duration(cluster):
    producer = started(rmq.Producer, config(cluster), ("Plain",))
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Plain": rmq.FilterExpression("R")}, 1)
    try:
        producer.send(message("Plain", "redeliver-me", tag="R"))
        (first,) = receive_all(consumer, 1, invisible_s=2, ack=False)
        assert first.delivery_attempt == 1
        assert consumer.receive(32, 2) == []  # invisible for 2 s
        (again,) = wait_for(lambda: consumer.receive(32, 30), 15, "the redelivery")
        assert again.message_id == first.message_id and again.delivery_attempt == 2
        old_handle = again.receipt_handle
        consumer.change_invisible_duration(again, 30)
        assert again.receipt_handle and again.receipt_handle != old_handle
        stale = rmq.Message()
        stale.topic, stale.message_id, stale.receipt_handle = "Plain", again.message_id, old_handle
        stale.endpoints = again.endpoints
        from rocketmq.v5.exception import BadRequestException

        with pytest.raises(BadRequestException) as refused:
            consumer.ack(stale)
        assert refused.value.code == rdef.INVALID_RECEIPT_HANDLE
        consumer.ack(again)  # the new handle works
        assert consumer.receive(32, 2) == []
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_fifo_one_in_flight_per_group_in_order(cluster):
    producer = started(rmq.Producer, config(cluster), ("Ordered",))
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Ordered": rmq.FilterExpression()}, 1)
    try:
        for i in range(4):
            for g in ("red", "green", "blue"):
                m = message("Ordered", f"{g}-{i}")
                m.message_group = g
                producer.send(m)
        seen: dict[str, list[int]] = {"red": [], "green": [], "blue": []}
        deadline = time.monotonic() + 30
        while sum(map(len, seen.values())) < 12 and time.monotonic() < deadline:
            batch = []
            for _ in range(2):  # both queues
                batch += consumer.receive(32, 20)
            groups = [m.message_group for m in batch]
            assert len(groups) == len(set(groups)), f"two messages of one group in flight: {groups}"
            for m in batch:
                seen[m.message_group].append(int(m.body.decode().split("-")[1]))
                consumer.ack(m)
        assert seen == {g: [0, 1, 2, 3] for g in seen}
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_delay_message_waits_for_its_delivery_time(cluster):
    producer = started(rmq.Producer, config(cluster), ("Later",))
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Later": rmq.FilterExpression()}, 1)
    try:
        due_ms = int(time.time() * 1000) + 3000
        m = message("Later", "later")
        m.delivery_timestamp = due_ms  # milliseconds, as Message.delivery_timestamp documents
        producer.send(m)
        assert receive_all(consumer, 1, timeout_s=1.5) == []
        (got,) = receive_all(consumer, 1, timeout_s=15)
        arrived_ms = time.time() * 1000
        assert got.body == b"later" and arrived_ms >= due_ms - 100
        assert abs(got.delivery_timestamp - due_ms) < 1000
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_transactions_commit_rollback_and_orphan_check(cluster):
    checked: list[str] = []

    class Checker(rmq.TransactionChecker):
        def check(self, message):
            checked.append(message.body.decode())
            return rmq.TransactionResolution.COMMIT

    producer = started(rmq.Producer, config(cluster), ("Deals",), checker=Checker())
    consumer = started(rmq.SimpleConsumer, config(cluster), group(), {"Deals": rmq.FilterExpression()}, 1)
    try:
        for body, end in (("commit", "commit"), ("rollback", "rollback"), ("orphan", None)):
            transaction = producer.begin_transaction()
            producer.send(message("Deals", body), transaction)
            if end == "commit":
                transaction.commit()
            elif end == "rollback":
                transaction.rollback()
        (first,) = receive_all(consumer, 1, timeout_s=10)
        assert first.body == b"commit"
        (second,) = receive_all(consumer, 1, timeout_s=30)  # the orphan, after the check
        assert second.body == b"orphan" and checked == ["orphan"]
        assert receive_all(consumer, 1, timeout_s=2) == []  # the rollback never shows
    finally:
        consumer.shutdown()
        producer.shutdown()


def _topic_exists(cluster: Cluster, name: str) -> bool:
    with cluster.client() as admin:
        return any(t.name == name for t in admin.call("ListTopics", cpb.ListTopicsRequest()).topics)


class Listener:
    def __init__(self, name: str, received: list, fail_tag: str = "bad") -> None:
        self.name, self.received, self.fail_tag = name, received, fail_tag

    def consume(self, message):
        self.received.append((self.name, message))
        if message.tag == self.fail_tag:
            return rmq.ConsumeResult.FAILURE
        return rmq.ConsumeResult.SUCCESS


def test_push_consumer_members_retry_and_dead_letter_queue(cluster):
    received: list = []
    sub = {"Pushed": rmq.FilterExpression()}
    first = started(rmq.PushConsumer, config(cluster), "failing", Listener("first", received), sub)
    producer = started(rmq.Producer, config(cluster), ("Pushed",))
    second = None
    try:
        producer.send(message("Pushed", "poison", tag="bad"))
        wait_for(
            lambda: sum(m.body == b"poison" for _, m in received) >= 3, 30, "three deliveries of the poison"
        )
        attempts = [m.delivery_attempt for _, m in received if m.body == b"poison"]
        assert attempts[:3] == [1, 2, 3]  # retry_max_times 2: three deliveries, then the DLQ
        wait_for(lambda: _topic_exists(cluster, "%DLQ%failing"), 15, "the dead-letter topic")
        dead = started(
            rmq.SimpleConsumer, config(cluster), group(), {"%DLQ%failing": rmq.FilterExpression()}, 1
        )
        try:
            (moved,) = receive_all(dead, 1, timeout_s=15)
            assert moved.body == b"poison"
        finally:
            dead.shutdown()
        # A second member joins: after rebalancing each member gets part of the queues.
        second = started(rmq.PushConsumer, config(cluster), "failing", Listener("second", received), sub)

        def both_consume() -> bool:
            producer.send(message("Pushed", "spread", tag="ok"))
            return {name for name, m in received[-20:] if m.body == b"spread"} == {"first", "second"}

        wait_for(both_consume, 30, "both members receiving", interval_s=0.2)
        second.shutdown()  # leaves: NotifyClientTermination
        second = None
        count = len(received)
        for i in range(8):
            producer.send(message("Pushed", f"after-{i}", tag="ok"))
        wait_for(lambda: sum(m.body.startswith(b"after") for _, m in received[count:]) >= 8, 30, "the rest")
        assert {name for name, m in received[count:] if m.body.startswith(b"after")} == {"first"}
    finally:
        for c in (second, first, producer):
            if c is not None:
                c.shutdown()


# The raw protocol, with the official client's own stubs ------------------------------------
def _metadata():
    return [("x-mq-client-id", f"test-{uuid.uuid4().hex[:6]}")]


def _broker_stub(cluster: Cluster):
    master = cluster.master_of("broker-a")
    return rsvc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.broker(master).grpc))


def _send(stub, topic: str, body: bytes, **system) -> rdef.Status:
    m = rdef.Message(topic=rdef.Resource(name=topic), body=body)
    m.system_properties.message_id = uuid.uuid4().hex
    m.system_properties.message_type = system.pop("message_type", rdef.NORMAL)
    for name, value in system.items():
        getattr(m.system_properties, name).CopyFrom(value)
    return stub.SendMessage(rsvc.SendMessageRequest(messages=[m]), metadata=_metadata(), timeout=10).status


def test_a_send_of_several_messages_answers_each(cluster):
    """A SendMessage of several messages (the proxy merges concurrent sends into one):
    each message is checked and answered on its own, in order; the good ones are stored."""
    stub = _broker_stub(cluster)

    def message(body: bytes) -> rdef.Message:
        m = rdef.Message(topic=rdef.Resource(name="Plain"), body=body)
        m.system_properties.message_id = uuid.uuid4().hex
        m.system_properties.message_type = rdef.NORMAL
        return m

    sent = [message(b"one"), message(b""), message(b"three")]
    answer = stub.SendMessage(rsvc.SendMessageRequest(messages=sent), metadata=_metadata(), timeout=10)
    assert answer.status.code == rdef.MULTIPLE_RESULTS
    assert [e.status.code for e in answer.entries] == [rdef.OK, rdef.MESSAGE_BODY_EMPTY, rdef.OK]
    assert [e.message_id for e in answer.entries] == [m.system_properties.message_id for m in sent]
    good = [message(b"a"), message(b"b")]
    answer = stub.SendMessage(rsvc.SendMessageRequest(messages=good), metadata=_metadata(), timeout=10)
    assert answer.status.code == rdef.OK and [e.status.code for e in answer.entries] == [rdef.OK] * 2
    too_many = [message(b"x") for _ in range(257)]
    answer = stub.SendMessage(rsvc.SendMessageRequest(messages=too_many), metadata=_metadata(), timeout=10)
    assert answer.status.code == rdef.BAD_REQUEST and not answer.entries


def test_bad_input_gets_its_code_never_internal(cluster):
    stub = _broker_stub(cluster)
    namesrv = rsvc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.namesrv))
    from google.protobuf.timestamp_pb2 import Timestamp

    route = namesrv.QueryRoute(rsvc.QueryRouteRequest(topic=rdef.Resource(name="Nowhere")), timeout=10)
    assert route.status.code == rdef.TOPIC_NOT_FOUND and "Nowhere" in route.status.message
    assert _send(stub, "Nowhere", b"x").code == rdef.TOPIC_NOT_FOUND
    assert _send(stub, "Plain", b"x" * (4 * 1024 * 1024 + 1)).code == rdef.MESSAGE_BODY_TOO_LARGE
    assert _send(stub, "Plain", b"").code == rdef.MESSAGE_BODY_EMPTY
    far = Timestamp(seconds=int(time.time()) + 30 * 24 * 3600)
    assert (
        _send(stub, "Later", b"x", message_type=rdef.DELAY, delivery_timestamp=far).code
        == rdef.ILLEGAL_DELIVERY_TIME
    )
    relative = Timestamp(seconds=5000)  # a delay given as a timestamp
    assert _send(stub, "Later", b"x", message_type=rdef.DELAY, delivery_timestamp=relative).code == (
        rdef.ILLEGAL_DELIVERY_TIME
    )
    assert (
        _send(stub, "Later", b"x").code == rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    )  # NORMAL to a DELAY topic
    queue = next(q for q in route_of(namesrv, "Plain") if q.id == 0)
    for expression, code in (("A || || B", rdef.ILLEGAL_FILTER_EXPRESSION),):
        request = rsvc.ReceiveMessageRequest(
            group=rdef.Resource(name="g"),
            message_queue=queue,
            filter_expression=rdef.FilterExpression(type=rdef.TAG, expression=expression),
            batch_size=1,
        )
        (answer,) = list(stub.ReceiveMessage(request, metadata=_metadata(), timeout=10))
        assert answer.status.code == code
    for handle in ("garbage", "v1.broker-a.1.abc.Plain.0.0.1.00000000"):
        ack = stub.AckMessage(
            rsvc.AckMessageRequest(
                group=rdef.Resource(name="g"),
                topic=rdef.Resource(name="Plain"),
                entries=[rsvc.AckMessageEntry(message_id="m", receipt_handle=handle)],
            ),
            metadata=_metadata(),
            timeout=10,
        )
        assert ack.status.code == rdef.INVALID_RECEIPT_HANDLE, ack.status
    no_id = stub.Heartbeat(rsvc.HeartbeatRequest(client_type=rdef.PRODUCER), timeout=10)
    assert no_id.status.code == rdef.CLIENT_ID_REQUIRED


def route_of(stub, topic: str):
    answer = stub.QueryRoute(rsvc.QueryRouteRequest(topic=rdef.Resource(name=topic)), timeout=10)
    assert answer.status.code == rdef.OK
    return list(answer.message_queues)


# Error classes: (our error, its domain code or "") -> the apache.rocketmq.v2 Code expected.
RETRYABLE = {
    ("NotMaster", ""): "HA_NOT_AVAILABLE",  # a slave, a lapsed lease, a handoff under way
    ("FencedEpoch", ""): "HA_NOT_AVAILABLE",
    ("NotLeader", ""): "HA_NOT_AVAILABLE",
    ("Unavailable", ""): "HA_NOT_AVAILABLE",
    ("FailedPrecondition", "IN_SYNC_REPLICAS_NOT_ENOUGH"): "HA_NOT_AVAILABLE",
    ("DeadlineExceeded", ""): "PROXY_TIMEOUT",
    ("FailedPrecondition", "FLUSH_SLAVE_TIMEOUT"): "SLAVE_PERSISTENCE_TIMEOUT",
}
CLIENT_ERRORS = {
    ("InvalidArgument", ""): "BAD_REQUEST",
    ("AlreadyExists", ""): "BAD_REQUEST",
    ("FailedPrecondition", ""): "BAD_REQUEST",
    ("NotFound", ""): "NOT_FOUND",
    ("NotFound", "TOPIC_NOT_FOUND"): "TOPIC_NOT_FOUND",
}
_TABLE_SCRIPT = """
import json, sys
from mqmeta import errors
from mqmeta.rocketmq import code_of_error
cases = json.loads(sys.argv[1])
print(json.dumps([code_of_error(getattr(errors, name)("x", code=code or None)) for name, code in cases]))
"""


def _server_codes(cases: list[tuple[str, str]]) -> list[int]:
    """mqmeta.rocketmq's table, asked in a process of its own (this one holds the client's stubs)."""
    answer = subprocess.run(
        [sys.executable, "-c", _TABLE_SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def test_error_classes_map_to_codes_the_client_retries_or_reports_as_bad_input():
    """Each condition that passes (new master, lease, controller leader) gets a code the
    official client raises as a retryable exception (the producer stops retrying only on
    TooManyRequestsException); bad input gets a client-error code; none is INTERNAL."""
    from rocketmq.v5.exception import InternalErrorException, ProxyTimeoutException, TooManyRequestsException
    from rocketmq.v5.util.messaging_result_checker import MessagingResultChecker

    table = {**RETRYABLE, **CLIENT_ERRORS}
    codes = dict(zip(table, _server_codes(list(table)), strict=True))
    assert {case: rdef.Code.Name(code) for case, code in codes.items()} == table
    for case in RETRYABLE:
        with pytest.raises((InternalErrorException, ProxyTimeoutException)) as raised:
            MessagingResultChecker.check(rdef.Status(code=codes[case], message="m"))
        assert not isinstance(raised.value, TooManyRequestsException), case


def test_a_send_to_a_slave_answers_ha_not_available_saying_why(cluster):
    master = cluster.master_of("broker-a")
    slave = next(b for b in cluster.layout.brokers if b.name != master)
    stub = rsvc_grpc.MessagingServiceStub(grpc.insecure_channel(slave.grpc))
    answer = _send(stub, "Plain", b"to a slave")
    assert rdef.Code.Name(answer.code) == "HA_NOT_AVAILABLE"
    assert "not the master" in answer.message and "broker-a" in answer.message


def test_telemetry_answers_every_settings_and_stays_open(cluster):
    stub = _broker_stub(cluster)
    settings = rdef.Settings(
        client_type=rdef.SIMPLE_CONSUMER,
        subscription=rdef.Subscription(
            group=rdef.Resource(name="telemetry"),
            subscriptions=[rdef.SubscriptionEntry(topic=rdef.Resource(name="Ordered"))],
        ),
    )
    outbound: list = []
    more = threading.Event()

    def commands():
        yield rsvc.TelemetryCommand(settings=settings)
        more.wait(10)
        yield rsvc.TelemetryCommand(settings=settings)
        # the sleep is the property: the server must keep the stream open through this
        # interval after its answers (a wait on a condition would end at a close)
        time.sleep(1.5)

    answers = []
    for answer in stub.Telemetry(commands(), metadata=_metadata(), timeout=20):
        answers.append(answer)
        more.set()
        outbound.append(time.monotonic())
    assert len(answers) == 2
    for answer in answers:
        assert answer.status.code == rdef.OK
        assert answer.settings.subscription.fifo  # Ordered is a FIFO topic
        assert answer.settings.backoff_policy.max_attempts == 17
    meta = _metadata()
    assert stub.Heartbeat(
        rsvc.HeartbeatRequest(client_type=rdef.PRODUCER), metadata=meta, timeout=10
    ).status.code == (rdef.OK)
    done = stub.NotifyClientTermination(rsvc.NotifyClientTerminationRequest(), metadata=meta, timeout=10)
    assert done.status.code == rdef.OK
