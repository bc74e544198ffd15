"""The broker's RocketMQ remoting service: what a RocketMQ 4.x producer and clustering
PushConsumer ask of a broker (RocketMQ's C++, Java and Go clients and their wrappers).

Sends are records of our commit log written by the same path as the RocketMQ 5 service's
(RmqBroker.send: a delay level parks the message in the delay queue); pulls read the
queues and answer V1 message records; consumer offsets are the group offsets the native
CommitOffset and QueryOffset keep (commit-log records: they replicate and survive a
failover). Clients are told who else is in their group (GET_CONSUMER_LIST_BY_GROUP) from
their heartbeats and rebalance themselves; a change is pushed to the group's members at
once (NOTIFY_CONSUMER_IDS_CHANGED). A consumer leaves on UNREGISTER_CLIENT, when its
connection closes, or after CONSUMER_EXPIRY_MS without a heartbeat. Orderly consumers lock
their queues (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ): the locks live in the master's memory, so a
failover frees them and the clients take them again at their next lock round. A batch
send writes its messages to one queue together; SEARCH_OFFSET_BY_TIMESTAMP searches a
queue by store time. QUERY_MESSAGE finds a topic's messages by key (or by message id)
through the key index, VIEW_MESSAGE_BY_ID reads the message at a commit offset.

A group is consumed either here (offsets) or through RocketMQ 5's receive/ack (the pop
model keeps its own progress per group): the two keep separate positions, so a group
used both ways gets each message once per way. Use one way per group.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.key_index import KEY_FOUND_MAX
from mqmeta.broker_agent.rmq_broker import RmqBroker

from mqmeta.clock import wall_ms
from mqmeta.codec import remoting as codec
from mqmeta.codec.remoting import Command
from mqmeta.codec.rocketmq5 import Send
from mqmeta.errors import InvalidArgument, MqmetaError
from mqmeta.formats.properties import (
    DEAD_LETTER_PREFIX,
    DELIVER_MS,
    MESSAGE_ID,
    MESSAGE_TYPE,
    RECONSUME_TIMES,
    RETRY_PREFIX,
    RETRY_TOPIC,
)
from mqmeta.formats.records import Message, StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.remoting.messages import MessageRefused, ipv4_host, matches, tag_set, to_record, to_wire
from mqmeta.remoting.server import (
    Connection,
    Handler,
    Refusal,
    RemotingServer,
    ext_bool,
    ext_int,
    ext_text,
    server_ssl_context,
)
from mqmeta.rocketmq import BODY_BYTES_MAX, RmqError
from mqmeta.validate import QUEUE_ID_MAX, REQUEST_INT_MAX, validate_name

log = logging.getLogger(__name__)

CONSUMER_EXPIRY_MS = 120_000  # RocketMQ's: a consumer silent this long has left
CLIENTS_MAX = 10_000
PULL_BATCH_MAX = 1024
PULL_SCAN_MAX = 8192  # records a filtered pull reads before it answers "retry at once"
LONG_POLL_MS_MAX = 30_000
WAIT_SLICE_S = 0.5
RECONSUME_TIMES_DEFAULT = 16  # RocketMQ's maxReconsumeTimes
RETRY_FIRST_LEVEL = 3  # the first retry waits 10 s, then each one level more (RocketMQ's)
LOCK_LIFETIME_MS = 60_000  # RocketMQ's: a queue lock not renewed this long is free again
LOCKS_MAX = 100_000
LOCK_BATCH_QUEUES_MAX = 1024
SEND_BATCH_MESSAGES_MAX = 1024
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
QUERY_KEY_CHARS_MAX = 4096
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # QUERY_MESSAGE's flag: the key is a message id
# SEND_MESSAGE_V2's one-letter header names.
_V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "consumeRetryTimes",
    "m": "batch",
}
# RocketMQ 5 refusals a send can meet, as remoting response codes.
_CODE_OF_RMQ: dict[int, int] = {
    rdef.TOPIC_NOT_FOUND: codec.TOPIC_NOT_EXIST,
    rdef.FORBIDDEN: codec.NO_PERMISSION,
    rdef.HA_NOT_AVAILABLE: codec.SERVICE_NOT_AVAILABLE,
    rdef.MASTER_PERSISTENCE_TIMEOUT: codec.SYSTEM_BUSY,  # outcome unknown: the client sends again
    rdef.SLAVE_PERSISTENCE_TIMEOUT: codec.SYSTEM_BUSY,
}


def _refusal(error: RmqError) -> Refusal:
    return Refusal(_CODE_OF_RMQ.get(error.code, codec.MESSAGE_ILLEGAL), error.message)


@dataclass
class _Member:
    connection: Connection
    last_seen_ms: int
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> expression


class ConsumerGroups:
    """Who consumes in each group, from heartbeats (pure but for its lock: no I/O)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, _Member]] = {}

    def heartbeat(
        self, client_id: str, connection: Connection, groups: dict[str, dict[str, str]], now_ms: int
    ) -> set[str]:
        """Records the client's groups; returns the groups whose members changed."""
        changed = set()
        with self._lock:
            for group, subscriptions in groups.items():
                members = self._groups.setdefault(group, {})
                if client_id not in members:
                    if sum(len(m) for m in self._groups.values()) >= CLIENTS_MAX:
                        raise Refusal(codec.SYSTEM_BUSY, f"over {CLIENTS_MAX} consumers on this broker")
                    changed.add(group)
                members[client_id] = _Member(connection, now_ms, subscriptions)
            changed |= self._expire(now_ms)
        return changed

    def unregister(self, client_id: str, group: str) -> set[str]:
        with self._lock:
            if self._groups.get(group, {}).pop(client_id, None) is not None:
                return {group}
        return set()

    def disconnected(self, connection: Connection) -> set[str]:
        changed = set()
        with self._lock:
            for group, members in self._groups.items():
                for client_id in [c for c, m in members.items() if m.connection is connection]:
                    del members[client_id]
                    changed.add(group)
        return changed

    def _expire(self, now_ms: int) -> set[str]:
        changed = set()
        for group, members in self._groups.items():
            for client_id in [c for c, m in members.items() if now_ms - m.last_seen_ms >= CONSUMER_EXPIRY_MS]:
                del members[client_id]
                changed.add(group)
        return changed

    def members(self, group: str, now_ms: int) -> list[str]:
        with self._lock:
            self._expire(now_ms)
            return sorted(self._groups.get(group, {}))

    def of_group(self, group: str, now_ms: int) -> list[tuple[str, str, int]]:
        """(client id, "remoting", last heartbeat ms) of the group's live consumers."""
        with self._lock:
            self._expire(now_ms)
            return [(c, "remoting", m.last_seen_ms) for c, m in self._groups.get(group, {}).items()]

    def connections(self, group: str) -> list[Connection]:
        with self._lock:
            return [m.connection for m in self._groups.get(group, {}).values()]

    def subscription(self, group: str, topic: str) -> str | None:
        with self._lock:
            for member in self._groups.get(group, {}).values():
                if topic in member.subscriptions:
                    return member.subscriptions[topic]
        return None


