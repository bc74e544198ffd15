"""Broker sets failing over, with real controller, nameserver and broker processes.

Properties checked:
- produce with acks from the whole SyncStateSet, the slaves fetching over the HA stream,
  kill -9 the master: a slave is elected and every acknowledged message is consumable,
  each at exactly one queue offset;
- a two-replica broker set fails over too (RIP-44: no third replica needed);
- SIGSTOP of the master (silent crash): it is replaced; on SIGCONT it finds itself
  fenced, rejoins as a slave and cuts what was never confirmed;
- the master cut off from the controllers only stops accepting writes within its lease,
  and no write is acknowledged by two masters;
- a slave restarted with an empty disk catches up; a lagging slave leaves the
  SyncStateSet and re-enters it once caught up;
- a flipped byte in a slave's log (running, or stopped and restarted) is found (scrub, or
  at open), cut there and fetched again from the master: byte-identical, counted.
"""

from __future__ import annotations

import shutil
import threading
import time

import grpc
import pytest

from mqmeta.broker_client import Producer
from mqmeta.pb import controller_pb2 as pb
from tests.support import TcpCut, consume_all, wait_for, wait_in_sync, wait_same_end
from tests.support.producing import FLAGS, ProduceLoop, check_no_loss

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

# Acknowledged sends before the fault, and again on the new master after it.
ACKED_BEFORE_FAULT_MIN = 50
ACKED_ON_NEW_MASTER_MIN = 50
LEASE_MS = 500  # the harness's lease_ms (cluster/harness.py configure_controller)
FENCE_MARGIN_MS = 300  # a status poll and a heartbeat round on a loaded machine
FETCH_WAIT_MS = 100  # a broker's default long-poll bound for a slave's fetch
FETCH_ANSWER_MARGIN_MS = 400  # a fetch queued in the master before it reached the handler


def broker_cluster(cluster_factory, replicas: int = 3, start_brokers: bool = True):
    cluster = cluster_factory(broker_sets=1, replicas=replicas, broker_flags=FLAGS)
    cluster.start(brokers=start_brokers)
    with cluster.client() as client:
        client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
    return cluster


def failover_with(cluster, fault, replicas: int) -> None:
    old = wait_in_sync(cluster, replicas)
    wait_for(  # the default transport: the slaves' fetches come over the HA stream
        lambda: [s.streamed for s in cluster.broker_status(old).slaves],
        15,
        "every slave fetching over the HA stream",
        until=lambda streamed: len(streamed) == replicas - 1 and all(streamed),
    )
    loop = ProduceLoop(cluster, "m")
    loop.start()
    wait_for(
        lambda: len(loop.acked),
        15,
        f"{ACKED_BEFORE_FAULT_MIN} acknowledged sends before the fault",
        until=lambda acked: acked >= ACKED_BEFORE_FAULT_MIN,
    )
    fault(old)
    new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
    assert new != old
    elected_at = len(loop.acked)
    wait_for(  # the load goes on against the new master
        lambda: len(loop.acked),
        15,
        f"{ACKED_ON_NEW_MASTER_MIN} acknowledged sends after the new master was elected",
        until=lambda acked: acked >= elected_at + ACKED_ON_NEW_MASTER_MIN,
    )
    loop.stop()
    check_no_loss(loop.acked, consume_all(cluster, "g1", [v.encode() for v in loop.acked]))


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
    status = wait_for(
        lambda: cluster.broker_status(old),
        15,
        f"{old} to rejoin as a slave",
        until=lambda status: status.role == "SLAVE",
    )
    assert status.master_epoch > old_epoch
    assert not status.writable
    wait_same_end(cluster, [old, new], timeout_s=10)  # the old master catches up
    check_no_loss(acked, consume_all(cluster, "g2", [v.encode() for v in acked]))


