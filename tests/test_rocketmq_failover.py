"""kill -9 of the master while the unchanged official RocketMQ 5 client produces and consumes.

Properties checked (a broker set of two replicas, acks from the whole SyncStateSet):
- every message whose send the client saw succeed is received after the failover;
- a stored message whose acknowledgement succeeded is never delivered again (acks are
  records of the commit log, replicated before the ack is answered). A stored message is
  one queue position, not one body: a send in flight when the master dies may have been
  written and replicated without an answer, and is sent again to the new master by the
  proxy (or by the client after its timeout), so one send can be stored twice, both copies
  with the send's message id (at least once, as RocketMQ's own retries). Each copy is then
  delivered and acknowledged once; a body stored twice under two message ids would be a bug;
- a message held in flight on the old master is delivered again by the new one (its lease
  was in memory only): bounded redelivery, never loss;
- the new master refuses that message's receipt handle from the old master with
  INVALID_RECEIPT_HANDLE instead of applying it, and takes its own;
- a batch acknowledged all at once just before the kill (the broker group-commits those
  acks into few progress records) is not delivered again by the new master.

A copy's queue position is read from its receipt handle (`v1.SET.EPOCH.BOOT.TOPIC.QUEUE.
OFFSET.LEASE.CRC`): the official client does not expose the queue offset, and this process
cannot import mqmeta's own decoder (the client's protobuf names clash with ours).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.errors import AlreadyExists, MqmetaError
from mqmeta.pb import controller_pb2 as cpb
from tests.support import wait_for
from tests.support.rmq_client import client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]

ACKS_IN_FLIGHT = 16

rmq = client()
from rocketmq.grpc_protocol import definition_pb2 as rdef  # noqa: E402
from rocketmq.v5.exception import BadRequestException  # noqa: E402

TOPIC = "Failover"


def in_sync_master(cluster: Cluster, members: int, timeout_s: float = 30.0) -> str:
    def check() -> str:
        try:
            master = cluster.master_of("broker-a", timeout_s=2)
            return master if len(cluster.broker_status(master).sync_state_set) == members else ""
        except MqmetaError:
            return ""

    return wait_for(check, timeout_s, f"a SyncStateSet of {members}")


class Producing(threading.Thread):
    def __init__(self, producer) -> None:
        super().__init__(daemon=True)
        self.producer, self.acked, self.failed = producer, [], 0
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            m = rmq.Message()
            m.topic, m.body = TOPIC, f"m-{i}".encode()
            try:
                self.producer.send(m)
                self.acked.append(m.body)
            except Exception:
                self.failed += 1
                self.stop.wait(0.1)  # back off after a failed send
            i += 1


Copy = tuple[str, int, int]  # one stored message: broker set, queue id, queue offset


def stored_copy(receipt_handle: str) -> Copy:
    """The queue position a delivery's receipt handle names (see the module doc)."""
    parts = receipt_handle.split(".")
    assert len(parts) == 9 and parts[0] == "v1", f"not an mqmeta receipt handle: {receipt_handle}"
    return parts[1], int(parts[5]), int(parts[6])


