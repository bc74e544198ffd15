"""gRPC ControllerService: validates requests, calls ControllerOperations, maps errors.

Protobuf <-> command (controller/commands.py) and state <-> protobuf translation lives
here and nowhere else: each request becomes its command once, in a typed function. The service runs on an
AsyncServer (mqmeta/rpc.py): the hot calls are coroutines on its event loop (Heartbeat
and HeartbeatStream, the linearizable reads that only wait for a barrier, and the Watch stream, which holds no
thread however many brokers watch); every other call is a plain method run in the
server's thread pool.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from mqmeta.controller.command_history import (
    COMMAND_TYPES_PER_READ_MAX,
    PAGE_COMMANDS_DEFAULT,
    PAGE_COMMANDS_MAX,
)
from mqmeta.controller.commands import (
    COMMAND_TYPES,
    REQUEST_ID_CHARS_MAX,
    AlterSyncStateSet,
    Barrier,
    CleanBrokerData,
    Command,
    DeleteGroup,
    DeleteTopic,
    ElectMaster,
    PutGroup,
    PutTopic,
    RegisterBroker,
    ReplicatorCommit,
    TieredCommit,
    TieredForgetAbandoned,
    TieredUploadStart,
    Undecodable,
    UpdateConfig,
)
from mqmeta.controller.operations import ControllerOperations, WatchSubscription
from mqmeta.controller.replicator_leases import NO_OFFSET, TaskKey, validate_task
from mqmeta.controller.replicator_liveness import STATS_FIELDS, lease_view, validate_heartbeat
from mqmeta.controller.state_machine import ControllerState, replica_view, tiered_key

from mqmeta.errors import InvalidArgument, MqmetaError, NotFound, Unavailable
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import controller_pb2_grpc as pb_grpc
from mqmeta.rpc import REQUEST_ID_HEADER, abort_with_async, rpc, rpc_async, rpc_async_stream
from mqmeta.validate import REQUEST_INT_MAX, validate_int, validate_name

log = logging.getLogger(__name__)
Json = dict[str, Any]

TRIGGERS = {
    pb.ELECT_TRIGGER_UNSPECIFIED: "admin",
    pb.ELECT_TRIGGER_ADMIN: "admin",
    pb.ELECT_TRIGGER_BROKER: "broker",
    pb.ELECT_TRIGGER_CONTROLLER: "controller",
    pb.ELECT_TRIGGER_HANDOFF: "handoff",
}


def replica_info_pb(view: Json) -> pb.ReplicaInfo:
    replicas = [
        pb.Replica(
            broker_id=int(i),
            address=r["address"],
            election_priority=r["election_priority"],
            alive=r.get("alive", False),
        )
        for i, r in sorted(view["replicas"].items(), key=lambda kv: int(kv[0]))
    ]
    return pb.ReplicaInfo(
        cluster=view["cluster"],
        broker_name=view["broker_name"],
        master_broker_id=view["master_broker_id"],
        master_address=view["master_address"],
        master_epoch=view["master_epoch"],
        sync_state_set=view["sync_state_set"],
        sync_state_set_epoch=view["sync_state_set_epoch"],
        replicas=replicas,
    )


LIST_TOPICS_NAMES_MAX = 100_000


def list_topics_names(request: pb.ListTopicsRequest) -> list[str] | None:
    """The topics a ListTopics names (checked before any read), None for every topic."""
    if not request.names:
        return None
    if len(request.names) > LIST_TOPICS_NAMES_MAX:
        raise InvalidArgument(
            f"ListTopics names {len(request.names)} topics; name at most {LIST_TOPICS_NAMES_MAX:,}, "
            "or none for every topic"
        )
    return [validate_name("topic name", name) for name in request.names]


def list_topics_pb(state: ControllerState, names: list[str] | None) -> pb.ListTopicsResponse:
    if names is None:
        return pb.ListTopicsResponse(topics=[topic_pb(t) for t in state.topics()])
    found = (state.get(f"topic/{name}") for name in dict.fromkeys(names))
    return pb.ListTopicsResponse(topics=[topic_pb(t) for t in found if t is not None])


def topic_pb(topic: Json) -> pb.Topic:
    return pb.Topic(
        name=topic["name"],
        cluster=topic["cluster"],
        queue_count=topic["queue_count"],
        broker_names=topic["broker_names"],
        perm=topic["perm"],
        message_type=topic["message_type"],
        version=topic["version"],
    )


def group_pb(group: Json) -> pb.Group:
    return pb.Group(
        name=group["name"],
        subscriptions=[pb.Subscription(**s) for s in group["subscriptions"]],
        consume_from=group["consume_from"],
        consume_timestamp_ms=group["consume_timestamp_ms"],
        retry_max_times=group["retry_max_times"],
        retry_policy=group["retry_policy"],
        version=group["version"],
    )


def route_pb(route: Json) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic=route["topic"],
        message_type=route["message_type"],
        queues=[pb.QueueRoute(**q) for q in route["queues"]],
        brokers=[broker_route_pb(b) for b in route["brokers"]],
    )


def broker_route_pb(route: Json) -> pb.BrokerRoute:
    return pb.BrokerRoute(**route)


def config_pb(config: Json) -> pb.ControllerConfig:
    return pb.ControllerConfig(values={k: _config_text(v) for k, v in config.items()})


def _config_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _broker_set_ref(request) -> tuple[str, str]:
    return (validate_name("cluster", request.cluster), validate_name("broker name", request.broker_name))


def _broker_id(value: int, allow_zero: bool = False) -> int:
    return validate_int("broker_id", value, 0 if allow_zero else 1, REQUEST_INT_MAX)


class SnapshotEvents:
    """Encoded snapshot events (a broker set as it is at a Raft index), shared by the watch
    streams that open at the same index: when 900 brokers subscribe at once to the whole
    cluster, each of the 300 broker sets is encoded once, not 900 times. Used on the event
    loop only. A broker set's stored value is never changed in place, so the value object
    itself tells a hit."""

    def __init__(self) -> None:
        self._events: collections.OrderedDict[tuple[int, str, str], tuple[Json, pb.WatchEvent]] = (
            collections.OrderedDict()
        )

    def get(self, index: int, bs: Json) -> pb.WatchEvent:
        key = (index, bs["cluster"], bs["broker_name"])
        hit = self._events.get(key)
        if hit is not None and hit[0] is bs:
            return hit[1]
        event = _event_pb(
            {
                "kind": "snapshot",
                "index": index,
                "cluster": bs["cluster"],
                "broker_name": bs["broker_name"],
                "replica_info": bs,
            },
            snapshot=True,
        )
        self._events[key] = (bs, event)
        if len(self._events) > SNAPSHOT_EVENTS_CACHED_MAX:
            self._events.popitem(last=False)
        return event


class ControllerServicer(pb_grpc.ControllerServiceServicer):
    def __init__(self, core: ControllerOperations) -> None:
        self.core = core
        self._snapshot_events = SnapshotEvents()

    @rpc
    def RegisterBroker(self, request, context):
        result = self.core.register_broker(register_command(request))
        return pb.RegisterBrokerResponse(
            broker_id=result["broker_id"], replica_info=replica_info_pb(result["replica_info"])
        )

    @rpc
    def GetNextBrokerId(self, request, context):
        cluster, broker_name = _broker_set_ref(request)
        bs = self.core.read_barrier().broker_set(cluster, broker_name)
        return pb.NextBrokerIdResponse(next_broker_id=bs["next_broker_id"] if bs else 1)

    def _heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        cluster, broker_name = _broker_set_ref(request)
        reply = self.core.heartbeat(
            {
                "cluster": cluster,
                "broker_name": broker_name,
                "broker_id": _broker_id(request.broker_id),
                "epoch": request.epoch,
                "max_offset": request.max_offset,
                "confirm_offset": request.confirm_offset,
                "election_priority": request.election_priority,
            }
        )
        return pb.HeartbeatResponse(**reply)

    @rpc_async
    async def Heartbeat(self, request, context):
        return self._heartbeat(request)

    @rpc_async_stream
    async def HeartbeatStream(self, request_iterator, context) -> AsyncIterator[pb.HeartbeatResponse]:
        """Each request answered in order, as the unary call would; the first one refused
        (malformed, not registered, this node not the leader) ends the stream with the unary
        call's status, so the broker turns to the leader or registers again."""
        async for request in request_iterator:
            yield self._heartbeat(request)

    @rpc
    def GetReplicaInfo(self, request, context):
        return replica_info_pb(self.core.replica_info(*_broker_set_ref(request)))

    @rpc
    def ElectMaster(self, request, context):
        view = self.core.elect_master(elect_command(request), master_unreachable=request.master_unreachable)
        return replica_info_pb(view)

    @rpc
    def AlterSyncStateSet(self, request, context):
        return replica_info_pb(self.core.alter_sync_state_set(alter_sync_state_set_command(request)))

    @rpc
    def GetSyncStateData(self, request, context):
        view = self.core.replica_info(*_broker_set_ref(request))
        info = replica_info_pb(view)
        in_set = set(view["sync_state_set"])
        return pb.SyncStateData(
            replica_info=info,
            in_sync_replicas=[r for r in info.replicas if r.broker_id in in_set],
            out_of_sync_replicas=[r for r in info.replicas if r.broker_id not in in_set],
        )

    @rpc
    def CleanBrokerData(self, request, context):
        result = self.core.clean_broker_data(clean_command(request))
        return pb.CleanBrokerDataResponse(
            cleaned_broker_ids=result["cleaned_broker_ids"], broker_set_removed=result["broker_set_removed"]
        )

    @rpc_async
    async def GetMetadata(self, request, context):
        meta = self.core.metadata()
        nodes = [pb.ControllerNode(**n) for n in meta.pop("nodes")]
        return pb.ControllerMetadata(nodes=nodes, **meta)

    @rpc
    def ListBrokerSets(self, request, context):
        cluster = validate_name("cluster", request.cluster) if request.cluster else ""
        return pb.ListBrokerSetsResponse(
            broker_sets=[replica_info_pb(v) for v in self.core.broker_sets(cluster)]
        )

    # The metadata writes are coroutines on the server's loop, as heartbeats are: a write
    # waits for its commit without a thread (a sync handler cost two thread hand-offs per
    # write, the loop's to a pool thread and back, and with 16 writers 16 threads woken).
    @rpc_async
    async def CreateTopic(self, request, context):
        command = _topic_command(request, "create", request_id(context))
        return topic_pb((await self.core.propose_async(command))["topic"])

    @rpc_async
    async def UpdateTopic(self, request, context):
        command = _topic_command(request, "update", request_id(context))
        return topic_pb((await self.core.propose_async(command))["topic"])

    @rpc_async
    async def DeleteTopic(self, request, context):
        await self.core.propose_async(DeleteTopic(name=request.name, request_id=request_id(context)))
        return pb.DeleteResponse(name=request.name)

    @rpc
    def ListTopics(self, request, context):
        names = list_topics_names(request)
        return list_topics_pb(self.core.read_barrier(), names)

    @rpc_async
    async def GetTopicRoute(self, request, context):
        return route_pb(await self.core.topic_route_async(request.name))

    @rpc_async
    async def CreateGroup(self, request, context):
        command = _group_command(request, "create", request_id(context))
        return group_pb((await self.core.propose_async(command))["group"])

    @rpc_async
    async def UpdateGroup(self, request, context):
        command = _group_command(request, "update", request_id(context))
        return group_pb((await self.core.propose_async(command))["group"])

    @rpc_async
    async def DeleteGroup(self, request, context):
        await self.core.propose_async(DeleteGroup(name=request.name, request_id=request_id(context)))
        return pb.DeleteResponse(name=request.name)

    @rpc
    def ListGroups(self, request, context):
        return pb.ListGroupsResponse(groups=[group_pb(g) for g in self.core.read_barrier().groups()])

    @rpc_async
    async def GetConfig(self, request, context):
        return config_pb((await self.core.read_barrier_async()).config())

    @rpc_async
    async def UpdateConfig(self, request, context):
        command = UpdateConfig(values=dict(request.values), request_id=request_id(context))
        return config_pb((await self.core.propose_async(command))["config"])

    @rpc_async
    async def Write(self, request, context):
        count = len(request.writes)
        if not 1 <= count <= WRITE_BATCH_MAX:
            raise InvalidArgument(f"a write batch holds 1 to {WRITE_BATCH_MAX} writes, not {count}")
        batch_id = request_id(context)
        commands: list[Command] = [
            replace(_write_command(i, op), request_id=f"{batch_id}/{i}" if batch_id else None)
            for i, op in enumerate(request.writes)
        ]
        timeout_s = min(5.0, context.time_remaining() or 5.0)
        outcomes = await self.core.propose_many_async(commands, timeout_s)
        return pb.WriteResults(results=[_write_result(o) for o in outcomes])

    def _tiered(self, command: Command) -> pb.TieredCheckpoint:
        return tiered_checkpoint_pb(self.core.propose(command)["checkpoint"])

    @rpc
    def TieredUploadStart(self, request, context):
        return self._tiered(tiered_upload_start_command(request))

    @rpc
    def TieredCommit(self, request, context):
        return self._tiered(tiered_commit_command(request))

    @rpc
    def TieredForgetAbandoned(self, request, context):
        return self._tiered(tiered_forget_command(request))

    @rpc
    def GetTieredCheckpoint(self, request, context):
        cluster, broker_name = _broker_set_ref(request)
        state = self.core.read_barrier()
        checkpoint = state.get(tiered_key(cluster, broker_name))
        if checkpoint is None:
            if state.broker_set(cluster, broker_name) is None:
                raise NotFound(f"broker set {cluster}/{broker_name} is not registered")
            return pb.TieredCheckpoint(cluster=cluster, broker_name=broker_name)
        return tiered_checkpoint_pb(checkpoint)

    @rpc
    def ReplicatorHeartbeat(self, request, context):
        worker_id = validate_name("worker_id", request.worker_id)
        heartbeat = validate_heartbeat(
            {
                "worker_id": worker_id,
                "incarnation": request.incarnation,
                "lease_ms": request.lease_ms,
                "dead_after_ms": request.dead_after_ms,
                "rules": list(request.rules),
                "tasks": [_task_key(t) for t in request.tasks],
                "running": [_task_stats(r) for r in request.running],
                "leaving": request.leaving,
            }
        )
        granted = self.core.replicator_heartbeat(heartbeat)
        return pb.ReplicatorHeartbeatResponse(
            leases=[
                pb.ReplicatorLease(
                    task=_task_key_pb(lease["task"]),
                    epoch=lease["epoch"],
                    start_offset=lease["start_offset"],
                    acked_offset=lease["acked_offset"],
                    rule_digest=lease["rule_digest"],
                )
                for lease in granted
            ]
        )

    @rpc
    def CommitReplicatorTask(self, request, context):
        view = lease_view(self.core.propose(replicator_commit_command(request))["checkpoint"])
        return pb.ReplicatorCheckpoint(
            task=_task_key_pb(view["task"]),
            worker_id=view["worker_id"],
            epoch=view["epoch"],
            start_offset=view["start_offset"],
            acked_offset=view["acked_offset"],
            replicated=view["replicated"],
        )

    @rpc
    def GetReplicatorStatus(self, request, context):
        rule = validate_name("rule name", request.rule) if request.rule else ""
        document = self.core.replicator_status(rule)
        workers = [
            pb.ReplicatorWorker(worker_id=w["worker_id"], running=[_task_key_pb(t) for t in w["running"]])
            for w in document["workers"]
        ]
        return pb.ReplicatorStatus(rules=[_rule_status_pb(r) for r in document["rules"]], workers=workers)

    @rpc
    def GetCommandHistory(self, request, context):
        """What this node applied (controller/command_history.py): no barrier, no leader
        needed; a follower answers what it has applied so far."""
        limit, before_index, command_types = command_history_query(request)
        raft = self.core.raft
        page = raft.history.page(limit, before_index, command_types)
        return pb.CommandHistory(
            commands=[pb.AppliedCommand(**record) for record in page["commands"]],
            next_before_index=page["next_before_index"],
            oldest_index=page["oldest_index"],
            last_applied_index=raft.raftLastApplied,
            node_id=self.core.node_id,
        )

    async def Watch(self, request, context) -> AsyncIterator[pb.WatchEvent]:
        async for events in self._watch(request, context, 1):  # one at a time: none held off the queue
            for event in events:
                yield event

    async def WatchBatched(self, request, context) -> AsyncIterator[pb.WatchBatch]:
        """Watch's events, every one waiting when the stream is written in one message."""
        async for events in self._watch(request, context, WATCH_BATCH_MAX):
            yield pb.WatchBatch(events=events)

    async def _watch(self, request, context, batch_max: int) -> AsyncIterator[list[pb.WatchEvent]]:
        hub = self.core.watch_hub
        try:
            cluster = validate_name("cluster", request.cluster) if request.cluster else ""
            broker_name = validate_name("broker name", request.broker_name) if request.broker_name else ""
            subscription = hub.subscribe(cluster, broker_name)
        except MqmetaError as error:
            await abort_with_async(context, error)
            return
        try:
            async for events in self._watch_stream(subscription, context, batch_max):
                yield events
        finally:
            hub.unsubscribe(subscription)

    async def _watch_stream(
        self, subscription: WatchSubscription, context, batch_max: int
    ) -> AsyncIterator[list[pb.WatchEvent]]:
        """The broker sets that match as they are after a barrier (each stamped with the
        barrier's index), then every event the node applies after that index, until the
        client goes away or falls behind; as lists of the events waiting together (at most
        `batch_max`: a stream that falls behind is noticed by its queue, so Watch takes one
        at a time). An event at or below the index is already in the snapshot and in
        whatever the client reads after the first message, so it is not sent: a node that
        is catching up (just restarted, or back from a partition) applies its backlog
        after the subscription, and would otherwise replay every topic and broker change
        of its log as news (a route copy then stopped answering every topic until its
        next reload). A change may still come twice: the snapshot is read just after its
        index, and an event above the index may repeat it."""
        try:
            state = await self.core.read_barrier_async()
        except MqmetaError as error:
            await abort_with_async(context, error)
            return
        index = self.core.raft.raftLastApplied
        snapshot = [
            self._snapshot_events.get(index, bs)
            for bs in state.broker_sets(subscription.cluster)
            if not subscription.broker_name or bs["broker_name"] == subscription.broker_name
        ]
        for start in range(0, len(snapshot), batch_max):
            yield snapshot[start : start + batch_max]
        queue = subscription.queue
        loop = asyncio.get_running_loop()
        sent_at = -WATCH_BATCH_PACE_S
        while True:  # until the client goes away: the wait below then raises CancelledError
            items = [await queue.get()]
            if batch_max > 1 and isinstance(items[-1], tuple) and queue.qsize() < batch_max - 1:
                wait_s = sent_at + WATCH_BATCH_PACE_S - loop.time()
                if wait_s > 0:  # one message per pace while events keep coming, unless one is full
                    await asyncio.sleep(wait_s)
            while len(items) < batch_max and not queue.empty() and isinstance(items[-1], tuple):
                items.append(queue.get_nowait())
            ended = not isinstance(items[-1], tuple)  # None (fell behind) or why it ends
            events = [item[1] for item in items if isinstance(item, tuple) and item[0]["index"] > index]
            if events:
                yield events
                sent_at = loop.time()
            if ended:
                why = (
                    items[-1]
                    if items[-1] is not None
                    else Unavailable("watch stream fell behind; resubscribe")
                )
                await abort_with_async(context, why)
                return


