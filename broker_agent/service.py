"""gRPC BrokerService over a BrokerAgent, and the `mqmeta broker` process."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from mqmeta.broker_agent import replication
from mqmeta.broker_agent.admin import BrokerAdmin
from mqmeta.broker_agent.agent import BrokerAgent, BrokerConfig
from mqmeta.broker_agent.commitlog import SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN
from mqmeta.broker_agent.metrics import BrokerMetrics
from mqmeta.broker_agent.origins import ORIGIN_AHEAD
from mqmeta.broker_agent.store import PutResult
from mqmeta.broker_agent.tiered import UPLOAD_BYTES_MAX

from mqmeta.clock import now_ms, wall_ms
from mqmeta.config_file import accept_config_file
from mqmeta.errors import FailedPrecondition, InvalidArgument, NotFound
from mqmeta.formats.origin import OriginKey
from mqmeta.formats.records import MessageFields
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.remoting.server import listen_address
from mqmeta.rpc import (
    STOP_GRACE_S,
    STOP_NOW_GRACE_S,
    add_health_and_reflection,
    build_server,
    rpc,
    serve_until_signal,
)
from mqmeta.validate import (
    QUEUE_ID_MAX,
    REQUEST_INT_MAX,
    FlagNumber,
    parse_addresses,
    validate_int,
    validate_name,
)

log = logging.getLogger(__name__)

PULL_COUNT_MAX = 1024
ORIGIN_REORDER_WAIT_MS = 1000  # how long a replicated batch waits for its predecessor
ORIGIN_REORDER_POLL_MS = 20
BROKER_SERVICE = bpb.DESCRIPTOR.services_by_name["BrokerService"].full_name
TOPICS_SEEN_MAX = 4096  # valid topic names _message remembers
_TOPICS_SEEN: set[str] = set()


def check_sent_messages(messages: Sequence[bpb.Message]) -> None:
    """The topic and queue id of each message sent (the store checks the rest as it
    encodes). The store takes the protobuf messages themselves (records.MessageFields):
    building a Message per record cost about 1 µs of the master's CPU per message."""
    for m in messages:
        topic, queue_id = m.topic, m.queue_id
        if topic not in _TOPICS_SEEN:  # one message per record sent: check a topic once
            validate_name("topic", topic)
            if len(_TOPICS_SEEN) >= TOPICS_SEEN_MAX:
                _TOPICS_SEEN.clear()
            _TOPICS_SEEN.add(topic)
        if not 0 <= queue_id <= QUEUE_ID_MAX:
            validate_int("queue_id", queue_id, 0, QUEUE_ID_MAX)


def send_response(epoch: int, results: Sequence[PutResult]) -> bpb.SendResponse:
    response = bpb.SendResponse(master_epoch=epoch)
    add = response.results.add
    for r in results:  # fields set one by one: half the cost of SendResult(**fields)
        sent = add()
        sent.msg_id = r.msg_id
        sent.topic = r.topic
        sent.queue_id = r.queue_id
        sent.queue_offset = r.queue_offset
        sent.commit_offset = r.commit_offset
        if r.duplicate:
            sent.duplicate = True
    return response


def _stored(record) -> bpb.StoredMessage:
    return bpb.StoredMessage(
        msg_id=record.msg_id,
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commit_offset=record.commit_offset,
        epoch=record.epoch,
        store_timestamp_ms=record.store_timestamp_ms,
        body=record.body,
        tags=record.tags,
        keys=record.keys,
        properties=dict(record.properties),
        producer_id=record.producer_id,
        producer_seq=record.producer_seq,
    )


