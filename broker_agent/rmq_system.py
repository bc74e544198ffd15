"""Delay and transaction messages of the RocketMQ 5 service: they wait in system topics
until the master moves them to their topic.

- `%DELAY%` (queue 0) holds DELAY messages whose delivery time is ahead. The master's
  timer keeps the pending ones in memory (by delivery time) and, when one is due, writes
  it to its topic and marks it done.
- `%HALF%` (queue 0) holds transaction half messages. EndTransaction COMMIT writes the
  message to its topic, ROLLBACK drops it; both mark the half done. A half left open for
  TXN_CHECK_AFTER_MS is checked: the master pushes a RecoverOrphanedTransactionCommand
  down the Telemetry stream of a producer of the topic (the sender first), whose checker
  answers with EndTransaction; after TXN_CHECKS_MAX checks it is rolled back.

"Done" is a pop.QueueCursor of a system group over the system queue, written as its
%CONSUMER_OFFSET% record after each move, so it replicates: a new master loads the
cursor and reads what is not done from the system queue again. A failover between the
write to the topic and the record may write a message twice (at least once, never lost).
A transaction id is the half's queue offset and record id, so any master can resolve it.
"""

from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.pop import QueueCursor
from mqmeta.broker_agent.rmq_metadata import Members, Metadata

from mqmeta.clock import wall_ms
from mqmeta.codec.rocketmq5 import DELIVER_MS, MESSAGE_ID, REAL_TOPIC, to_message
from mqmeta.errors import MqmetaError, NotMaster
from mqmeta.formats.records import Message, StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import RmqError, TelemetryHub, status


class SystemHost(Protocol):
    """What the system queues use of the RocketMQ 5 service (rmq_broker.RmqBroker)."""

    agent: BrokerAgent
    store: Any
    metadata: Metadata
    members: Members
    hub: TelemetryHub
    round_robin: Any

    def master_epoch(self) -> int: ...


log = logging.getLogger(__name__)

DELAY_TOPIC = "%DELAY%"
HALF_TOPIC = "%HALF%"
TIMER_GROUP = "%TIMER%"
TXN_GROUP = "%TXN%"
TICK_S = 0.1
TXN_CHECK_AFTER_MS = 5000  # a half this old without EndTransaction is checked...
TXN_CHECK_INTERVAL_MS = 5000  # ...this often...
TXN_CHECKS_MAX = 15  # ...this many times (RocketMQ's transactionCheckMax), then rolled back
LOAD_BATCH = 256


@dataclass
class _System:
    """One system queue's cursor and pending records, for the master epoch it was loaded in."""

    epoch: int
    cursor: QueueCursor
    pending: dict[int, int] = field(default_factory=dict)  # queue offset -> due ms
    heap: list[tuple[int, int]] = field(default_factory=list)  # (due ms, queue offset)
    checks: dict[int, int] = field(default_factory=dict)  # transactions: checks pushed so far