WATCH_BATCH_MAX = 256  # events in one WatchBatched message
# WatchBatched sends at most one message per pace while events keep coming (the first after
# a quiet pace goes at once): a gRPC stream message costs the serving node's loop and the
# follower (the nameserver's route copy) 0.2-0.3 ms of CPU each, and one writer creating
# topics one after another made one message per topic. Watch (the brokers') is not paced.
WATCH_BATCH_PACE_S = 0.01
WRITE_BATCH_MAX = 1024
SNAPSHOT_EVENTS_CACHED_MAX = 4096
_INT_SEGMENT_FIELDS = ("base_offset", "end_offset", "size", "record_count", "first_epoch", "last_epoch")


def _task_key(key: pb.ReplicatorTaskKey) -> TaskKey:
    if not key.rule and not key.topic:
        raise InvalidArgument("a replicator task names its rule, topic, broker_name and queue_id")
    return validate_task([key.rule, key.topic, key.broker_name, key.queue_id])


def _task_key_pb(task: TaskKey) -> pb.ReplicatorTaskKey:
    rule, topic, broker_name, queue_id = task
    return pb.ReplicatorTaskKey(rule=rule, topic=topic, broker_name=broker_name, queue_id=queue_id)


def _task_stats(stats: pb.ReplicatorTaskStats) -> Json:
    rate = stats.messages_per_s
    if not math.isfinite(rate) or rate < 0:
        raise InvalidArgument("messages_per_s must be a finite number of at least 0")
    document: Json = {
        "task": _task_key(stats.task),
        "epoch": validate_int("epoch", stats.epoch, 1, REQUEST_INT_MAX),
        "messages_per_s": rate,
    }
    for name in STATS_FIELDS:
        document[name] = validate_int(name, getattr(stats, name), 0, REQUEST_INT_MAX)
    return document


