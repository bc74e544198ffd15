"""Metadata at scale, phase watch: watch-stream fan-out."""

from __future__ import annotations

import time
from typing import Any

from bench.benchlib import (
    CpuMeter,
    _r,
    latency_summary,
    percentile,
)
from bench.metadata_scale.cluster import ScaleCluster
from bench.metadata_scale.common import CLUSTER, WRITE_BATCH, log, set_name, thread_count
from bench.metadata_scale.fleet import BrokerFleet, WatchFleet, event_key
from bench.metadata_scale.phase_heartbeat import _error_name

# Phase: watch fan-out ----------------------------------------------------------------------------


def _open_streams(watchers: WatchFleet, sets: int, limit_s: float) -> dict[str, Any]:
    """Waits until every stream has its initial snapshot (one event per broker set it watches)."""
    t0_wall, t0 = time.time(), time.monotonic()
    watchers.open()
    expected = watchers.snapshot_events_expected(sets)
    status: dict[str, Any] = {}
    full = 0
    for _ in range(100_000):
        status = watchers.status()
        full = sum(1 for n in status["snapshot_counts"] if n >= expected)
        if full >= watchers.streams or time.monotonic() - t0 > limit_s:
            break
        time.sleep(0.5)
    return {
        "streams": watchers.streams,
        "streams_served": status["with_first_event"],
        "streams_with_full_snapshot": full,
        "open_s": _r(time.monotonic() - t0, 2),
        "first_event_after_s": seconds_stats([w - t0_wall for w in status["first_event_walls"]]),
        "first_event_after_subscribing_s": seconds_stats(status["first_event_after_subscribing"]),
        "ended": status["ended"],
    }


def seconds_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50_s": _r(percentile(values, 50)),
        "p99_s": _r(percentile(values, 99)),
        "max_s": _r(max(values)),
    }


def _fan_out_round(
    cluster: ScaleCluster, watchers: WatchFleet, set_index: int, wait_s: float
) -> dict[str, Any]:
    """One committed broker-set change (a new master chosen by the admin), and when each
    stream watching that set had the event: measured from the ElectMaster call (so it
    includes the commit) and from its reply (negative: the stream had it first)."""
    from mqmeta.pb import controller_pb2 as pb

    name = set_name(set_index)
    with cluster.leader_client(timeout_s=10.0) as client:
        info = client.get_replica_info(pb.BrokerSetRef(cluster=CLUSTER, broker_name=name))
        if not info.master_broker_id:  # no alive in-sync replica at an election: elect one first
            info = client.elect_master(
                pb.ElectMasterRequest(cluster=CLUSTER, broker_name=name, trigger=pb.ELECT_TRIGGER_ADMIN),
            )
        if len(info.sync_state_set) < 2:  # an election since the load reset it: widen it first
            info = _all_in_sync(client, info)
        preferred = next(i for i in info.sync_state_set if i != info.master_broker_id)
        called = time.time()
        reply = client.elect_master(
            pb.ElectMasterRequest(
                cluster=CLUSTER,
                broker_name=name,
                trigger=pb.ELECT_TRIGGER_ADMIN,
                preferred_broker_id=preferred,
            ),
        )
        acknowledged = time.time()
        _all_in_sync(client, reply)  # elections reset the SyncStateSet to the new master
    key = event_key("role", name, reply.master_epoch)
    expected = watchers.watching(name)
    times: list[float] = []
    deadline = time.monotonic() + wait_s
    for _ in range(10_000):
        times = watchers.event_times(key)
        if len(times) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {
        "broker_set": name,
        "acknowledged_ms": _r(1000 * (acknowledged - called), 2),
        "streams_expected": expected,
        "streams_with_event": len(times),
        "from_call_ms": latency_summary([t - called for t in times]),
        "from_reply_ms": latency_summary([t - acknowledged for t in times]),
    }


def _all_in_sync(client, info):
    """Puts every replica of a broker set in its SyncStateSet; the new ReplicaInfo."""
    from mqmeta.pb import controller_pb2 as pb

    return client.alter_sync_state_set(
        pb.AlterSyncStateSetRequest(
            cluster=info.cluster,
            broker_name=info.broker_name,
            master_broker_id=info.master_broker_id,
            master_epoch=info.master_epoch,
            sync_state_set_epoch=info.sync_state_set_epoch,
            new_sync_state_set=sorted(r.broker_id for r in info.replicas),
        ),
    )


def watch_phase(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args) -> dict[str, Any]:
    streams = args.watch_streams or sizes["brokers"]
    out: dict[str, Any] = {}
    for style in args.watch_styles:
        out[f"{style}_streams"] = _watch_style(cluster, fleet, sizes, args, style, streams)
    return out


