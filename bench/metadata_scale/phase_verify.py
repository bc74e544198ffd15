"""Metadata at scale, phase verify: counts and routes read back, every node's digest equal."""

from __future__ import annotations

import random
import time
from typing import Any

from bench.benchlib import (
    _r,
)
from bench.metadata_scale.cluster import ScaleCluster, _metadata
from bench.metadata_scale.common import CLUSTER, SETS_PER_TOPIC, topic_name

# Phase: verify -------------------------------------------------------------------------------

BIG_MESSAGE_BYTES = 512 << 20


def _big_stub(address: str):
    """A stub whose channel accepts replies up to 512 MB (gRPC's default limit is 4 MB)."""
    import grpc

    from mqmeta.pb import controller_pb2_grpc

    options = [("grpc.max_receive_message_length", BIG_MESSAGE_BYTES)]
    channel = grpc.insecure_channel(address, options=options)
    return channel, controller_pb2_grpc.ControllerServiceStub(channel)


def _timed_list(stub, method: str, request, field: str) -> tuple[list[Any], dict[str, Any]]:
    t0 = time.perf_counter()
    reply = getattr(stub, method)(request, timeout=120.0)
    seconds = time.perf_counter() - t0
    items = list(getattr(reply, field))
    return items, {"count": len(items), "seconds": _r(seconds, 3), "reply_bytes": reply.ByteSize()}


def _default_client_lists_topics(address: str) -> dict[str, Any]:
    """What an unmodified client (mqmeta admin topic list) gets: gRPC's 4 MB reply limit."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    try:
        with ControllerClient([address], timeout_s=120.0) as client:
            count = len(client.list_topics(pb.ListTopicsRequest()).topics)
        return {"ok": True, "count": count}
    except MqmetaError as exc:
        return {"ok": False, "error": f"{exc.code}: {exc.message[:200]}"}


def verify_phase(cluster: ScaleCluster, sizes: dict[str, int]) -> dict[str, Any]:
    from mqmeta.pb import controller_pb2 as pb

    leader = cluster.leader()
    channel, stub = _big_stub(cluster.grpc(leader))
    try:
        topics, topics_call = _timed_list(stub, "ListTopics", pb.ListTopicsRequest(), "topics")
        groups, groups_call = _timed_list(stub, "ListGroups", pb.ListGroupsRequest(), "groups")
        sets, sets_call = _timed_list(
            stub, "ListBrokerSets", pb.ListBrokerSetsRequest(cluster=CLUSTER), "broker_sets"
        )
        expected_topics = {topic_name(i) for i in range(sizes["topics"])}
        routes_ok = 0
        picks = random.Random(7).sample(range(sizes["topics"]), min(20, sizes["topics"]))
        for i in picks:
            route = stub.GetTopicRoute(pb.NameRequest(name=topic_name(i)), timeout=10.0)
            full = len(route.queues) == min(SETS_PER_TOPIC, sizes["broker_sets"]) and all(
                q.write_queue_count == sizes["queues"] for q in route.queues
            )
            routes_ok += int(full and all(b.master_address for b in route.brokers))
    finally:
        channel.close()
    out = {
        "topics": {"expected": sizes["topics"], "read_back": len(topics), "list_call": topics_call},
        "topic_names_match": {t.name for t in topics if t.name.startswith("topic-")} == expected_topics,
        "queues_per_topic": sorted({t.queue_count for t in topics}),
        "groups": {"expected": sizes["groups"], "read_back": len(groups), "list_call": groups_call},
        "subscriptions_read_back": sum(len(g.subscriptions) for g in groups),
        "broker_sets": {"expected": sizes["broker_sets"], "read_back": len(sets), "list_call": sets_call},
        "replicas_read_back": sum(len(s.replicas) for s in sets),
        "sets_with_master": sum(1 for s in sets if s.master_broker_id),
        "sets_all_in_sync": sum(1 for s in sets if len(s.sync_state_set) == sizes["replicas"]),
        "sample_routes_complete": f"{routes_ok}/{len(picks)}",
        "default_client_list_topics": _default_client_lists_topics(cluster.grpc(leader)),
    }
    out["state_digests"] = same_digests(cluster)
    return out


def same_digests(cluster: ScaleCluster, timeout_s: float = 60.0) -> dict[str, Any]:
    """Every node answers a linearizable read, then reports the same (applied index, digest)."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    deadline = time.monotonic() + timeout_s
    seen: dict[str, tuple[int, str]] = {}
    for _ in range(1000):
        try:
            for node in cluster.ids:
                with ControllerClient([cluster.grpc(node)], timeout_s=10.0) as client:
                    client.get_config(pb.GetConfigRequest())
            metas = {n: _metadata(cluster.grpc(n)) for n in cluster.ids}
        except MqmetaError:
            metas = {}
        seen = {n: (m.last_applied, m.state_digest) for n, m in metas.items()}
        if len(seen) == len(cluster.ids) and len(set(seen.values())) == 1:
            index, digest = next(iter(seen.values()))
            return {"equal": True, "last_applied": index, "digest": digest[:16]}
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"equal": False, "seen": {n: [i, d[:16]] for n, (i, d) in seen.items()}}