class BrokerServicer(bpb_grpc.BrokerServiceServicer):
    def __init__(
        self, agent: BrokerAgent, metrics: BrokerMetrics | None = None, admin: BrokerAdmin | None = None
    ) -> None:
        self.agent = agent
        self.metrics = metrics
        self.admin = admin if admin is not None else BrokerAdmin(agent)

    @rpc
    def Send(self, request, context):
        messages = request.messages
        check_sent_messages(messages)
        started = time.perf_counter()
        results, epoch = self._send_in_origin_order(messages)
        if self.metrics is not None:
            self.metrics.send_seconds.observe(time.perf_counter() - started)
            self.metrics.messages_in.inc(len(messages))
            self.metrics.bytes_in.inc(sum(len(m.body) for m in messages))
        return send_response(epoch, results)

    def _send_in_origin_order(self, messages: Sequence[MessageFields]) -> tuple[list, int]:
        """agent.send; a batch of replicated copies whose predecessor has not arrived yet
        (several batches in flight over a WAN can overtake each other in this server's
        threads) waits for it, a bounded time, instead of failing the whole pipeline."""
        deadline = time.monotonic() + ORIGIN_REORDER_WAIT_MS / 1000
        while True:
            try:
                return self.agent.send(messages)
            except FailedPrecondition as error:
                remaining = deadline - time.monotonic()
                if error.code != ORIGIN_AHEAD or remaining <= 0:
                    raise
            with self.agent.lock:  # notified by every append
                self.agent.lock.wait(timeout=min(remaining, ORIGIN_REORDER_POLL_MS / 1000))

    @rpc
    def Pull(self, request, context):
        validate_name("topic", request.topic)
        validate_int("queue_id", request.queue_id, 0, QUEUE_ID_MAX)
        validate_int("queue_offset", request.queue_offset, 0, REQUEST_INT_MAX)
        count = validate_int("max_count", request.max_count or 32, 1, PULL_COUNT_MAX)
        self.agent.require_master()
        confirm = self.agent.view().confirm_offset
        try:
            records = self.agent.store.get_messages(
                request.topic, request.queue_id, request.queue_offset, count, confirm
            )
        except InvalidArgument as error:
            if error.code != "OFFSET_TOO_SMALL" or self.agent.tiered is None:
                raise
            records = self.agent.tiered.read_queue(
                request.topic, request.queue_id, request.queue_offset, count
            )
        next_offset = records[-1].queue_offset + 1 if records else request.queue_offset
        readable = self.agent.store.readable_queue_max_offset(request.topic, request.queue_id, confirm)
        if self.metrics is not None:
            self.metrics.messages_out.inc(len(records))
            self.metrics.delivered_bytes_out.inc(sum(len(r.body) for r in records))
        return bpb.PullResponse(
            messages=[_stored(r) for r in records], next_queue_offset=next_offset, max_queue_offset=readable
        )

    @rpc
    def CommitOffset(self, request, context):
        validate_name("group", request.group)
        validate_name("topic", request.topic)
        validate_int("queue_id", request.queue_id, 0, QUEUE_ID_MAX)
        validate_int("offset", request.offset, 0, REQUEST_INT_MAX)
        self.agent.commit_consumer_offset(request.group, request.topic, request.queue_id, request.offset)
        self.admin.note_commit(request.group, context.peer(), wall_ms())
        return bpb.CommitOffsetResponse()

    @rpc
    def QueryOffset(self, request, context):
        validate_name("group", request.group)
        validate_name("topic", request.topic)
        self.agent.require_master()
        offset = self.agent.store.consumer_offset(request.group, request.topic, request.queue_id)
        return bpb.QueryOffsetResponse(offset=-1 if offset is None else offset)

    @rpc
    def QueryOrigin(self, request, context):
        for kind, name in (("cluster", request.cluster), ("broker_name", request.broker_name)):
            validate_name(kind, name)
        validate_name("topic", request.topic)
        validate_int("queue_id", request.queue_id, 0, QUEUE_ID_MAX)
        with self.agent.lock:
            self.agent.core.check_master()
            epoch = self.agent.core.master_epoch
        key = OriginKey(request.cluster, request.broker_name, request.topic, request.queue_id)
        head = self.agent.store.origin_head(key)
        if head is None:
            return bpb.QueryOriginResponse(offset=-1, translated=-1)
        # Answer only a durable head: a replicator resumes after it, so a head a failover
        # could still cut off would skip the messages it names.
        self.agent.wait_acknowledged(head.end_offset, epoch)
        translated = -1
        if request.HasField("translate"):
            validate_int("translate", request.translate, 0, REQUEST_INT_MAX)
            found = self.agent.store.translate_origin(key, request.translate)
            translated = -1 if found is None else found
        return bpb.QueryOriginResponse(
            offset=head.offset,
            topic=head.topic,
            queue_id=head.queue_id,
            queue_offset=head.queue_offset,
            translated=translated,
        )

    @rpc
    def ListConsumerOffsets(self, request, context):
        validate_name("topic", request.topic)
        validate_int("queue_id", request.queue_id, 0, QUEUE_ID_MAX)
        self.agent.require_master()
        offsets = self.agent.store.consumer_offsets_of(request.topic, request.queue_id)
        return bpb.ListConsumerOffsetsResponse(
            offsets=[bpb.ConsumerOffset(group=g, offset=o) for g, o in offsets]
        )

    @rpc
    def GetEpochCache(self, request, context):
        agent = self.agent
        with agent.lock:
            view = agent.core.view()
            return bpb.EpochCache(
                broker_name=agent.config.broker_name,
                broker_id=view.broker_id,
                entries=[bpb.EpochEntry(epoch=e, start_offset=s) for e, s in agent.store.epochs.entries],
                max_offset=agent.store.max_offset,
                confirm_offset=view.confirm_offset,
            )

    @rpc
    def GetHaStatus(self, request, context):
        return ha_status(self.agent)

    @rpc
    def HaFetch(self, request, context):
        if request.broker_name != self.agent.config.broker_name:
            raise NotFound(f"this broker serves {self.agent.config.broker_name}, not {request.broker_name}")
        started = time.perf_counter()
        reply = replication.serve_fetch(self.agent, request)
        if self.metrics is not None:
            self.metrics.fetch_seconds.observe(time.perf_counter() - started)
            self.metrics.bytes_out.inc(len(reply.data))
        return reply

    # Admin calls (broker_agent/admin.py) -----------------------------------------------------
    @rpc
    def QueryMessages(self, request, context):
        return self.admin.query_messages(request)

    @rpc
    def TraceMessage(self, request, context):
        return self.admin.trace_message(request)

    @rpc
    def ResendMessage(self, request, context):
        return self.admin.resend(request)

    @rpc
    def GetGroupLag(self, request, context):
        return self.admin.group_lag(request)

    @rpc
    def ResetOffsets(self, request, context):
        return self.admin.reset_offsets(request)

    @rpc
    def Handoff(self, request, context):
        preferred = validate_int("preferred_broker_id", request.preferred_broker_id, 0, REQUEST_INT_MAX)
        view, unavailable_ms = self.agent.handoff(preferred)
        return bpb.HandoffResponse(
            master_broker_id=view.master_broker_id,
            master_address=view.master_address,
            master_epoch=view.master_epoch,
            unavailable_ms=unavailable_ms,
        )


