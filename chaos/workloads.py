"""Chaos workloads: what the clients do while faults are injected, recorded as a history.

Queue workload (OpenChaos's queue model): `concurrency` producer threads share `rate_per_s`;
producer i owns sharding keys `p{i}-k{j}`, each pinned to one queue and sent in sequence, so
per-key order is defined. Every enqueue is one message whose body is its unique value and
its send time. `consumers` consumer threads of one group (client ids 0, -1, -2, ...) split
the queues statically (Consumer share) and record each delivered message as a dequeue
with its end-to-end latency. A send answers:
  SUCCESS  - the broker set acknowledged it (the ack policy held);
  FAILURE  - refused before anything was written (bad input, too few in-sync replicas, a full disk);
  UNKNOWN  - anything else (timeouts, a master that lost its role while waiting): the message
             may or may not be stored, and the checkers treat it so.

Metadata workload (a register per key): `concurrency` clients do reads, writes and
compare-and-sets on the queue count of topics `chaos-meta-{k}` straight through the gRPC stub of
one controller (one attempt per operation: a client retry would blur what took effect).
Reads (ListTopics) are linearizable reads; writes are topic updates; cas is an update with
`if_queue_count`. Only answers that prove nothing changed are FAILURE (TOPIC_CHANGED with the
observed value, INVALID_ARGUMENT); every other error is UNKNOWN.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from mqmeta.chaos.history import HistoryRecorder, RequestEvent, ResponseEvent, Result, encode_cas_value

from mqmeta import tls
from mqmeta.broker_client import Consumer, Producer, QueueRef
from mqmeta.clock import wall_ms
from mqmeta.dialmap import dial
from mqmeta.errors import (
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
)
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import controller_pb2_grpc as pb_grpc
from mqmeta.rpc import from_rpc_error

TOPIC = "chaos"
GROUP = "chaos-checker"
QUEUE_COUNT = 4
KEYS_PER_PRODUCER = 2
SEND_TIMEOUT_S = 5.0
METADATA_KEYS = 3
METADATA_CALL_TIMEOUT_S = 2.0
METADATA_VALUE_MAX = 1024  # a topic's queue count bound


@dataclass
class WorkloadConfig:
    concurrency: int = 4
    rate_per_s: float = 20.0
    consumers: int = 2


class _Paced(threading.Thread):
    """A client thread doing one operation every `interval_s` until stopped."""

    def __init__(self, name: str, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s = interval_s
        self.stopping = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.operate()
            next_at = max(next_at + self.interval_s, time.monotonic() - 1.0)
            self.stopping.wait(max(0.0, next_at - time.monotonic()))
        self.close()

    def operate(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _QueueProducer(_Paced):
    def __init__(
        self,
        client_id: int,
        namesrv: str,
        recorder: HistoryRecorder,
        interval_s: float,
        broker_names: list[str],
    ) -> None:
        super().__init__(f"producer-{client_id}", interval_s)
        self.client_id = client_id
        self.recorder = recorder
        self.producer = Producer(namesrv, timeout_s=SEND_TIMEOUT_S)
        self.keys = [f"p{client_id}-k{j}" for j in range(KEYS_PER_PRODUCER)]
        self.queues = {key: _queue_of(key, broker_names) for key in self.keys}
        self.sequence = itertools.count()
        self.acknowledged: set[str] = set()
        self.last_success_ms = 0

    def operate(self) -> None:
        sequence = next(self.sequence)
        key = self.keys[sequence % len(self.keys)]
        value = f"{self.client_id}-{sequence}"
        sent_ms = wall_ms()
        self.recorder.record(RequestEvent(self.client_id, "enqueue", value, key, sent_ms))
        body = f"{value}|{key}|{sent_ms}".encode()
        try:
            self.producer.send(TOPIC, [body], queue=self.queues[key], keys=[key])
            result, info = Result.SUCCESS, None
            self.acknowledged.add(value)
            self.last_success_ms = wall_ms()
        except InvalidArgument as error:
            result, info = Result.FAILURE, _info(error)
        except MqmetaError as error:
            definite = error.code in ("IN_SYNC_REPLICAS_NOT_ENOUGH", "DISK_FULL")  # nothing was kept
            result, info = (Result.FAILURE if definite else Result.UNKNOWN), _info(error)
        done_ms = wall_ms()
        self.recorder.record(
            ResponseEvent(self.client_id, "enqueue", result, value, key, done_ms, done_ms - sent_ms, info)
        )

    def close(self) -> None:
        self.producer.close()


def _queue_of(sharding_key: str, broker_names: list[str]) -> QueueRef:
    """A sharding key always goes to the same queue: per-key order is defined."""
    digest = zlib.crc32(sharding_key.encode())
    return QueueRef(broker_names[digest % len(broker_names)], digest % QUEUE_COUNT)


def _info(error: MqmetaError) -> str:
    return f"{error.code}: {error.message}".replace("\t", " ").replace("\n", " ")[:200]


class _QueueConsumer(threading.Thread):
    """Consumer `index` of `count` (client id -index): pulls its share of the queues,
    records deliveries; keeps going until told to stop."""

    def __init__(self, namesrv: str, recorder: HistoryRecorder, index: int, count: int) -> None:
        super().__init__(name=f"consumer-{index}", daemon=True)
        self.recorder = recorder
        self.client_id = -index
        self.consumer = Consumer(namesrv, TOPIC, GROUP, timeout_s=SEND_TIMEOUT_S, share=(index, count))
        self.stopping = threading.Event()
        self.delivered: set[str] = set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                messages = self.consumer.poll()
            except MqmetaError:
                self.stopping.wait(0.2)
                continue
            for message in messages:
                self._record(message.body)
            if not messages:
                self.stopping.wait(0.05)
        try:
            self.consumer.commit()
        except MqmetaError:
            pass
        self.consumer.close()

    def _record(self, body: bytes) -> None:
        self.delivered.add(record_dequeue(self.recorder, self.client_id, body))


def record_dequeue(recorder: HistoryRecorder, client_id: int, body: bytes) -> str:
    """Records one delivery of a queue-workload message (body `value|key|sent ms`) in the
    history; returns its value."""
    value, key, sent = body.decode().split("|")
    at_ms = wall_ms()
    recorder.record(RequestEvent(client_id, "dequeue", None, None, at_ms))
    recorder.record(
        ResponseEvent(client_id, "dequeue", Result.SUCCESS, value, key, at_ms, 0, None, at_ms - int(sent))
    )
    return value


class _Stoppable(Protocol):
    stopping: threading.Event

    def join(self, timeout: float | None = None) -> None: ...


class _Producing(_Stoppable, Protocol):
    last_success_ms: int
    acknowledged: set[str]


def stop_producers_after_recovery(producers: Sequence[_Producing], healed_ms: int, deadline: float) -> None:
    """Lets the producers go on until one send succeeds after the last heal (the service is
    back) or `deadline` (monotonic) passes, then stops them and waits for their threads."""
    while time.monotonic() < deadline and max(p.last_success_ms for p in producers) <= healed_ms:
        time.sleep(0.1)
    stop_threads(producers)


def drain_after_producing(
    producers: Sequence[_Producing], delivered: Callable[[], set[str]], drain_s: float, healed_ms: int
) -> None:
    """A queue workload's stop, up to its consumers: keeps producing until a send succeeds
    after the last heal (the service is back; at most drain_s), stops producing, then lets
    the consumers drain until they have delivered every acknowledged message (at most drain_s
    more) and one quiet second for stragglers. The waits only bound how long the run lasts;
    the checkers judge what happened."""
    stop_producers_after_recovery(producers, healed_ms, time.monotonic() + drain_s)
    acknowledged = set().union(*(p.acknowledged for p in producers))
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and not acknowledged <= delivered():
        time.sleep(0.1)
    time.sleep(1.0)


def stop_threads(threads: Sequence[_Stoppable]) -> None:
    """Sets each thread's stopping event, then waits for them all (bounded)."""
    for thread in threads:
        thread.stopping.set()
    for thread in threads:
        thread.join(timeout=SEND_TIMEOUT_S * 2)


