"""Metadata at scale, phase raw: a raw pysyncobj cluster's entries/s ceiling."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import (
    _r,
    latency_summary,
)
from bench.metadata_scale.fleet import ChildPool

# Phase: raw pysyncobj --------------------------------------------------------------------------


def _raw_node(index: int, addresses: list[str], secret: str, data_dir: str, conn) -> None:
    """A pysyncobj node with the controller's SyncObjConf whose replicated method stores
    nothing but the size of its argument; obeys the parent over a Pipe."""
    import mqmeta.controller.raft_node as raft_node
    from mqmeta.controller import pysyncobj_compat
    from pysyncobj import FAIL_REASON, replicated

    raft_node.install_pysyncobj_patches()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    conf = raft_node._syncobj_conf(raft_node.RaftSettings(secret=secret), Path(data_dir), addresses[index])

    class Sink(pysyncobj_compat.RaftFixes):  # the controller's two Raft fixes, nothing else
        def __init__(self) -> None:
            super().__init__(addresses[index], [a for a in addresses if a != addresses[index]], conf)
            self.bytes_applied = 0

        @replicated
        def put(self, payload: str) -> int:
            self.bytes_applied += len(payload)
            return self.bytes_applied

    node = Sink()
    try:
        for _ in range(10_000):
            if not conn.poll(120.0):
                return
            message = conn.recv()
            if message[0] == "stop":
                conn.send(("ok", None))
                return
            if message[0] == "is_leader":
                conn.send(("ok", pysyncobj_compat.is_leader(node)))
                continue
            if message[0] == "sequential":
                conn.send(("ok", _raw_sequential(node, message[1], message[2])))
                continue
            _, entry_bytes, window, seconds = message
            conn.send(("ok", _raw_window(node, "x" * entry_bytes, window, seconds, FAIL_REASON.SUCCESS)))
    finally:
        node.destroy()


def _raw_sequential(node, count: int, seconds: float) -> dict[str, Any]:
    """One tiny entry at a time, each waited for: what a barrier costs this Raft library on
    this disk, without gRPC or the controller (the floor of a linearizable read)."""
    from pysyncobj import SyncObjException

    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        try:
            node.put("b", sync=True, timeout=2.0)
        except SyncObjException:
            errors += 1
            continue
        latencies.append(time.perf_counter() - t0)
    out = latency_summary(latencies)
    out["errors"] = errors
    return out


def _raw_window(node, payload: str, window: int, seconds: float, success: int) -> dict[str, Any]:
    slots = threading.BoundedSemaphore(window)
    done: list[float] = []
    errors = [0]

    def callback(result, error) -> None:
        if error == success:
            done.append(time.monotonic())
        else:
            errors[0] += 1
        slots.release()

    start = time.monotonic()
    end = start + seconds
    for _ in range(10_000_000):
        if time.monotonic() >= end:
            break
        if slots.acquire(timeout=1.0):
            node.put(payload, callback=callback)
    counted = [t for t in done if t <= end]
    return {"entries_per_s": _r(len(counted) / seconds, 1), "errors": errors[0], "window": window}


def raw_phase(root: Path, entry_bytes: int, seconds: float) -> dict[str, Any]:
    from mqmeta.cluster.ports import PortReservation

    secret = (root / "cluster" / "secret").read_text().strip()
    with PortReservation.pick(3) as reserved:  # released before the raw nodes bind them
        addresses = reserved.addresses
    pool = ChildPool("raw")
    try:
        pool.start(_raw_node, [(i, addresses, secret, str(root / f"raw{i}")) for i in range(3)])
        leader = None
        deadline = time.monotonic() + 30.0
        while leader is None and time.monotonic() < deadline:
            for i in range(3):
                pool.conns[i].send(("is_leader",))
                if pool.receive(i, 10.0):
                    leader = i
            time.sleep(0.1)
        if leader is None:
            return {"error": "the raw pysyncobj cluster elected no leader in 30 s"}
        pool.conns[leader].send(("sequential", 100_000, seconds))
        out: dict[str, Any] = {"sequential_tiny_entries": pool.receive(leader, seconds + 60.0)}
        out.update({"entry_bytes": entry_bytes, "windows": []})
        for window in (1, 4):
            pool.conns[leader].send(("put", entry_bytes, window, seconds))
            result = pool.receive(leader, seconds + 60.0)
            result["mb_per_s"] = _r(result["entries_per_s"] * entry_bytes / 1e6, 2)
            out["windows"].append(result)
        out["what"] = (
            "3 pysyncobj processes with the controller's SyncObjConf and Raft fixes (journal with fsync, "
            "password), "
            "a replicated method that does nothing with entries of the load's mean entry size; "
            "window 1 is what the controller's proposer does (one entry in flight)"
        )
        return out
    finally:
        pool.stop()