def _watch_style(cluster: ScaleCluster, fleet: BrokerFleet, sizes, args, style: str, streams: int) -> dict:
    leader = cluster.leader()
    leader_pid = cluster.pid(leader)
    watchers = WatchFleet(cluster.grpc(leader), sizes, style, streams)
    out: dict[str, Any] = {
        "leader": leader,
        "filter": "each stream its broker's set" if style == "broker" else f"cluster={CLUSTER}, every set",
    }
    threads_before = thread_count(leader_pid) if leader_pid else None
    start_wall = time.time()
    meter = CpuMeter(dict(cluster.pids(), **fleet.pids()))
    try:
        out["open"] = _open_streams(watchers, sizes["broker_sets"], args.watch_open_s)
        out["cpu_percent_while_opening"] = meter.stop()
        out["heartbeats_while_opening"] = fleet.window(start_wall, time.time())
        out["leader_threads"] = {"before": threads_before, "with_streams": thread_count(leader_pid)}
        opened = out["open"]
        log(f"watch ({style}): {opened['streams_served']}/{streams} streams served in {opened['open_s']} s")
        settle_t0 = time.monotonic()
        try:  # the fan-out is measured once the opening storm is over and heartbeats answer again
            fleet.wait_heartbeating(sizes["brokers"], timeout_s=args.watch_open_s)
            out["settled_after_open_s"] = _r(time.monotonic() - settle_t0, 1)
        except RuntimeError as exc:
            out["settled_after_open_s"] = None
            out["not_settled"] = str(exc)[:300]
        out["rounds"] = _fan_out_rounds(cluster, watchers, sizes, args)
        out["fan_out"] = _fan_out_summary(out["rounds"])
        burst_wall = time.time()
        burst = min(WRITE_BATCH, max(10, sizes["topics"] // 10))
        out["topic_burst"] = _topic_burst(cluster, watchers, burst, args.watch_wait_s)
        out["heartbeats_during_burst"] = fleet.window(burst_wall, time.time())
        out["heartbeats_with_streams_open"] = fleet.window(start_wall, time.time())
    finally:
        watchers.stop()
    return out


def _fan_out_rounds(cluster: ScaleCluster, watchers: WatchFleet, sizes, args) -> list[dict[str, Any]]:
    """args.watch_rounds changes, each on the next broker set; a change refused because an
    election moved the set on meanwhile (fenced) is tried again on the next set."""
    rounds: list[dict[str, Any]] = []
    for k in range(args.watch_rounds * 3):
        if len([r for r in rounds if "error" not in r]) >= args.watch_rounds:
            break
        try:
            rounds.append(_fan_out_round(cluster, watchers, k % sizes["broker_sets"], args.watch_wait_s))
        except Exception as exc:  # the server may not answer (before: its workers are held)
            rounds.append({"error": f"{_error_name(exc)}: {str(exc)[:200]}"})
            if "FENCED" not in str(exc) and "MASTER_NOT_AVAILABLE" not in str(exc):
                break
    return rounds


def _fan_out_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rounds if "from_call_ms" in r and r["streams_with_event"]]
    if not good:
        return {"rounds": 0}

    def worst(which: str, stat: str) -> float:
        return max(r[which].get(stat) or 0 for r in good)

    return {
        "rounds": len(good),
        "streams_per_change": good[0]["streams_expected"],
        "streams_with_event_min": min(r["streams_with_event"] for r in good),
        "all_streams_had_every_event": all(r["streams_with_event"] >= r["streams_expected"] for r in good),
        "from_call_p50_ms": worst("from_call_ms", "p50_ms"),
        "from_call_p99_ms": worst("from_call_ms", "p99_ms"),
        "from_call_max_ms": worst("from_call_ms", "max_ms"),
        "from_reply_p99_ms": worst("from_reply_ms", "p99_ms"),
        "from_reply_max_ms": worst("from_reply_ms", "max_ms"),
        "note": "worst round of each figure; from_call includes the commit (acknowledged_ms per round)",
    }


def _topic_burst(cluster: ScaleCluster, watchers: WatchFleet, burst: int, wait_s: float) -> dict[str, Any]:
    """`burst` topic creations in one Write call while every stream is open: streams that
    want topic events should get them all (or be cut off if they fall behind)."""
    from mqmeta.pb import controller_pb2 as pb

    before = watchers.status()
    ops = [
        pb.WriteOp(create_topic=pb.TopicSpec(name=f"burst-{watchers.style}-{i}", queue_count=8))
        for i in range(burst)
    ]
    t0 = time.monotonic()
    try:
        with cluster.leader_client(timeout_s=30.0) as client:
            client.write(pb.WriteBatch(writes=ops), timeout_s=30.0)
    except Exception as exc:
        return {"error": f"{_error_name(exc)}: {str(exc)[:200]}"}
    wanting = watchers.watching("") if watchers.style == "cluster" else 0
    status = before
    for _ in range(10_000):
        status = watchers.status()
        got = status["topic_events"] - before["topic_events"]
        settled = got >= burst * wanting and time.monotonic() - t0 > 1.0
        if settled or time.monotonic() - t0 > wait_s:
            break
        time.sleep(0.2)
    return {
        "topics": burst,
        "streams_wanting_topic_events": wanting,
        "events_delivered": status["topic_events"] - before["topic_events"],
        "seconds": _r(time.monotonic() - t0, 2),
        "streams_ended": status["ended_count"] - before["ended_count"],
        "ended_reasons": status["ended"],
    }
