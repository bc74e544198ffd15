"""Metadata at scale: the flags, the phases in order, the summary and cleanup."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchlib import (
    _r,
    _ratio,
    environment,
    machine_busy,
    machine_busy_percent,
    run_main,
    stop_clusters,
)
from bench.metadata_scale.cluster import ScaleCluster
from bench.metadata_scale.common import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    TARGETS,
    TRANSPORTS,
    log,
    process_memory,
    sizes_for,
    thread_count,
)
from bench.metadata_scale.fleet import BrokerFleet, ChildPool
from bench.metadata_scale.monitors import LeaderMonitor, SnapshotMonitor
from bench.metadata_scale.phase_heartbeat import capacity_phase, heartbeat_and_route_phase
from bench.metadata_scale.phase_load import load_phase
from bench.metadata_scale.phase_raw import raw_phase
from bench.metadata_scale.phase_restart import restart_phase
from bench.metadata_scale.phase_snapshot import pickle_baseline, snapshot_phase
from bench.metadata_scale.phase_verify import verify_phase
from bench.metadata_scale.phase_watch import watch_phase

# Orchestration ------------------------------------------------------------------------------------

CLUSTERS: list[ScaleCluster] = []
LEADERS: list[LeaderMonitor] = []
POOLS: list[ChildPool] = []
PHASES = ("load", "verify", "heartbeat", "capacity", "snapshot", "raw", "watch", "restart")


def parse_args(argv: list[str]) -> argparse.Namespace:
    import bench.metadata_scale as package

    p = argparse.ArgumentParser(
        prog="python -m bench.metadata_scale", description=(package.__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--scale", type=float, default=1.0, help="size factor (1.0 = the issue's sizes)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--skip", default="", help=f"comma list of phases to skip: {','.join(PHASES[2:])}")
    p.add_argument("--phase-s", type=float, default=0.0, help="seconds per measuring window")
    p.add_argument("--route-clients", type=int, default=4)
    p.add_argument("--load-threads", type=int, default=4)
    p.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        default=DEFAULT_HEARTBEAT_INTERVAL_MS,
        help=f"the fleet's heartbeat interval (default: the controllers', {DEFAULT_HEARTBEAT_INTERVAL_MS})",
    )
    p.add_argument(
        "--heartbeat-transport",
        choices=TRANSPORTS,
        default="stream",
        help="how the fleet heartbeats (stream: one HeartbeatStream per broker, as the broker agent does)",
    )
    p.add_argument(
        "--capacity-transports",
        default=",".join(TRANSPORTS),
        help="the capacity phase's steps for each of these (the unary call is the baseline)",
    )
    p.add_argument(
        "--capacity-intervals",
        default="",
        help="heartbeat intervals (ms) to try (default: the fleet's interval, then 1/2, 1/4, 1/8 of it)",
    )
    p.add_argument("--compaction-min-entries", type=int, default=0, help="raft setting (0: the node default)")
    p.add_argument("--watch-streams", type=int, default=0, help="0: one per broker")
    p.add_argument("--watch-rounds", type=int, default=5)
    p.add_argument("--watch-styles", default="broker,cluster", help="watch phase: broker,cluster or one")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    p.add_argument("--budget-s", type=float, default=0.0, help="watchdog (default from the scale)")
    return _derived(p, p.parse_args(argv))


def _derived(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The flags checked, split into lists, and the bounds that follow from --scale."""
    if args.scale <= 0 or args.scale > 10:
        p.error("--scale must be in (0, 10]")
    small = args.scale < 0.2
    args.phase_s = args.phase_s or (2.0 if small else 10.0)
    args.warmup_s = 0.5 if small else 2.0
    # a whole phase even when small: the kernel counts CPU in 10 ms ticks, and a leader's
    # few milliseconds per second of heartbeats read as 0 in a shorter window
    args.capacity_s = args.phase_s if small else 6.0
    if not 50 <= args.heartbeat_interval_ms <= 60_000:
        p.error("--heartbeat-interval-ms must be in [50, 60000] (the controllers' bounds)")
    args.capacity_intervals = [int(x) for x in args.capacity_intervals.split(",") if x] or [
        max(1, args.heartbeat_interval_ms // k) for k in (1, 2, 4, 8)
    ]
    args.capacity_transports = [x for x in args.capacity_transports.split(",") if x]
    if not args.capacity_transports or not set(args.capacity_transports) <= set(TRANSPORTS):
        p.error(f"--capacity-transports takes one or more of {', '.join(TRANSPORTS)}")
    args.watch_styles = [x for x in args.watch_styles.split(",") if x]
    if not set(args.watch_styles) <= {"broker", "cluster"}:
        p.error("--watch-styles takes broker, cluster or both")
    args.route_reads = 100_000
    args.snapshot_reads_max = 200_000
    args.snapshot_s_max = 120.0 if args.scale >= 0.05 else 30.0
    args.watch_open_s = 20.0 if small else 120.0
    args.watch_wait_s = 5.0 if small else 15.0
    args.restart_s_max = 60.0 if small else 120.0
    args.budget_s = args.budget_s or (240.0 if small else 900.0 + 1500.0 * args.scale)
    args.profile = not args.no_profile
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = args.skip - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    return args


def _phase(result: dict[str, Any], name: str, args, fn) -> Any:
    if name in args.skip:
        result[name] = {"skipped": True}
        return None
    t0 = time.monotonic()
    log(f"phase {name}")
    value = fn()
    result.setdefault("phase_seconds", {})[name] = _r(time.monotonic() - t0, 1)
    if LEADERS:
        result.setdefault("leader_changes_by_phase", {})[name] = LEADERS[0].changes(t0, time.monotonic())
    result[name] = value
    return value


def memory_snapshot(cluster: ScaleCluster) -> dict[str, Any]:
    return {
        name: dict(process_memory(pid), threads=thread_count(pid)) for name, pid in cluster.pids().items()
    }


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    sizes = sizes_for(args.scale)
    result["sizes"] = sizes
    raft_settings = (
        {"compaction_min_entries": args.compaction_min_entries} if args.compaction_min_entries else {}
    )
    result["raft_settings_overrides"] = raft_settings
    cluster = ScaleCluster(root, raft_settings)
    CLUSTERS.append(cluster)
    t0 = time.monotonic()
    cluster.start()
    result["cluster"] = {
        "start_to_ready_s": _r(time.monotonic() - t0, 2),
        "controllers": {n: cluster.grpc(n) for n in cluster.ids},
        "nameserver": cluster.namesrv,
    }
    result["memory_empty"] = memory_snapshot(cluster)
    snapshots = SnapshotMonitor(cluster.data_dirs()).start()
    leaders = LeaderMonitor({n: cluster.grpc(n) for n in cluster.ids}).start()
    LEADERS.append(leaders)
    fleet = BrokerFleet(sizes, cluster.addresses())
    POOLS.append(fleet)
    try:
        _run_phases(args, root, result, sizes, cluster, fleet, snapshots, leaders)
    finally:
        snapshots.stop()
        leaders.stop()
        result["leader_changes_whole_run"] = leaders.changes(0.0, time.monotonic())


def _run_phases(args, root, result, sizes, cluster, fleet, snapshots, leaders) -> None:
    load = _phase(result, "load", args, lambda: load_phase(cluster, fleet, sizes, args))
    load.pop("registered", None)
    _phase(result, "verify", args, lambda: verify_phase(cluster, sizes))
    result["memory"] = memory_snapshot(cluster)
    log(f"memory: {result['memory']}")
    both = _phase(
        result, "heartbeat", args, lambda: heartbeat_and_route_phase(cluster, fleet, sizes, args, root)
    )
    if both is not None:
        result["heartbeat"], result["route"] = both["heartbeat"], both["route"]
    _phase(result, "capacity", args, lambda: capacity_phase(cluster, fleet, sizes, args))
    snap = _phase(result, "snapshot", args, lambda: snapshot_phase(cluster, snapshots, leaders, args, root))
    snapshot_file = cluster.data_dirs()[cluster.ids[0]] / "raft.snapshot"
    if snap is not None and snapshot_file.exists():
        result["snapshot"]["baseline"] = pickle_baseline(snapshot_file)
    entry_bytes = (load or {}).get("topics", {}).get("entry_bytes_mean") or 50_000
    _phase(result, "raw", args, lambda: raw_phase(root, entry_bytes, args.phase_s))
    _phase(result, "watch", args, lambda: watch_phase(cluster, fleet, sizes, args))
    result["memory_after_watch"] = memory_snapshot(cluster)
    _phase(result, "restart", args, lambda: restart_phase(cluster, args))
    result["memory_after_restart"] = memory_snapshot(cluster)


def summarize(result: dict[str, Any]) -> None:
    """Headline figures, targets and same-run ratios (None where a phase did not run)."""

    def get(*path: str) -> Any:
        node: Any = result
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    memory = result.get("memory") or {}
    restart_one = get("restart", "one_node", "serving_s")
    restart_all = get("restart", "all_nodes", "all_serving_s")
    route_p99 = get("route", "sequential", "p99_ms")
    figures = {
        "controller_rss_mb": {n: m.get("rss_mb") for n, m in memory.items() if n != "namesrv"},
        "nameserver_rss_mb": (memory.get("namesrv") or {}).get("rss_mb"),
        "snapshot_bytes": get("snapshot", "snapshot_bytes"),
        "snapshot_write_s": get("snapshot", "write_s_max"),
        "snapshot_longest_read_ms": get("snapshot", "longest_read_ms"),
        "snapshot_leader_changes": get("snapshot", "leader_changes", "leader_changes"),
        "restart_one_node_s": restart_one,
        "restart_all_nodes_s": restart_all,
        "route_p50_ms": get("route", "sequential", "p50_ms"),
        "route_p99_ms": route_p99,
        "route_concurrent_reads_per_s": get("route", "concurrent", "reads_per_s"),
        "route_concurrent_p99_ms": get("route", "concurrent", "p99_ms"),
        "route_change_seen_by_nameserver_p99_ms": get("route", "change_seen_by_nameserver", "p99_ms"),
        "heartbeats_per_s": get("heartbeat", "heartbeats_per_s"),
        "heartbeat_p99_ms": get("heartbeat", "p99_ms"),
        "heartbeat_leader_cpu_percent": get("heartbeat", "leader_cpu_percent"),
        "heartbeat_leader_cpu_ms_each": get("heartbeat", "leader_cpu_ms_per_heartbeat"),
        "heartbeats_sustained_per_s": get("capacity", "stream", "sustained_heartbeats_per_s"),
        "heartbeats_sustained_unary_per_s": get("capacity", "unary", "sustained_heartbeats_per_s"),
        "watch_broker_streams_served": get("watch", "broker_streams", "open", "streams_served"),
        "watch_cluster_streams_served": get("watch", "cluster_streams", "open", "streams_served"),
        "watch_fan_out_streams": get("watch", "cluster_streams", "fan_out", "streams_per_change"),
        "watch_fan_out_p50_ms": get("watch", "cluster_streams", "fan_out", "from_call_p50_ms"),
        "watch_fan_out_p99_ms": get("watch", "cluster_streams", "fan_out", "from_call_p99_ms"),
        "watch_fan_out_max_ms": get("watch", "cluster_streams", "fan_out", "from_call_max_ms"),
        "watch_broker_style_p99_ms": get("watch", "broker_streams", "fan_out", "from_call_p99_ms"),
        "watch_topic_burst_to_broker_streams": get(
            "watch", "broker_streams", "topic_burst", "events_delivered"
        ),
        "load_writes_per_s": get("load", "topics", "writes_per_s"),
        "load_raft_entries_per_s": get("load", "topics", "raft_entries_per_s"),
    }
    result["figures"] = figures
    result["ratios"] = {
        "snapshot_write_vs_plain_pickle_gzip9": _ratio(
            figures["snapshot_write_s"], get("snapshot", "baseline", "stock_pysyncobj_snapshot_s")
        ),
        "heartbeat_leader_cpu_stream_vs_unary": get(
            "capacity", "stream_to_unary", "leader_cpu_us_per_heartbeat_first_measured_step"
        ),
        "route_p99_vs_grpc_floor_p99": _ratio(
            route_p99, get("route", "baselines", "nameserver_health_check", "p99_ms")
        ),
        "route_p99_vs_raw_pysyncobj_commit_p99": _ratio(
            route_p99, get("raw", "sequential_tiny_entries", "p99_ms")
        ),
        "load_entries_per_s_vs_raw_pysyncobj_window1": _ratio(
            figures["load_raft_entries_per_s"], (get("raw", "windows") or [{}])[0].get("entries_per_s")
        ),
    }
    result["targets"] = TARGETS
    result["targets_met"] = {
        "restart_one_node_le_10s": restart_one is not None and restart_one <= TARGETS["restart_one_s_max"],
        "restart_all_nodes_le_10s": restart_all is not None and restart_all <= TARGETS["restart_all_s_max"],
        "route_p99_le_5ms": route_p99 is not None and route_p99 <= TARGETS["route_p99_ms_max"],
    }


def cleanup() -> None:
    for pool in POOLS:
        try:
            pool.stop()
        except Exception as exc:  # keep cleaning the rest
            log(f"cleanup: {exc!r}")
    stop_clusters(CLUSTERS, log)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-scale-"))
    env = {**environment(), "loadavg_before_start": os.getloadavg()}
    result: dict[str, Any] = {"bench": "mqmeta metadata at scale", "scale": args.scale, "env": env}
    busy0 = machine_busy()
    time.sleep(1.0)
    result["env"]["machine_busy_percent_before_start"] = machine_busy_percent(busy0)
    return run_main(
        args, root, result, lambda t0: run(args, root, result), summarize, cleanup, log, watchdog_grace_s=30.0
    )