def _rule_status_pb(rule: Json) -> pb.ReplicatorRuleStatus:
    tasks = []
    for task in rule["tasks"]:
        key = pb.ReplicatorTaskKey(
            rule=task["rule"], topic=task["topic"], broker_name=task["broker_name"], queue_id=task["queue_id"]
        )
        stats = pb.ReplicatorTaskStats(
            task=key,
            epoch=task["epoch"],
            messages_per_s=task["messages_per_s"],
            **{name: task[name] for name in STATS_FIELDS},
        )
        tasks.append(
            pb.ReplicatorTaskStatus(
                task=key,
                worker_id=task["worker_id"],
                epoch=task["epoch"],
                start_offset=task["start_offset"],
                acked_offset=task["acked_offset"],
                running=task["running"],
                stats=stats,
            )
        )
    return pb.ReplicatorRuleStatus(
        name=rule["name"],
        tasks=tasks,
        replicated=rule["replicated"],
        lag_messages=rule["lag_messages"],
        delay_ms=rule["delay_ms"],
        last_sync_ms=rule["last_sync_ms"],
        messages_per_s=rule["messages_per_s"],
    )


def tiered_checkpoint_pb(checkpoint: Json) -> pb.TieredCheckpoint:
    inflight = checkpoint.get("inflight") or {}
    return pb.TieredCheckpoint(
        cluster=checkpoint["cluster"],
        broker_name=checkpoint["broker_name"],
        uploaded_offset=checkpoint["uploaded_offset"],
        checkpoint_epoch=checkpoint["checkpoint_epoch"],
        segments=[
            pb.TieredSegment(
                key=s.get("key", ""),
                sha256=s.get("sha256", ""),
                **{f: int(s.get(f, 0)) for f in _INT_SEGMENT_FIELDS},
            )
            for s in checkpoint["segments"]
        ],
        epochs=[pb.TieredEpoch(epoch=e, start_offset=o) for e, o in checkpoint["epochs"]],
        inflight_upload_id=inflight.get("upload_id", ""),
        inflight_base_offset=inflight.get("base_offset", 0),
        inflight_end_offset=inflight.get("end_offset", 0),
        abandoned_upload_ids=checkpoint["abandoned"],
    )


