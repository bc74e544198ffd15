"""Metadata at scale, phase snapshot: Raft log compaction under reads, with pickle baselines."""

from __future__ import annotations

import gzip
import pickle
import re
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import (
    _r,
    profile_start,
    profile_stop,
)
from bench.metadata_scale.cluster import ScaleCluster
from bench.metadata_scale.common import SNAPSHOT_READERS_PER_NODE, log
from bench.metadata_scale.monitors import LeaderMonitor, SnapshotMonitor
from bench.metadata_scale.phase_heartbeat import _sequential

# Phase: snapshot -----------------------------------------------------------------------------


def snapshot_phase(
    cluster: ScaleCluster, monitor: SnapshotMonitor, leaders: LeaderMonitor, args, root: Path
) -> dict[str, Any]:
    """Linearizable reads on every node until every node has written a new snapshot, the
    log grown by a writer per node (reads add no entry since ReadIndex); the longest read
    meanwhile is the stall a snapshot causes."""
    before = len(monitor.done)
    logged_before = {node: len(lines) for node, lines in _snapshot_log_lines(cluster).items()}
    leader = cluster.leader()
    leader_pid = cluster.pid(leader)
    profile_out = root / "profile-snapshot.txt"
    profiler = profile_start(leader_pid, profile_out) if args.profile and leader_pid else None
    t0 = time.monotonic()
    results = _reads_until_snapshots(cluster, monitor, args, before, t0)
    t1 = time.monotonic()
    written = monitor.done[before:]
    out: dict[str, Any] = {
        "snapshots": [dict(d, at_s=_r(d["at"] - t0, 2), at=None) for d in written],
        "all_nodes_wrote_one": {d["node"] for d in written} >= set(cluster.ids),
        "seconds": _r(t1 - t0, 1),
        "reads_by_node": results,
        "longest_read_ms": max(
            (r.get("max_ms") or 0 for k, r in results.items() if not k.endswith(".writes")), default=None
        ),
        "leader_changes": leaders.changes(t0, t1),
    }
    for item in out["snapshots"]:
        item.pop("at")
    out.update(_snapshot_sizes_and_times(cluster, written, logged_before))
    if args.profile:
        out["leader_profile"] = profile_stop(profiler, profile_out)
    log(
        f"snapshot: {len(written)} written, {out['snapshot_bytes']} bytes, write {out['write_s_max']} s, "
        f"longest read {out['longest_read_ms']} ms, leader changes {out['leader_changes']['leader_changes']}"
    )
    return out


def _reads_until_snapshots(
    cluster: ScaleCluster, monitor: SnapshotMonitor, args, before: int, t0: float
) -> dict[str, dict[str, Any]]:
    """SNAPSHOT_READERS_PER_NODE sequential readers per node until every node has written a
    snapshot after the first `before` (or args.snapshot_s_max); each reader's latencies."""
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    stop = threading.Event()
    results: dict[str, dict[str, Any]] = {}

    def drive(node: str, k: int) -> None:
        with ControllerClient([cluster.grpc(node)], timeout_s=10.0) as client:
            results[f"{node}.{k}"] = _sequential(
                lambda i: client.get_config(pb.GetConfigRequest()),
                args.snapshot_reads_max,
                args.snapshot_s_max,
                stop,
            )

    def write(node: str) -> None:
        """Grows the log: a config update that changes nothing is still an entry."""
        with ControllerClient([cluster.grpc(node)], timeout_s=10.0) as client:
            same = dict(client.get_config(pb.GetConfigRequest()).values)
            unchanged = {"default_queue_count": same.get("default_queue_count", "8")}
            results[f"{node}.writes"] = _sequential(
                lambda i: client.update_config(pb.UpdateConfigRequest(values=unchanged)),
                args.snapshot_reads_max,
                args.snapshot_s_max,
                stop,
            )

    def all_written() -> bool:
        return {d["node"] for d in monitor.done[before:]} >= set(cluster.ids)

    threads = [
        threading.Thread(target=drive, args=(n, k), daemon=True)
        for n in cluster.ids
        for k in range(SNAPSHOT_READERS_PER_NODE)
    ] + [threading.Thread(target=write, args=(n,), daemon=True) for n in cluster.ids]
    for thread in threads:
        thread.start()
    for _ in range(100_000):
        if all_written() or time.monotonic() - t0 > args.snapshot_s_max:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # reads just after the snapshots finish show the tail of the stall
    stop.set()
    for thread in threads:
        thread.join(timeout=30.0)
    return results