QueueKey = tuple[str, str, int]  # (group, topic, queue id)


class QueueLocks:
    """Which client of a group holds each queue (orderly consumers: one consumer per queue at a
    time). Pure but for its lock. Held by the master in memory only: a failover frees every
    lock, and the clients take them again at their next lock round (RocketMQ's brokers keep
    them in memory too); a lock not renewed for LOCK_LIFETIME_MS is free."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[QueueKey, tuple[str, int]] = {}  # -> (client id, expires at ms)

    def lock(self, group: str, client_id: str, queues: list[tuple[str, int]], now_ms: int) -> list[int]:
        """Takes or renews each queue that is free, expired or already the client's; the
        positions in `queues` of those the client now holds."""
        held = []
        with self._lock:
            for position, (topic, queue_id) in enumerate(queues):
                key = (group, topic, queue_id)
                owner = self._held.get(key)
                if owner is None and len(self._held) >= LOCKS_MAX:
                    self._expire(now_ms)
                    if len(self._held) >= LOCKS_MAX:
                        raise Refusal(codec.SYSTEM_BUSY, f"over {LOCKS_MAX} queue locks on this broker")
                if owner is None or owner[0] == client_id or owner[1] <= now_ms:
                    self._held[key] = (client_id, now_ms + LOCK_LIFETIME_MS)
                    held.append(position)
        return held

    def unlock(self, group: str, client_id: str, queues: list[tuple[str, int]]) -> None:
        with self._lock:
            for topic, queue_id in queues:
                key = (group, topic, queue_id)
                if self._held.get(key, ("", 0))[0] == client_id:
                    del self._held[key]

    def _expire(self, now_ms: int) -> None:
        for key in [k for k, (_, expires) in self._held.items() if expires <= now_ms]:
            del self._held[key]


class RemotingBroker:
    """The handlers of the broker's remoting listener."""

    def __init__(self, agent: BrokerAgent, rmq: RmqBroker, address: str) -> None:
        self.agent = agent
        self.store = agent.store
        self.rmq = rmq
        self.metadata = rmq.metadata
        self.address = address
        self.store_host = ipv4_host(address)
        self.groups = ConsumerGroups()
        self.locks = QueueLocks()
        self._opaques = itertools.count(1)
        self.delay_levels_ms = agent.config.message_delay_levels_ms  # --message-delay-levels

    def handlers(self) -> dict[int, Handler]:
        return {
            codec.HEART_BEAT: self.heartbeat,
            codec.UNREGISTER_CLIENT: self.unregister,
            codec.SEND_MESSAGE: self.send,
            codec.SEND_MESSAGE_V2: self.send,
            codec.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            codec.QUERY_CONSUMER_OFFSET: self.query_offset,
            codec.UPDATE_CONSUMER_OFFSET: self.update_offset,
            codec.GET_MAX_OFFSET: self.max_offset,
            codec.GET_MIN_OFFSET: self.min_offset,
            codec.PULL_MESSAGE: self.pull,
            codec.CONSUMER_SEND_MSG_BACK: self.send_back,
            codec.LOCK_BATCH_MQ: self.lock_batch,
            codec.UNLOCK_BATCH_MQ: self.unlock_batch,
            codec.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            codec.QUERY_MESSAGE: self.query_message,
            codec.VIEW_MESSAGE_BY_ID: self.view_message,
        }

    def server(self) -> RemotingServer:
        return RemotingServer(
            self.address,
            self.handlers(),
            long_codes=frozenset({codec.PULL_MESSAGE}),
            on_close=self.closed,
            name="broker-remoting",
            ssl_context=server_ssl_context(),
        )

    # Clients --------------------------------------------------------------------------------
    def heartbeat(self, command: Command, connection: Connection) -> Command:
        data = codec.fastjson_loads(command.body) if command.body else {}
        if not isinstance(data, dict):
            raise Refusal(codec.SYSTEM_ERROR, "the heartbeat body is not a JSON object")
        client_id = str(data.get("clientID") or "")[:255]
        if not client_id:
            raise Refusal(codec.SYSTEM_ERROR, "the heartbeat names no clientID")
        groups: dict[str, dict[str, str]] = {}
        for consumer in _list(data.get("consumerDataSet")):
            group = str(consumer.get("groupName") or "")
            if group:
                groups[group] = {
                    str(s.get("topic")): str(s.get("subString") or "*")
                    for s in _list(consumer.get("subscriptionDataSet"))
                    if s.get("topic")
                }
        self._notify(self.groups.heartbeat(client_id, connection, groups, wall_ms()))
        return command.answer()

    def unregister(self, command: Command, connection: Connection) -> Command:
        client_id = ext_text(command, "clientID")
        group = command.ext.get("consumerGroup", "")
        if group:
            self._notify(self.groups.unregister(client_id, group))
        return command.answer()

    def closed(self, connection: Connection) -> None:
        self._notify(self.groups.disconnected(connection))

    def _notify(self, groups: set[str]) -> None:
        """Tells every member of each group that its members changed (it rebalances now
        instead of at its next 20 s round)."""
        for group in groups:
            for connection in self.groups.connections(group):
                connection.send(
                    Command(
                        codec.NOTIFY_CONSUMER_IDS_CHANGED,
                        next(self._opaques) & 0x7FFFFFFF,
                        codec.FLAG_ONEWAY,
                        ext={"consumerGroup": group},
                    )
                )

    def consumer_list(self, command: Command, connection: Connection) -> Command:
        group = ext_text(command, "consumerGroup")
        members = self.groups.members(group, wall_ms())
        return command.answer(body=codec.fastjson_dumps({"consumerIdList": members}))

    # Offsets --------------------------------------------------------------------------------
    def _queue(self, command: Command) -> tuple[str, int]:
        topic = _name("topic", ext_text(command, "topic"))
        return topic, ext_int(command, "queueId", 0, QUEUE_ID_MAX)

    def query_offset(self, command: Command, connection: Connection) -> Command:
        group = _name("consumerGroup", ext_text(command, "consumerGroup"))
        topic, queue_id = self._queue(command)
        self.agent.require_master()
        offset = self.store.consumer_offset(group, topic, queue_id)
        if offset is None:
            # A group the controller does not know (or one that starts at its first offset)
            # starts at the oldest stored message, as the RocketMQ 5 service starts it;
            # QUERY_NOT_FOUND makes the client start at the newest (its LAST_OFFSET).
            config = self.metadata.group(group, wall_ms())
            if config is not None and config.consume_from != "FIRST_OFFSET":
                raise Refusal(codec.QUERY_NOT_FOUND, f"group {group} has no offset in {topic}/{queue_id}")
            offset = self.store.queue_min_offset(topic, queue_id)
        return command.answer(ext={"offset": offset})

    def update_offset(self, command: Command, connection: Connection) -> Command:
        group = _name("consumerGroup", ext_text(command, "consumerGroup"))
        topic, queue_id = self._queue(command)
        offset = ext_int(command, "commitOffset", -1, REQUEST_INT_MAX)
        self._commit(group, topic, queue_id, offset)
        return command.answer()

    def _commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Writes the group's offset unless it is already the stored one (clients repeat
        theirs every few seconds)."""
        if offset >= 0 and self.store.consumer_offset(group, topic, queue_id) != offset:
            self.agent.commit_consumer_offset(group, topic, queue_id, offset)

    def max_offset(self, command: Command, connection: Connection) -> Command:
        topic, queue_id = self._queue(command)
        self.agent.require_master()
        confirm = self.agent.view().confirm_offset
        return command.answer(ext={"offset": self.store.readable_queue_max_offset(topic, queue_id, confirm)})

    def min_offset(self, command: Command, connection: Connection) -> Command:
        topic, queue_id = self._queue(command)
        self.agent.require_master()
        return command.answer(ext={"offset": self.store.queue_min_offset(topic, queue_id)})

    def search_offset(self, command: Command, connection: Connection) -> Command:
        """The first queue offset stored at or after `timestamp` (ms); the max offset when none is."""
        topic, queue_id = self._queue(command)
        timestamp = ext_int(command, "timestamp", 0, REQUEST_INT_MAX)
        self.agent.require_master()
        confirm = self.agent.view().confirm_offset
        offset = self.store.queue_offset_at_time(topic, queue_id, timestamp, confirm)
        return command.answer(ext={"offset": offset})

    # Orderly consumers ----------------------------------------------------------------------
    def _lock_body(self, command: Command) -> tuple[str, str, list[dict], list[tuple[str, int]]]:
        data = codec.fastjson_loads(command.body) if command.body else None
        if not isinstance(data, dict):
            raise Refusal(codec.SYSTEM_ERROR, "the lock request body is not a JSON object")
        group = _name("consumerGroup", str(data.get("consumerGroup") or ""))
        client_id = str(data.get("clientId") or "")[:255]
        if not client_id:
            raise Refusal(codec.SYSTEM_ERROR, "the lock request names no clientId")
        items = _list(data.get("mqSet"))
        if len(items) > LOCK_BATCH_QUEUES_MAX:
            raise Refusal(codec.SYSTEM_ERROR, f"a lock request names at most {LOCK_BATCH_QUEUES_MAX} queues")
        queues = []
        for item in items:
            try:
                queues.append((_name("topic", str(item.get("topic") or "")), int(item.get("queueId", -1))))
            except (TypeError, ValueError):
                raise Refusal(
                    codec.SYSTEM_ERROR, f"a queue of the lock request is malformed: {item}"
                ) from None
        return group, client_id, items, queues

    def lock_batch(self, command: Command, connection: Connection) -> Command:
        group, client_id, items, queues = self._lock_body(command)
        self.agent.require_master()  # locks live on the master: a failover frees them
        held = self.locks.lock(group, client_id, queues, wall_ms())
        return command.answer(body=codec.fastjson_dumps({"lockOKMQSet": [items[i] for i in held]}))

    def unlock_batch(self, command: Command, connection: Connection) -> Command:
        group, client_id, _, queues = self._lock_body(command)
        self.locks.unlock(group, client_id, queues)
        return command.answer()

    # Sending --------------------------------------------------------------------------------
    def send(self, command: Command, connection: Connection) -> Command:
        if command.code == codec.SEND_MESSAGE_V2:
            command.ext = {_V2_NAMES.get(k, k): v for k, v in command.ext.items()}
        topic = _name("topic", ext_text(command, "topic"))
        if topic.startswith("%"):
            raise Refusal(codec.NO_PERMISSION, f"topic {topic} is a system topic; send to your own topics")
        sys_flag = ext_int(command, "sysFlag", 0, (1 << 31) - 1, 0)
        if sys_flag & codec.SYS_FLAG_TRANSACTION_TYPES:
            raise Refusal(codec.MESSAGE_ILLEGAL, "transaction sends are not served yet")
        if ext_bool(command, "batch"):
            return self._send_batch(command, connection, topic)
        body = command.body
        if sys_flag & codec.SYS_FLAG_COMPRESSED:
            body = codec.inflate_body(body, BODY_BYTES_MAX)
        if not body or len(body) > BODY_BYTES_MAX:
            raise Refusal(
                codec.MESSAGE_ILLEGAL, f"the body must be 1 to {BODY_BYTES_MAX} bytes, not {len(body)}"
            )
        now = wall_ms()
        queue_id = self._writable_queue(command, topic, now)
        try:
            sent = to_record(
                topic,
                queue_id,
                body,
                command.ext.get("properties", ""),
                ext_int(command, "bornTimestamp", 0, REQUEST_INT_MAX, now),
                connection.peer,
                ext_text(command, "producerGroup", ""),
            )
        except MessageRefused as error:
            raise Refusal(codec.MESSAGE_ILLEGAL, str(error)) from None
        message_id = sent.message_id or uuid.uuid4().hex.upper()
        record, deliver_at, kind = self._typed(sent.record, message_id, sent.delay_level, now)
        try:
            entry = self.rmq.send(Send(record, kind, deliver_at))
        except RmqError as error:
            raise _refusal(error) from None
        if entry.status.code != rdef.OK:
            raise Refusal(_CODE_OF_RMQ.get(entry.status.code, codec.SYSTEM_ERROR), entry.status.message)
        return command.answer(ext={"msgId": message_id, "queueId": queue_id, "queueOffset": entry.offset})

    def _writable_queue(self, command: Command, topic: str, now: int) -> int:
        try:
            local = self.metadata.local(topic, now)
        except RmqError as error:
            raise _refusal(error) from None
        queue_id = ext_int(command, "queueId", 0, QUEUE_ID_MAX)
        if "W" not in local.perm or queue_id >= local.write_queues:
            raise Refusal(
                codec.NO_PERMISSION,
                f"queue {queue_id} of {topic} is not writable on broker set {self.agent.broker_name}",
            )
        return queue_id

    def _send_batch(self, command: Command, connection: Connection, topic: str) -> Command:
        """Several plain messages to one queue, written together (in order, one after another)."""
        now = wall_ms()
        queue_id = self._writable_queue(command, topic, now)
        try:
            items = codec.decode_batch(command.body, SEND_BATCH_MESSAGES_MAX)
        except codec.FrameError as error:
            raise Refusal(codec.MESSAGE_ILLEGAL, error.message) from None
        records, ids = [], []
        born = ext_int(command, "bornTimestamp", 0, REQUEST_INT_MAX, now)
        producer = ext_text(command, "producerGroup", "")
        for item in items:
            if not item.body or len(item.body) > BODY_BYTES_MAX:
                raise Refusal(codec.MESSAGE_ILLEGAL, f"each body must be 1 to {BODY_BYTES_MAX} bytes")
            try:
                sent = to_record(topic, queue_id, item.body, item.properties, born, connection.peer, producer)
            except MessageRefused as error:
                raise Refusal(codec.MESSAGE_ILLEGAL, str(error)) from None
            if sent.delay_level:
                raise Refusal(codec.MESSAGE_ILLEGAL, "a batch cannot carry delayed messages")
            ids.append(sent.message_id or uuid.uuid4().hex.upper())
            records.append(self._typed(sent.record, ids[-1], 0, now)[0])
        try:
            offsets = self.rmq.send_many(records)
        except RmqError as error:
            raise _refusal(error) from None
        return command.answer(ext={"msgId": ",".join(ids), "queueId": queue_id, "queueOffset": offsets[0]})

    def _typed(
        self, record: Message, message_id: str, delay_level: int, now: int
    ) -> tuple[Message, int, int]:
        """The record with its RocketMQ 5 message id and type, and when it is delivered."""
        properties = dict(record.properties)
        properties[MESSAGE_ID] = message_id
        kind, deliver_at = rdef.NORMAL, 0
        if delay_level > 0:
            kind = rdef.DELAY
            deliver_at = now + self.delay_levels_ms[min(delay_level, len(self.delay_levels_ms)) - 1]
            properties[DELIVER_MS] = str(deliver_at)
        properties[MESSAGE_TYPE] = str(kind)
        typed = Message(
            record.topic,
            record.queue_id,
            record.body,
            record.tags,
            record.keys,
            properties,
            record.producer_id,
        )
        return typed, deliver_at, kind

    # Retries --------------------------------------------------------------------------------
    def send_back(self, command: Command, connection: Connection) -> Command:
        """A message the consumer failed: again after a delay level through %RETRY%{group}
        (which the clients subscribe to), or to %DLQ%{group} past its reconsume times."""
        group = _name("group", ext_text(command, "group"))
        offset = ext_int(command, "offset", 0, REQUEST_INT_MAX)
        delay_level = ext_int(command, "delayLevel", -1, 1 << 20, 0)
        times_max = ext_int(command, "maxReconsumeTimes", -1, 1 << 20, RECONSUME_TIMES_DEFAULT)
        # a message failed again is read from %RETRY%group, its origin topic still named
        origin_topic = command.ext.get("originTopic", "")
        original = self._record_at(offset, origin_topic, RETRY_PREFIX + group if origin_topic else "")
        times = _number(original.properties.get(RECONSUME_TIMES)) + 1
        properties = dict(original.properties)
        properties.setdefault(RETRY_TOPIC, original.topic)
        properties[RECONSUME_TIMES] = str(times)
        properties.pop(DELIVER_MS, None)
        if delay_level < 0 or times > (times_max if times_max >= 0 else RECONSUME_TIMES_DEFAULT):
            topic, delay_level = DEAD_LETTER_PREFIX + group, 0
        else:
            topic = RETRY_PREFIX + group
            delay_level = delay_level or min(RETRY_FIRST_LEVEL + times - 1, len(self.delay_levels_ms))
        self.metadata.ensure_dead_letter_topic(topic)  # creates a one-queue topic on first use
        record = Message(
            topic, 0, original.body, original.tags, original.keys, properties, original.producer_id
        )
        now = wall_ms()
        message_id = properties.get(MESSAGE_ID) or original.msg_id
        typed, deliver_at, kind = self._typed(record, message_id, delay_level, now)
        try:
            entry = self.rmq.send(Send(typed, kind, deliver_at))
        except RmqError as error:
            raise _refusal(error) from None
        if entry.status.code != rdef.OK:
            raise Refusal(_CODE_OF_RMQ.get(entry.status.code, codec.SYSTEM_ERROR), entry.status.message)
        return command.answer()

    def _record_at(self, offset: int, topic: str, or_topic: str = "") -> StoredRecord:
        """The stored record at commit offset `offset` (what a pull answered as its physical
        offset), checked to be a readable record of `topic` (or of `or_topic`)."""
        self.agent.require_master()
        confirm = self.agent.view().confirm_offset
        try:
            record = self.store.log.read_record(offset) if offset < confirm else None
        except Exception:  # not a record's first byte (client input), or since deleted
            record = None
        if record is None or record.end_offset > confirm or (topic and record.topic not in (topic, or_topic)):
            of = f" of {topic[:128]}" if topic else ""
            raise Refusal(codec.SYSTEM_ERROR, f"no readable message{of} at commit offset {offset}")
        return record

    # Message queries ------------------------------------------------------------------------
    def query_message(self, command: Command, connection: Connection) -> Command:
        """The readable messages of `topic` carrying `key` (with `_UNIQUE_KEY_QUERY` true: whose
        message id is `key`) stored from beginTimestamp to endTimestamp, newest first, at most
        maxNum (and KEY_FOUND_MAX). Found through the key index, as far as it covers."""
        topic = _name("topic", ext_text(command, "topic"))
        key = ext_text(command, "key")
        if not key or len(key) > QUERY_KEY_CHARS_MAX or " " in key:
            raise Refusal(
                codec.SYSTEM_ERROR, f"a key is 1 to {QUERY_KEY_CHARS_MAX} characters without spaces"
            )
        count = min(ext_int(command, "maxNum", 1, REQUEST_INT_MAX), KEY_FOUND_MAX)
        begin_ms = ext_int(command, "beginTimestamp", 0, REQUEST_INT_MAX, 0)
        end_ms = ext_int(command, "endTimestamp", 0, REQUEST_INT_MAX, REQUEST_INT_MAX)
        self.agent.require_master()
        if command.ext.get(UNIQUE_KEY_QUERY) == "true":
            records = self.store.records_by_id(key, topic)
        else:
            records = self.store.records_by_key(topic, key, KEY_FOUND_MAX)
        confirm = self.agent.view().confirm_offset
        found = [
            r for r in records if r.end_offset <= confirm and begin_ms <= r.store_timestamp_ms <= end_ms
        ][:count]
        if not found:
            raise Refusal(
                codec.QUERY_NOT_FOUND,
                f"no readable message of {topic} with key {key[:128]} stored from {begin_ms} to {end_ms} ms",
            )
        ext = {"indexLastUpdateTimestamp": wall_ms(), "indexLastUpdatePhyoffset": confirm}
        return command.answer(ext=ext, body=b"".join(self._encoded(r) for r in found))

    def view_message(self, command: Command, connection: Connection) -> Command:
        """The message at commit offset `offset` (the last 16 hex digits of the id a client
        computes from a pulled message's store host and physical offset)."""
        record = self._record_at(ext_int(command, "offset", 0, REQUEST_INT_MAX), "")
        return command.answer(body=self._encoded(record))

    def _encoded(self, record: StoredRecord) -> bytes:
        reconsume_times = _number(record.properties.get(RECONSUME_TIMES))
        return codec.encode_message(to_wire(record, self.store_host, reconsume_times))

    # Pulling --------------------------------------------------------------------------------
    def pull(self, command: Command, connection: Connection) -> Command:
        group = _name("consumerGroup", ext_text(command, "consumerGroup"))
        topic, queue_id = self._queue(command)
        offset = ext_int(command, "queueOffset", 0, REQUEST_INT_MAX)
        count = ext_int(command, "maxMsgNums", 1, 1 << 20)
        count = min(count, PULL_BATCH_MAX)
        sys_flag = ext_int(command, "sysFlag", 0, (1 << 31) - 1, 0)
        suspend_ms = ext_int(command, "suspendTimeoutMillis", 0, REQUEST_INT_MAX, 0)
        self.agent.require_master()
        try:
            self.metadata.local(topic, wall_ms())
        except RmqError as error:
            raise _refusal(error) from None
        if sys_flag & PULL_FLAG_COMMIT_OFFSET:
            commit = ext_int(command, "commitOffset", -1, REQUEST_INT_MAX, -1)
            self._commit(group, topic, queue_id, commit)
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            expression = command.ext.get("subscription", "*")
        else:
            expression = self.groups.subscription(group, topic) or "*"
        tags = tag_set(expression)
        wait_s = min(suspend_ms, LONG_POLL_MS_MAX) / 1000 if sys_flag & PULL_FLAG_SUSPEND else 0.0
        return self._pull(command, topic, queue_id, offset, count, tags, time.monotonic() + wait_s)

    def _pull(
        self,
        command: Command,
        topic: str,
        queue_id: int,
        offset: int,
        count: int,
        tags: frozenset[str] | None,
        deadline: float,
    ) -> Command:
        position, scanned = offset, 0
        while True:
            confirm = self.agent.view().confirm_offset
            minimum = self.store.queue_min_offset(topic, queue_id)
            maximum = self.store.readable_queue_max_offset(topic, queue_id, confirm)
            bounds = {"minOffset": minimum, "maxOffset": maximum, "suggestWhichBrokerId": 0}
            if position > maximum or (position < minimum and self.agent.tiered is None):
                moved = maximum if position > maximum else minimum
                return command.answer(
                    codec.PULL_OFFSET_MOVED,
                    f"offset {position} is outside {minimum}..{maximum}",
                    {**bounds, "nextBeginOffset": moved},
                )
            if position < maximum:
                records = self._read(topic, queue_id, position, count, confirm)
                if not records:
                    break
                found = [r for r in records if matches(tags, r.tags)]
                position = records[-1].queue_offset + 1
                scanned += len(records)
                if found:
                    body = b"".join(self._encoded(r) for r in found)
                    return command.answer(ext={**bounds, "nextBeginOffset": position}, body=body)
                if scanned >= PULL_SCAN_MAX:
                    return command.answer(
                        codec.PULL_RETRY_IMMEDIATELY, "", {**bounds, "nextBeginOffset": position}
                    )
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self.agent.lock:  # notified when the confirm offset moves
                self.agent.lock.wait(timeout=min(left, WAIT_SLICE_S))
        confirm = self.agent.view().confirm_offset
        return command.answer(
            codec.PULL_NOT_FOUND,
            "no new message",
            {
                "nextBeginOffset": position,
                "minOffset": self.store.queue_min_offset(topic, queue_id),
                "maxOffset": self.store.readable_queue_max_offset(topic, queue_id, confirm),
                "suggestWhichBrokerId": 0,
            },
        )

    def _read(self, topic: str, queue_id: int, offset: int, count: int, confirm: int) -> list[StoredRecord]:
        try:
            return self.store.get_messages(topic, queue_id, offset, count, confirm)
        except InvalidArgument as error:
            if error.code != "OFFSET_TOO_SMALL" or self.agent.tiered is None:
                raise
            return self.agent.tiered.read_queue(topic, queue_id, offset, count)


def _name(kind: str, value: str) -> str:
    try:
        return validate_name(kind, value)
    except MqmetaError as error:
        raise Refusal(codec.SYSTEM_ERROR, error.message) from None


def _number(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def _list(value: object) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def start_remoting(agent: BrokerAgent, rmq: RmqBroker, address: str) -> tuple[RemotingServer, ConsumerGroups]:
    """The broker's remoting listener on `address`, started, and its consumers (the
    admin calls list them as group members)."""
    broker = RemotingBroker(agent, rmq, address)
    server = broker.server()
    server.start()
    log.info("remoting listener on %s", address)
    return server, broker.groups