# Requests -> commands (each request once) ---------------------------------------------


def register_command(request: pb.RegisterBrokerRequest) -> RegisterBroker:
    cluster, broker_name = _broker_set_ref(request)
    return RegisterBroker(
        cluster=cluster,
        broker_name=broker_name,
        broker_id=_broker_id(request.broker_id, allow_zero=True),
        check_code=request.check_code,
        address=request.address,
        election_priority=request.election_priority,
        new_process=True if request.new_process else None,  # False: an older broker, or not its first
    )


def elect_command(request: pb.ElectMasterRequest) -> ElectMaster:
    cluster, broker_name = _broker_set_ref(request)
    trigger = TRIGGERS.get(request.trigger)
    if trigger is None:
        raise InvalidArgument(f"unknown election trigger {request.trigger}")
    return ElectMaster(
        cluster=cluster,
        broker_name=broker_name,
        trigger=trigger,
        requester_broker_id=_broker_id(request.requester_broker_id, allow_zero=True),
        preferred_broker_id=_broker_id(request.preferred_broker_id, allow_zero=True),
        master_epoch=request.master_epoch if trigger == "handoff" else 0,
    )


def command_history_query(request: pb.GetCommandHistoryRequest) -> tuple[int, int, list[str]]:
    """(limit, before_index, command types) of a GetCommandHistory, checked."""
    limit = request.limit or PAGE_COMMANDS_DEFAULT
    if not 1 <= limit <= PAGE_COMMANDS_MAX:
        raise InvalidArgument(
            f"limit must be 1 to {PAGE_COMMANDS_MAX} commands (0: {PAGE_COMMANDS_DEFAULT}), not {limit}"
        )
    if request.before_index < 0:
        raise InvalidArgument(
            f"before_index must be a Raft index (1 or more; 0: the newest), not {request.before_index}"
        )
    if len(request.command_types) > COMMAND_TYPES_PER_READ_MAX:
        raise InvalidArgument(f"name at most {COMMAND_TYPES_PER_READ_MAX} command types")
    unknown = sorted(set(request.command_types) - set(COMMAND_TYPES) - {Undecodable.TYPE})
    if unknown or Barrier.TYPE in request.command_types:
        known = ", ".join(sorted(set(COMMAND_TYPES) - {Barrier.TYPE}))
        which = (unknown or [Barrier.TYPE])[0][:64]
        raise InvalidArgument(f"no command type {which!r} in the history; the types are {known}, undecodable")
    return limit, request.before_index, list(request.command_types)


