"""What the console shows, read through the same calls as `mqmeta admin`: the controllers'
gRPC reads (ControllerClient) and the brokers' (GetHaStatus, Pull, ListConsumerOffsets).

Every function here blocks (gRPC); the web layer runs them in its bounded pool. Each
returns a JSON document; a broker that does not answer is reported in its row (`error`),
never as a failed page.
"""

from __future__ import annotations

import argparse
import base64
import threading
import time
from typing import Any

import grpc

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.formats.properties import KEY_SEPARATOR
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc
from mqmeta.pb import controller_pb2 as pb
from mqmeta.rpc import from_rpc_error

Json = dict[str, Any]

BROKER_CALL_TIMEOUT_S = 1.0  # one broker's answer; a dead one must not hold a page
TOPICS_MAX = 200  # topics a page lists (and the sampler reads)
SEARCH_RESULTS_MAX = 64  # per broker set (QueryMessages' bound)
TRACES_MAX = 10  # messages of a search shown with their trace
ADMIN_CALL_TIMEOUT_S = 5.0
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
    """Per group (those the controllers list and those with committed offsets), per topic
    it consumes, per queue: consumed offset, readable end, backlog in messages and in time
    (now − store time of the oldest unconsumed message), and its members; from the
    brokers' GetGroupLag (as `mqmeta admin group lag`). Sorted by backlog time, the
    longest first."""
    now_ms = int(time.time() * 1000)
    groups: dict[str, Json] = {
        g.name: _group_row(g.name) for g in client.list_groups(pb.ListGroupsRequest()).groups
    }
    for topic in client.list_topics(pb.ListTopicsRequest()).topics[:TOPICS_MAX]:
        try:
            queues, masters = _masters(client, topic.name)
        except MqmetaError:
            continue
        consumers: set[str] = set()
        for broker_name, queue_id in queues:
            try:
                offsets = brokers.call(
                    masters.get(broker_name, ""),
                    "ListConsumerOffsets",
                    bpb.ListConsumerOffsetsRequest(topic=topic.name, queue_id=queue_id),
                ).offsets
            except MqmetaError:
                continue  # a set without a master: its queues show again after the election
            consumers.update(o.group for o in offsets)
        for group in sorted(consumers):
            row = groups.setdefault(group, _group_row(group))
            for broker_name, address in masters.items():
                _add_lag(brokers, row, broker_name, address, group, topic.name)
    for row in groups.values():
        row["backlog"] = sum(q["backlog"] for q in row["queues"])
        row["backlog_ms"] = max((q["backlog_ms"] for q in row["queues"]), default=0)
    ordered = sorted(groups.values(), key=lambda g: (-g["backlog_ms"], -g["backlog"], g["group"]))
    return {"groups": ordered, "now_ms": now_ms}


def _add_lag(brokers: Brokers, row: Json, broker_name: str, address: str, group: str, topic: str) -> None:
    try:
        answer = brokers.call(address, "GetGroupLag", bpb.GroupLagRequest(group=group, topic=topic))
    except MqmetaError as error:
        row["errors"].append(f"{broker_name}: {error.message}")
        return
    for queue in answer.queues:
        row["queues"].append(
            {
                "topic": queue.topic,
                "broker_name": broker_name,
                "queue_id": queue.queue_id,
                "consumed_offset": queue.consumed_offset,
                "max_offset": queue.max_offset,
                "backlog": queue.backlog,
                "backlog_ms": queue.backlog_ms,
            }
        )
    known = {m["client_id"] for m in row["members"]}
    for member in answer.members:
        if member.client_id not in known:
            row["members"].append(
                {
                    "client_id": member.client_id,
                    "protocol": member.protocol,
                    "last_seen_ms_ago": member.last_seen_ms_ago,
                }
            )


def _group_row(name: str) -> Json:
    return {"group": name, "queues": [], "members": [], "errors": []}


def replicator(client: ControllerClient) -> Json:
    from mqmeta.admin_cli import replicator_status

    class _Args:
        rule = ""

    document, _ = replicator_status(client, _Args())
    return document


def search(
    client: ControllerClient,
    topic: str,
    key: str = "",
    msg_id: str = "",
    since_ms: int = 0,
    until_ms: int = 0,
) -> Json:
    """Messages by id, or of `topic` by key or store-time range (a key with a range: the
    key's messages within it), from the brokers' QueryMessages (as `mqmeta admin message
    query`); the first TRACES_MAX each with its trace (TraceMessage)."""
    from mqmeta import admin_messages

    if not (key or msg_id or since_ms or until_ms):
        raise InvalidArgument("a search needs a key, a message id or a time range")
    if (key or since_ms or until_ms) and not topic:
        raise InvalidArgument("a search by key or time range needs a topic")
    if since_ms and until_ms and until_ms <= since_ms:
        raise InvalidArgument(f"the time range ends ({until_ms}) before it starts ({since_ms})")
    args = argparse.Namespace(
        topic=topic,
        id=msg_id,
        key="" if msg_id else key,
        queue=None,
        offset=None,
        since=None if (msg_id or key or not since_ms) else since_ms,
        until=None if (msg_id or key or not until_ms) else until_ms,
        broker_name="",
        max=SEARCH_RESULTS_MAX,
        body_bytes=BODY_PREVIEW_BYTES,
        timeout=ADMIN_CALL_TIMEOUT_S,
    )
    document, _ = admin_messages.message_query(client, args)
    found = [
        m
        for m in document["messages"]
        if (not since_ms or m["store_timestamp_ms"] >= since_ms)
        and (not until_ms or m["store_timestamp_ms"] < until_ms)
    ]
    messages = [_message(m) for m in found]
    for message in messages[:TRACES_MAX]:
        message["trace"] = trace(client, message)
    return {"messages": messages}