class Consuming(threading.Thread):
    """Receives batches and acknowledges each batch's messages together (as a consumer with
    a concurrent listener does), so the broker's group commit writes one progress record
    for many acks, and that record must survive the kill like each ack would."""

    def __init__(self, consumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.deliveries: dict[Copy, list[bool]] = defaultdict(list)  # ack succeeded, per delivery
        self.copies: dict[bytes, dict[Copy, str]] = defaultdict(dict)  # body -> its copies' message ids
        self.stop = threading.Event()

    def _ack(self, message) -> bool:
        try:
            self.consumer.ack(message)
            return True
        except Exception:
            return False

    def run(self) -> None:
        with ThreadPoolExecutor(ACKS_IN_FLIGHT) as pool:
            while not self.stop.is_set():
                try:
                    messages = self.consumer.receive(ACKS_IN_FLIGHT, 5)
                except Exception:
                    self.stop.wait(0.2)  # back off after a failed receive
                    continue
                for m, acked in zip(messages, pool.map(self._ack, messages), strict=True):
                    copy = stored_copy(m.receipt_handle)
                    self.deliveries[copy].append(acked)
                    self.copies[m.body][copy] = m.message_id

    def bodies(self) -> set[bytes]:
        return set(self.copies)


def test_kill_master_while_the_official_client_produces_and_consumes(tmp_path):
    cluster = Cluster(tmp_path / "c", count=1, broker_sets=1, replicas=2).start()
    threads: list = []
    clients: list = []
    try:
        old_master = in_sync_master(cluster, 2)
        with cluster.client() as admin:
            try:
                admin.call("CreateTopic", cpb.TopicSpec(name=TOPIC, queue_count=2))
            except AlreadyExists:
                pass
        config = rmq.ClientConfiguration(cluster.namesrv, rmq.Credentials(), request_timeout=2)
        producer = rmq.Producer(config, (TOPIC,))
        consumer = rmq.SimpleConsumer(config, "survivors", {TOPIC: rmq.FilterExpression()}, 1)
        holder = rmq.SimpleConsumer(config, "holders", {TOPIC: rmq.FilterExpression()}, 1)
        for c in (producer, consumer, holder):
            c.startup()
            clients.append(c)
        producing, consuming = Producing(producer), Consuming(consumer)
        threads += [producing, consuming]
        producing.start()
        consuming.start()
        wait_for(lambda: len(producing.acked) >= 20 and consuming.deliveries, 10, "traffic before the kill")
        (held,) = wait_for(lambda: holder.receive(1, 30), 10, "a message held in flight")
        # A batch acknowledged all at once right before the kill: the group commit's last
        # progress record must cover every ack it answered.
        burst = rmq.SimpleConsumer(config, "burst", {TOPIC: rmq.FilterExpression()}, 1)
        burst.startup()
        clients.append(burst)
        batch = wait_for(lambda: burst.receive(32, 30), 10, "a batch for the burst group")
        with ThreadPoolExecutor(len(batch)) as pool:
            assert all(pool.map(Consuming(burst)._ack, batch)), "an ack of the burst failed"
        burst_acked = {stored_copy(m.receipt_handle) for m in batch}
        burst_bodies = {m.body for m in batch}

        cluster.kill(old_master)  # kill -9 (the clients' first route refresh comes 10 s after their start)
        sent_before = len(producing.acked)
        wait_for(lambda: len(producing.acked) >= sent_before + 20, 60, "sends succeeding on the new master")
        producing.stop.set()
        producing.join(10)
        acked = set(producing.acked)
        wait_for(lambda: acked <= consuming.bodies(), 45, "every acknowledged send received")
        for copy, acks in list(consuming.deliveries.items()):
            assert True not in acks[:-1], f"{copy} was delivered again after a successful ack: {acks}"
        for body, copies in list(consuming.copies.items()):
            assert len(set(copies.values())) == 1, f"{body!r} stored under several message ids: {copies}"

        again = wait_for(
            lambda: [m for m in _receive(holder) if m.message_id == held.message_id], 30, "the held message"
        )
        assert again[0].delivery_attempt >= 1
        held.endpoints = again[0].endpoints  # the old master's handle, shown to the new master
        with pytest.raises(BadRequestException) as refused:
            holder.ack(held)
        assert refused.value.code == rdef.INVALID_RECEIPT_HANDLE
        holder.ack(again[0])  # while its own handle is good

        burst_drain = Consuming(burst)
        threads.append(burst_drain)
        burst_drain.start()
        wait_for(lambda: acked - burst_bodies <= burst_drain.bodies(), 45, "the burst group's rest")
        redelivered = burst_acked & set(burst_drain.deliveries)
        assert not redelivered, f"acknowledged before the kill, delivered again: {sorted(redelivered)}"
    finally:
        for thread in threads:
            thread.stop.set()
        for thread in threads:
            thread.join(10)
        for c in clients:
            c.shutdown()
        cluster.stop()


def _receive(consumer) -> list:
    try:
        return consumer.receive(16, 30)
    except Exception:  # a queue of the dead master, until the client's route refreshes
        return []