def alter_sync_state_set_command(request: pb.AlterSyncStateSetRequest) -> AlterSyncStateSet:
    cluster, broker_name = _broker_set_ref(request)
    if not request.new_sync_state_set:
        raise InvalidArgument("new_sync_state_set must list at least the master")
    return AlterSyncStateSet(
        cluster=cluster,
        broker_name=broker_name,
        master_broker_id=_broker_id(request.master_broker_id),
        master_epoch=request.master_epoch,
        sync_state_set_epoch=request.sync_state_set_epoch,
        new_sync_state_set=[_broker_id(i) for i in request.new_sync_state_set],
    )


def clean_command(request: pb.CleanBrokerDataRequest) -> CleanBrokerData:
    cluster, broker_name = _broker_set_ref(request)
    return CleanBrokerData(
        cluster=cluster,
        broker_name=broker_name,
        broker_ids=[_broker_id(i) for i in request.broker_ids],
        force=request.force,
    )


def tiered_upload_start_command(request: pb.TieredUploadStartRequest) -> TieredUploadStart:
    cluster, broker_name = _broker_set_ref(request)
    return TieredUploadStart(
        cluster=cluster,
        broker_name=broker_name,
        master_broker_id=request.master_broker_id,
        master_epoch=request.master_epoch,
        upload_id=request.upload_id,
        base_offset=request.base_offset,
        end_offset=request.end_offset,
    )


