"""Metadata at scale, phase load: brokers register, masters are elected, topics and groups are written."""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mqmeta.controller.journal import parse_records
from mqmeta.controller.state_machine import CONFIG_SCHEMA  # noqa: E402

from bench.benchlib import (
    _r,
)
from bench.metadata_scale.cluster import ScaleCluster, _metadata
from bench.metadata_scale.common import (
    CLUSTER,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    ELECT_ATTEMPTS_MAX,
    SETS_PER_TOPIC,
    WRITE_BATCH,
    group_name,
    log,
    set_name,
    topic_name,
)
from bench.metadata_scale.fleet import BrokerFleet
from mqmeta.errors import CorruptData

# Phase: load ---------------------------------------------------------------------------------


def elect_and_sync(cluster: ScaleCluster, registered: list[tuple[str, int, int]]) -> dict[str, Any]:
    """First election per broker set (requester: replica 1), then all replicas in sync."""
    from mqmeta.pb import controller_pb2 as pb

    ids: dict[str, list[int]] = collections.defaultdict(list)
    first: dict[str, int] = {}
    for name, replica, broker_id in registered:
        ids[name].append(broker_id)
        if replica == 1:
            first[name] = broker_id
    t0 = time.monotonic()

    def one(name: str) -> None:
        from mqmeta.errors import FailedPrecondition

        for attempt in range(ELECT_ATTEMPTS_MAX):  # a heartbeat queued behind others may be late
            try:
                return elect_one(name)
            except FailedPrecondition:
                if attempt == ELECT_ATTEMPTS_MAX - 1:
                    raise
                time.sleep(1.0)

    def elect_one(name: str) -> None:
        with cluster.leader_client() as client:
            info = client.elect_master(
                pb.ElectMasterRequest(
                    cluster=CLUSTER,
                    broker_name=name,
                    trigger=pb.ELECT_TRIGGER_BROKER,
                    requester_broker_id=first[name],
                ),
            )
            client.alter_sync_state_set(
                pb.AlterSyncStateSetRequest(
                    cluster=CLUSTER,
                    broker_name=name,
                    master_broker_id=info.master_broker_id,
                    master_epoch=info.master_epoch,
                    sync_state_set_epoch=info.sync_state_set_epoch,
                    new_sync_state_set=sorted(ids[name]),
                ),
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, sorted(ids)))
    return {"broker_sets": len(ids), "elect_and_sync_s": _r(time.monotonic() - t0, 2)}


def _write_batches(cluster: ScaleCluster, ops: list[Any], threads: int, what: str) -> dict[str, Any]:
    """Sends `ops` (WriteOps) as Write batches of WRITE_BATCH from `threads` clients."""
    from mqmeta.pb import controller_pb2 as pb

    batches = [ops[i : i + WRITE_BATCH] for i in range(0, len(ops), WRITE_BATCH)]
    errors: collections.Counter = collections.Counter()
    lock = threading.Lock()
    leader = cluster.leader()
    commit0 = _metadata(cluster.grpc(leader)).commit_index
    t0 = time.monotonic()

    def run(k: int) -> None:
        with cluster.leader_client(timeout_s=60.0) as client:
            for batch in batches[k::threads]:
                results = client.write(pb.WriteBatch(writes=batch), timeout_s=60.0).results
                failed = [r.error_code for r in results if r.error_code]
                if failed:
                    with lock:
                        errors.update(failed)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(threads)))
    seconds = time.monotonic() - t0
    commit1 = _metadata(cluster.grpc(leader)).commit_index
    entries = commit1 - commit0
    log(f"{what}: {len(ops)} writes in {seconds:.1f}s ({len(ops) / seconds:.0f}/s), {entries} entries")
    return {
        "writes": len(ops),
        "seconds": _r(seconds, 2),
        "writes_per_s": _r(len(ops) / seconds, 1),
        "raft_entries": entries,
        "raft_entries_per_s": _r(entries / seconds, 1),
        "writes_per_entry": _r(len(ops) / max(1, entries), 1),
        "errors": dict(errors),
    }


