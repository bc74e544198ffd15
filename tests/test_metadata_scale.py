"""bench/metadata_scale/ at a small scale, so that the benchmark cannot rot.

Properties checked (one run of the real benchmark: 3 controller processes, a nameserver,
the broker fleet and the watch fleets, on loopback):
- it ends with status ok and its JSON holds every figure docs/benchmarks.md reports;
- the state it loaded is really there, read back through the API: every topic (with its
  8 queues), group, broker set and replica, a master and a full SyncStateSet per set,
  complete routes, and one state digest on every node;
- more watch streams than the server has worker threads (GRPC_WORKERS_MAX) are all
  served while heartbeats keep being answered, and every stream has every change;
- a stream that names a broker set gets none of the topic events; cluster-wide ones do;
- every node wrote a snapshot, and every node serves again after kill -9 and restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mqmeta.controller.server import GRPC_WORKERS_MAX

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
STREAMS = GRPC_WORKERS_MAX + 36  # more streams than worker threads

FIGURES = (
    "controller_rss_mb",
    "nameserver_rss_mb",
    "snapshot_bytes",
    "snapshot_write_s",
    "restart_one_node_s",
    "restart_all_nodes_s",
    "route_p50_ms",
    "route_p99_ms",
    "route_concurrent_reads_per_s",
    "heartbeats_per_s",
    "heartbeat_p99_ms",
    "heartbeat_leader_cpu_percent",
    "watch_broker_streams_served",
    "watch_cluster_streams_served",
    "watch_fan_out_p50_ms",
    "watch_fan_out_p99_ms",
    "watch_fan_out_max_ms",
    "load_writes_per_s",
    "load_raft_entries_per_s",
)


@pytest.fixture(scope="module")
def report():
    command = [
        sys.executable,
        "-m",
        "bench.metadata_scale",
        "--scale=0.01",
        "--phase-s=1",
        "--capacity-intervals=1000,250",
        "--compaction-min-entries=300",  # so that the snapshot phase is short
        f"--watch-streams={STREAMS}",
        "--watch-rounds=3",
        "--budget-s=200",
    ]
    run = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_the_run_reports_every_figure(report):
    assert report["status"] == "ok"
    missing = [name for name in FIGURES if report["figures"].get(name) in (None, {}, [])]
    assert not missing, f"figures without a value: {missing}"
    assert set(report["figures"]["controller_rss_mb"]) == {"c1", "c2", "c3"}
    ratios = (
        "snapshot_write_vs_plain_pickle_gzip9",
        "route_p99_vs_grpc_floor_p99",
        "heartbeat_leader_cpu_stream_vs_unary",
    )
    first_steps = {
        t: (c.get("steps") or [None])[0] for t, c in report["capacity"].items() if isinstance(c, dict)
    }
    for ratio in ratios:
        assert report["ratios"][ratio] is not None, (ratio, report["heartbeat"], first_steps)
    assert report["raw"]["windows"][0]["entries_per_s"] > 0
    for transport in ("stream", "unary"):
        steps = report["capacity"][transport]["steps"]
        assert steps, f"no heartbeat capacity step ran on {transport}"
        assert steps[0]["errors"] == {} and steps[0]["heartbeats_per_s"] > 0, (transport, steps[0])
    assert set(report["targets_met"]) == {
        "restart_one_node_le_10s",
        "restart_all_nodes_le_10s",
        "route_p99_le_5ms",
    }


def test_the_loaded_state_is_read_back_through_the_api(report):
    sizes, verify = report["sizes"], report["verify"]
    for kind in ("topics", "groups", "broker_sets"):
        assert verify[kind]["read_back"] == verify[kind]["expected"] == sizes[kind], kind
    assert verify["topic_names_match"]
    assert verify["queues_per_topic"] == [sizes["queues"]]
    assert verify["subscriptions_read_back"] == 2 * sizes["groups"]
    assert verify["replicas_read_back"] == sizes["brokers"]
    assert verify["sets_with_master"] == verify["sets_all_in_sync"] == sizes["broker_sets"]
    picked = int(verify["sample_routes_complete"].split("/")[1])
    assert verify["sample_routes_complete"] == f"{picked}/{picked}" and picked > 0
    assert verify["state_digests"]["equal"], verify["state_digests"]
    assert report["load"]["topics"]["errors"] == {} and report["load"]["groups"]["errors"] == {}


def test_more_watch_streams_than_workers_are_served_with_every_change(report):
    for style in ("broker_streams", "cluster_streams"):
        watch = report["watch"][style]
        assert watch["open"]["streams_served"] == STREAMS, (style, watch["open"])
        assert watch["heartbeats_while_opening"]["errors"] == {}, (style, watch["heartbeats_while_opening"])
        assert watch["fan_out"]["rounds"] == 3 and watch["fan_out"]["all_streams_had_every_event"], style
    assert report["watch"]["cluster_streams"]["fan_out"]["streams_per_change"] == STREAMS


def test_topic_events_reach_cluster_streams_only(report):
    broker, cluster = report["watch"]["broker_streams"], report["watch"]["cluster_streams"]
    assert broker["topic_burst"]["events_delivered"] == 0, broker["topic_burst"]
    assert cluster["topic_burst"]["events_delivered"] > 0, cluster["topic_burst"]


def test_snapshots_and_restarts(report):
    snapshot = report["snapshot"]
    assert snapshot["all_nodes_wrote_one"] and snapshot["snapshot_bytes"] > 0
    assert snapshot["baseline"]["keys"] >= sum(
        report["sizes"][k] for k in ("topics", "groups", "broker_sets")
    )
    restart = report["restart"]
    assert restart["one_node"]["serving_s"] is not None
    assert all(r["serving_s"] is not None for r in restart["all_nodes"]["by_node"].values())
    assert restart["digests_after"]["equal"], restart["digests_after"]
