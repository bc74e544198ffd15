"""gRPC BrokerService over a BrokerAgent (the `mqmeta broker` process is broker_agent/cli.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from mqmeta.broker_agent import ha_fetch
from mqmeta.broker_agent.admin import BrokerAdmin
from mqmeta.broker_agent.agent import Acknowledged, BrokerAgent
from mqmeta.broker_agent.metrics import BrokerMetrics
from mqmeta.broker_agent.origins import ORIGIN_AHEAD
from mqmeta.broker_agent.status import ha_status
from mqmeta.broker_agent.store import PutResult

from mqmeta.call_stream import answer_early
from mqmeta.clock import wall_ms
from mqmeta.errors import FailedPrecondition, InvalidArgument, NotFound
from mqmeta.formats.origin import OriginKey
from mqmeta.formats.records import MessageFields
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.rpc import (
    rpc,
)
from mqmeta.validate import (
    QUEUE_ID_MAX,
    REQUEST_INT_MAX,
    validate_int,
    validate_name,
)

log = logging.getLogger(__name__)

PULL_COUNT_MAX = 1024
ORIGIN_REORDER_WAIT_MS = 1000  # how long a replicated batch waits for its predecessor
ORIGIN_REORDER_POLL_MS = 20
BROKER_DESCRIPTOR = bpb.DESCRIPTOR.services_by_name["BrokerService"]
BROKER_SERVICE = BROKER_DESCRIPTOR.full_name
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


_ANSWERED = bpb.SendResponse()


def _send_early(answer: Callable[[bpb.SendResponse], None], results: Sequence[PutResult], epoch: int) -> None:
    answer(send_response(epoch, results))


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
        agent.fetch_served = self._observe_fetch  # the HA stream's fetches are counted too

    @rpc
    def Send(self, request, context):
        messages = request.messages
        check_sent_messages(messages)
        started = time.perf_counter()
        early = answer_early(context)  # the call stream's: sent by the thread the last ack arrives on
        told = None if early is None else partial(_send_early, early.send)
        results, epoch = self._send_in_origin_order(messages, told)
        if self.metrics is not None:
            self.metrics.send_seconds.observe(time.perf_counter() - started)
            self.metrics.messages_in.inc(len(messages))
            self.metrics.bytes_in.inc(sum(len(m.body) for m in messages))
        if early is not None and early.sent:
            return _ANSWERED  # dropped: the answer went early
        return send_response(epoch, results)

    def _send_in_origin_order(
        self, messages: Sequence[MessageFields], on_acknowledged: Acknowledged | None
    ) -> tuple[list, int]:
        """agent.send; a batch of replicated copies whose predecessor has not arrived yet
        (several batches in flight over a WAN can overtake each other in this server's
        threads) waits for it, a bounded time, instead of failing the whole pipeline."""
        deadline = time.monotonic() + ORIGIN_REORDER_WAIT_MS / 1000
        while True:
            try:
                return self.agent.send(messages, on_acknowledged)
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
        if request.group:
            validate_name("group", request.group)
        self.agent.require_master()
        if request.group:  # a consumer that polls, idle or not, is a live member
            self.admin.note_member(request.group, context.peer(), wall_ms())
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
        self.admin.note_member(request.group, context.peer(), wall_ms())
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
        reply = ha_fetch.serve_fetch(self.agent, request)
        self.agent.fetch_transports[request.broker_id] = False  # after serve_fetch: a replica of this set
        if request.handshake:  # the later fetches may use the stream (ha_stream.py)
            reply.stream_port = self.agent.ha_stream_port
        self._observe_fetch(time.perf_counter() - started, len(reply.data))
        return reply

    def _observe_fetch(self, seconds: float, data_bytes: int) -> None:
        """A fetch served, over gRPC or the HA stream (agent.fetch_served)."""
        if self.metrics is not None:
            self.metrics.fetch_seconds.observe(seconds)
            self.metrics.bytes_out.inc(data_bytes)

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