def topic_ops(sizes: dict[str, int]) -> list[Any]:
    from mqmeta.pb import controller_pb2 as pb

    sets = sizes["broker_sets"]
    return [
        pb.WriteOp(
            create_topic=pb.TopicSpec(
                name=topic_name(i),
                cluster=CLUSTER,
                queue_count=sizes["queues"],
                broker_names=sorted({set_name((i + k) % sets) for k in range(SETS_PER_TOPIC)}),
            )
        )
        for i in range(sizes["topics"])
    ]


def group_ops(sizes: dict[str, int]) -> list[Any]:
    from mqmeta.pb import controller_pb2 as pb

    topics = sizes["topics"]
    return [
        pb.WriteOp(
            create_group=pb.GroupSpec(
                name=group_name(i),
                subscriptions=[
                    pb.Subscription(topic=topic_name(i % topics), expression="*"),
                    pb.Subscription(topic=topic_name((7 * i + 1) % topics), expression="TagA || TagB"),
                ],
            )
        )
        for i in range(sizes["groups"])
    ]


def journal_bytes(cluster: ScaleCluster, node: str) -> int:
    """Where the journal's records end (the file goes on with the zeros written ahead)."""
    path = cluster.data_dirs()[node] / "raft.journal"
    try:
        return parse_records(path.read_bytes(), str(path))[2]
    except (OSError, CorruptData):
        return 0


def liveness_config(interval_ms: int) -> dict[str, str]:
    """The controllers' liveness settings for a fleet heartbeating every `interval_ms`:
    none to change at the default interval; otherwise dead-after at least 4 intervals (the
    controllers refuse less than 3), never below its default."""
    if interval_ms == DEFAULT_HEARTBEAT_INTERVAL_MS:
        return {}
    dead_after = max(CONFIG_SCHEMA["broker_dead_after_ms"][1], 4 * interval_ms)
    return {"broker_heartbeat_interval_ms": str(interval_ms), "broker_dead_after_ms": str(dead_after)}


def load_phase(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args) -> dict[str, Any]:
    from mqmeta.pb import controller_pb2 as pb

    t0 = time.monotonic()
    config = liveness_config(args.heartbeat_interval_ms)
    if config:  # what a real broker would read from the controllers and follow
        with cluster.leader_client() as client:
            client.update_config(pb.UpdateConfigRequest(values=config))
    registered = fleet.start_fleet(args.heartbeat_interval_ms, args.heartbeat_transport, timeout_s=300.0)
    out: dict[str, Any] = {
        "liveness_config": config or "the defaults",
        "brokers_registered": len(registered),
        "register_s": _r(time.monotonic() - t0, 2),
    }
    out["heartbeating"] = fleet.wait_heartbeating(len(registered), timeout_s=60.0)
    log(f"registered {len(registered)} brokers in {out['register_s']}s; electing masters")
    out.update(elect_and_sync(cluster, registered))
    leader = cluster.leader()
    bytes0 = journal_bytes(cluster, leader)
    loading_from = time.time()
    out["topics"] = _write_batches(cluster, topic_ops(sizes), args.load_threads, "topics")
    # sent below the offered rate: the fleet was late; answered late: the leader was
    out["heartbeats_during_topic_load"] = dict(
        fleet.window(loading_from, time.time()),
        offered_per_s=_r(len(registered) * 1000 / args.heartbeat_interval_ms, 1),
    )
    grown = journal_bytes(cluster, leader) - bytes0
    if grown > 0 and out["topics"]["raft_entries"]:
        out["topics"]["entry_bytes_mean"] = round(grown / out["topics"]["raft_entries"])
    out["groups"] = _write_batches(cluster, group_ops(sizes), args.load_threads, "groups")
    out["registered"] = registered
    return out