class SystemQueues:
    def __init__(self, broker: SystemHost) -> None:
        self.broker = broker
        self.agent = broker.agent
        self.store = broker.store
        self._lock = threading.Lock()
        self._systems: dict[str, _System] = {}

    # Loading -----------------------------------------------------------------------------
    def _system(self, topic: str) -> _System:
        """The system queue's state for the current master epoch, loaded from its cursor."""
        epoch = self.broker.master_epoch()
        with self._lock:
            system = self._systems.get(topic)
            if system is not None and system.epoch == epoch:
                return system
            group = TIMER_GROUP if topic == DELAY_TOPIC else TXN_GROUP
            progress = self.store.consumer_progress(group, topic, 0)
            cursor = QueueCursor.from_progress(*progress) if progress else QueueCursor(consumed=0)
            cursor.skip_to(self.store.queue_min_offset(topic, 0))
            system = _System(epoch, cursor)
            confirm = self.agent.view().confirm_offset
            offset = cursor.consumed
            while True:
                records = self.store.get_messages(topic, 0, offset, LOAD_BATCH, confirm)
                for record in records:
                    if record.queue_offset not in cursor.done:
                        self._add(system, record.queue_offset, self._due(topic, record))
                if len(records) < LOAD_BATCH:
                    break
                offset = records[-1].queue_offset + 1
            self._systems[topic] = system
            return system

    @staticmethod
    def _due(topic: str, record: StoredRecord) -> int:
        if topic == DELAY_TOPIC:
            return int(record.properties.get(DELIVER_MS, "0"))
        return record.store_timestamp_ms + TXN_CHECK_AFTER_MS

    @staticmethod
    def _add(system: _System, offset: int, due_ms: int) -> None:
        system.pending[offset] = due_ms
        heapq.heappush(system.heap, (due_ms, offset))

    def _persist(self, topic: str, system: _System) -> None:
        group = TIMER_GROUP if topic == DELAY_TOPIC else TXN_GROUP
        with self._lock:
            offset, ranges = system.cursor.progress()
        self.agent.commit_consumer_progress([(group, topic, 0, offset, ranges)])

    # Writing -----------------------------------------------------------------------------
    def _park(self, topic: str, record: Message, due_ms: int) -> tuple[int, str]:
        props = dict(record.properties)
        props[REAL_TOPIC] = record.topic
        parked = Message(topic, 0, record.body, record.tags, record.keys, props, record.producer_id)
        try:
            (result,), _ = self.agent.send([parked])
        except NotMaster as error:
            raise RmqError(rdef.MASTER_PERSISTENCE_TIMEOUT, f"outcome unknown: {error.message}") from None
        try:
            system = self._system(topic)
            with self._lock:
                self._add(system, result.queue_offset, due_ms)
        except MqmetaError:
            pass  # deposed: the next master loads it from the system queue
        return result.queue_offset, result.msg_id

    def send_delayed(self, record: Message, deliver_ms: int) -> rsvc.SendResultEntry:
        offset, _ = self._park(DELAY_TOPIC, record, deliver_ms)
        return rsvc.SendResultEntry(status=status(), message_id=record.properties[MESSAGE_ID], offset=offset)

    def send_half(self, record: Message) -> rsvc.SendResultEntry:
        offset, record_id = self._park(HALF_TOPIC, record, wall_ms() + TXN_CHECK_AFTER_MS)
        return rsvc.SendResultEntry(
            status=status(),
            message_id=record.properties[MESSAGE_ID],
            transaction_id=self.transaction_id(offset, record_id),
            offset=offset,
        )

    def _release(self, topic: str, record: StoredRecord) -> None:
        """Writes a parked record to its own topic (a queue chosen round-robin)."""
        real = record.properties.get(REAL_TOPIC, "")
        local = self.broker.metadata.local(real, wall_ms())
        props = {k: v for k, v in record.properties.items() if k != REAL_TOPIC}
        queue_id = next(self.broker.round_robin) % max(1, local.write_queues)
        self.agent.send(
            [Message(real, queue_id, record.body, record.tags, record.keys, props, record.producer_id)]
        )

    def _done(self, topic: str, system: _System, offset: int) -> None:
        with self._lock:
            system.cursor.dead_lettered(offset)  # done without a delivery
            system.pending.pop(offset, None)
            system.checks.pop(offset, None)

    # Transactions ------------------------------------------------------------------------
    def transaction_id(self, offset: int, record_id: str) -> str:
        """ "SET/OFFSET.ID": the broker set's name first, so that a proxy knows where an
        EndTransaction goes (broker names have no "/")."""
        return f"{self.agent.broker_name}/{offset}.{record_id}"

    def end_transaction(self, topic: str, transaction_id: str, commit: bool) -> None:
        broker_name, slash, local_id = transaction_id.partition("/")
        if not slash:  # an id from before the set's name was in it
            broker_name, local_id = "", transaction_id
        offset_text, _, record_id = local_id.partition(".")
        if (slash and broker_name != self.agent.broker_name) or not offset_text.isdigit() or not record_id:
            raise RmqError(
                rdef.INVALID_TRANSACTION_ID, f"transaction id {transaction_id[:80]!r} is malformed"
            )
        offset = int(offset_text)
        system = self._system(HALF_TOPIC)
        confirm = self.agent.view().confirm_offset
        records = (
            self.store.get_messages(HALF_TOPIC, 0, offset, 1, confirm)
            if offset >= system.cursor.consumed
            else []
        )
        with self._lock:
            settled = offset < system.cursor.consumed or offset in system.cursor.done
        if settled:
            return  # already committed or rolled back (a retry, or a check answered twice)
        if not records or records[0].msg_id != record_id or records[0].properties.get(REAL_TOPIC) != topic:
            raise RmqError(
                rdef.INVALID_TRANSACTION_ID, f"transaction {transaction_id[:80]} is unknown for topic {topic}"
            )
        if commit:
            self._release(HALF_TOPIC, records[0])
        self._done(HALF_TOPIC, system, offset)
        self._persist(HALF_TOPIC, system)

    def _check(self, system: _System, record: StoredRecord, now_ms: int) -> None:
        offset = record.queue_offset
        checks = system.checks.get(offset, 0)
        if checks >= TXN_CHECKS_MAX:
            log.warning(
                "transaction %d.%s unresolved after %d checks: rolled back", offset, record.msg_id, checks
            )
            self._done(HALF_TOPIC, system, offset)
            self._persist(HALF_TOPIC, system)
            return
        topic = record.properties.get(REAL_TOPIC, "")
        producers = self.broker.members.producers(topic, now_ms)
        if record.producer_id in producers:
            producers.remove(record.producer_id)
            producers.insert(0, record.producer_id)
        command = rsvc.TelemetryCommand(
            recover_orphaned_transaction_command=rsvc.RecoverOrphanedTransactionCommand(
                message=to_message(record, topic, self.agent.config.listen),
                transaction_id=self.transaction_id(offset, record.msg_id),
            )
        )
        if any(self.broker.hub.push(client_id, command) for client_id in producers):
            with self._lock:
                system.checks[offset] = checks + 1
        with self._lock:
            self._add(system, offset, now_ms + TXN_CHECK_INTERVAL_MS)

    # The loop ------------------------------------------------------------------------------
    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(TICK_S):
            for topic in (DELAY_TOPIC, HALF_TOPIC):
                try:
                    if self.agent.writable():
                        self._tick(topic, wall_ms())
                except MqmetaError as exc:
                    log.debug("%s: %s", topic, exc)
                except Exception:  # a bug must not stop the timer for good
                    log.exception("%s tick failed", topic)

    def _tick(self, topic: str, now_ms: int) -> None:
        system = self._system(topic)
        due: list[int] = []
        with self._lock:
            while system.heap and system.heap[0][0] <= now_ms:
                due_ms, offset = heapq.heappop(system.heap)
                if system.pending.get(offset) == due_ms:
                    due.append(offset)
        if not due:
            return
        confirm = self.agent.view().confirm_offset
        moved = False
        for offset in due:
            (record,) = self.store.get_messages(topic, 0, offset, 1, confirm)
            if topic == HALF_TOPIC:
                self._check(system, record, now_ms)
                continue
            try:
                self._release(topic, record)
            except RmqError as error:  # the topic was deleted: nothing to deliver to
                log.warning("delayed message %s dropped: %s", record.msg_id, error.message)
            self._done(topic, system, offset)
            moved = True
        if moved:
            self._persist(topic, system)
