"""The broker's admin calls (BrokerService's QueryMessages, TraceMessage, ResendMessage,
GetGroupLag, ResetOffsets): message query and trace, resend to a group, consumer lag and
offset resets, each answered from this replica's store.

Members of a group come from the three ways clients consume: native clients (a peer
that pulled for the group, or committed an offset of it, in the last NATIVE_MEMBER_MS;
our Consumer names its group in every pull, so an idle one that keeps polling stays a
member), remoting clients (their heartbeats) and RocketMQ 5 clients (theirs); run_broker
wires the last two in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.consumer_progress import CONSUMER_OFFSET_TOPIC
from mqmeta.broker_agent.status import ha_status, queue_lag
from mqmeta.broker_agent.store import MessageStore

from mqmeta.clock import wall_ms
from mqmeta.errors import FailedPrecondition, InvalidArgument, NotFound
from mqmeta.formats import origin as origin_properties
from mqmeta.formats.properties import (
    BORN_MS,
    DEAD_LETTER_PREFIX,
    DLQ_ORIGIN,
    MESSAGE_ID,
    RECONSUME_TIMES,
    RESENT_FROM,
    RETRY_PREFIX,
    RETRY_TOPIC,
)
from mqmeta.formats.records import Message, StoredRecord
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.validate import QUEUE_ID_MAX, REQUEST_INT_MAX, validate_int, validate_name

QUERY_COUNT_DEFAULT = 32
QUERY_COUNT_MAX = 64
BODY_BYTES_DEFAULT = 4096
BODY_BYTES_MAX = 1 << 20
MSG_ID_CHARS_MAX = 128
RETRY_SCAN_RECORDS_MAX = 4096  # the newest records of each retry/DLQ queue a trace reads
NATIVE_MEMBER_MS = 30_000  # a native client that pulled or committed this recently is a member
NATIVE_MEMBERS_MAX = 4096

# (client id, protocol, last seen wall ms) of one group's members, from one source
MemberSource = Callable[[str, int], list[tuple[str, str, int]]]


@dataclass
class BrokerAdmin:
    """The admin calls over one agent; the sources and hooks are set by run_broker."""

    agent: BrokerAgent
    member_sources: list[MemberSource] = field(default_factory=list)
    ensure_topic: Callable[[str], None] | None = None  # creates %RETRY%/%DLQ% topics in the controller
    forget_cursors: Callable[[list[tuple[str, str, int]]], None] | None = None  # the pop shell's
    _native: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def store(self) -> MessageStore:
        return self.agent.store

    # Members ---------------------------------------------------------------------------------
    def note_member(self, group: str, peer: str, now_ms: int) -> None:
        """A native client pulled for `group` or committed an offset of it: a member for
        NATIVE_MEMBER_MS."""
        with self._lock:
            if len(self._native) >= NATIVE_MEMBERS_MAX:
                for key, seen in list(self._native.items()):
                    if now_ms - seen >= NATIVE_MEMBER_MS:
                        del self._native[key]
                if len(self._native) >= NATIVE_MEMBERS_MAX:
                    return
            self._native[(group, peer)] = now_ms

    def members(self, group: str, now_ms: int) -> list[bpb.GroupMember]:
        with self._lock:
            found = [
                (peer, "native", seen)
                for (g, peer), seen in self._native.items()
                if g == group and now_ms - seen < NATIVE_MEMBER_MS
            ]
        for source in self.member_sources:
            found += source(group, now_ms)
        return [
            bpb.GroupMember(client_id=c, protocol=p, last_seen_ms_ago=max(0, now_ms - s))
            for c, p, s in sorted(found)
        ]

    # Message query ---------------------------------------------------------------------------
    def query_messages(self, request: bpb.QueryMessagesRequest) -> bpb.QueryMessagesResponse:
        count = validate_int("max_count", request.max_count or QUERY_COUNT_DEFAULT, 1, QUERY_COUNT_MAX)
        body_max = validate_int(
            "body_bytes_max", request.body_bytes_max or BODY_BYTES_DEFAULT, 1, BODY_BYTES_MAX
        )
        selector = request.WhichOneof("selector")
        if selector is None:
            raise InvalidArgument("a query names one of msg_id, key, position or time_range")
        if request.topic or selector != "msg_id":
            validate_name("topic", request.topic)
        covered = 0
        if selector == "msg_id":
            records = self._by_id(request.msg_id, request.topic)
        elif selector == "key":
            if not request.key or len(request.key) > 4096 or " " in request.key:
                raise InvalidArgument("a key is 1 to 4096 characters without spaces")
            records = self.store.records_by_key(request.topic, request.key, count)
            covered = self.store.key_covered_from(request.topic)
        elif selector == "position":
            records = [self._at(request.topic, request.position)]
        else:
            records = self._in_range(request.topic, request.time_range, count)
        confirm = self.agent.view().confirm_offset
        return bpb.QueryMessagesResponse(
            messages=[self.queried(r, confirm, body_max) for r in records[:count]], key_covered_from=covered
        )

    def _by_id(self, msg_id: str, topic: str) -> list[StoredRecord]:
        if not msg_id or len(msg_id) > MSG_ID_CHARS_MAX:
            raise InvalidArgument(f"a message id is 1 to {MSG_ID_CHARS_MAX} characters")
        records = self.store.records_by_id(msg_id, topic)
        if not records:
            raise NotFound(f"broker set {self.agent.broker_name} holds no message with id {msg_id}")
        return records

    def _at(self, topic: str, position: bpb.QueuePosition) -> StoredRecord:
        validate_int("queue_id", position.queue_id, 0, QUEUE_ID_MAX)
        validate_int("queue_offset", position.queue_offset, 0, REQUEST_INT_MAX)
        record = self.store.record_at(topic, position.queue_id, position.queue_offset)
        if record is None:
            raise NotFound(
                f"broker set {self.agent.broker_name} holds no message at "
                f"{topic}/{position.queue_id}/{position.queue_offset}"
            )
        return record

    def _in_range(self, topic: str, time_range: bpb.TimeRange, count: int) -> list[StoredRecord]:
        since, until = time_range.since_ms, time_range.until_ms
        validate_int("since_ms", since, 0, REQUEST_INT_MAX)
        validate_int("until_ms", until, 0, REQUEST_INT_MAX)
        if until and until <= since:
            raise InvalidArgument(f"the time range [{since}, {until}) is empty: until must be after since")
        found: list[StoredRecord] = []
        for name, queue_id in self.store.queues():
            if name != topic:
                continue
            offset = self.store.queue_offset_at_time(topic, queue_id, since)
            for _ in range(count):
                record = self.store.record_at(topic, queue_id, offset)
                if record is None or (until and record.store_timestamp_ms >= until):
                    break
                found.append(record)
                offset += 1
        found.sort(key=lambda r: (r.store_timestamp_ms, r.queue_id, r.queue_offset))
        return found[:count]

    def queried(self, record: StoredRecord, confirm: int, body_max: int) -> bpb.QueriedMessage:
        properties = record.properties
        born = properties.get(BORN_MS) or properties.get(origin_properties.BORN_MS) or ""
        return bpb.QueriedMessage(
            message=bpb.StoredMessage(
                msg_id=record.msg_id,
                topic=record.topic,
                queue_id=record.queue_id,
                queue_offset=record.queue_offset,
                commit_offset=record.commit_offset,
                epoch=record.epoch,
                store_timestamp_ms=record.store_timestamp_ms,
                body=record.body[:body_max],
                tags=record.tags,
                keys=record.keys,
                properties=dict(properties),
                producer_id=record.producer_id,
                producer_seq=record.producer_seq,
            ),
            body_truncated=len(record.body) > body_max,
            body_bytes=len(record.body),
            born_timestamp_ms=int(born) if born.isdigit() else record.store_timestamp_ms,
            broker_name=self.agent.broker_name,
            confirmed=record.end_offset <= confirm,
            origin={k: v for k, v in properties.items() if k.startswith(origin_properties.PREFIX)},
        )

    def find_one(self, msg_id: str, topic: str, position: bpb.QueuePosition | None) -> StoredRecord:
        """The message a trace or a resend names: by id (the newest record with it), or by
        topic and queue position."""
        if msg_id:
            return self._by_id(msg_id, topic)[0]
        if position is None:
            raise InvalidArgument("name the message by msg_id, or by topic and position")
        validate_name("topic", topic)
        return self._at(topic, position)

    # Trace -----------------------------------------------------------------------------------
    def trace_message(self, request: bpb.TraceMessageRequest) -> bpb.TraceMessageResponse:
        position = request.position if request.HasField("position") else None
        record = self.find_one(request.msg_id, request.topic, position)

        status = ha_status(self.agent)
        end = record.end_offset
        tiered_offset = -1
        tiered = self.agent.tiered
        if tiered is not None and tiered.checkpoint is not None:
            tiered_offset = tiered.checkpoint.uploaded_offset
        return bpb.TraceMessageResponse(
            message=self.queried(record, status.confirm_offset, BODY_BYTES_DEFAULT),
            commit_offset=record.commit_offset,
            end_offset=end,
            master_epoch=status.master_epoch,
            role=status.role,
            confirm_offset=status.confirm_offset,
            replicas=[
                bpb.ReplicaHolding(
                    broker_id=s.broker_id, acked_offset=s.acked_offset, holds=s.acked_offset >= end
                )
                for s in status.slaves
            ],
            tiered_offset=tiered_offset,
            tiered=tiered_offset >= end,
            groups=self._groups_past(record),
            retries=self._retries_of(record),
        )

    def _groups_past(self, record: StoredRecord) -> list[bpb.GroupPosition]:
        positions = []
        for group, offset in self.store.consumer_offsets_of(record.topic, record.queue_id):
            progress = self.store.consumer_progress(group, record.topic, record.queue_id)
            ranges = progress[1] if progress is not None else ()
            consumed = offset > record.queue_offset or any(
                low <= record.queue_offset < high for low, high in ranges
            )
            positions.append(bpb.GroupPosition(group=group, consumed_offset=offset, consumed=consumed))
        return positions

    def _retries_of(self, record: StoredRecord) -> list[bpb.RetryCopy]:
        """The copies of `record` in %RETRY% and %DLQ% queues, among each one's newest
        RETRY_SCAN_RECORDS_MAX records."""
        ids = {record.msg_id, record.properties.get(MESSAGE_ID, record.msg_id)}
        position = f"{record.topic}/{record.queue_id}/{record.queue_offset}"
        copies = []
        for topic, queue_id in self.store.queues():
            if not topic.startswith((RETRY_PREFIX, DEAD_LETTER_PREFIX)) or topic == record.topic:
                continue
            end = self.store.queue_max_offset(topic, queue_id)
            start = max(self.store.queue_min_offset(topic, queue_id), end - RETRY_SCAN_RECORDS_MAX)
            for copy in _records(self.store, topic, queue_id, range(start, end)):
                properties = copy.properties
                if (
                    properties.get(MESSAGE_ID) in ids
                    or properties.get(RESENT_FROM) in ids
                    or properties.get(DLQ_ORIGIN) == position
                ):
                    times = properties.get(RECONSUME_TIMES, "0")
                    copies.append(
                        bpb.RetryCopy(
                            topic=topic,
                            queue_id=queue_id,
                            queue_offset=copy.queue_offset,
                            msg_id=copy.msg_id,
                            reconsume_times=int(times) if times.isdigit() else 0,
                            dead_letter=topic.startswith(DEAD_LETTER_PREFIX),
                        )
                    )
        return copies

    # Resend ----------------------------------------------------------------------------------
    def resend(self, request: bpb.ResendMessageRequest) -> bpb.ResendMessageResponse:
        """A copy into %RETRY%{group}: consumed again by that group only (a remoting
        consumer subscribes to its retry topic). From %DLQ%{group} this is the requeue."""
        group = validate_name("group", request.group)
        self.agent.require_master()
        position = request.position if request.HasField("position") else None
        record = self.find_one(request.msg_id, request.topic, position)
        if record.topic == CONSUMER_OFFSET_TOPIC:
            raise InvalidArgument(f"{CONSUMER_OFFSET_TOPIC} records are progress, not messages")
        topic = RETRY_PREFIX + group
        validate_name("topic", topic)
        properties = dict(record.properties)
        properties.setdefault(RETRY_TOPIC, properties.get(DLQ_ORIGIN, "").split("/")[0] or record.topic)
        if record.topic.startswith(RETRY_PREFIX):
            properties[RETRY_TOPIC] = record.properties.get(RETRY_TOPIC, record.topic)
        properties[RESENT_FROM] = properties.get(MESSAGE_ID, record.msg_id)
        properties.pop(DLQ_ORIGIN, None)
        for key in [k for k in properties if k.startswith(origin_properties.PREFIX)]:
            del properties[key]  # a new message of this cluster, not a replicated copy
        if self.ensure_topic is not None:
            self.ensure_topic(topic)
        copy = Message(topic, 0, record.body, record.tags, record.keys, properties, record.producer_id)
        (result,), _ = self.agent.send([copy])
        return bpb.ResendMessageResponse(
            result=bpb.SendResult(
                msg_id=result.msg_id,
                topic=result.topic,
                queue_id=result.queue_id,
                queue_offset=result.queue_offset,
                commit_offset=result.commit_offset,
            )
        )

    # Lag and reset ---------------------------------------------------------------------------
    def _group_queues(self, group: str, topic: str) -> list[tuple[str, int]]:
        """The queues of `topic` (every queue, progress or not), or, without a topic, every
        queue the group has progress in."""
        if topic:
            return [(t, q) for t, q in self.store.queues() if t == topic]
        return [
            (t, q)
            for t, q in self.store.queues()
            if t != CONSUMER_OFFSET_TOPIC and self.store.consumer_progress(group, t, q) is not None
        ]

    def group_lag(self, request: bpb.GroupLagRequest) -> bpb.GroupLagResponse:
        group = validate_name("group", request.group)
        if request.topic:
            validate_name("topic", request.topic)
        now = wall_ms()
        confirm = self.agent.view().confirm_offset
        queues = [
            queue_lag(self.store, group, t, q, confirm, now)
            for t, q in self._group_queues(group, request.topic)
        ]
        return bpb.GroupLagResponse(
            broker_name=self.agent.broker_name,
            queues=queues,
            members=self.members(group, now),
            backlog=sum(q.backlog for q in queues),
            backlog_ms=max((q.backlog_ms for q in queues), default=0),
        )

    def reset_offsets(self, request: bpb.ResetOffsetsRequest) -> bpb.ResetOffsetsResponse:
        group = validate_name("group", request.group)
        if request.topic:
            validate_name("topic", request.topic)
        to = request.WhichOneof("to")
        if to is None:
            raise InvalidArgument("a reset names one of timestamp_ms, earliest or latest")
        if to == "timestamp_ms":
            validate_int("timestamp_ms", request.timestamp_ms, 0, REQUEST_INT_MAX)
        self.agent.require_master()
        now = wall_ms()
        members = self.members(group, now)
        if members and not request.force:
            names = ", ".join(f"{m.client_id} ({m.protocol})" for m in members[:5])
            raise FailedPrecondition(
                f"group {group} has {len(members)} member(s) connected to broker set "
                f"{self.agent.broker_name} ({names}); stop them first or pass --force"
            )
        queues = self._group_queues(group, request.topic)
        if not queues:
            raise NotFound(
                f"group {group} has no progress on broker set {self.agent.broker_name}"
                + (f" and topic {request.topic} has no queue there" if request.topic else "")
            )
        confirm = self.agent.view().confirm_offset
        entries = []
        for topic, queue_id in queues:
            if to == "earliest":
                offset = self.store.queue_min_offset(topic, queue_id)
            elif to == "latest":
                offset = self.store.readable_queue_max_offset(topic, queue_id, confirm)
            else:
                offset = min(
                    self.store.queue_offset_at_time(topic, queue_id, request.timestamp_ms),
                    self.store.readable_queue_max_offset(topic, queue_id, confirm),
                )
            entries.append((group, topic, queue_id, offset, ()))
        keys = [(g, t, q) for g, t, q, _, _ in entries]
        if self.forget_cursors is not None:
            self.forget_cursors(keys)
        for start in range(0, len(entries), 1024):
            self.agent.commit_consumer_progress(entries[start : start + 1024])
        if self.forget_cursors is not None:
            self.forget_cursors(keys)  # a cursor flushed meanwhile reloads from the reset
        confirm = self.agent.view().confirm_offset
        return bpb.ResetOffsetsResponse(
            queues=[queue_lag(self.store, group, t, q, confirm, now) for t, q in queues]
        )


def _records(
    store: MessageStore, topic: str, queue_id: int, offsets: Iterable[int]
) -> Iterable[StoredRecord]:
    for offset in offsets:
        record = store.record_at(topic, queue_id, offset)
        if record is not None:
            yield record
