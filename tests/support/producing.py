"""Producing into a real cluster's broker set under faults, and checking what came back."""

from __future__ import annotations

import threading
import time
from collections import Counter

from mqmeta.broker_client import Producer
from mqmeta.errors import MqmetaError

# The broker flags of the failover tests: a slave that lags 1.5 s leaves the SyncStateSet;
# a send not acknowledged within 3 s fails (outcome unknown).
FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]


# A produce loop under test is paced: its volume must not grow with the brokers' speed (an
# unpaced loop reached its count bound mid-test once sends got faster, CI runs 11 and 19).
PRODUCE_RATE_MAX = 1_000  # messages a second
PRODUCED_MAX = 200_000  # 200 s at that rate: longer than any test's timeout


class ProduceLoop(threading.Thread):
    """Sends batches, paced at PRODUCE_RATE_MAX, until stopped; remembers what was
    acknowledged and what failed."""

    def __init__(self, cluster, prefix: str, batch: int = 5) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(cluster.namesrv, timeout_s=8.0)
        self.prefix, self.batch = prefix, batch
        self.acked: list[str] = []
        self.ack_times: list[float] = []  # time.monotonic() of each acknowledged batch
        self.unknown: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        i = 0
        started = time.monotonic()
        while not self.stop_event.is_set() and i < PRODUCED_MAX:
            ahead_s = started + i / PRODUCE_RATE_MAX - time.monotonic()
            if ahead_s > 0 and self.stop_event.wait(ahead_s):
                break
            values = [f"{self.prefix}-{i + k}" for k in range(self.batch)]
            i += self.batch
            try:
                self.producer.send("Orders", [v.encode() for v in values])
                self.acked += values
                self.ack_times.append(time.monotonic())
            except MqmetaError:
                self.unknown += values

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=20)
        self.producer.close()


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
