"""apache.rocketmq.v2.MessagingService on the broker: the official RocketMQ 5 clients send,
receive, acknowledge and end transactions here (on the same port as mqmeta.v1).

This module is the gRPC servicer only: it checks each request, calls the broker side and
turns outcomes into statuses. Messages are converted by the codec (mqmeta.codec.rocketmq5);
RmqBroker (rmq_broker.py) sends them and holds the role, clients and Telemetry streams;
receives follow RocketMQ 5's "pop" model, whose cursors, leases and progress writes are
the pop shell's (rmq_pop.py, around the pure pop.QueueCursor). Delay and transaction
messages wait in system topics (rmq_system.py).

Threads: with the synchronous gRPC server every call holds a worker for its length, so
the long-lived ones are bounded — at most LONG_POLLS_MAX receives wait at once (the
next gets TOO_MANY_REQUESTS and the client backs off) and at most TELEMETRY_STREAMS_MAX
Telemetry streams are held — and the broker's pool is sized with room for both beside
GRPC_WORKERS_MAX for everything else (SERVER_WORKERS), so they can never starve sends or
replication.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from mqmeta.broker_agent.metrics import BrokerMetrics
from mqmeta.broker_agent.pop import Delivery, LeaseGrant
from mqmeta.broker_agent.rmq_broker import LONG_POLLS_MAX, TELEMETRY_STREAMS_MAX, RmqBroker
from mqmeta.broker_agent.rmq_metadata import allocate
from mqmeta.broker_agent.rmq_pop import AUTO_RENEW_MAX_MS, AUTO_RENEW_MS, RECEIVE_BATCH_MAX, CursorKey

from mqmeta.clock import wall_ms
from mqmeta.codec.rocketmq5 import Send, to_message
from mqmeta.errors import MqmetaError, NotMaster
from mqmeta.formats.records import StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
from mqmeta.rocketmq import (
    BODY_BYTES_MAX,
    ReceiptHandle,
    RmqError,
    check_name,
    client_id_of,
    duration_ms,
    entries_status,
    message_queues,
    rmq_call,
    status,
    status_of_error,
    tag_filter,
    timestamp,
)
from mqmeta.rpc import GRPC_WORKERS_MAX

__all__ = ["REQUEST_BYTES_MAX", "SERVER_WORKERS", "MessagingServicer", "RmqBroker"]

log = logging.getLogger(__name__)

SERVER_WORKERS = GRPC_WORKERS_MAX + LONG_POLLS_MAX + TELEMETRY_STREAMS_MAX
# a body a little over the limit still gets MESSAGE_BODY_TOO_LARGE
REQUEST_BYTES_MAX = BODY_BYTES_MAX + (1 << 20)
LONG_POLL_MS_MAX = 60_000
LONG_POLL_MARGIN_MS = 500  # answer this long before the client's deadline
INVISIBLE_MS_MAX = 12 * 3600 * 1000
INVISIBLE_MS_DEFAULT = 30_000
SEND_MESSAGES_MAX = 256  # messages of one SendMessage (the clients send one; the proxy merges)


class MessagingServicer(rsvc_grpc.MessagingServiceServicer):
    def __init__(self, broker: RmqBroker, metrics: BrokerMetrics | None = None) -> None:
        self.broker = broker
        self.metadata = broker.metadata
        self.metrics = metrics  # the same counters as the native Send's

    @rmq_call(rsvc.QueryRouteResponse)
    def QueryRoute(self, request, context):
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        queues = message_queues(self.metadata.route(topic, wall_ms()))
        return rsvc.QueryRouteResponse(status=status(), message_queues=queues)

    @rmq_call(rsvc.HeartbeatResponse)
    def Heartbeat(self, request, context):
        group = request.group.name if request.HasField("group") else ""
        self.broker.members.seen(client_id_of(context), wall_ms(), request.client_type, group)
        return rsvc.HeartbeatResponse(status=status())

    @rmq_call(rsvc.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, context):
        self.broker.members.remove(client_id_of(context), wall_ms())
        return rsvc.NotifyClientTerminationResponse(status=status())

    def Telemetry(self, request_iterator, context):
        return self.broker.hub.serve(request_iterator, context)

    @rmq_call(rsvc.SendMessageResponse)
    def SendMessage(self, request, context):
        if not 1 <= len(request.messages) <= SEND_MESSAGES_MAX:
            raise RmqError(
                rdef.BAD_REQUEST,
                f"a send carries 1 to {SEND_MESSAGES_MAX} messages, not {len(request.messages)}",
            )
        client_id = client_id_of(context)
        now = wall_ms()
        started = time.perf_counter()
        if len(request.messages) == 1:
            entries = [self.broker.send(self.broker.to_record(request.messages[0], client_id, now))]
        else:
            entries = self._send_many(list(request.messages), client_id, now)
        if self.metrics is not None:
            self.metrics.send_seconds.observe(time.perf_counter() - started)
            for message, entry in zip(request.messages, entries, strict=True):
                if entry.status.code == rdef.OK:  # acknowledged: counted as the native Send counts
                    self.metrics.messages_in.inc()
                    self.metrics.bytes_in.inc(len(message.body))
        return rsvc.SendMessageResponse(status=entries_status(entries), entries=entries)

    def _send_many(
        self, messages: list[rdef.Message], client_id: str, now: int
    ) -> list[rsvc.SendResultEntry]:
        """Several messages of one SendMessage (the proxy merges concurrent sends): each
        checked on its own (a bad one is refused alone); the plain ones written together,
        so they wait once for the SyncStateSet; delay and transaction messages one by one.
        A refusal of a write is the answer of each message it carried."""
        entries: list[rsvc.SendResultEntry | None] = [None] * len(messages)
        plain: list[tuple[int, Send]] = []
        for i, message in enumerate(messages):
            try:
                send = self.broker.to_record(message, client_id, now)
            except RmqError as error:
                entries[i] = _send_refused(message, status(error.code, error.message))
                continue
            if send.message_type == rdef.TRANSACTION or send.deliver_at_ms:
                entries[i] = _sent_or_refused(message, lambda send=send: self.broker.send(send))
            else:
                plain.append((i, send))
        if plain:
            try:
                written = self.broker.send_plain([send for _, send in plain])
            except (RmqError, MqmetaError) as error:
                refused = _status_of(error)
                for i, _ in plain:
                    entries[i] = _send_refused(messages[i], refused)
            else:
                for (i, _), entry in zip(plain, written, strict=True):
                    entries[i] = entry
        return [e for e in entries if e is not None]

    @rmq_call(rsvc.QueryAssignmentResponse)
    def QueryAssignment(self, request, context):
        client_id = client_id_of(context)
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        now = wall_ms()
        self.broker.members.seen(client_id, now, rdef.PUSH_CONSUMER, group)
        members = self.broker.members.push_consumers(group, topic, now)
        mine = allocate(members, self.metadata.queues(topic, now), client_id)
        return rsvc.QueryAssignmentResponse(
            status=status(), assignments=[rdef.Assignment(message_queue=q) for q in mine]
        )

    def ReceiveMessage(self, request, context):
        try:
            yield from self._receive(request, context)
        except RmqError as error:
            yield rsvc.ReceiveMessageResponse(status=status(error.code, error.message))
        except MqmetaError as error:
            yield rsvc.ReceiveMessageResponse(status=status_of_error(error))
        except Exception as exc:  # a bug: say so in the status
            log.exception("ReceiveMessage failed")
            yield rsvc.ReceiveMessageResponse(
                status=status(rdef.INTERNAL_SERVER_ERROR, f"internal error: {exc}")
            )

    def _receive_params(
        self, request, context
    ) -> tuple[CursorKey, frozenset[str] | None, int, LeaseGrant, int]:
        client_id = client_id_of(context)
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        topic = check_name("topic", request.message_queue.topic, rdef.ILLEGAL_TOPIC)
        now = wall_ms()
        if request.message_queue.broker.name != self.broker.agent.broker_name:
            raise RmqError(
                rdef.ILLEGAL_ACCESS_POINT,
                f"this broker serves broker set {self.broker.agent.broker_name}, "
                f"not {request.message_queue.broker.name}",
            )
        local = self.metadata.local(topic, now)
        if not 0 <= request.message_queue.id < local.read_queues or "R" not in local.perm:
            raise RmqError(
                rdef.BAD_REQUEST, f"queue {request.message_queue.id} of {topic} is not readable here"
            )
        if not 1 <= request.batch_size <= RECEIVE_BATCH_MAX:
            raise RmqError(rdef.BAD_REQUEST, f"batch size must be 1-{RECEIVE_BATCH_MAX}")
        tags = tag_filter(request.filter_expression)
        invisible = duration_ms(request.invisible_duration) if request.HasField("invisible_duration") else 0
        if request.HasField("invisible_duration") and not 0 < invisible <= INVISIBLE_MS_MAX:
            raise RmqError(
                rdef.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration must be 1 ms to {INVISIBLE_MS_MAX // 3_600_000} h",
            )
        poll = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        if not 0 <= poll <= LONG_POLL_MS_MAX:
            raise RmqError(
                rdef.ILLEGAL_POLLING_TIME, f"long polling timeout must be 0-{LONG_POLL_MS_MAX // 1000} s"
            )
        self.broker.members.seen(client_id, now, group=group)
        auto_renew = request.auto_renew and not invisible
        grant = LeaseGrant(
            now,
            invisible or (AUTO_RENEW_MS if auto_renew else INVISIBLE_MS_DEFAULT),
            client_id,
            auto_renew,
            AUTO_RENEW_MAX_MS,
        )
        return (group, topic, request.message_queue.id), tags, request.batch_size, grant, poll

    def _receive(self, request, context) -> Iterator[rsvc.ReceiveMessageResponse]:
        key, tags, batch, grant, poll_ms = self._receive_params(request, context)
        now = grant.now_ms
        remaining_ms = (context.time_remaining() or 0) * 1000 - LONG_POLL_MARGIN_MS
        deadline = time.monotonic() + max(0.0, min(poll_ms, remaining_ms)) / 1000
        fifo = self.metadata.local(key[1], now).message_type == "FIFO"
        max_attempts = self.metadata.consumer_settings(key[0], [], now).max_attempts
        # A PushConsumer reads only the queues QueryAssignment gave it; a SimpleConsumer
        # takes messages from any queue of the topic here (see _receive_any).
        simple = self.broker.members.client_type(grant.client_id) == rdef.SIMPLE_CONSUMER
        queues = self.metadata.local(key[1], now).read_queues if simple else 0
        held = False
        try:
            while True:
                key, found = self._receive_any(key, queues, tags, batch, grant, fifo, max_attempts)
                left = deadline - time.monotonic()
                if found or left <= 0 or not context.is_active():
                    break
                if not held:
                    held = self.broker.polls.acquire(blocking=False)
                    if not held:
                        raise RmqError(
                            rdef.TOO_MANY_REQUESTS,
                            f"{LONG_POLLS_MAX} receives already wait here; retry later",
                        )
                self.broker.pop.wait_for_work(key, left)
                grant = LeaseGrant(
                    wall_ms(), grant.invisible_ms, grant.client_id, grant.auto_renew, grant.renew_max_ms
                )
        finally:
            if held:
                self.broker.polls.release()
        yield from self._answer(key, found, grant)

    def _receive_any(
        self,
        key: CursorKey,
        queues: int,
        tags: frozenset[str] | None,
        batch: int,
        grant: LeaseGrant,
        fifo: bool,
        max_attempts: int,
    ) -> tuple[CursorKey, list[tuple[StoredRecord, Delivery]]]:
        """Messages from the queue the client named or, when it has none, from the topic's
        other `queues` readable queues on this broker (RocketMQ's proxy pops from every queue of the
        broker too): a client that picked a drained queue gets what waits next to it
        instead of long-polling an empty queue. Each queue keeps its own cursor, so FIFO
        groups (one queue each) keep one message in flight. Returns the queue it read."""
        group, topic, named = key
        start = next(self.broker.round_robin)
        others = [(start + i) % queues for i in range(queues)]  # none when `queues` is 0
        for queue_id in [named, *(q for q in others if q != named)]:
            found = self.broker.pop.receive((group, topic, queue_id), tags, batch, grant, fifo, max_attempts)
            if found:
                return (group, topic, queue_id), found
        return key, []

    def _answer(self, key: CursorKey, found: list[tuple[StoredRecord, Delivery]], grant: LeaseGrant):
        if not found:
            yield rsvc.ReceiveMessageResponse(status=status(rdef.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield rsvc.ReceiveMessageResponse(status=status())
        if self.metrics is not None:
            self.metrics.messages_out.inc(len(found))
            self.metrics.delivered_bytes_out.inc(sum(len(record.body) for record, _ in found))
        epoch = self.broker.master_epoch()
        for record, delivery in found:
            message = to_message(record, record.topic, self.broker.agent.config.listen)
            handle = ReceiptHandle(
                self.broker.agent.broker_name,
                epoch,
                self.broker.boot_id,
                key[1],
                key[2],
                delivery.offset,
                delivery.lease,
            )
            message.system_properties.receipt_handle = handle.encode()
            message.system_properties.delivery_attempt = delivery.attempt
            message.system_properties.invisible_duration.FromMilliseconds(grant.invisible_ms)
            yield rsvc.ReceiveMessageResponse(message=message)
        yield rsvc.ReceiveMessageResponse(delivery_timestamp=timestamp(grant.now_ms))

    @rmq_call(rsvc.AckMessageResponse)
    def AckMessage(self, request, context):
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        if not request.entries:
            raise RmqError(rdef.BAD_REQUEST, "the acknowledgement names no message")
        entries = self._ack_entries(group, topic, list(request.entries))
        overall = entries_status(entries)
        return rsvc.AckMessageResponse(status=overall, entries=entries)

    def _ack_entries(
        self, group: str, topic: str, entries: list[rsvc.AckMessageEntry]
    ) -> list[rsvc.AckMessageResultEntry]:
        """Each entry's result, in the request's order. The handles are checked one by one
        (a stale one is refused on its own); the valid ones are acknowledged together, so
        the batch waits once for the SyncStateSet (PopShell.ack_many)."""
        codes: list[tuple[int, str] | None] = []
        acks: list[tuple[CursorKey, int, int]] = []
        for entry in entries:
            try:
                handle = ReceiptHandle.decode(entry.receipt_handle)
                self.broker.check_handle(handle, topic)
            except RmqError as error:
                codes.append((error.code, error.message))
                continue
            codes.append(None)
            acks.append(((group, topic, handle.queue_id), handle.offset, handle.lease))
        try:
            done = iter(self.broker.pop.ack_many(acks))
            written: tuple[int, str] | None = None
        except RmqError as error:
            done, written = iter([False] * len(acks)), (error.code, error.message)
        except MqmetaError as error:
            failed = status_of_error(error)
            if isinstance(error, NotMaster):  # deposed while writing the progress: unknown
                failed = status(rdef.MASTER_PERSISTENCE_TIMEOUT, failed.message)
            done, written = iter([False] * len(acks)), (failed.code, failed.message)
        results = []
        for entry, code in zip(entries, codes, strict=True):
            if code is None:
                acked = next(done)
                code = written or (
                    (rdef.OK, "OK")
                    if acked
                    else (
                        rdef.INVALID_RECEIPT_HANDLE,
                        "the lease expired and the message was delivered again",
                    )
                )
            results.append(
                rsvc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status(*code)
                )
            )
        return results

    @rmq_call(rsvc.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request, context):
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        invisible = duration_ms(request.invisible_duration)
        if not 0 <= invisible <= INVISIBLE_MS_MAX:
            raise RmqError(
                rdef.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration must be 0 to {INVISIBLE_MS_MAX // 3_600_000} h",
            )
        handle = ReceiptHandle.decode(request.receipt_handle)
        self.broker.check_handle(handle, topic)
        lease = self.broker.pop.change_invisible(
            (group, topic, handle.queue_id), handle.offset, handle.lease, invisible
        )
        renewed = ReceiptHandle(
            handle.broker_name, handle.epoch, handle.boot_id, topic, handle.queue_id, handle.offset, lease
        )
        return rsvc.ChangeInvisibleDurationResponse(status=status(), receipt_handle=renewed.encode())

    @rmq_call(rsvc.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context):
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        handle = ReceiptHandle.decode(request.receipt_handle)
        self.broker.check_handle(handle, topic)
        self.broker.pop.forward_to_dead_letter((group, topic, handle.queue_id), handle.offset, handle.lease)
        return rsvc.ForwardMessageToDeadLetterQueueResponse(status=status())

    @rmq_call(rsvc.EndTransactionResponse)
    def EndTransaction(self, request, context):
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        if request.resolution not in (rdef.COMMIT, rdef.ROLLBACK):
            raise RmqError(rdef.BAD_REQUEST, "the resolution must be COMMIT or ROLLBACK")
        self.broker.system.end_transaction(topic, request.transaction_id, request.resolution == rdef.COMMIT)
        return rsvc.EndTransactionResponse(status=status())

    def _unsupported(self, response_type, what: str):
        return response_type(
            status=status(rdef.UNSUPPORTED, f"{what} is not supported by mqmeta; use receive/ack")
        )

    def PullMessage(self, request, context):
        yield rsvc.PullMessageResponse(
            status=status(rdef.UNSUPPORTED, "PullMessage is not supported; use ReceiveMessage")
        )

    def UpdateOffset(self, request, context):
        return self._unsupported(rsvc.UpdateOffsetResponse, "UpdateOffset")

    def GetOffset(self, request, context):
        return self._unsupported(rsvc.GetOffsetResponse, "GetOffset")

    def QueryOffset(self, request, context):
        return self._unsupported(rsvc.QueryOffsetResponse, "QueryOffset")

    def RecallMessage(self, request, context):
        return self._unsupported(rsvc.RecallMessageResponse, "RecallMessage")

    def SyncLiteSubscription(self, request, context):
        return self._unsupported(rsvc.SyncLiteSubscriptionResponse, "lite topics")


def _status_of(error: RmqError | MqmetaError) -> rdef.Status:
    if isinstance(error, RmqError):
        return status(error.code, error.message)
    return status_of_error(error)


def _send_refused(message: rdef.Message, refused: rdef.Status) -> rsvc.SendResultEntry:
    return rsvc.SendResultEntry(status=refused, message_id=message.system_properties.message_id)


def _sent_or_refused(message: rdef.Message, send) -> rsvc.SendResultEntry:
    try:
        return send()
    except (RmqError, MqmetaError) as error:
        return _send_refused(message, _status_of(error))
