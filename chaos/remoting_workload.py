"""The queue workload through RocketMQ 4.x's C++ client (`--client remoting`).

The same history as the native workload (chaos/workloads.py), so the checkers and the
audit's H1 apply unchanged: producer i sends the values of its sharding keys `p{i}-k{j}`
in sequence, with body `value|key|send ms`, as orderly sends (a key's messages go to one
queue, in order); `consumers` orderly PushConsumers of one group receive and record (the
client locks each queue, so one key is consumed in order).

The client is rocketmq-client-python 2.0.0 over the C++ client's librocketmq.so, which
cannot share a process with the official RocketMQ 5 client (both import as `rocketmq`):
each producer and consumer runs chaos/remoting_driver.py in a process of its own, which
prints one JSON line per event; a thread here reads the lines as they come and records
them. Where the client is: $MQMETA_REMOTING_CLIENT (the directory holding its `rocketmq`
package) and $MQMETA_REMOTING_LIBRARY (the directory holding librocketmq.so).

A send the client saw succeed is SUCCESS; any failed send is UNKNOWN (the client retries a
send on another attempt, one of which may have been written). The client dials the
nameserver's remoting proxy, which dials the brokers: its links do not go through the
fault proxies, as with `--client rocketmq`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from mqmeta.chaos.history import HistoryRecorder, RequestEvent, ResponseEvent, Result
from mqmeta.chaos.workloads import (
    KEYS_PER_PRODUCER,
    TOPIC,
    WorkloadConfig,
    drain_after_producing,
    record_dequeue,
)

from mqmeta.errors import InvalidArgument

GROUP = "chaos-checker"
DRIVER = Path(__file__).with_name("remoting_driver.py")
CLIENT_ENV = "MQMETA_REMOTING_CLIENT"
LIBRARY_ENV = "MQMETA_REMOTING_LIBRARY"
READ_PAUSE_S = 0.05
STOP_TIMEOUT_S = 30.0


def client_environment(home: Path) -> dict[str, str]:
    """The driver processes' environment; InvalidArgument naming what is missing."""
    directory, library = os.environ.get(CLIENT_ENV, ""), os.environ.get(LIBRARY_ENV, "")
    if not (directory and (Path(directory) / "rocketmq").is_dir()):
        raise InvalidArgument(
            f"--client remoting needs ${CLIENT_ENV}: a directory holding rocketmq-client-python 2.0.0 "
            "(pip install --target DIR rocketmq-client-python==2.0.0)"
        )
    if not (library and (Path(library) / "librocketmq.so").is_file()):
        raise InvalidArgument(f"--client remoting needs ${LIBRARY_ENV}: the directory holding librocketmq.so")
    home.mkdir(parents=True, exist_ok=True)  # the client writes its logs under $HOME/logs
    return {**os.environ, "PYTHONPATH": directory, "LD_LIBRARY_PATH": library, "HOME": str(home)}


class _Driven(threading.Thread):
    """One driver process and the thread that records its lines."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], output: Path) -> None:
        super().__init__(name=name, daemon=True)
        self.output = output
        self.stop_file = output.with_suffix(".stop")
        self.stopping = threading.Event()
        with open(output, "wb") as sink, open(output.with_suffix(".err"), "wb") as errors:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), *args, str(self.stop_file)],
                stdout=sink,
                stderr=errors,
                env=env,
                cwd=env["HOME"],
            )

    def run(self) -> None:
        with open(self.output, "rb") as lines:
            while True:
                exited = self.process.poll() is not None  # read to the end after it exits
                line = lines.readline()
                if line.endswith(b"\n"):
                    self.record(json.loads(line))
                    continue
                lines.seek(lines.tell() - len(line))  # a line still being written
                if exited:
                    return
                time.sleep(READ_PAUSE_S)

    def record(self, line: dict) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.join(STOP_TIMEOUT_S)

    def join(self, timeout: float | None = None) -> None:
        """stop_producers_after_recovery sets `stopping` and joins: the process stops then."""
        if self.stopping.is_set() and not self.stop_file.exists():
            self.stop()
            return
        super().join(timeout)


class _Producer(_Driven):
    def __init__(
        self, client_id: int, namesrv: str, recorder: HistoryRecorder, interval_s: float, env, root: Path
    ):
        args = ["produce", namesrv, TOPIC, f"chaos-producer-{client_id}", str(client_id)]
        args += [str(KEYS_PER_PRODUCER), str(interval_s)]
        super().__init__(f"remoting-producer-{client_id}", args, env, root / f"producer-{client_id}.jsonl")
        self.client_id = client_id
        self.recorder = recorder
        self.acknowledged: set[str] = set()
        self.last_success_ms = 0
        self._sent_ms: dict[str, int] = {}

    def record(self, line: dict) -> None:
        value, key, at_ms = line["value"], line["key"], int(line["ms"])
        if line["kind"] == "request":
            self._sent_ms[value] = at_ms
            self.recorder.record(RequestEvent(self.client_id, "enqueue", value, key, at_ms))
            return
        result = Result.SUCCESS if line.get("ok") else Result.UNKNOWN
        if result is Result.SUCCESS:
            self.acknowledged.add(value)
            self.last_success_ms = at_ms
        latency = at_ms - self._sent_ms.pop(value, at_ms)
        self.recorder.record(
            ResponseEvent(self.client_id, "enqueue", result, value, key, at_ms, latency, line.get("info"))
        )


class _Consumer(_Driven):
    def __init__(self, index: int, namesrv: str, recorder: HistoryRecorder, env, root: Path):
        args = ["consume", namesrv, TOPIC, GROUP]
        super().__init__(f"remoting-consumer-{index}", args, env, root / f"consumer-{index}.jsonl")
        self.client_id = -index
        self.recorder = recorder
        self.delivered: set[str] = set()

    def record(self, line: dict) -> None:
        self.delivered.add(record_dequeue(self.recorder, self.client_id, line["body"].encode()))


class RemotingQueueWorkload:
    """The queue workload's interface (start, stop, delivered) over the C++ client."""

    def __init__(self, namesrv: str, recorder: HistoryRecorder, config: WorkloadConfig, root: Path) -> None:
        env = client_environment(root / "home")
        interval_s = config.concurrency / max(config.rate_per_s, 0.1)
        self.consumers = [_Consumer(i, namesrv, recorder, env, root) for i in range(config.consumers)]
        self.producers = [
            _Producer(i + 1, namesrv, recorder, interval_s, env, root) for i in range(config.concurrency)
        ]

    def delivered(self) -> set[str]:
        return set().union(*(c.delivered for c in self.consumers))

    def start(self) -> None:
        for thread in [*self.consumers, *self.producers]:
            thread.start()

    def stop(self, drain_s: float, healed_ms: int = 0) -> None:
        """As QueueWorkload.stop (drain_after_producing), then stops the consumers."""
        drain_after_producing(self.producers, self.delivered, drain_s, healed_ms)
        for consumer in self.consumers:
            consumer.stop()
