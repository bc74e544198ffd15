"""Broker sets failing over, with real controller, nameserver and broker processes.

Properties checked:
- produce with acks from the whole SyncStateSet, kill -9 the master: a slave is elected
  and every acknowledged message is consumable, each at exactly one queue offset;
- a two-replica broker set fails over too (RIP-44: no third replica needed);
- SIGSTOP of the master (silent crash): it is replaced; on SIGCONT it finds itself
  fenced, rejoins as a slave and cuts what was never confirmed;
- the master cut off from the controllers only stops accepting writes within its lease,
  and no write is acknowledged by two masters;
- a slave restarted with an empty disk catches up; a lagging slave leaves the
  SyncStateSet and re-enters it once caught up;
- a flipped byte in a replica's log stops that replica at recovery, with a clear message.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter

import grpc
import pytest

from mqmeta.broker_client import Consumer, Producer
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from tests.tcp_cut import TcpCut

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]


def broker_cluster(cluster_factory, replicas: int = 3, start_brokers: bool = True):
    cluster = cluster_factory(broker_sets=1, replicas=replicas, broker_flags=FLAGS)
    cluster.start(brokers=start_brokers)
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    return cluster


def wait_in_sync(cluster, members: int, timeout_s: float = 20.0) -> str:
    """Waits until the master's SyncStateSet has `members` brokers; returns the master."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            master = cluster.master_of("broker-a", timeout_s=5)
            status = cluster.broker_status(master)
            if len(status.sync_state_set) == members:
                return master
        except MqmetaError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the SyncStateSet never reached {members} members")


class ProduceLoop(threading.Thread):
    """Sends batches until stopped; remembers what was acknowledged and what failed."""

    def __init__(self, cluster, prefix: str, batch: int = 5) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(cluster.namesrv, timeout_s=8.0)
        self.prefix, self.batch = prefix, batch
        self.acked: list[str] = []
        self.unknown: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set() and i < 50_000:
            values = [f"{self.prefix}-{i + k}" for k in range(self.batch)]
            i += self.batch
            try:
                self.producer.send("Orders", [v.encode() for v in values])
                self.acked += values
            except MqmetaError:
                self.unknown += values

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=20)
        self.producer.close()


def consume_all(cluster, group: str, expected: int, timeout_s: float = 30.0):
    consumer = Consumer(cluster.namesrv, "Orders", group)
    seen: list = []
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            try:
                batch = consumer.poll()
            except MqmetaError:
                consumer.refresh()
                time.sleep(0.1)
                continue
            if batch:
                seen += batch
                idle_since = time.monotonic()
            elif len(seen) >= expected and time.monotonic() - idle_since > 1.0:
                break
            else:
                time.sleep(0.05)
    finally:
        consumer.close()
    return seen


def check_no_loss(acked: list[str], seen: list) -> None:
    values = Counter(m.body.decode() for m in seen)
    lost = [v for v in acked if v not in values]
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    positions = Counter((m.queue_id, m.queue_offset) for m in seen)
    assert max(positions.values()) == 1, "a queue offset was delivered twice"
    by_queue: dict[int, list[int]] = {}
    for m in seen:
        by_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    for queue_id, offsets in by_queue.items():
        assert sorted(offsets) == list(range(len(offsets))), f"queue {queue_id} has gaps"


def failover_with(cluster, fault, replicas: int) -> None:
    old = wait_in_sync(cluster, replicas)
    loop = ProduceLoop(cluster, "m")
    loop.start()
    time.sleep(1.0)
    fault(old)
    new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
    assert new != old
    time.sleep(1.5)  # keep producing on the new master
    loop.stop()
    assert len(loop.acked) > 50
    check_no_loss(loop.acked, consume_all(cluster, "g1", len(loop.acked)))


def test_kill_master_loses_nothing_acknowledged(cluster_factory):
    cluster = broker_cluster(cluster_factory)
    failover_with(cluster, cluster.kill, replicas=3)


def test_two_replica_set_fails_over(cluster_factory):
    cluster = broker_cluster(cluster_factory, replicas=2)
    failover_with(cluster, cluster.kill, replicas=2)