class QueueWorkload:
    def __init__(
        self, namesrv: str, recorder: HistoryRecorder, config: WorkloadConfig, broker_names: list[str]
    ) -> None:
        interval_s = config.concurrency / max(config.rate_per_s, 0.1)
        self.producers = [
            _QueueProducer(i + 1, namesrv, recorder, interval_s, broker_names)
            for i in range(config.concurrency)
        ]
        self.consumers = [
            _QueueConsumer(namesrv, recorder, i, config.consumers) for i in range(config.consumers)
        ]
        self.recorder = recorder

    def delivered(self) -> set[str]:
        return set().union(*(c.delivered for c in self.consumers))

    def start(self) -> None:
        for consumer in self.consumers:
            consumer.start()
        for producer in self.producers:
            producer.start()

    def stop(self, drain_s: float, healed_ms: int = 0) -> None:
        """Stops producing once the service is back, drains (drain_after_producing), then
        stops the consumers."""
        drain_after_producing(self.producers, self.delivered, drain_s, healed_ms)
        stop_threads(self.consumers)


class _MetadataClient(_Paced):
    def __init__(
        self,
        client_id: int,
        controllers: list[str],
        recorder: HistoryRecorder,
        interval_s: float,
        seed: int,
        values: itertools.count,
    ) -> None:
        super().__init__(f"metadata-{client_id}", interval_s)
        self.client_id = client_id
        self.recorder = recorder
        self.rng = random.Random(seed)
        self.values = values
        self.last_read: dict[str, int] = {}
        self.last_success_ms = 0
        self.channel = tls.channel(dial(controllers[client_id % len(controllers)]))
        self.stub = pb_grpc.ControllerServiceStub(self.channel)

    def operate(self) -> None:
        key = f"chaos-meta-{self.rng.randrange(METADATA_KEYS)}"
        kind = self.rng.choice(("read", "read", "write", "cas"))
        if kind == "read":
            self._read(key)
            return
        new = str(1 + next(self.values) % METADATA_VALUE_MAX)
        if kind == "write":
            self._update(key, "write", new, pb.TopicSpec(name=key, queue_count=int(new)))
        else:
            old = str(
                self.rng.randrange(1, METADATA_VALUE_MAX + 1)
                if self.rng.random() < 0.3
                else self._last_seen(key)
            )
            self._update(
                key,
                "cas",
                encode_cas_value(old, new),
                pb.TopicSpec(name=key, queue_count=int(new), if_queue_count=int(old)),
            )

    def _last_seen(self, key: str) -> int:
        return self.last_read.get(key, 1)

    def _read(self, key: str) -> None:
        start = wall_ms()
        self.recorder.record(RequestEvent(self.client_id, "read", None, key, start))
        try:
            topics = self.stub.ListTopics(pb.ListTopicsRequest(), timeout=METADATA_CALL_TIMEOUT_S)
            found = [t.queue_count for t in topics.topics if t.name == key]
            result, value = Result.SUCCESS, (str(found[0]) if found else None)
            if found:
                self.last_read[key] = found[0]
        except grpc.RpcError:
            result, value = Result.FAILURE, None  # a read that failed observed nothing
        done = wall_ms()
        self.recorder.record(ResponseEvent(self.client_id, "read", result, value, key, done, done - start))

    def _update(self, key: str, kind: str, value: str, spec: pb.TopicSpec) -> None:
        start = wall_ms()
        self.recorder.record(RequestEvent(self.client_id, kind, value, key, start))
        info = None
        try:
            self.stub.UpdateTopic(spec, timeout=METADATA_CALL_TIMEOUT_S)
            result = Result.SUCCESS
            self.last_success_ms = wall_ms()
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
            result, value, info = _classify_update(error, kind, value, spec)
        done = wall_ms()
        self.recorder.record(
            ResponseEvent(self.client_id, kind, result, value, key, done, done - start, info)
        )

    def close(self) -> None:
        self.channel.close()


