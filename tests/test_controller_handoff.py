"""SIGTERM on the controller leader hands leadership over before the process stops.

Property checked, with 3 real controller processes whose election timeout is long
(1.5-2 s): under a loop of metadata writes (a retrying client), SIGTERM on the leader
makes another node leader by a hand-over, not by an election after its timeout: the old
leader logs that it handed leadership over and never leads again, the new one that the
previous leader handed it over (its last leadership: it stood for election in the term
right after the one whose leader asked it);
the old leader exits with status 0, no write fails and writes go on on the new leader.
How long writes pause is timed by `python -m bench.controller_bench --only handover`,
not here (a loaded machine stalls fdatasync and ticks for longer than a timeout).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.errors import AlreadyExists, MqmetaError
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

SLOW_ELECTIONS = {"election_min_ms": 1500, "election_max_ms": 2000, "leader_fallback_ms": 3000}
HANDED = "leadership handed over before stopping"
TOOK_OVER = "the previous leader handed leadership over"
LED, STEPPED_DOWN = "Raft leader now", "no longer the Raft leader"
WRITES_MAX = 5000


class WriteLoop(threading.Thread):
    """Creates topics one by one until stopped; notes when each write was committed."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.client = cluster.client(timeout_s=10.0)
        self.committed: list[float] = []
        self.failed: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        for i in range(WRITES_MAX):
            if self.stop_event.is_set():
                break
            try:
                self.client.call("CreateTopic", pb.TopicSpec(name=f"handover-{i}", queue_count=1))
                self.committed.append(time.monotonic())
            except AlreadyExists:  # retried after an outcome the client did not see: committed
                self.committed.append(time.monotonic())
            except MqmetaError as error:
                self.failed.append(str(error))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=20)
        self.client.close()

    def longest_pause_ms(self) -> float:
        times = self.committed
        return max(b - a for a, b in zip(times, times[1:], strict=False)) * 1000


def test_sigterm_on_the_leader_hands_leadership_over(tmp_path):
    with Cluster(tmp_path / "c", raft_settings=SLOW_ELECTIONS).start() as cluster:
        old = cluster.leader_id()
        loop = WriteLoop(cluster)
        loop.start()
        try:
            wait_for(lambda: len(loop.committed), 20, "20 committed writes", until=lambda n: n >= 20)
            process = cluster.supervisor.children[old]
            process.send_signal(signal.SIGTERM)
            new = cluster.leader_id(exclude=old, timeout_s=10)
            assert process.wait(timeout=10) == 0
            done = len(loop.committed)
            wait_for(
                lambda: len(loop.committed), 20, "writes on the new leader", until=lambda n: n >= done + 20
            )
        finally:
            loop.stop()
        assert new != old
        assert loop.failed == [], loop.failed[:3]
        print(f"writes paused at most {loop.longest_pause_ms():.0f} ms across the handover")
        old_log, new_log = ((cluster.root / "logs" / f"{n}.log").read_text() for n in (old, new))
        assert HANDED in old_log, old_log[-2000:]
        after_stepping_down = old_log.rsplit(STEPPED_DOWN, 1)[-1]
        assert STEPPED_DOWN in old_log and LED not in after_stepping_down, old_log[-2000:]  # never led again
        led = [line for line in new_log.splitlines() if LED in line]
        assert led and TOOK_OVER in led[-1], new_log[-2000:]  # the hand-over made it leader, last
