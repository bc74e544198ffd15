"""The broker-side shell of RocketMQ 5's "pop" consumption: pop.QueueCursor (pure) holds
a consumer group's progress in one queue and the leases of what it holds in flight; this
module carries out its effects. It loads a cursor from the group's %CONSUMER_OFFSET%
record when this broker is master of an epoch (a cursor of an older epoch is dropped),
reads the records a receive may deliver, writes the progress (group commit) and waits
for the SyncStateSet before an acknowledgement is answered, and hands messages past
their attempts to the host's dead-letter queue.

The gRPC servicer (rmq_service.py) checks requests and turns outcomes into statuses;
RmqBroker (rmq_broker.py) is the host: role, metadata, members, dead-letter writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.pop import AckResult, Candidate, Delivery, LeaseGrant, QueueCursor, Verdict
from mqmeta.broker_agent.rmq_metadata import Members, Metadata
from mqmeta.broker_agent.store import MessageStore

from mqmeta.clock import wall_ms
from mqmeta.codec.rocketmq5 import MESSAGE_GROUP
from mqmeta.errors import MqmetaError
from mqmeta.formats.records import StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.rocketmq import RmqError

log = logging.getLogger(__name__)

RECEIVE_BATCH_MAX = 1024
AUTO_RENEW_MS = 30_000  # a PushConsumer's lease, renewed while the client is alive...
AUTO_RENEW_MAX_MS = 3 * 3600 * 1000  # ...up to this long
WAIT_SLICE_S = 0.5
READ_CHUNK_MIN = 32  # records a receive reads at a time (more when its batch is larger)
FLUSH_INTERVAL_S = 1.0  # progress changed without an ack (filtered, dead-lettered) is written this often

CursorKey = tuple[str, str, int]  # group, topic, queue id


class PopHost(Protocol):
    """What the pop shell uses of the RocketMQ 5 broker (rmq_broker.RmqBroker)."""

    agent: BrokerAgent
    store: MessageStore
    metadata: Metadata
    members: Members

    def master_epoch(self) -> int: ...

    def dead_letter(self, group: str, record: StoredRecord) -> None: ...


@dataclass
class _Slot:
    """One cursor, for the master epoch it was loaded in."""

    epoch: int
    cursor: QueueCursor
    lock: threading.Lock
    # Group commit of the cursor's progress (see PopShell.persist): changes asked to be
    # written are counted under `lock`; one append at a time, under `writer`, covers every
    # change counted before its snapshot.
    writer: threading.Lock = field(default_factory=threading.Lock)
    asked: int = 0
    written: int = 0  # the count the last appended snapshot covered
    written_at: tuple[int, int] = (0, 0)  # that append's (end offset, epoch)


class PopShell:
    """The cursors of every (group, topic, queue) this master serves, and their effects."""

    def __init__(self, host: PopHost) -> None:
        self.host = host
        self.agent = host.agent
        self.store = host.store
        self._cursors: dict[CursorKey, _Slot] = {}
        self._cursors_lock = threading.Lock()

    # Cursors ---------------------------------------------------------------------------------
    def slot(self, key: CursorKey, now_ms: int) -> _Slot:
        epoch = self.host.master_epoch()
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

    def forget(self, keys: list[CursorKey]) -> None:
        """Drops these cursors: the next receive loads them from the store's progress
        (an admin's offset reset wrote it)."""
        with self._cursors_lock:
            for key in keys:
                self._cursors.pop(key, None)

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
        config = self.host.metadata.group(group, now_ms)
        if config is None or config.consume_from == "FIRST_OFFSET":
            return self.store.queue_min_offset(topic, queue_id)
        confirm = self.agent.view().confirm_offset
        if config.consume_from == "TIMESTAMP":
            return self.store.queue_offset_at_time(topic, queue_id, config.consume_timestamp_ms, confirm)
        return self.store.readable_queue_max_offset(topic, queue_id, confirm)

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
        end, epoch = self._append_progress(key, slot)
        self.agent.wait_acknowledged(end, epoch)

    def _append_progress(self, key: CursorKey, slot: _Slot) -> tuple[int, int]:
        """The first half of persist: appends the cursor's progress unless a record
        appended since the change covers it; returns (end offset, epoch) of that record
        for wait_acknowledged."""
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
            return slot.written_at

    def flush_loop(self, stopping: threading.Event) -> None:
        """Writes progress that changed without an ack (filtered, dead-lettered)."""
        while not stopping.wait(FLUSH_INTERVAL_S):
            with self._cursors_lock:
                dirty = [(k, s) for k, s in self._cursors.items() if s.cursor.dirty]
            for key, slot in dirty:
                try:
                    if slot.epoch == self.host.master_epoch():
                        self.persist(key, slot)
                except MqmetaError as exc:
                    log.debug("progress of %s not written: %s", key, exc)

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
        """Up to `batch` deliveries of the queue, each with a lease; what the filter skips
        is done, what is past its attempts goes to the dead-letter queue."""
        group, topic, queue_id = key
        slot = self.slot(key, grant.now_ms)
        confirm = self.agent.view().confirm_offset
        readable_end = self.store.readable_queue_max_offset(topic, queue_id, confirm)
        out: list[tuple[StoredRecord, Delivery]] = []
        dead: list[StoredRecord] = []
        with slot.lock:
            cursor = slot.cursor
            cursor.skip_to(self.store.queue_min_offset(topic, queue_id))
            cursor.expire(grant.now_ms, self.host.members.alive(grant.now_ms), AUTO_RENEW_MS)
            if not cursor.has_work(readable_end):
                return []
            chunk = max(batch, READ_CHUNK_MIN)
            for record in self._read(topic, queue_id, cursor.candidates(readable_end), confirm, chunk):
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
            self.host.dead_letter(group, record)
            with slot.lock:
                slot.cursor.dead_lettered(record.queue_offset)
        return out

    def _read(
        self, topic: str, queue_id: int, offsets: list[int], confirm: int, chunk: int
    ) -> Iterator[StoredRecord]:
        """The records at `offsets` (sorted), each contiguous run read `chunk` records at a
        time as the caller asks for more: a receive of 32 decodes about 32 records, not the
        whole scan window (up to SCAN_MAX) that its candidates span."""
        i = 0
        while i < len(offsets):
            j = i
            while j + 1 < len(offsets) and offsets[j + 1] == offsets[j] + 1:
                j += 1
            position, end = offsets[i], offsets[j] + 1
            while position < end:
                count = min(chunk, end - position)
                records = self.store.get_messages(topic, queue_id, position, count, confirm)
                if not records or records[-1].queue_offset < position:
                    break
                yield from records
                position = records[-1].queue_offset + 1
            i = j + 1

    def wait_for_work(self, key: CursorKey, timeout_s: float) -> None:
        """Sleeps until the confirm offset moves (the agent wakes its waiters) or a slice passes."""
        with self.agent.lock:
            self.agent.lock.wait(timeout=min(timeout_s, WAIT_SLICE_S))

    # Acknowledging ---------------------------------------------------------------------------
    def ack(self, key: CursorKey, offset: int, lease: int) -> bool:
        """Marks the delivery done and writes the progress (acknowledged by the SyncStateSet
        on return); False when the lease is not the offset's last (it expired and the
        message was delivered again, or this master never delivered it)."""
        return self.ack_many([(key, offset, lease)])[0]

    def ack_many(self, acks: list[tuple[CursorKey, int, int]]) -> list[bool]:
        """ack for each (queue, offset, lease) of one AckMessage: every delivery is marked
        done first, then each queue's progress is appended once and the last append is
        awaited once — a batch costs one wait for the SyncStateSet, not one per entry.
        A failed write (MqmetaError) fails the whole batch."""
        now = wall_ms()
        outcomes: list[bool] = []
        touched: dict[CursorKey, _Slot] = {}
        for key, offset, lease in acks:
            slot = self.slot(key, now)
            with slot.lock:
                outcome = slot.cursor.ack(offset, lease)
            done = outcome not in (AckResult.STALE, AckResult.UNKNOWN)
            outcomes.append(done)
            if done:
                touched[key] = slot
        written = {self._append_progress(key, slot) for key, slot in touched.items()}
        for end, epoch in sorted(written, reverse=True):  # the latest first: the rest are covered
            self.agent.wait_acknowledged(end, epoch)
        return outcomes

    def change_invisible(self, key: CursorKey, offset: int, lease: int, invisible_ms: int) -> int:
        """The new lease of a delivery made invisible for `invisible_ms` from now."""
        now = wall_ms()
        slot = self.slot(key, now)
        with slot.lock:
            outcome = slot.cursor.change_invisible(offset, lease, now, invisible_ms)
        if not isinstance(outcome, int):
            raise RmqError(
                rdef.INVALID_RECEIPT_HANDLE,
                f"the message cannot be leased again ({outcome.value}): "
                "it was acknowledged or delivered again",
            )
        return outcome

    def forward_to_dead_letter(self, key: CursorKey, offset: int, lease: int) -> None:
        """Moves a delivery still under `lease` to the group's dead-letter queue, marks it
        done and writes the progress."""
        group, topic, queue_id = key
        slot = self.slot(key, wall_ms())
        confirm = self.agent.view().confirm_offset
        records = self.store.get_messages(topic, queue_id, offset, 1, confirm)
        if not records:
            raise RmqError(rdef.INVALID_RECEIPT_HANDLE, "the receipt handle names no stored message")
        with slot.lock:
            if slot.cursor.last_lease.get(offset) != lease:
                raise RmqError(rdef.INVALID_RECEIPT_HANDLE, "the message was acknowledged or delivered again")
        self.host.dead_letter(group, records[0])
        with slot.lock:
            slot.cursor.dead_lettered(offset)
        self.persist(key, slot)
