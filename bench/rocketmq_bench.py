"""Official RocketMQ 5 client throughput against mqmeta, beside our native client, in one run.

    PYTHONPATH=. .venv/bin/python bench/rocketmq_bench.py [--messages N] [--threads T] [--size B]

Starts a real cluster (one controller, a nameserver, a broker set of two replicas, acks
from the whole SyncStateSet), then measures on the same topic:
- send: T threads, each sending its share of N messages of B bytes one at a time and
  waiting for each acknowledgement, through the official client's Producer.send, then
  through mqmeta/broker_client.Producer.send (one message per call, like for like);
- receive: one consumer draining what was sent: the official SimpleConsumer (batches of
  32, each message acknowledged, which writes the group's progress: once with each ack
  awaited before the next, once with a batch's acks sent together) and the native
  Consumer (polls, committing offsets as it goes).
Prints one JSON document with messages per second for each and the ratios (official /
native).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqmeta.cluster.harness import Cluster  # noqa: E402

from mqmeta.broker_client import Consumer, Producer  # noqa: E402
from mqmeta.errors import AlreadyExists  # noqa: E402
from mqmeta.pb import controller_pb2 as cpb  # noqa: E402

TOPIC = "Bench"
QUEUES = 4
ACKS_IN_FLIGHT_MAX = 32  # a received batch's acks, sent together


def official_client(home: Path):
    os.environ["HOME"] = str(home)  # the client's logs go under $HOME/logs
    import rocketmq

    return rocketmq


def timed_threads(count: int, work) -> float:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def official_send(rmq, namesrv: str, total: int, threads: int, body: bytes) -> float:
    config = rmq.ClientConfiguration(namesrv, rmq.Credentials(), request_timeout=5)
    producer = rmq.Producer(config, (TOPIC,))
    producer.startup()

    def work(i: int) -> None:
        for _ in range(total // threads):
            m = rmq.Message()
            m.topic, m.body = TOPIC, body
            producer.send(m)

    try:
        return timed_threads(threads, work)
    finally:
        producer.shutdown()


def native_send(namesrv: str, total: int, threads: int, body: bytes) -> float:
    producers = [Producer(namesrv) for _ in range(threads)]

    def work(i: int) -> None:
        for _ in range(total // threads):
            producers[i].send(TOPIC, [body])

    try:
        return timed_threads(threads, work)
    finally:
        for p in producers:
            p.close()


def official_receive(rmq, namesrv: str, total: int, group: str, concurrent_acks: bool) -> tuple[float, int]:
    """Drains `total` messages; each received batch's acks are sent one after the other
    (`ack`, waiting for each) or all at once. Returns the seconds taken and how many acks
    failed (a refused ack leaves its message to come back after its invisible time, as an
    application would; on a loaded machine a master can lose its lease for a moment)."""

    def ack(message) -> bool:
        try:
            consumer.ack(message)
            return True
        except Exception:
            return False

    config = rmq.ClientConfiguration(namesrv, rmq.Credentials(), request_timeout=5)
    consumer = rmq.SimpleConsumer(config, group, {TOPIC: rmq.FilterExpression()}, 1)
    consumer.startup()
    pool = ThreadPoolExecutor(ACKS_IN_FLIGHT_MAX)
    got, idle, failed = 0, 0, 0
    start = time.perf_counter()
    try:
        while got < total and idle < QUEUES * 3:
            messages = consumer.receive(32, 30)
            idle = 0 if messages else idle + 1
            if concurrent_acks:
                # the client's ack_async returns None in 5.1.2 (no future to wait on), so a
                # pool sends a batch's acks together through the public ack
                failed += sum(not done for done in pool.map(ack, messages))
            else:
                failed += sum(not ack(m) for m in messages)
            got += len(messages)
        return ((time.perf_counter() - start) if got >= total else float("nan")), failed
    finally:
        pool.shutdown()
        consumer.shutdown()


def native_receive(namesrv: str, total: int) -> float:
    consumer = Consumer(namesrv, TOPIC, "bench-native")
    got = 0
    start = time.perf_counter()
    try:
        deadline = time.monotonic() + 120
        while got < total and time.monotonic() < deadline:
            got += len(consumer.poll(256))
        consumer.commit()
        return (time.perf_counter() - start) if got >= total else float("nan")
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rmq-bench-"))
    rmq = official_client(root / "home")
    cluster = Cluster(root / "cluster", count=1, broker_sets=1, replicas=2).start()
    try:
        cluster.master_of("broker-a")
        with cluster.client() as admin:
            try:
                admin.create_topic(cpb.TopicSpec(name=TOPIC, queue_count=QUEUES))
            except AlreadyExists:
                pass
        body = os.urandom(args.size)
        total = args.messages - args.messages % args.threads
        official_send(
            rmq, cluster.namesrv, args.threads * 10, args.threads, body
        )  # warm-up (routes, channels)
        native_send(cluster.namesrv, args.threads * 10, args.threads, body)
        sent_official = official_send(rmq, cluster.namesrv, total, args.threads, body)
        sent_native = native_send(cluster.namesrv, total, args.threads, body)
        stored = total * 2 + args.threads * 20  # every message on the topic, both clients' and the warm-ups
        received_official, failed_official = official_receive(
            rmq, cluster.namesrv, stored, "bench-official", False
        )
        received_concurrent, failed_concurrent = official_receive(
            rmq, cluster.namesrv, stored, "bench-official-concurrent", True
        )
        received_native = native_receive(cluster.namesrv, stored)
    finally:
        cluster.stop()
    rates = {
        "official_send_msgs_per_s": total / sent_official,
        "native_send_msgs_per_s": total / sent_native,
        "official_receive_msgs_per_s": stored / received_official,
        "official_receive_concurrent_acks_msgs_per_s": stored / received_concurrent,
        "native_receive_msgs_per_s": stored / received_native,
    }
    print(
        json.dumps(
            {
                "messages": total,
                "threads": args.threads,
                "body_bytes": args.size,
                "replicas": 2,
                "official_ack_failures": failed_official,
                "official_concurrent_ack_failures": failed_concurrent,
                **{k: round(v, 1) for k, v in rates.items()},
                "send_ratio_official_to_native": round(
                    rates["official_send_msgs_per_s"] / rates["native_send_msgs_per_s"], 3
                ),
                "receive_ratio_official_to_native": round(
                    rates["official_receive_msgs_per_s"] / rates["native_receive_msgs_per_s"], 3
                ),
                "receive_ratio_official_concurrent_acks_to_native": round(
                    rates["official_receive_concurrent_acks_msgs_per_s"] / rates["native_receive_msgs_per_s"],
                    3,
                ),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
