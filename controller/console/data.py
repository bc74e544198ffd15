"""What the console shows, read through the same calls as `mqmeta admin`: the controllers'
gRPC reads (ControllerClient) and the brokers' (GetHaStatus, Pull, ListConsumerOffsets).

Every function here blocks (gRPC); the web layer runs them in its bounded pool. Each
returns a JSON document; a broker that does not answer is reported in its row (`error`),
never as a failed page.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument, MqmetaError, NotFound
from mqmeta.formats.properties import KEY_SEPARATOR
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc
from mqmeta.pb import controller_pb2 as pb
from mqmeta.rpc import from_rpc_error

Json = dict[str, Any]

BROKER_CALL_TIMEOUT_S = 1.0  # one broker's answer; a dead one must not hold a page
TOPICS_MAX = 200  # topics a page lists (and the sampler reads)
SEARCH_SCAN_PER_QUEUE_MAX = 4096  # newest messages a search reads per queue
SEARCH_RESULTS_MAX = 50
PULL_BATCH = 1024  # the brokers' PULL_COUNT_MAX
BODY_PREVIEW_BYTES = 256
BROKER_CHANNELS_MAX = 256


class Brokers:
    """One channel per broker address (bounded), shared by every page."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, broker_pb2_grpc.BrokerServiceStub]] = {}

    def stub(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        with self._lock:
            found = self._stubs.get(address)
            if found is None:
                if len(self._stubs) >= BROKER_CHANNELS_MAX:  # brokers come and go: drop the oldest
                    oldest = next(iter(self._stubs))
                    self._stubs.pop(oldest)[0].close()
                channel = tls.channel(address)
                found = self._stubs[address] = (channel, broker_pb2_grpc.BrokerServiceStub(channel))
            return found[1]

    def call(self, address: str, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub(address), method)(request, timeout=BROKER_CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()


def controllers(client: ControllerClient) -> Json:
    meta = client.get_metadata(pb.GetMetadataRequest())
    return {
        "leader": meta.leader_id,
        "leader_grpc": meta.leader_grpc,
        "term": meta.term,
        "commit_index": meta.commit_index,
        "last_applied": meta.last_applied,
        "nodes": [{"id": n.id, "grpc": n.grpc, "role": n.role, "healthy": n.healthy} for n in meta.nodes],
    }


def _replica_status(brokers: Brokers, replica: pb.Replica) -> Json:
    row: Json = {"broker_id": replica.broker_id, "address": replica.address, "alive": replica.alive}
    try:
        status = brokers.call(replica.address, "GetHaStatus", bpb.HaStatusRequest())
    except MqmetaError as error:
        return {**row, "error": error.message}
    row.update(
        role=status.role,
        master_epoch=status.master_epoch,
        max_offset=status.max_offset,
        confirm_offset=status.confirm_offset,
    )
    row["slaves"] = [
        {
            "broker_id": s.broker_id,
            "acked_offset": s.acked_offset,
            "lag_bytes": s.lag_bytes,
            "in_sync": s.in_sync,
        }
        for s in status.slaves
    ]
    return row


def broker_set(client: ControllerClient, brokers: Brokers, info: pb.ReplicaInfo) -> Json:
    """One broker set: its master and SyncStateSet, each replica's offsets and its lag
    behind the master (as the master reports it), and the tiered checkpoint."""
    replicas = [_replica_status(brokers, r) for r in info.replicas]
    master = next((r for r in replicas if r["broker_id"] == info.master_broker_id), None)
    lag = {s["broker_id"]: s for s in (master or {}).get("slaves", [])}
    for row in replicas:
        slave = lag.get(row["broker_id"])
        row["in_sync"] = row["broker_id"] in info.sync_state_set
        row["lag_bytes"] = 0 if row is master else (slave["lag_bytes"] if slave else None)
    document: Json = {
        "cluster": info.cluster,
        "broker_name": info.broker_name,
        "master_broker_id": info.master_broker_id,
        "master_address": info.master_address,
        "master_epoch": info.master_epoch,
        "sync_state_set": sorted(info.sync_state_set),
        "sync_state_set_epoch": info.sync_state_set_epoch,
        "replicas": replicas,
    }
    try:
        checkpoint = client.get_tiered_checkpoint(
            pb.BrokerSetRef(cluster=info.cluster, broker_name=info.broker_name)
        )
        confirm = (master or {}).get("confirm_offset")
        document["tiered"] = {
            "uploaded_offset": checkpoint.uploaded_offset,
            "segments": len(checkpoint.segments),
            "lag_bytes": None if confirm is None else max(0, confirm - checkpoint.uploaded_offset),
        }
    except MqmetaError as error:
        document["tiered"] = {"error": error.message}
    return document


def overview(client: ControllerClient, brokers: Brokers) -> Json:
    sets = client.list_broker_sets(pb.ListBrokerSetsRequest()).broker_sets
    return {
        "controllers": controllers(client),
        "broker_sets": [broker_set(client, brokers, info) for info in sets],
        "now_ms": int(time.time() * 1000),
    }


def _masters(client: ControllerClient, topic: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """(broker set, queue id) of every readable queue of `topic`, and each set's master."""
    route = client.get_topic_route(pb.NameRequest(name=topic))
    masters = {b.broker_name: b.master_address for b in route.brokers}
    queues = [(q.broker_name, i) for q in route.queues for i in range(q.read_queue_count)]
    return queues, masters


def _queue_end(brokers: Brokers, address: str, topic: str, queue_id: int, offset: int) -> tuple[int, int]:
    """(readable end of the queue, store time of the message at `offset` or 0)."""
    reply = brokers.call(
        address, "Pull", bpb.PullRequest(topic=topic, queue_id=queue_id, queue_offset=offset, max_count=1)
    )
    stored = reply.messages[0].store_timestamp_ms if reply.messages else 0
    return reply.max_queue_offset, stored


def topics(client: ControllerClient, brokers: Brokers) -> Json:
    """Every topic (up to TOPICS_MAX) with its queues' readable ends; the sampler turns
    two of these into message rates."""
    listed = client.list_topics(pb.ListTopicsRequest()).topics[:TOPICS_MAX]
    rows = []
    for topic in listed:
        row: Json = {
            "name": topic.name,
            "cluster": topic.cluster,
            "queue_count": topic.queue_count,
            "broker_names": list(topic.broker_names),
            "perm": topic.perm,
            "message_type": topic.message_type,
            "queues": [],
        }
        try:
            queues, masters = _masters(client, topic.name)
        except MqmetaError as error:
            rows.append({**row, "error": error.message})
            continue
        for broker_name, queue_id in queues:
            queue: Json = {"broker_name": broker_name, "queue_id": queue_id}
            try:
                queue["max_offset"] = _queue_end(
                    brokers, masters.get(broker_name, ""), topic.name, queue_id, 0
                )[0]
            except MqmetaError as error:
                queue["error"] = error.message
            row["queues"].append(queue)
        row["messages"] = sum(q.get("max_offset", 0) for q in row["queues"])
        rows.append(row)
    return {"topics": rows, "now_ms": int(time.time() * 1000)}


def group_lag(client: ControllerClient, brokers: Brokers) -> Json:
    """Per group, per topic, per queue: consumed offset, readable end, backlog in messages
    and in time (now − store time of the oldest unconsumed message); groups sorted by
    backlog time, the longest first. A group that committed on some queue of a topic
    reads the topic's other queues from 0 (as our consumers do): they count from 0."""
    now_ms = int(time.time() * 1000)
    groups: dict[str, Json] = {
        g.name: _group_row(g.name) for g in client.list_groups(pb.ListGroupsRequest()).groups
    }
    for topic in client.list_topics(pb.ListTopicsRequest()).topics[:TOPICS_MAX]:
        try:
            queues, masters = _masters(client, topic.name)
        except MqmetaError:
            continue
        committed: dict[tuple[str, int], dict[str, int]] = {}
        for broker_name, queue_id in queues:
            try:
                offsets = brokers.call(
                    masters.get(broker_name, ""),
                    "ListConsumerOffsets",
                    bpb.ListConsumerOffsetsRequest(topic=topic.name, queue_id=queue_id),
                ).offsets
            except MqmetaError:
                continue  # a set without a master: its queues show again after the election
            committed[(broker_name, queue_id)] = {o.group: o.offset for o in offsets}
        consumers = sorted({group for by_group in committed.values() for group in by_group})
        for (broker_name, queue_id), by_group in committed.items():
            for group in consumers:
                row = groups.setdefault(group, _group_row(group))
                queue = _lag_row(
                    brokers, masters.get(broker_name, ""), topic.name, queue_id, by_group.get(group), now_ms
                )
                row["queues"].append({"broker_name": broker_name, **queue})
    for row in groups.values():
        row["backlog"] = sum(q["backlog"] for q in row["queues"])
        row["backlog_ms"] = max((q["backlog_ms"] for q in row["queues"]), default=0)
    ordered = sorted(groups.values(), key=lambda g: (-g["backlog_ms"], -g["backlog"], g["group"]))
    return {"groups": ordered, "now_ms": now_ms}


def _lag_row(
    brokers: Brokers, address: str, topic: str, queue_id: int, offset: int | None, now_ms: int
) -> Json:
    consumed = max(0, offset or 0)
    try:
        end, stored = _queue_end(brokers, address, topic, queue_id, consumed)
    except MqmetaError as error:
        return {"topic": topic, "queue_id": queue_id, "error": error.message, "backlog": 0, "backlog_ms": 0}
    backlog = max(0, end - consumed)
    return {
        "topic": topic,
        "queue_id": queue_id,
        "consumed_offset": consumed,
        "committed": offset is not None,
        "max_offset": end,
        "backlog": backlog,
        "backlog_ms": max(0, now_ms - stored) if backlog and stored else 0,
    }


def _group_row(name: str) -> Json:
    return {"group": name, "queues": []}


def replicator(client: ControllerClient) -> Json:
    from mqmeta.controller.admin_cli import replicator_status

    class _Args:
        rule = ""

    document, _ = replicator_status(client, _Args())
    return document


def search(
    client: ControllerClient,
    brokers: Brokers,
    topic: str,
    key: str = "",
    msg_id: str = "",
    since_ms: int = 0,
    until_ms: int = 0,
) -> Json:
    """Messages of `topic` with key `key`, id `msg_id` and a store time in [since, until]
    (each when given), each with its trace. Reads the newest SEARCH_SCAN_PER_QUEUE_MAX
    messages of each queue."""
    if not topic:
        raise InvalidArgument("a search needs a topic")
    if not (key or msg_id or since_ms or until_ms):
        raise InvalidArgument("a search needs a key, a message id or a time range")
    if since_ms and until_ms and since_ms > until_ms:
        raise InvalidArgument(f"the time range ends ({until_ms}) before it starts ({since_ms})")
    route = client.get_topic_route(pb.NameRequest(name=topic))
    clusters = {b.broker_name: b.cluster for b in route.brokers}
    queues, masters = _masters(client, topic)
    found: list[Json] = []
    for broker_name, queue_id in queues:
        address = masters.get(broker_name, "")
        for message in _scan(brokers, address, topic, queue_id):
            if key and key not in message.keys.split(KEY_SEPARATOR):
                continue
            if msg_id and message.msg_id != msg_id:
                continue
            if since_ms and message.store_timestamp_ms < since_ms:
                continue
            if until_ms and message.store_timestamp_ms > until_ms:
                continue
            found.append({"cluster": clusters.get(broker_name, ""), **_message(message, broker_name)})
            if len(found) >= SEARCH_RESULTS_MAX:
                break
    if msg_id and not found:
        raise NotFound(
            f"no message {msg_id} in the newest {SEARCH_SCAN_PER_QUEUE_MAX} of each queue of {topic}"
        )
    for document in found:
        document["trace"] = trace(client, brokers, document)
    return {"messages": found}


def _scan(brokers: Brokers, address: str, topic: str, queue_id: int) -> list[bpb.StoredMessage]:
    end, _ = _queue_end(brokers, address, topic, queue_id, 0)
    offset = max(0, end - SEARCH_SCAN_PER_QUEUE_MAX)
    messages: list[bpb.StoredMessage] = []
    while offset < end:
        reply = brokers.call(
            address,
            "Pull",
            bpb.PullRequest(topic=topic, queue_id=queue_id, queue_offset=offset, max_count=PULL_BATCH),
        )
        if not reply.messages:
            break
        messages.extend(reply.messages)
        offset = reply.next_queue_offset
    return messages


def _message(message: bpb.StoredMessage, broker_name: str) -> Json:
    body = bytes(message.body)
    return {
        "msg_id": message.msg_id,
        "topic": message.topic,
        "broker_name": broker_name,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "commit_offset": message.commit_offset,
        "store_timestamp_ms": message.store_timestamp_ms,
        "tags": message.tags,
        "keys": [k for k in message.keys.split(KEY_SEPARATOR) if k],
        "properties": dict(message.properties),
        "body": body[:BODY_PREVIEW_BYTES].decode(errors="replace"),
        "body_bytes": len(body),
    }


def trace(client: ControllerClient, brokers: Brokers, message: Json) -> Json:
    """Where one stored message is: the replicas that hold it, whether the confirm offset
    has passed it, whether it is tiered, and the groups that consumed past it."""
    ref = pb.BrokerSetRef(cluster=message["cluster"], broker_name=message["broker_name"])
    info = client.get_replica_info(ref)
    end = message["commit_offset"] + 1
    replicas, confirmed = [], False
    for replica in info.replicas:
        row = _replica_status(brokers, replica)
        holds = row.get("max_offset", 0) >= end
        replicas.append({"broker_id": replica.broker_id, "address": replica.address, "holds": holds})
        if replica.broker_id == info.master_broker_id:
            confirmed = row.get("confirm_offset", 0) >= end
    try:
        uploaded = client.get_tiered_checkpoint(ref).uploaded_offset
    except MqmetaError:
        uploaded = 0
    consumed: list[str] = []
    try:
        offsets = brokers.call(
            info.master_address,
            "ListConsumerOffsets",
            bpb.ListConsumerOffsetsRequest(topic=message["topic"], queue_id=message["queue_id"]),
        ).offsets
        consumed = sorted(o.group for o in offsets if o.offset > message["queue_offset"])
    except MqmetaError:
        pass
    return {
        "stored": True,
        "replicas": replicas,
        "confirmed": confirmed,
        "tiered": uploaded >= end,
        "consumed_by": consumed,
        "origin": {k: v for k, v in message["properties"].items() if k.lower().startswith("origin")},
    }