def tiered_commit_command(request: pb.TieredCommitRequest) -> TieredCommit:
    cluster, broker_name = _broker_set_ref(request)
    return TieredCommit(
        cluster=cluster,
        broker_name=broker_name,
        master_broker_id=request.master_broker_id,
        master_epoch=request.master_epoch,
        upload_id=request.upload_id,
        segments=[
            {"key": seg.key, "sha256": seg.sha256, **{f: getattr(seg, f) for f in _INT_SEGMENT_FIELDS}}
            for seg in request.segments
        ],
        epochs=[[e.epoch, e.start_offset] for e in request.epochs],
    )


def tiered_forget_command(request: pb.TieredForgetRequest) -> TieredForgetAbandoned:
    cluster, broker_name = _broker_set_ref(request)
    return TieredForgetAbandoned(
        cluster=cluster,
        broker_name=broker_name,
        master_broker_id=request.master_broker_id,
        master_epoch=request.master_epoch,
        upload_ids=list(request.upload_ids),
    )


def replicator_commit_command(request: pb.CommitReplicatorTaskRequest) -> ReplicatorCommit:
    return ReplicatorCommit(
        worker_id=validate_name("worker_id", request.worker_id),
        task=list(_task_key(request.task)),
        epoch=validate_int("epoch", request.epoch, 1, REQUEST_INT_MAX),
        start_offset=validate_int("start_offset", request.start_offset, NO_OFFSET, REQUEST_INT_MAX),
        acked_offset=validate_int("acked_offset", request.acked_offset, NO_OFFSET, REQUEST_INT_MAX),
        replicated=validate_int("replicated", request.replicated, 0, REQUEST_INT_MAX),
        rule_digest=request.rule_digest,
    )