def _classify_update(
    error: MqmetaError, kind: str, value: str, spec: pb.TopicSpec
) -> tuple[Result, str, str]:
    if isinstance(error, FailedPrecondition) and error.code == "TOPIC_CHANGED":
        return (
            Result.FAILURE,
            encode_cas_value(str(spec.if_queue_count), str(spec.queue_count), mismatch=True),
            _info(error),
        )
    if isinstance(error, InvalidArgument):
        return Result.FAILURE, value, _info(error)
    return Result.UNKNOWN, value, _info(error)


class MetadataWorkload:
    def __init__(
        self, controllers: list[str], recorder: HistoryRecorder, config: WorkloadConfig, seed: int
    ) -> None:
        self.controllers = controllers
        self.recorder = recorder
        interval_s = config.concurrency / max(config.rate_per_s, 0.1)
        values = itertools.count(1)
        self.clients = [
            _MetadataClient(i + 1, controllers, recorder, interval_s, seed + i, values)
            for i in range(config.concurrency)
        ]

    def prepare(self, create: Callable[[pb.TopicSpec], object]) -> None:
        """Creates each key's topic, recorded as the key's first write (keys start absent)."""
        for k in range(METADATA_KEYS):
            key = f"chaos-meta-{k}"
            start = wall_ms()
            self.recorder.record(RequestEvent(0, "write", "1", key, start))
            create(pb.TopicSpec(name=key, queue_count=1))
            done = wall_ms()
            self.recorder.record(ResponseEvent(0, "write", Result.SUCCESS, "1", key, done, done - start))

    def start(self) -> None:
        for client in self.clients:
            client.start()

    def stop(self, drain_s: float, healed_ms: int = 0) -> None:
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and max(c.last_success_ms for c in self.clients) <= healed_ms:
            time.sleep(0.1)
        for client in self.clients:
            client.stopping.set()
        for client in self.clients:
            client.join(timeout=METADATA_CALL_TIMEOUT_S * 2)
