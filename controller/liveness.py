"""Broker liveness, kept in memory on the leader only (heartbeats are chatter, not log).

Pure bookkeeping: every method takes `now_ms` (monotonic), so tests drive the clock.
A node that has just become leader has heard nobody yet; for one dead-after interval
it gives every registered broker the benefit of the doubt and declares nobody dead.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

from mqmeta.dialmap import dial

PROBE_TIMEOUT_S = 0.3  # a connect to a live (or stopped) process answers within this here

BrokerKey = tuple[str, str, int]  # cluster, broker name, broker id


@dataclass
class Heartbeat:
    seen_ms: int
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    priority: int = 0


class Liveness:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: dict[BrokerKey, Heartbeat] = {}
        self._leader_since_ms: int | None = None

    def on_leadership(self, is_leader: bool, now_ms: int) -> bool:
        """Tracks leadership; returns True when this node has just become leader."""
        with self._lock:
            if not is_leader:
                self._leader_since_ms = None
                self._beats.clear()
                return False
            if self._leader_since_ms is None:
                self._leader_since_ms = now_ms
                return True
            return False

    def record(self, key: BrokerKey, beat: Heartbeat) -> None:
        with self._lock:
            self._beats[key] = beat

    def forget(self, key: BrokerKey) -> None:
        with self._lock:
            self._beats.pop(key, None)

    def in_grace(self, now_ms: int, dead_after_ms: int) -> bool:
        with self._lock:
            since = self._leader_since_ms
        return since is None or now_ms - since < dead_after_ms

    def alive(
        self, cluster: str, broker_name: str, broker_ids: list[int], now_ms: int, dead_after_ms: int
    ) -> dict[int, Heartbeat]:
        """Which of broker_ids count as alive now, with what they last reported."""
        grace = self.in_grace(now_ms, dead_after_ms)
        result: dict[int, Heartbeat] = {}
        with self._lock:
            for broker_id in broker_ids:
                beat = self._beats.get((cluster, broker_name, broker_id))
                if beat is not None and now_ms - beat.seen_ms < dead_after_ms:
                    result[broker_id] = beat
                elif beat is None and grace:
                    result[broker_id] = Heartbeat(seen_ms=now_ms)
        return result


def listener_gone(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Is nothing listening at `address` any more (the connection is refused)?

    A killed process's kernel closes its listening socket at once, so a refusal proves
    that the process serving `address` is gone (or has stopped serving: a broker stops
    its server only on its way out, and one restarted starts fenced, without a lease).
    Anything else (accepted, timed out, unreachable) proves nothing: a stopped (SIGSTOP)
    or partitioned process may still hold its lease, so it is left to dead-after. A
    firewall that rejects with a TCP reset would fake a refusal: do not put one between
    the controllers and the brokers."""
    host, _, port = dial(address).rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False