def ha_status(agent: BrokerAgent) -> bpb.HaStatus:
    with agent.lock:
        now = now_ms()
        core = agent.core
        view = core.view()
        max_offset = agent.store.max_offset
        slaves = [
            bpb.SlaveStatus(
                broker_id=i,
                acked_offset=p.acked_offset,
                in_sync=i in view.sync_state_set,
                lag_bytes=max(0, max_offset - p.acked_offset),
                last_fetch_ms_ago=now - p.last_fetch_ms,
            )
            for i, p in sorted(core.slaves().items())  # empty unless master
        ]
        return bpb.HaStatus(
            cluster=agent.config.cluster,
            broker_name=agent.config.broker_name,
            broker_id=view.broker_id,
            role=view.role.value,
            master_epoch=view.master_epoch,
            master_broker_id=view.master_broker_id,
            master_address=view.master_address,
            max_offset=max_offset,
            confirm_offset=view.confirm_offset,
            sync_state_set=list(view.sync_state_set),
            sync_state_set_epoch=view.sync_state_set_epoch,
            slaves=slaves,
            lease_valid=core.lease_valid(now),
            writable=core.writable(now),
            remoting_address=agent.config.extra.get("remoting", ""),
        )


# The ranges of the broker's numeric flags (and --config keys), checked at parse time: a
# value outside would start a broker that loops on a refused registration (priority), fails a
# protobuf field, or overflows a timer at its first send.
PRIORITY_MAX = 1_000_000  # the controller's bound on election_priority
REPLICAS_MAX = 16
TIMEOUT_MS_MIN, TIMEOUT_MS_MAX = 100, 3_600_000
RETENTION_BYTES_MAX = 1 << 50  # 1 PiB
UPLOAD_BYTES_MIN = 1 << 10  # as TieredConfig.validate checks them when --tiered-store is given
UPLOAD_INTERVAL_MS_MIN, UPLOAD_INTERVAL_MS_MAX = 10, 3_600_000