class DirectSender(threading.Thread):
    """Sends to one broker address only, as fast as it answers; records, for each send
    acknowledged, when it was sent (the broker handled it at that time or later)."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.acks: list[float] = []  # the send times of the acknowledged sends
        self.stop_event = threading.Event()

    def run(self) -> None:
        from mqmeta.pb import broker_pb2, broker_pb2_grpc

        with grpc.insecure_channel(self.address) as channel:
            stub = broker_pb2_grpc.BrokerServiceStub(channel)
            for i in range(100_000):
                if self.stop_event.is_set():
                    break
                sent = time.monotonic()
                try:
                    stub.Send(
                        broker_pb2.SendRequest(
                            messages=[
                                broker_pb2.Message(topic="Orders", queue_id=1, body=f"direct-{i}".encode())
                            ]
                        ),
                        timeout=3,
                    )
                    self.acks.append(sent)
                except grpc.RpcError:
                    # Not synchronisation: paces retries against a broker that refuses writes.
                    self.stop_event.wait(0.01)

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
        wait_for(lambda: hammer.acks, 10, "the old master acknowledging the direct sender")
        for cut in cuts:
            cut.cut()
        cut_at = time.monotonic()  # no heartbeat passes from here on (TcpCut.cut has returned)
        # The isolated master must refuse writes once its lease (500 ms) is over. Measured by
        # when each status call was sent, not answered: the broker computed `writable` at or
        # after the send. Measured by the answers (as this test first did), a status call
        # slowed by a loaded machine (hundreds of ms between send and answer) counted into
        # the fence time and failed the test in a full run while the broker was right.
        polls: list[tuple[float, bool]] = []

        def writable() -> bool:
            sent = time.monotonic()
            polls.append((sent, cluster.broker_status(first).writable))
            return polls[-1][1]

        wait_for(
            writable,
            5,
            f"{first} to stop being writable once cut off",
            until=lambda w: not w,
            interval_s=0.02,
        )
        last_writable = max([sent for sent, answer in polls if answer], default=cut_at)
        bound_s = (LEASE_MS + FENCE_MARGIN_MS) / 1000
        assert last_writable - cut_at < bound_s, f"still writable {last_writable - cut_at:.2f}s after the cut"
        new = cluster.master_of("broker-a", exclude=first, timeout_s=15)
        new_epoch = cluster.broker_status(new).master_epoch
        results = direct.send("Orders", [b"after-partition"])
        new_first_ack = time.monotonic()
        assert results, "the new master accepts writes"
        old = cluster.broker_status(first)
        assert old.master_epoch < new_epoch and not old.writable
        hammer.stop()
        assert max(hammer.acks) < new_first_ack, "two masters acknowledged writes at once"  # send times
        assert max(hammer.acks) - cut_at < bound_s, "the old master acked past its lease"
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
    wait_same_end(cluster, [slave, master], timeout_s=20)
    lagging = slave
    lagging_id = cluster.broker_status(lagging).broker_id
    # Only a member can be seen leaving: wait until it is back in the set (it left while
    # it was down, or will once its empty log is found behind) before freezing it.
    master = wait_in_sync(cluster, 3)
    cluster.pause(lagging)
    try:
        producer.send("Orders", [b"while-paused"])  # acknowledged once the set shrinks
        status = cluster.broker_status(master)
        members = list(status.sync_state_set)
        assert lagging_id not in members and len(members) == 2, (
            f"acknowledged with {lagging} (id {lagging_id}) frozen, yet {master}'s set is {members} "
            f"(role {status.role}, epoch {status.master_epoch})"
        )
    finally:
        cluster.resume(lagging)
    master = wait_in_sync(cluster, 3)
    assert lagging_id in cluster.broker_status(master).sync_state_set
    producer.close()


def flip_byte_in_place(path, position: int) -> None:
    """One bit flipped where it lies (r+b: a running broker's open file is not replaced)."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x01]))


def log_bytes(cluster, name: str) -> bytes:
    """A broker's log as its segments hold it, without the zeros written ahead of the next
    record (a running broker's last segment ends in them, however far)."""
    segments = sorted((cluster.root / cluster.broker(name).data_dir / "store").rglob("*.log"))
    return b"".join(segment.read_bytes() for segment in segments).rstrip(b"\0")


def test_a_corrupt_slave_log_is_found_cut_and_fetched_again(cluster_factory):
    """P16: a byte flipped below the confirm offset in a running slave's log is found by
    the background scrub, and in a stopped slave's log at its restart (which no longer
    refuses to start); each time the slave cuts its log at the bad record and fetches the
    rest from the master, ending byte-identical to it, and its metrics count it."""
    from tests.support.prometheus import scrape

    cluster = broker_cluster(cluster_factory)
    master = wait_in_sync(cluster, 3)
    producer = Producer(cluster.namesrv)
    bodies = [f"x{i}".encode() * 20 for i in range(40)]
    for body in bodies:
        producer.send("Orders", [body])
    slave = next(b.name for b in cluster.layout.brokers if b.name != master)
    end = wait_same_end(cluster, [master, slave], 20)
    segment = sorted((cluster.root / cluster.broker(slave).data_dir / "store").rglob("*.log"))[0]
    metrics = cluster.broker(slave).metrics

    def counted(name: str) -> float:
        return scrape(metrics).get((f"mqmeta_broker_{name}_total", ()), 0.0)

    flip_byte_in_place(segment, end // 2)  # while it runs: the scrub finds it
    wait_for(lambda: counted("corruption_repairs"), 20, "the scrub to repair the slave", until=bool)
    assert counted("corruptions_found") >= 1 and counted("scrub_bytes") > 0
    wait_same_end(cluster, [master, slave], 20)
    assert log_bytes(cluster, slave) == log_bytes(cluster, master)

    cluster.kill(slave)  # stopped: found when the log opens
    flip_byte_in_place(segment, end // 3)
    cluster.start_broker(slave)
    wait_for(
        lambda: counted("corruption_repairs"),
        20,
        "the restarted slave to repair its log",
        until=bool,
        retry_on=(OSError,),  # its metrics port is not listening yet
    )
    producer.send("Orders", [b"after the repair"])
    producer.close()
    wait_same_end(cluster, [master, slave], 20)
    assert log_bytes(cluster, slave) == log_bytes(cluster, master)
    wait_in_sync(cluster, 3)
    consume_all(cluster, "g1", [*bodies, b"after the repair"])
    text = (cluster.root / "logs" / f"{slave}.log").read_text()
    assert "cutting the log there" in text and "Traceback" not in text


def test_unconfirmed_record_of_an_old_master_is_cut_when_it_rejoins(cluster_factory):
    """RocketMQ #6662: a record only the old master holds was never acknowledged, so the
    new master's history wins and the old master cuts it instead of serving it."""
    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    cluster = broker_cluster(cluster_factory)
    old = wait_in_sync(cluster, 3)
    slaves = [b.name for b in cluster.layout.brokers if b.name != old]
    slave_ids = {cluster.broker_status(slave).broker_id for slave in slaves}
    for slave in slaves:
        cluster.pause(slave)
    # A fetch the master was holding (long-poll) when the slaves froze would carry the next
    # record into a frozen slave's socket, to be stored once it thaws: wait until each
    # slave's last fetch is older than the long-poll bound, so every held fetch has returned.
    wait_for(
        lambda: {s.broker_id: s.last_fetch_ms_ago for s in cluster.broker_status(old).slaves},
        5,
        "the frozen slaves' last fetches to return (last value: ms since each slave's last fetch)",
        until=lambda ago: all(ago.get(i, 0) > FETCH_WAIT_MS + FETCH_ANSWER_MARGIN_MS for i in slave_ids),
    )
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

    stored_before = cluster.broker_status(old).max_offset
    sender = threading.Thread(target=send_once)
    sender.start()
    # Stored on the old master, waiting for acks that cannot come; frozen at once, long
    # before the set could shrink to the old master alone (1.5 s without the slaves).
    wait_for(
        lambda: cluster.broker_status(old).max_offset,
        5,
        "the old master to store the record it cannot replicate",
        until=lambda end: end > stored_before,
        interval_s=0.01,
    )
    cluster.pause(old)
    for slave in slaves:
        cluster.resume(slave)
    new = cluster.master_of("broker-a", exclude=old, timeout_s=15)
    producer = Producer(cluster.namesrv)
    producer.send("Orders", [b"on-the-new-master"])
    producer.close()
    cluster.resume(old)
    sender.join(timeout=15)
    assert not sender.is_alive() and "error" in outcome, outcome
    assert "acked" not in outcome, "the old master acknowledged a write it could not replicate"
    wait_for(
        lambda: cluster.broker_status(old).role,
        15,
        f"{old} to rejoin as a slave",
        until=lambda role: role == "SLAVE",
    )
    wait_same_end(cluster, [old, new], timeout_s=15)
    log_text = (cluster.root / "logs" / f"{old}.log").read_text()
    assert "to the consistent point" in log_text, "the old master never cut its tail"
    bodies = [m.body for m in consume_all(cluster, "g3", [b"on-the-new-master"])]
    assert b"unconfirmed" not in bodies
