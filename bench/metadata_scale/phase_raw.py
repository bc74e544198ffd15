"""Metadata at scale, phase raw: a raw pysyncobj cluster's entries/s ceiling."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r
from bench.metadata_scale.fleet import ChildPool
from bench.raw_raft import RawSpec, raw_node

# Phase: raw pysyncobj --------------------------------------------------------------------------


def raw_phase(root: Path, entry_bytes: int, seconds: float) -> dict[str, Any]:
    from mqmeta.cluster.ports import PortReservation

    secret = (root / "cluster" / "secret").read_text().strip()
    with PortReservation.pick(3) as reserved:  # released before the raw nodes bind them
        addresses = reserved.addresses
    pool = ChildPool("raw")
    try:
        spec = RawSpec(secret=secret, base="fixes", bind_own_address=True, idle_s=120.0)
        pool.start(raw_node, [(i, addresses, spec, str(root / f"raw{i}")) for i in range(3)])
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
