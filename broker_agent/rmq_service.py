"""apache.rocketmq.v2.MessagingService on the broker: the official RocketMQ 5 clients send,
receive, acknowledge and end transactions here (on the same port as mqmeta.v1).

Sends become records of our commit log like any other (the client's message id, type,
born time and host, message group and delivery time ride as __RMQ_ properties). Receives
follow RocketMQ 5's "pop" model: a consumer group's progress in each queue and the leases
of what it holds in flight are pop.QueueCursor's (pure); this module is its shell: it
loads a cursor from the group's %CONSUMER_OFFSET% record when this broker is master of
an epoch, reads the records, writes the progress before it answers an acknowledgement,
and moves messages past their attempts to %DLQ%{group}. Delay and transaction messages
wait in system topics (rmq_system.py).

Threads: with the synchronous gRPC server every call holds a worker for its length, so
the long-lived ones are bounded here — at most LONG_POLLS_MAX receives wait at once (the
next gets TOO_MANY_REQUESTS and the client backs off) and at most TELEMETRY_STREAMS_MAX
Telemetry streams are held — and the broker's pool is sized with room for both beside
GRPC_WORKERS_MAX for everything else (SERVER_WORKERS), so they can never starve sends or
replication.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.metrics import BrokerMetrics
from mqmeta.broker_agent.pop import AckResult, Candidate, Delivery, LeaseGrant, QueueCursor, Verdict
from mqmeta.broker_agent.rmq_metadata import Members, Metadata, allocate, fifo_queue
from mqmeta.broker_agent.rmq_system import SystemQueues

from mqmeta.clock import now_ms, wall_ms
from mqmeta.errors import FailedPrecondition, MqmetaError, NotMaster
from mqmeta.formats.records import KEYS_BYTES_MAX, TAGS_BYTES_MAX, Message, StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
from mqmeta.rocketmq import (
    BODY_BYTES_MAX,
    BORN_HOST,
    BORN_MS,
    DELIVER_MS,
    DLQ_ORIGIN,
    KEY_SEPARATOR,
    MESSAGE_GROUP,
    MESSAGE_ID,
    MESSAGE_ID_CHARS_MAX,
    MESSAGE_TYPE,
    PROPERTY_PREFIX,
    TYPE_OF_TOPIC,
    USER_PROPERTIES_MAX,
    ReceiptHandle,
    RmqError,
    TelemetryHub,
    answer_settings,
    check_name,
    client_id_of,
    code_of_error,
    delivery_ms,
    duration_ms,
    message_queues,
    rmq_call,
    status,
    status_of_error,
    tag_filter,
    timestamp,
    to_message,
)
from mqmeta.rpc import GRPC_WORKERS_MAX

log = logging.getLogger(__name__)

LONG_POLLS_MAX = 128
TELEMETRY_STREAMS_MAX = 128
SERVER_WORKERS = GRPC_WORKERS_MAX + LONG_POLLS_MAX + TELEMETRY_STREAMS_MAX
RECEIVE_BATCH_MAX = 1024
REQUEST_BYTES_MAX = BODY_BYTES_MAX + (
    1 << 20
)  # a body a little over the limit still gets MESSAGE_BODY_TOO_LARGE
LONG_POLL_MS_MAX = 60_000
LONG_POLL_MARGIN_MS = 500  # answer this long before the client's deadline
INVISIBLE_MS_MAX = 12 * 3600 * 1000
INVISIBLE_MS_DEFAULT = 30_000
AUTO_RENEW_MS = 30_000  # a PushConsumer's lease, renewed while the client is alive...
AUTO_RENEW_MAX_MS = 3 * 3600 * 1000  # ...up to this long
WAIT_SLICE_S = 0.5
FLUSH_INTERVAL_S = 1.0  # progress changed without an ack (filtered, dead-lettered) is written this often
DEAD_LETTER_PREFIX = "%DLQ%"

CursorKey = tuple[str, str, int]


@dataclass
class _Slot:
    """One cursor, for the master epoch it was loaded in."""

    epoch: int
    cursor: QueueCursor
    lock: threading.Lock
    # Group commit of the cursor's progress (see RmqBroker.persist): changes asked to be
    # written are counted under `lock`; one append at a time, under `writer`, covers every
    # change counted before its snapshot.
    writer: threading.Lock = field(default_factory=threading.Lock)
    asked: int = 0
    written: int = 0  # the count the last appended snapshot covered
    written_at: tuple[int, int] = (0, 0)  # that append's (end offset, epoch)


class RmqBroker:
    """The state behind the service: cursors, clients, Telemetry streams, system queues."""

    def __init__(self, agent: BrokerAgent) -> None:
        self.agent = agent
        self.store = agent.store
        self.boot_id = uuid.uuid4().hex[:8]  # a handle from another process is stale
        self.metadata = Metadata(agent.call_controller, agent.broker_name)
        self.members = Members()
        self.hub = TelemetryHub(TELEMETRY_STREAMS_MAX, self._on_settings)
        self.polls = threading.BoundedSemaphore(LONG_POLLS_MAX)
        self.round_robin = itertools.count()
        self._cursors: dict[CursorKey, _Slot] = {}
        self._cursors_lock = threading.Lock()
        self.system = SystemQueues(self)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target, name in ((self._flush_loop, "rmq-flush"), (self.system.run, "rmq-system")):
            thread = threading.Thread(target=target, args=(self._stopping,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=3)

    # Role and cursors ------------------------------------------------------------------------
    def master_epoch(self) -> int:
        """The epoch this broker is master of; NotMaster (HA_NOT_AVAILABLE) otherwise."""
        view = self.agent.view()
        if view.role != Role.MASTER:
            raise NotMaster(
                f"broker set {self.agent.broker_name}: this broker is {view.role.value}, not the master; "
                "the client's route refreshes within 30 s",
                leader=view.master_address,
            )
        return view.master_epoch

    def check_handle(self, handle: ReceiptHandle, topic: str) -> None:
        view = self.agent.view()
        if (
            handle.broker_name != self.agent.broker_name
            or handle.boot_id != self.boot_id
            or view.role != Role.MASTER
            or handle.epoch != view.master_epoch
        ):
            raise RmqError(
                rdef.INVALID_RECEIPT_HANDLE,
                "the receipt handle is stale: it was issued before a role change or by another "
                "broker; the message is delivered again after its invisible time",
            )
        if handle.topic != topic:
            raise RmqError(
                rdef.INVALID_RECEIPT_HANDLE, f"the receipt handle is for topic {handle.topic}, not {topic}"
            )

    def slot(self, key: CursorKey, now_ms: int) -> _Slot:
        epoch = self.master_epoch()
        with self._cursors_lock:
            slot = self._cursors.get(key)
            if slot is None or slot.epoch != epoch:
                slot = _Slot(epoch, QueueCursor(consumed=0), threading.Lock())
                slot.lock.acquire()  # loaded below, outside the map's lock
                self._cursors[key] = slot
                fresh = True
            else:
                fresh = False
        if fresh:
            try:
                slot.cursor, write_now = self._load(key, now_ms)
            except BaseException:
                with self._cursors_lock:
                    self._cursors.pop(key, None)
                slot.lock.release()
                raise
            slot.lock.release()
            if write_now:
                self.persist(key, slot)
        return slot

    def _load(self, key: CursorKey, now_ms: int) -> tuple[QueueCursor, bool]:
        """The cursor from the group's last progress record; a group new to this queue
        starts where its group config says (see start_offset). Returns whether the start
        must be written at once (so that a failover does not move it)."""
        group, topic, queue_id = key
        progress = self.store.consumer_progress(group, topic, queue_id)
        minimum = self.store.queue_min_offset(topic, queue_id)
        if progress is not None:
            cursor = QueueCursor.from_progress(*progress)
            cursor.skip_to(minimum)
            return cursor, False
        start = self.start_offset(group, topic, queue_id, now_ms)
        cursor = QueueCursor(consumed=max(start, minimum))
        return cursor, cursor.consumed > minimum

    def start_offset(self, group: str, topic: str, queue_id: int, now_ms: int) -> int:
        """Where a group starts in a queue it never consumed from. A group created in the
        controller follows its consume_from (LAST_OFFSET, its default, is RocketMQ's newest
        offset); a group the controller does not know starts at the oldest stored offset,
        so nothing sent before its first consumer connected is skipped silently."""
        config = self.metadata.group(group, now_ms)
        if config is None or config.consume_from == "FIRST_OFFSET":
            return self.store.queue_min_offset(topic, queue_id)
        confirm = self.agent.view().confirm_offset
        if config.consume_from == "TIMESTAMP":
            return self._offset_at(topic, queue_id, config.consume_timestamp_ms, confirm)
        return self.store.readable_queue_max_offset(topic, queue_id, confirm)

    def _offset_at(self, topic: str, queue_id: int, at_ms: int, confirm: int) -> int:
        """The first offset stored at or after `at_ms` (binary search; store times only grow)."""
        low = self.store.queue_min_offset(topic, queue_id)
        high = self.store.readable_queue_max_offset(topic, queue_id, confirm)
        while low < high:
            middle = (low + high) // 2
            (record,) = self.store.get_messages(topic, queue_id, middle, 1, confirm)
            if record.store_timestamp_ms < at_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def persist(self, key: CursorKey, slot: _Slot) -> None:
        """Writes the cursor's progress as a %CONSUMER_OFFSET% record and waits until the
        SyncStateSet has it.

        Group commit: acks of one queue that arrive while a progress record is being
        appended are covered by the next single append instead of one append each (a
        consumer acknowledging a batch concurrently costs about two appends, not one per
        message). Snapshots are taken and appended one at a time under the slot's writer
        lock, so a later record never holds older progress than an earlier one; a change
        counted before a snapshot is in it, because the cursor changed before it was
        counted. A caller whose change another caller's append covered waits for that
        append (or a later one) to be acknowledged, never for less."""
        with slot.lock:
            slot.asked += 1
            mine = slot.asked
        with slot.writer:
            if slot.written < mine:
                with slot.lock:
                    offset, ranges = slot.cursor.progress()
                    covered = slot.asked
                    slot.cursor.dirty = False
                try:
                    _, end, epoch = self.agent.append(
                        lambda e: self.store.commit_consumer_progress([(*key, offset, ranges)], e, wall_ms())
                    )
                except BaseException:
                    with slot.lock:
                        slot.cursor.dirty = True
                    raise
                slot.written, slot.written_at = covered, (end, epoch)
            end, epoch = slot.written_at
        self.agent.wait_acknowledged(end, epoch)

    def _flush_loop(self, stopping: threading.Event) -> None:
        while not stopping.wait(FLUSH_INTERVAL_S):
            with self._cursors_lock:
                dirty = [(k, s) for k, s in self._cursors.items() if s.cursor.dirty]
            for key, slot in dirty:
                try:
                    if slot.epoch == self.master_epoch():
                        self.persist(key, slot)
                except MqmetaError as exc:
                    log.debug("progress of %s not written: %s", key, exc)

    # Telemetry -----------------------------------------------------------------------------
    def _on_settings(self, client_id: str, settings: rdef.Settings) -> rdef.Settings:
        now = wall_ms()
        self.members.settings(client_id, settings, now)
        if settings.WhichOneof("pub_sub") != "subscription":
            return answer_settings(settings, None)
        group = settings.subscription.group.name
        topics = [s.topic.name for s in settings.subscription.subscriptions]
        return answer_settings(settings, self.metadata.consumer_settings(group, topics, now))

    # Sending -------------------------------------------------------------------------------
    def to_record(self, message: rdef.Message, client_id: str, now_ms: int) -> tuple[Message, int]:
        """Validates one message of a SendMessage and returns it as a record of its topic
        (with queue 0 for now) and its delivery time (0 = now)."""
        topic = check_name("topic", message.topic, rdef.ILLEGAL_TOPIC)
        if topic.startswith("%"):
            raise RmqError(rdef.ILLEGAL_TOPIC, f"topic {topic} is a system topic; send to your own topics")
        system = message.system_properties
        local = self.metadata.local(topic, now_ms)
        if "W" not in local.perm or not local.write_queues:
            raise RmqError(
                rdef.FORBIDDEN, f"topic {topic} is not writable on broker set {self.agent.broker_name}"
            )
        if not message.body:
            raise RmqError(rdef.MESSAGE_BODY_EMPTY, "the message body is empty")
        if len(message.body) > BODY_BYTES_MAX:
            raise RmqError(
                rdef.MESSAGE_BODY_TOO_LARGE,
                f"the body is {len(message.body)} bytes; the limit is {BODY_BYTES_MAX}",
            )
        tag = system.tag if system.HasField("tag") else ""
        if system.HasField("tag") and (not tag.strip() or "|" in tag or len(tag.encode()) > TAGS_BYTES_MAX):
            raise RmqError(
                rdef.ILLEGAL_MESSAGE_TAG, f"tag {tag[:64]!r} is blank, contains '|' or is too long"
            )
        if any(not k.strip() or KEY_SEPARATOR in k for k in system.keys):
            raise RmqError(rdef.ILLEGAL_MESSAGE_KEY, "a key is blank or contains a space")
        keys = KEY_SEPARATOR.join(system.keys)
        if len(keys.encode()) > KEYS_BYTES_MAX:
            raise RmqError(rdef.ILLEGAL_MESSAGE_KEY, f"the keys are over {KEYS_BYTES_MAX} bytes")
        if not system.message_id or len(system.message_id) > MESSAGE_ID_CHARS_MAX:
            raise RmqError(
                rdef.ILLEGAL_MESSAGE_ID, f"the message id must be 1-{MESSAGE_ID_CHARS_MAX} characters"
            )
        props = self._user_properties(message)
        kind = system.message_type or rdef.NORMAL
        if TYPE_OF_TOPIC.get(local.message_type, rdef.NORMAL) != kind:
            raise RmqError(
                rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {topic} takes {local.message_type} messages, not {rdef.MessageType.Name(kind)}",
            )
        props.update(
            {MESSAGE_ID: system.message_id, MESSAGE_TYPE: str(kind), BORN_HOST: system.born_host[:255]}
        )
        props[BORN_MS] = str(system.born_timestamp.seconds * 1000 + system.born_timestamp.nanos // 1_000_000)
        deliver_at = self._typed(kind, system, props, local.write_queues, now_ms)
        queue_id = int(props.pop("_queue", "0"))
        return Message(topic, queue_id, bytes(message.body), tag, keys, props, client_id[:255]), deliver_at

    def _user_properties(self, message: rdef.Message) -> dict[str, str]:
        if len(message.user_properties) > USER_PROPERTIES_MAX:
            raise RmqError(rdef.MESSAGE_PROPERTIES_TOO_LARGE, f"more than {USER_PROPERTIES_MAX} properties")
        for key in message.user_properties:
            if not key or key.startswith(PROPERTY_PREFIX):
                raise RmqError(
                    rdef.ILLEGAL_MESSAGE_PROPERTY_KEY,
                    f"property key {key!r} is blank or uses the reserved prefix {PROPERTY_PREFIX}",
                )
        return dict(message.user_properties)

    def _typed(
        self, kind: int, system: rdef.SystemProperties, props: dict[str, str], queues: int, now_ms: int
    ) -> int:
        """Type-specific checks and properties; the queue (FIFO: by group) in props["_queue"]."""
        deliver_at = 0
        if kind == rdef.FIFO:
            group = system.message_group
            if not group or len(group) > MESSAGE_ID_CHARS_MAX:
                raise RmqError(
                    rdef.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group of 1-128 characters"
                )
            props[MESSAGE_GROUP] = group
            props["_queue"] = str(fifo_queue(group, queues))
            return 0
        if system.HasField("message_group"):
            raise RmqError(
                rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only FIFO messages carry a message group"
            )
        if kind == rdef.DELAY:
            if not system.HasField("delivery_timestamp"):
                raise RmqError(rdef.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
            deliver_at = delivery_ms(system.delivery_timestamp, now_ms)
            props[DELIVER_MS] = str(deliver_at)
            deliver_at = deliver_at if deliver_at > now_ms else 0
        elif system.HasField("delivery_timestamp"):
            raise RmqError(
                rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only DELAY messages carry a delivery timestamp"
            )
        props["_queue"] = str(next(self.round_robin) % queues)
        return deliver_at

    def send(self, record: Message, deliver_at: int, kind: int) -> rsvc.SendResultEntry:
        """Writes one message (to its topic, or to the delay or half queue) and waits for the
        ack policy. Refused before writing -> HA_NOT_AVAILABLE; unknown outcome ->
        a persistence timeout, which the client retries with the same message id."""
        self._check_writable()
        if kind == rdef.TRANSACTION:
            return self.system.send_half(record)
        if deliver_at:
            return self.system.send_delayed(record, deliver_at)
        try:
            (result,), _ = self.agent.send([record])
        except NotMaster as error:
            raise RmqError(rdef.MASTER_PERSISTENCE_TIMEOUT, f"outcome unknown: {error.message}") from None
        return rsvc.SendResultEntry(
            status=status(), message_id=record.properties[MESSAGE_ID], offset=result.queue_offset
        )

    def _check_writable(self) -> None:
        """Refused before writing (not the master, lease lapsed, handing off, SyncStateSet too
        small): HA_NOT_AVAILABLE with the reason, which the official clients retry."""
        with self.agent.lock:
            try:
                self.agent.core.check_writable(now_ms())
            except FailedPrecondition as error:
                raise RmqError(
                    code_of_error(error),
                    f"broker set {self.agent.broker_name}: {error.message} (the client's route "
                    "refreshes within 30 s)",
                ) from None

    def dead_letter(self, group: str, record: StoredRecord) -> None:
        topic = DEAD_LETTER_PREFIX + group
        try:
            self.metadata.ensure_dead_letter_topic(topic)
        except MqmetaError as exc:  # still kept locally; readable once the topic exists
            log.warning("could not create %s: %s", topic, exc)
        props = dict(record.properties)
        props[DLQ_ORIGIN] = f"{record.topic}/{record.queue_id}/{record.queue_offset}"
        self.agent.send([Message(topic, 0, record.body, record.tags, record.keys, props, record.producer_id)])

    # Receiving -----------------------------------------------------------------------------
    def receive(
        self,
        key: CursorKey,
        tags: frozenset[str] | None,
        batch: int,
        grant: LeaseGrant,
        fifo: bool,
        max_attempts: int,
    ) -> list[tuple[StoredRecord, Delivery]]:
        group, topic, queue_id = key
        slot = self.slot(key, grant.now_ms)
        confirm = self.agent.view().confirm_offset
        readable_end = self.store.readable_queue_max_offset(topic, queue_id, confirm)
        out: list[tuple[StoredRecord, Delivery]] = []
        dead: list[StoredRecord] = []
        with slot.lock:
            cursor = slot.cursor
            cursor.skip_to(self.store.queue_min_offset(topic, queue_id))
            cursor.expire(grant.now_ms, self.members.alive(grant.now_ms), AUTO_RENEW_MS)
            if not cursor.has_work(readable_end):
                return []
            for record in self._read(topic, queue_id, cursor.candidates(readable_end), confirm):
                message_group = record.properties.get(MESSAGE_GROUP, "") if fifo else ""
                candidate = Candidate(record.queue_offset, record.tags, message_group)
                verdict = cursor.judge(candidate, tags, max_attempts, fifo)
                if verdict is Verdict.DELIVER and len(out) >= batch:
                    break
                delivery = cursor.apply(candidate, verdict, grant)
                if verdict is Verdict.DEAD:
                    dead.append(record)
                elif delivery is not None:
                    out.append((record, delivery))
        for record in dead:
            self.dead_letter(group, record)
            with slot.lock:
                slot.cursor.dead_lettered(record.queue_offset)
        return out

    def _read(self, topic: str, queue_id: int, offsets: list[int], confirm: int) -> Iterator[StoredRecord]:
        """The records at `offsets` (sorted), reading each contiguous run at once."""
        i = 0
        while i < len(offsets):
            j = i
            while (
                j + 1 < len(offsets)
                and offsets[j + 1] == offsets[j] + 1
                and j + 1 - i < RECEIVE_BATCH_MAX - 1
            ):
                j += 1
            yield from self.store.get_messages(topic, queue_id, offsets[i], j - i + 1, confirm)
            i = j + 1

    def wait_for_work(self, key: CursorKey, timeout_s: float) -> None:
        """Sleeps until the confirm offset moves (the agent wakes its waiters) or a slice passes."""
        with self.agent.lock:
            self.agent.lock.wait(timeout=min(timeout_s, WAIT_SLICE_S))


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
        self.broker.members.remove(client_id_of(context))
        return rsvc.NotifyClientTerminationResponse(status=status())

    def Telemetry(self, request_iterator, context):
        return self.broker.hub.serve(request_iterator, context)

    @rmq_call(rsvc.SendMessageResponse)
    def SendMessage(self, request, context):
        if len(request.messages) != 1:
            raise RmqError(rdef.BAD_REQUEST, f"a send carries one message, not {len(request.messages)}")
        client_id = client_id_of(context)
        now = wall_ms()
        record, deliver_at = self.broker.to_record(request.messages[0], client_id, now)
        kind = request.messages[0].system_properties.message_type or rdef.NORMAL
        started = time.perf_counter()
        entry = self.broker.send(record, deliver_at, kind)
        if self.metrics is not None:
            self.metrics.send_seconds.observe(time.perf_counter() - started)
            if entry.status.code == rdef.OK:  # acknowledged: counted as the native Send counts
                self.metrics.messages_in.inc()
                self.metrics.bytes_in.inc(len(request.messages[0].body))
        return rsvc.SendMessageResponse(status=entry.status, entries=[entry])

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
                self.broker.wait_for_work(key, left)
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
            found = self.broker.receive((group, topic, queue_id), tags, batch, grant, fifo, max_attempts)
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
        entries = [self._ack_one(group, topic, e) for e in request.entries]
        failed = [e.status for e in entries if e.status.code != rdef.OK]
        overall = (
            failed[0]
            if len(failed) == len(entries)
            else status(rdef.MULTIPLE_RESULTS, "")
            if failed
            else status()
        )
        return rsvc.AckMessageResponse(status=overall, entries=entries)

    def _ack_one(self, group: str, topic: str, entry: rsvc.AckMessageEntry) -> rsvc.AckMessageResultEntry:
        def result(code: int = rdef.OK, message: str = "OK") -> rsvc.AckMessageResultEntry:
            return rsvc.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status(code, message)
            )

        try:
            handle = ReceiptHandle.decode(entry.receipt_handle)
            self.broker.check_handle(handle, topic)
            key = (group, topic, handle.queue_id)
            slot = self.broker.slot(key, wall_ms())
            with slot.lock:
                outcome = slot.cursor.ack(handle.offset, handle.lease)
            if outcome in (AckResult.STALE, AckResult.UNKNOWN):
                return result(
                    rdef.INVALID_RECEIPT_HANDLE, "the lease expired and the message was delivered again"
                )
            self.broker.persist(key, slot)
            return result()
        except RmqError as error:
            return result(error.code, error.message)
        except MqmetaError as error:
            failed = status_of_error(error)
            if isinstance(error, NotMaster):  # deposed while writing the progress: unknown
                failed = status(rdef.MASTER_PERSISTENCE_TIMEOUT, failed.message)
            return result(failed.code, failed.message)

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
        now = wall_ms()
        slot = self.broker.slot((group, topic, handle.queue_id), now)
        with slot.lock:
            outcome = slot.cursor.change_invisible(handle.offset, handle.lease, now, invisible)
        if not isinstance(outcome, int):
            code = rdef.INVALID_RECEIPT_HANDLE
            raise RmqError(
                code,
                f"the message cannot be leased again ({outcome.value}): "
                "it was acknowledged or delivered again",
            )
        renewed = ReceiptHandle(
            handle.broker_name, handle.epoch, handle.boot_id, topic, handle.queue_id, handle.offset, outcome
        )
        return rsvc.ChangeInvisibleDurationResponse(status=status(), receipt_handle=renewed.encode())

    @rmq_call(rsvc.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context):
        group = check_name("group", request.group, rdef.ILLEGAL_CONSUMER_GROUP)
        topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
        handle = ReceiptHandle.decode(request.receipt_handle)
        self.broker.check_handle(handle, topic)
        key = (group, topic, handle.queue_id)
        slot = self.broker.slot(key, wall_ms())
        confirm = self.broker.agent.view().confirm_offset
        records = self.broker.store.get_messages(topic, handle.queue_id, handle.offset, 1, confirm)
        if not records:
            raise RmqError(rdef.INVALID_RECEIPT_HANDLE, "the receipt handle names no stored message")
        with slot.lock:
            if slot.cursor.last_lease.get(handle.offset) != handle.lease:
                raise RmqError(rdef.INVALID_RECEIPT_HANDLE, "the message was acknowledged or delivered again")
        self.broker.dead_letter(group, records[0])
        with slot.lock:
            slot.cursor.dead_lettered(handle.offset)
        self.broker.persist(key, slot)
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