def _topic_command(spec: pb.TopicSpec, mode: str, request_id: str | None = None) -> PutTopic:
    return PutTopic(
        mode=mode,
        name=spec.name,
        cluster=spec.cluster,
        queue_count=spec.queue_count,
        broker_names=list(spec.broker_names),
        perm=spec.perm,
        message_type=spec.message_type,
        if_queue_count=spec.if_queue_count,
        request_id=request_id,
    )


def _group_command(spec: pb.GroupSpec, mode: str, request_id: str | None = None) -> PutGroup:
    return PutGroup(
        mode=mode,
        name=spec.name,
        subscriptions=[{"topic": s.topic, "expression": s.expression} for s in spec.subscriptions],
        consume_from=spec.consume_from,
        consume_timestamp_ms=spec.consume_timestamp_ms,
        retry_max_times=spec.retry_max_times,
        retry_policy=spec.retry_policy,
        request_id=request_id,
    )


def request_id(context: Any) -> str | None:
    """The id of the logical write this call is an attempt of (metadata REQUEST_ID_HEADER,
    sent by mqmeta.client with every attempt), or None for a client that sends none."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_HEADER:
            if not (
                isinstance(value, str) and 1 <= len(value) <= REQUEST_ID_CHARS_MAX and value.isprintable()
            ):
                raise InvalidArgument(
                    f"metadata {REQUEST_ID_HEADER} must be 1 to {REQUEST_ID_CHARS_MAX} printable characters"
                )
            return value
    return None


def _write_command(
    position: int, op: pb.WriteOp
) -> PutTopic | PutGroup | DeleteTopic | DeleteGroup | UpdateConfig:
    kind = op.WhichOneof("op")
    if kind == "create_topic":
        return _topic_command(op.create_topic, "create")
    if kind == "update_topic":
        return _topic_command(op.update_topic, "update")
    if kind == "create_group":
        return _group_command(op.create_group, "create")
    if kind == "update_group":
        return _group_command(op.update_group, "update")
    if kind == "delete_topic":
        return DeleteTopic(name=op.delete_topic)
    if kind == "delete_group":
        return DeleteGroup(name=op.delete_group)
    if kind == "update_config":
        return UpdateConfig(values=dict(op.update_config.values))
    raise InvalidArgument(f"write #{position} names no operation")


def _write_result(outcome: Json | MqmetaError) -> pb.WriteResult:
    if isinstance(outcome, MqmetaError):
        return pb.WriteResult(error_code=outcome.code, message=outcome.message)
    if "topic" in outcome:
        return pb.WriteResult(topic=topic_pb(outcome["topic"]))
    if "group" in outcome:
        return pb.WriteResult(group=group_pb(outcome["group"]))
    if "config" in outcome:
        return pb.WriteResult(config=config_pb(outcome["config"]))
    return pb.WriteResult(deleted=outcome["name"])


def watch_event_pb(event: Json) -> pb.WatchEvent:
    """An applied event as the Watch stream sends it (the hub encodes each event once)."""
    return _event_pb(event)


def _event_pb(event: Json, snapshot: bool = False) -> pb.WatchEvent:
    info = event.get("replica_info")
    if info is not None and snapshot:
        info = replica_view(info)
    return pb.WatchEvent(
        index=event["index"],
        kind=event["kind"],
        cluster=event.get("cluster", ""),
        broker_name=event.get("broker_name", ""),
        name=event.get("name", ""),
        replica_info=replica_info_pb(info) if info is not None else None,
    )