def _bounded(flag: str, minimum: int, maximum: int) -> FlagNumber:
    return FlagNumber(flag, int, minimum, maximum)


def add_broker_parser(sub) -> None:
    broker = sub.add_parser("broker", help="run one broker agent")
    broker.add_argument("--cluster", default="DefaultCluster")
    broker.add_argument("--broker-name", required=True)
    broker.add_argument("--listen", required=True, help="gRPC address HOST:PORT")
    broker.add_argument("--controllers", required=True, help="HOST:PORT[,HOST:PORT...]")
    broker.add_argument("--data-dir", type=Path, required=True)
    broker.add_argument(
        "--election-priority", type=_bounded("--election-priority", 0, PRIORITY_MAX), default=0
    )
    broker.add_argument("--in-sync-replicas", type=_bounded("--in-sync-replicas", 1, REPLICAS_MAX), default=1)
    broker.add_argument(
        "--min-in-sync-replicas", type=_bounded("--min-in-sync-replicas", 1, REPLICAS_MAX), default=1
    )
    broker.add_argument(
        "--no-all-ack",
        action="store_true",
        help="acknowledge at in_sync_replicas copies instead of the whole set",
    )
    broker.add_argument(
        "--ha-max-time-slave-not-catchup-ms",
        type=_bounded("--ha-max-time-slave-not-catchup-ms", TIMEOUT_MS_MIN, TIMEOUT_MS_MAX),
        default=15_000,
    )
    broker.add_argument(
        "--send-timeout-ms", type=_bounded("--send-timeout-ms", TIMEOUT_MS_MIN, TIMEOUT_MS_MAX), default=3000
    )
    broker.add_argument(
        "--segment-bytes",
        type=_bounded("--segment-bytes", SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX),
        default=64 << 20,
    )
    broker.add_argument(
        "--metrics-listen", default="", help="serve Prometheus metrics over HTTP on HOST:PORT"
    )
    broker.add_argument(
        "--remoting-listen",
        default="",
        help="serve RocketMQ 4.x clients (the classic remoting protocol) on HOST:PORT",
    )
    broker.add_argument(
        "--tiered-store", default="", help="tiered storage location: a directory or an fsspec URL"
    )
    broker.add_argument(
        "--tiered-upload-bytes",
        type=_bounded("--tiered-upload-bytes", UPLOAD_BYTES_MIN, UPLOAD_BYTES_MAX),
        default=4 << 20,
    )
    broker.add_argument(
        "--tiered-upload-interval-ms",
        type=_bounded("--tiered-upload-interval-ms", UPLOAD_INTERVAL_MS_MIN, UPLOAD_INTERVAL_MS_MAX),
        default=2000,
    )
    broker.add_argument(
        "--local-retention-bytes",
        type=_bounded("--local-retention-bytes", 0, RETENTION_BYTES_MAX),
        default=0,
        help="keep at least this many bytes locally once uploaded (0 = keep all)",
    )
    accept_config_file(broker)  # last: every flag above is a key of the file


