"""Metadata at scale: the monitors running through the whole bench (snapshots, leader changes)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import (
    _r,
)

# Monitors running through the whole bench -------------------------------------------------


class SnapshotMonitor:
    """Polls each node's data directory: a snapshot is being written while raft.snapshot.tmp
    exists (pysyncobj writes there, then renames); records each one's lifetime and size."""

    POLL_S = 0.01

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs
        self.done: list[dict[str, Any]] = []
        self.open: dict[str, float] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="snapshot-monitor", daemon=True)

    def start(self) -> SnapshotMonitor:
        self.thread.start()
        return self

    def _run(self) -> None:
        last = {n: self._stat(d / "raft.snapshot") for n, d in self.dirs.items()}
        for _ in range(10**8):
            if self.stop_event.wait(self.POLL_S):
                return
            for node, directory in self.dirs.items():
                writing = (directory / "raft.snapshot.tmp").exists()
                now = time.monotonic()
                if writing and node not in self.open:
                    self.open[node] = now
                current = self._stat(directory / "raft.snapshot")
                if current != last[node] and current is not None:
                    started = self.open.pop(node, None)
                    self.done.append(
                        {
                            "node": node,
                            "at": now,
                            "write_s": None if started is None else _r(now - started, 3),
                            "bytes": current[1],
                        }
                    )
                    last[node] = current
                elif not writing and node in self.open and now - self.open[node] > 600:
                    self.open.pop(node)

    @staticmethod
    def _stat(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=2.0)


class LeaderMonitor:
    """Polls every node's GetMetadata (leader, term) so that each phase can report leader
    changes (a node stalled by a snapshot loses its leadership)."""

    POLL_S = 0.25

    def __init__(self, addresses: dict[str, str]) -> None:
        self.addresses = addresses
        self.samples: list[tuple[float, str, str, int]] = []  # (monotonic, node, leader, term)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="leader-monitor", daemon=True)

    def start(self) -> LeaderMonitor:
        self.thread.start()
        return self

    def _run(self) -> None:
        from mqmeta.client import ControllerClient
        from mqmeta.errors import MqmetaError
        from mqmeta.pb import controller_pb2 as pb

        clients = {n: ControllerClient([a], timeout_s=0.5) for n, a in self.addresses.items()}
        try:
            for _ in range(10**7):
                if self.stop_event.wait(self.POLL_S):
                    return
                for node, client in clients.items():
                    try:
                        meta = client.get_metadata(pb.GetMetadataRequest())
                    except MqmetaError:
                        continue
                    self.samples.append((time.monotonic(), node, meta.leader_id, meta.term))
        finally:
            for client in clients.values():
                client.close()

    def changes(self, start: float, end: float) -> dict[str, Any]:
        window = [s for s in self.samples if start <= s[0] <= end]
        terms = sorted({s[3] for s in window})
        leaders = sorted({s[2] for s in window if s[2]})
        return {"terms_seen": terms, "leaders_seen": leaders, "leader_changes": max(0, len(terms) - 1)}

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=3.0)