def _message(found: Json) -> Json:
    body = base64.b64decode(found.get("body", ""))
    return {
        "msg_id": found["msg_id"],
        "topic": found["topic"],
        "broker_name": found["broker_name"],
        "queue_id": found["queue_id"],
        "queue_offset": found["queue_offset"],
        "store_timestamp_ms": found["store_timestamp_ms"],
        "born_timestamp_ms": found.get("born_timestamp_ms", 0),
        "tags": found.get("tags", ""),
        "keys": [k for k in found.get("keys", "").split(KEY_SEPARATOR) if k],
        "properties": found.get("properties", {}),
        "origin": found.get("origin", {}),
        "confirmed": found.get("confirmed", False),
        "body": body.decode(errors="replace"),
        "body_bytes": found.get("body_bytes", len(body)),
    }


def trace(client: ControllerClient, message: Json) -> Json:
    """Where one message is, from TraceMessage (as `mqmeta admin message trace`): the
    replicas that hold it, confirmed or not, tiered or not, the groups past it, its
    retry and dead-letter copies, the replicator tasks that copied it."""
    from mqmeta import admin_messages

    args = argparse.Namespace(
        id=message["msg_id"],
        topic=message["topic"],
        broker_name="",
        queue=None,
        offset=None,
        replicator_controllers="",
        controllers=",".join(client.addresses),
        timeout=ADMIN_CALL_TIMEOUT_S,
    )
    try:
        document, _ = admin_messages.message_trace(client, args)
    except MqmetaError as error:
        return {"error": error.message}
    return {
        # the master answered (it stores the message); these are its slaves
        "replicas": [{"broker_id": r["broker_id"], "holds": r["holds"]} for r in document["replicas"]],
        "confirmed": document["message"]["confirmed"],
        "tiered": document["tiered"],
        "consumed_by": [g["group"] for g in document["groups"] if g["consumed"]],
        "retries": [f"{r['topic']}/{r['queue_offset']}" for r in document["retries"]],
        "replicated_to": [r["rule"] for r in document["replicated_to"]],
        "origin": message["origin"],
    }


def reset_offsets(client: ControllerClient, group: str, topic: str, to: str, force: bool) -> Json:
    """A group's offsets to the earliest or latest (as `mqmeta admin group reset-offsets`);
    refused while members are connected unless `force`."""
    from mqmeta import admin_messages

    if to not in ("earliest", "latest"):
        raise InvalidArgument(f"reset to {to[:32]!r}? Use earliest or latest")
    args = argparse.Namespace(
        name=group,
        topic=topic,
        to_time=None,
        earliest=to == "earliest",
        latest=to == "latest",
        force=force,
        broker_name="",
        timeout=ADMIN_CALL_TIMEOUT_S,
    )
    document, _ = admin_messages.reset_offsets(client, args)
    return document


def resend(client: ControllerClient, msg_id: str, topic: str, group: str) -> Json:
    """A copy of one message for `group` (as `mqmeta admin message resend`): into
    %RETRY%{group}; from a %DLQ%{group} topic, this is the requeue."""
    from mqmeta import admin_messages

    if not msg_id:
        raise InvalidArgument("name the message to resend by its id")
    if not group:
        raise InvalidArgument("name the group that is to consume the copy")
    args = argparse.Namespace(
        id=msg_id,
        topic=topic,
        broker_name="",
        queue=None,
        offset=None,
        group=group,
        timeout=ADMIN_CALL_TIMEOUT_S,
    )
    document, _ = admin_messages.message_resend(client, args)
    return document


def history(client: ControllerClient, before_index: int, limit: int) -> Json:
    """One page of the commands the controllers applied, newest first (as `mqmeta admin
    history`): elections, SyncStateSet changes, topics, groups; fenced ones marked."""
    from mqmeta.admin_cli import history_page

    args = argparse.Namespace(limit=limit, before=before_index, command_types=[])
    document, _ = history_page(client, args)
    return document


def newest_history_index(client: ControllerClient) -> int:
    """The Raft index of the newest command in the history (0: none)."""
    reply = client.get_command_history(pb.GetCommandHistoryRequest(limit=1))
    return reply.commands[0].index if reply.commands else 0
