"""The queue workload through the official RocketMQ 5 Python client (`--client rocketmq`).

The same history as the native workload (chaos/workloads.py), so the checkers and the
audit's H1 apply unchanged: producer i sends the values of its sharding keys `p{i}-k{j}`
in sequence, with body `value|key|send ms`; here the key is the message's FIFO message
group on a FIFO topic, so the broker keeps each key in one queue and in order (the
official client cannot pick a queue). `consumers` SimpleConsumers of one group receive,
record and acknowledge.

A send the client saw succeed is SUCCESS. A failed send is UNKNOWN unless the broker
refused it as bad input: the 5.1.2 client retries a failed send up to three times with the
same message id, and one attempt may have been written before a later one was refused.
The official client dials the addresses it is given (routes name the brokers' real
addresses): its links do not go through the fault proxies, which is what the native
workload's "clients are never partitioned" already means. It writes its logs under
$HOME/logs, so HOME points into the run's output dir when it is first imported.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

from mqmeta.chaos.history import HistoryRecorder, RequestEvent, ResponseEvent, Result
from mqmeta.chaos.workloads import (
    KEYS_PER_PRODUCER,
    TOPIC,
    WorkloadConfig,
    _Paced,
    drain_after_producing,
    record_dequeue,
    stop_threads,
)

from mqmeta.clock import wall_ms

GROUP = "chaos-checker"
RECEIVE_BATCH = 16
INVISIBLE_S = 10
AWAIT_S = 1
REQUEST_TIMEOUT_S = 3


def official_client(log_home: Path) -> Any:
    """The `rocketmq` package, first imported with HOME at `log_home` (its log directory)."""
    log_home.mkdir(parents=True, exist_ok=True)
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(log_home)
    try:
        import rocketmq
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
    return rocketmq


class _Producer(_Paced):
    def __init__(
        self, rmq: Any, client_id: int, namesrv: str, recorder: HistoryRecorder, interval_s: float
    ) -> None:
        super().__init__(f"rmq-producer-{client_id}", interval_s)
        self.rmq = rmq
        self.client_id = client_id
        self.recorder = recorder
        config = rmq.ClientConfiguration(namesrv, rmq.Credentials(), request_timeout=REQUEST_TIMEOUT_S)
        self.producer = rmq.Producer(config, (TOPIC,))
        self.producer.startup()
        self.keys = [f"p{client_id}-k{j}" for j in range(KEYS_PER_PRODUCER)]
        self.sequence = itertools.count()
        self.acknowledged: set[str] = set()
        self.last_success_ms = 0

    def operate(self) -> None:
        from rocketmq.v5.exception import BadRequestException, IllegalArgumentException

        sequence = next(self.sequence)
        key = self.keys[sequence % len(self.keys)]
        value = f"{self.client_id}-{sequence}"
        sent_ms = wall_ms()
        self.recorder.record(RequestEvent(self.client_id, "enqueue", value, key, sent_ms))
        message = self.rmq.Message()
        message.topic, message.body = TOPIC, f"{value}|{key}|{sent_ms}".encode()
        message.message_group, message.keys = key, key
        info = None
        try:
            self.producer.send(message)
            result = Result.SUCCESS
            self.acknowledged.add(value)
            self.last_success_ms = wall_ms()
        except (BadRequestException, IllegalArgumentException) as error:
            result, info = Result.FAILURE, _info(error)
        except Exception as error:  # timeouts, refusals after a retry, a dead master: unknown
            result, info = Result.UNKNOWN, _info(error)
        done_ms = wall_ms()
        self.recorder.record(
            ResponseEvent(self.client_id, "enqueue", result, value, key, done_ms, done_ms - sent_ms, info)
        )

    def close(self) -> None:
        self.producer.shutdown()


def _info(error: Exception) -> str:
    return f"{type(error).__name__}: {error}".replace("\t", " ").replace("\n", " ")[:200]


class _Consumer(threading.Thread):
    def __init__(self, rmq: Any, namesrv: str, recorder: HistoryRecorder, index: int) -> None:
        super().__init__(name=f"rmq-consumer-{index}", daemon=True)
        self.recorder = recorder
        self.client_id = -index
        config = rmq.ClientConfiguration(namesrv, rmq.Credentials(), request_timeout=REQUEST_TIMEOUT_S)
        self.consumer = rmq.SimpleConsumer(config, GROUP, {TOPIC: rmq.FilterExpression()}, AWAIT_S)
        self.consumer.startup()
        self.stopping = threading.Event()
        self.delivered: set[str] = set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                messages = self.consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
            except Exception:  # a queue of a dead master until the route refreshes
                self.stopping.wait(0.2)
                continue
            for message in messages:
                self._record(message.body)
                try:
                    self.consumer.ack(message)
                except Exception:
                    pass  # delivered again later: the checkers skip re-deliveries
        self.consumer.shutdown()

    def _record(self, body: bytes) -> None:
        self.delivered.add(record_dequeue(self.recorder, self.client_id, body))


class RmqQueueWorkload:
    """The queue workload's interface (start, stop, delivered) over the official client."""

    def __init__(
        self, namesrv: str, recorder: HistoryRecorder, config: WorkloadConfig, log_home: Path
    ) -> None:
        rmq = official_client(log_home)
        interval_s = config.concurrency / max(config.rate_per_s, 0.1)
        self.consumers = [_Consumer(rmq, namesrv, recorder, i) for i in range(config.consumers)]
        self.producers = [
            _Producer(rmq, i + 1, namesrv, recorder, interval_s) for i in range(config.concurrency)
        ]

    def delivered(self) -> set[str]:
        return set().union(*(c.delivered for c in self.consumers))

    def start(self) -> None:
        for thread in [*self.consumers, *self.producers]:
            thread.start()

    def stop(self, drain_s: float, healed_ms: int = 0) -> None:
        """As QueueWorkload.stop (drain_after_producing), then stops the consumers."""
        drain_after_producing(self.producers, self.delivered, drain_s, healed_ms)
        stop_threads(self.consumers)