def _snapshot_sizes_and_times(
    cluster: ScaleCluster, written: list[dict[str, Any]], logged_before: dict[str, int]
) -> dict[str, Any]:
    sizes = [d["bytes"] for d in written]
    times = [d["write_s"] for d in written if d["write_s"] is not None]
    # A snapshot written between two polls of the monitor (a small one, or a starved
    # monitor thread on a loaded machine) has no time from it: the controllers' own log
    # lines give each snapshot's write time then.
    logged = {
        node: lines[logged_before.get(node, 0) :] for node, lines in _snapshot_log_lines(cluster).items()
    }
    out: dict[str, Any] = {"written_by_node_log": logged, "write_s_source": "monitor"}
    if not times:
        times = [line["write_s"] for lines in logged.values() for line in lines]
        out["write_s_source"] = "node logs"
    out["snapshot_bytes"] = max(sizes) if sizes else None
    out["write_s_max"] = max(times) if times else None
    out["write_s_mean"] = _r(sum(times) / len(times), 3) if times else None
    return out


SNAPSHOT_LOG_LINE = re.compile(r"snapshot at index (\d+) written: (\d+) keys, (\d+) bytes in ([0-9.]+) s")


def _snapshot_log_lines(cluster: ScaleCluster) -> dict[str, list[dict[str, Any]]]:
    """Each node's snapshots as its log reports them (controller/snapshot.py), oldest first."""
    out: dict[str, list[dict[str, Any]]] = {}
    for node in cluster.ids:
        try:
            text = (cluster.harness.root / "logs" / f"{node}.log").read_text(errors="replace")
        except OSError:
            text = ""
        out[node] = [
            {"index": int(m[1]), "keys": int(m[2]), "bytes": int(m[3]), "write_s": float(m[4])}
            for m in SNAPSHOT_LOG_LINE.finditer(text)
        ]
    return out


def load_snapshot_state(path: Path) -> Any:
    """The ControllerState in a node's snapshot file, whichever format wrote it."""
    try:
        from mqmeta.controller.snapshot import read_state  # the controller's own reader, when it has one
    except ImportError:
        read_state = None
    if read_state is not None:
        state = read_state(path)  # format 2 keeps values encoded: decode them all, as before
        return type(state).from_items(state.freeze().items()) if hasattr(state, "freeze") else state
    import pysyncobj.pickle as syncobj_pickle

    with gzip.open(path, "rb") as f:
        data = syncobj_pickle.loads(f.read())
    return data[0]["_state"]


def pickle_baseline(path: Path) -> dict[str, Any]:
    """Plain pickle/unpickle and gzip of the same state, in this process: what a snapshot
    costs at the least, and what pysyncobj's stock snapshot (gzip level 9) costs."""
    t0 = time.perf_counter()
    state = load_snapshot_state(path)
    out: dict[str, Any] = {"read_snapshot_file_s": _r(time.perf_counter() - t0, 3)}
    out["keys"] = len(state.entries)
    t0 = time.perf_counter()
    raw = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    out["pickle_s"] = _r(time.perf_counter() - t0, 3)
    out["pickle_bytes"] = len(raw)
    t0 = time.perf_counter()
    pickle.loads(raw)
    out["unpickle_s"] = _r(time.perf_counter() - t0, 3)
    for level in (9, 1):
        t0 = time.perf_counter()
        packed = gzip.compress(raw, compresslevel=level)
        out[f"gzip{level}_s"] = _r(time.perf_counter() - t0, 3)
        out[f"gzip{level}_bytes"] = len(packed)
    t0 = time.perf_counter()
    gzip.decompress(packed)
    out["gunzip_s"] = _r(time.perf_counter() - t0, 3)
    out["stock_pysyncobj_snapshot_s"] = _r(out["pickle_s"] + out["gzip9_s"], 3)
    out["what"] = (
        "stock_pysyncobj_snapshot_s: pickle + gzip level 9 (pysyncobj's Serializer), the time its "
        "tick thread is blocked when it writes a snapshot in-thread"
    )
    del state
    return out