def test_suspended_master_is_replaced_and_rejoins_as_slave(cluster_factory):
    cluster = broker_cluster(cluster_factory)
    old = wait_in_sync(cluster, 3)
    old_epoch = cluster.broker_status(old).master_epoch
    cluster.pause(old)
    try:
        new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
        producer = Producer(cluster.namesrv)
        acked = [f"after-{i}" for i in range(20)]
        for value in acked:
            producer.send("Orders", [value.encode()])
        producer.close()
    finally:
        cluster.resume(old)
    deadline = time.monotonic() + 15
    status = cluster.broker_status(old)
    while time.monotonic() < deadline and status.role != "SLAVE":
        time.sleep(0.1)
        status = cluster.broker_status(old)
    assert status.role == "SLAVE" and status.master_epoch > old_epoch
    assert not status.writable
    master_status = cluster.broker_status(new)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and status.max_offset != master_status.max_offset:
        time.sleep(0.1)
        status, master_status = cluster.broker_status(old), cluster.broker_status(new)
    assert status.max_offset == master_status.max_offset, "the old master did not catch up"
    check_no_loss(acked, consume_all(cluster, "g2", len(acked)))


class DirectSender(threading.Thread):
    """Sends to one broker address only, as fast as it answers; records ack times."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.acks: list[float] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        from mqmeta.pb import broker_pb2, broker_pb2_grpc

        with grpc.insecure_channel(self.address) as channel:
            stub = broker_pb2_grpc.BrokerServiceStub(channel)
            for i in range(100_000):
                if self.stop_event.is_set():
                    break
                try:
                    stub.Send(
                        broker_pb2.SendRequest(
                            messages=[
                                broker_pb2.Message(topic="Orders", queue_id=1, body=f"direct-{i}".encode())
                            ]
                        ),
                        timeout=3,
                    )
                    self.acks.append(time.monotonic())
                except grpc.RpcError:
                    time.sleep(0.01)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def test_master_cut_from_controllers_stops_writing_within_its_lease(cluster_factory):
    cluster = broker_cluster(cluster_factory, start_brokers=False)
    cuts = [TcpCut(n.grpc) for n in cluster.layout.controllers]
    try:
        first = cluster.layout.brokers[0].name
        cluster.start_broker(first, controllers=",".join(c.address for c in cuts))
        assert cluster.master_of("broker-a") == first
        for broker in cluster.layout.brokers[1:]:
            cluster.start_broker(broker.name)
        wait_in_sync(cluster, 3)
        direct = Producer(cluster.namesrv)  # keeps writing to whoever the route names
        hammer = DirectSender(cluster.broker(first).grpc)  # keeps writing to the old master
        hammer.start()
        time.sleep(0.3)
        cut_at = time.monotonic()
        for cut in cuts:
            cut.cut()
        # The isolated master must refuse writes once its lease (500 ms) is over.
        deadline = cut_at + 5
        while time.monotonic() < deadline and cluster.broker_status(first).writable:
            time.sleep(0.02)
        fenced_after = time.monotonic() - cut_at
        assert not cluster.broker_status(first).writable
        assert fenced_after < 0.5 + 0.3, f"still writable {fenced_after:.2f}s after the cut"
        new = cluster.master_of("broker-a", exclude=first, timeout_s=15)
        new_epoch = cluster.broker_status(new).master_epoch
        results = direct.send("Orders", [b"after-partition"])
        new_first_ack = time.monotonic()
        assert results, "the new master accepts writes"
        old = cluster.broker_status(first)
        assert old.master_epoch < new_epoch and not old.writable
        hammer.stop()
        assert hammer.acks, "the old master was acknowledging writes before the cut"
        assert max(hammer.acks) < new_first_ack, "two masters acknowledged writes at once"
        assert max(hammer.acks) - cut_at < 0.5 + 0.3, "the old master acked past its lease"
        direct.close()
    finally:
        for cut in cuts:
            cut.close()


def test_empty_slave_catches_up_and_lagging_slave_leaves_and_returns(cluster_factory):
    cluster = broker_cluster(cluster_factory)
    master = wait_in_sync(cluster, 3)
    producer = Producer(cluster.namesrv)
    for i in range(40):
        producer.send("Orders", [f"v{i}".encode()] * 5)
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    cluster.kill(slave)
    store = cluster.root / cluster.broker(slave).data_dir / "store"
    shutil.rmtree(store)  # an empty disk, same identity
    cluster.start_broker(slave)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if cluster.broker_status(slave).max_offset == cluster.broker_status(master).max_offset:
                break
        except grpc.RpcError:
            pass  # still starting
        time.sleep(0.1)
    assert cluster.broker_status(slave).max_offset == cluster.broker_status(master).max_offset
    lagging = slave
    lagging_id = cluster.broker_status(lagging).broker_id
    cluster.pause(lagging)
    try:
        producer.send("Orders", [b"while-paused"])  # acknowledged once the set shrinks
        members = list(cluster.broker_status(master).sync_state_set)
        assert lagging_id not in members and len(members) == 2
    finally:
        cluster.resume(lagging)
    wait_in_sync(cluster, 3)
    assert lagging_id in cluster.broker_status(master).sync_state_set
    producer.close()


def test_flipped_byte_stops_the_replica_at_recovery(cluster_factory):
    cluster = broker_cluster(cluster_factory)
    master = wait_in_sync(cluster, 3)
    producer = Producer(cluster.namesrv)
    for i in range(10):
        producer.send("Orders", [f"x{i}".encode() * 20])
    producer.close()
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    cluster.kill(slave)
    segment = sorted((cluster.root / cluster.broker(slave).data_dir / "store").rglob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    proc = cluster.start_broker(slave)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a broker with a corrupt record kept running")
    text = (cluster.root / "logs" / f"{slave}.log").read_text()
    assert code == 2 and "refusing to open this commit log" in text and "Traceback" not in text


def test_unconfirmed_record_of_an_old_master_is_cut_when_it_rejoins(cluster_factory):
    """RocketMQ #6662: a record only the old master holds was never acknowledged, so the
    new master's history wins and the old master cuts it instead of serving it."""
    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    cluster = broker_cluster(cluster_factory)
    old = wait_in_sync(cluster, 3)
    slaves = [b.name for b in cluster.layout.brokers if b.name != old]
    for slave in slaves:
        cluster.pause(slave)
    time.sleep(0.3)  # let fetches already in flight (long-poll <= 100 ms) return empty
    outcome: dict = {}

    def send_once() -> None:  # one attempt, no retry on another master
        with grpc.insecure_channel(cluster.broker(old).grpc) as channel:
            try:
                broker_pb2_grpc.BrokerServiceStub(channel).Send(
                    broker_pb2.SendRequest(
                        messages=[broker_pb2.Message(topic="Orders", queue_id=0, body=b"unconfirmed")]
                    ),
                    timeout=10,
                )
                outcome["acked"] = True
            except grpc.RpcError as error:
                outcome["error"] = error.code()

    sender = threading.Thread(target=send_once)
    sender.start()
    time.sleep(0.4)  # stored on the old master, waiting for acks; before the set can shrink
    stored_until = cluster.broker_status(old).max_offset
    cluster.pause(old)
    for slave in slaves:
        cluster.resume(slave)
    new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
    producer = Producer(cluster.namesrv)
    producer.send("Orders", [b"on-the-new-master"])
    producer.close()
    cluster.resume(old)
    sender.join(timeout=15)
    assert "acked" not in outcome, "the old master acknowledged a write it could not replicate"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status, master = cluster.broker_status(old), cluster.broker_status(new)
        if status.role == "SLAVE" and status.max_offset == master.max_offset:
            break
        time.sleep(0.1)
    assert status.role == "SLAVE" and status.max_offset == master.max_offset
    log_text = (cluster.root / "logs" / f"{old}.log").read_text()
    assert "to the consistent point" in log_text, "the old master never cut its tail"
    assert stored_until > 0
    bodies = [m.body for m in consume_all(cluster, "g3", 1)]
    assert b"on-the-new-master" in bodies and b"unconfirmed" not in bodies
