"""Metadata at scale: the sizes, bounds and names every phase shares."""

from __future__ import annotations

from pathlib import Path

from mqmeta.controller.state_machine import CONFIG_SCHEMA  # noqa: E402

from bench.benchlib import (
    make_log,
)

CLUSTER = "DefaultCluster"
FULL_SIZES = {"topics": 100_000, "queues": 8, "groups": 10_000, "broker_sets": 300, "replicas": 3}
TARGETS = {"restart_one_s_max": 10.0, "restart_all_s_max": 10.0, "route_p99_ms_max": 5.0}
WRITE_BATCH = 1024  # writes per Write RPC (the RPC's own maximum)
SETS_PER_TOPIC = 2  # each topic lives on this many broker sets (8 queues on each)
# The fleet heartbeats as real brokers do by default: at the controllers' default interval
# (P9 made it 300 ms with dead-after 2 s; at 1 s, two late heartbeats made a master dead).
DEFAULT_HEARTBEAT_INTERVAL_MS = CONFIG_SCHEMA["broker_heartbeat_interval_ms"][1]
HEARTBEAT_TIMEOUT_S = 2.0
FLEET_BROKERS_PER_PROCESS = 300
TRANSPORTS = ("stream", "unary")  # how the fleet heartbeats: HeartbeatStream, or Heartbeat calls
WATCH_STREAMS_PER_PROCESS = 300
SAMPLES_MAX = 3_000_000  # per fleet process: ~1 hour of one broker per second each
SNAPSHOT_READERS_PER_NODE = 2  # sequential readers per node driving barrier entries
ELECT_ATTEMPTS_MAX = 20  # a set whose brokers look dead right now is retried (1 s apart)
WATCH_CLUSTER_OPEN_PER_S = 20  # cluster-wide streams subscribing per second (300 events each)

log = make_log("scale")


def sizes_for(scale: float) -> dict[str, int]:
    out = {k: max(1, round(v * scale)) for k, v in FULL_SIZES.items()}
    out["queues"] = FULL_SIZES["queues"]
    out["replicas"] = FULL_SIZES["replicas"]
    out["brokers"] = out["broker_sets"] * out["replicas"]
    return out


def set_name(index: int) -> str:
    return f"bs-{index:04d}"


def topic_name(index: int) -> str:
    return f"topic-{index:07d}"


def group_name(index: int) -> str:
    return f"group-{index:06d}"


def process_memory(pid: int) -> dict[str, float | None]:
    """VmRSS and VmHWM (peak RSS) of a process, in MB."""
    values: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                values["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                values["peak_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return values


def thread_count(pid: int) -> int | None:
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return None