def run_broker(args: argparse.Namespace) -> int:
    validate_name("--cluster", args.cluster)
    validate_name("--broker-name", args.broker_name)
    config = BrokerConfig(
        cluster=args.cluster,
        broker_name=args.broker_name,
        listen=parse_addresses(args.listen, "--listen address")[0],
        controllers=parse_addresses(args.controllers),
        data_dir=args.data_dir,
        election_priority=args.election_priority,
        in_sync_replicas=args.in_sync_replicas,
        min_in_sync_replicas=args.min_in_sync_replicas,
        all_ack_in_sync_state_set=not args.no_all_ack,
        ha_max_time_slave_not_catchup_ms=args.ha_max_time_slave_not_catchup_ms,
        send_timeout_ms=args.send_timeout_ms,
        segment_bytes=args.segment_bytes,
        tiered_url=args.tiered_store,
        tiered_upload_bytes=args.tiered_upload_bytes,
        tiered_upload_interval_ms=args.tiered_upload_interval_ms,
        local_retention_bytes=args.local_retention_bytes,
    )
    if listen_address(args):
        config.extra["remoting"] = listen_address(args)
    if config.tiered_url:
        from mqmeta.broker_agent.tiered import TieredConfig

        TieredConfig(
            config.tiered_url,
            config.tiered_upload_bytes,
            config.tiered_upload_interval_ms,
            config.local_retention_bytes,
        ).validate()
    elif config.local_retention_bytes:
        raise InvalidArgument(
            "--local-retention-bytes needs --tiered-store: local segments are "
            "deleted only once they are in the tiered store"
        )
    # The RocketMQ 5 service (and its stubs, which clash with the official client's in one
    # process) is imported only here, in the broker process.
    from mqmeta.broker_agent.rmq_service import (
        REQUEST_BYTES_MAX,
        SERVER_WORKERS,
        MessagingServicer,
        RmqBroker,
    )

    from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
    from mqmeta.rocketmq import MESSAGING_SERVICE

    if args.metrics_listen:
        parse_addresses(args.metrics_listen, "--metrics-listen address")
    agent = BrokerAgent(config)
    rmq = RmqBroker(agent)
    server = build_server(config.listen, SERVER_WORKERS, REQUEST_BYTES_MAX)
    metrics = BrokerMetrics(agent)
    admin = BrokerAdmin(
        agent,
        member_sources=[rmq.members.of_group],
        ensure_topic=rmq.metadata.ensure_dead_letter_topic,
        forget_cursors=rmq.pop.forget,
    )
    bpb_grpc.add_BrokerServiceServicer_to_server(BrokerServicer(agent, metrics, admin), server)
    rsvc_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(rmq, metrics), server)
    add_health_and_reflection(server, [BROKER_SERVICE, MESSAGING_SERVICE])
    server.start()
    agent.start()
    rmq.start()
    remoting = None
    if config.extra.get("remoting"):
        from mqmeta.broker_agent.remoting import start_remoting

        remoting, remoting_groups = start_remoting(agent, rmq, config.extra["remoting"])
        admin.member_sources.append(remoting_groups.of_group)
    metrics.serve(args.metrics_listen)

    class _Node:
        def stop(self, graceful: bool = True) -> None:
            # SIGTERM: hand off (a master) or leave the SyncStateSet (a slave) while the
            # server still answers the slaves' fetches, then stop serving. SIGINT (Ctrl-C,
            # `local up` stopping the whole cluster): the slaves are stopping too, so a
            # handoff could only wait for them; the controllers' failover takes over.
            if graceful:
                agent.depart()
            server.stop(grace=STOP_GRACE_S if graceful else STOP_NOW_GRACE_S).wait()
            if remoting is not None:
                remoting.stop()
            rmq.stop()
            agent.stop()
            metrics.stop()

    serve_until_signal(_Node())
    return 0
