"""One replication task: a (rule, source broker set, queue) copied into one target queue.

Position: the target is the checkpoint. A task starts by asking every target broker set
of its target topic for the highest copy of its origin queue (QueryOrigin, answered only
once durable); it resumes right after it, into the queue that holds it. Only a task the
target knows nothing of starts where its rule says (earliest, latest, a time). So a
worker killed at any instant resumes exactly once, without a separate checkpoint.

Sending: copies carry their origin and the origin offset they follow (a chain the target
checks, see broker_agent.origins), so several batches can be in flight at once and the
target still stores them in order, once: a batch that overtook its predecessor is refused
(OUT_OF_ORDER), never stored out of order nor judged a duplicate. On any failure the task
waits for its in-flight sends, re-resolves both sides' masters, asks the target again and
goes on from what it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from mqmeta.replicator.site import Site

from mqmeta import backoff
from mqmeta.errors import InvalidArgument, MqmetaError, NotFound
from mqmeta.formats.origin import NO_PREVIOUS, STORE_MS, Origin, OriginKey, path_of, replicated_properties
from mqmeta.formats.replication_rules import Rule
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.rpc import from_rpc_error

if TYPE_CHECKING:
    from mqmeta.replicator.leases import TaskLease

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0  # a Pull or QueryOrigin, retried across master changes within it
SEND_TIMEOUT_S = 10.0  # one Send: the target waits for its SyncStateSet before answering
MISSING_PAUSE_S = 5.0  # at least, after NOT_FOUND (a target topic not created yet)
# A caught-up queue is pulled again after a pause that doubles while it stays quiet (the
# delay a new message may wait, against the load of polling every quiet queue).
IDLE_PAUSE_MIN_S = 0.02
IDLE_PAUSE_MAX_S = 0.32
END_OF_QUEUE = 2**62  # a Pull from here returns nothing but the queue's readable end
LEASE_WAIT_S = 0.05  # a task whose lease ran out checks again after this
NO_OFFSET = -1
FENCED_LEASE_EPOCH = "FENCED_LEASE_EPOCH"  # the controllers gave the task to another worker


@dataclass(frozen=True)
class TaskKey:
    rule: str
    topic: str  # the source topic
    broker_name: str  # the source broker set
    queue_id: int

    def label(self) -> str:
        return f"{self.rule}:{self.topic}/{self.broker_name}/{self.queue_id}"


@dataclass
class TaskStats:
    replicated: int = 0  # copies the target stored (duplicates not counted)
    replicated_bytes: int = 0  # their bodies
    skipped: int = 0  # messages the rule's tags or the loop rule left out
    errors: int = 0
    lag_messages: int = 0  # source readable end - next offset to read
    last_sync_ms: int = 0
    last_store_ms: int = 0  # the source store time of the last copy the target acknowledged
    caught_up: bool = False  # the last pull found nothing new and nothing is in flight
    last_error: str = ""


@dataclass
class _Position:
    origin: OriginKey
    target_topic: str
    target_broker: str
    target_queue: int
    target_cluster: str
    next_offset: int  # the next source queue offset to read
    previous: int  # the origin offset of the last copy sent (the chain), or NO_PREVIOUS
    since_ms: int  # only while nothing was sent: the rule's start time


@dataclass
class _InFlight:
    future: Any
    count: int
    body_bytes: int
    last_store_ms: int
    next_offset: int  # the source offset after this batch (and the messages skipped behind it)


@dataclass
class Task:
    key: TaskKey
    rule: Rule
    settings: dict[str, int]
    stop: threading.Event  # this task's own: set when the worker stops or the lease is lost
    source_index: int | None = 0  # this queue's place among the topic's source queues (None: look)
    lease: TaskLease | None = None  # with [replicator] controllers: the lease it runs under
    stats: TaskStats = field(default_factory=TaskStats)
    acked_offset: int = NO_OFFSET  # the target acknowledged every copy below this source offset
    _synced: dict[str, tuple[int, int]] = field(default_factory=dict)  # group -> (source, target) offsets

    @property
    def lease_id(self) -> tuple[TaskKey, int]:
        return (self.key, self.lease.epoch if self.lease else 0)

    def run(self) -> None:
        source, target = Site(self.rule.source_namesrv), Site(self.rule.target_namesrv)
        attempts = backoff.Attempts(backoff.REPLICATOR_TASK)  # after each failure: re-resolve, resume
        try:
            while not self.stop.is_set():
                try:
                    self._wait_for_lease()
                    position = self._position(source, target)
                    self._replicate(source, target, position)
                except MqmetaError as error:
                    if error.code == FENCED_LEASE_EPOCH:  # another worker holds the task now
                        log.warning("task %s: %s; stopping it", self.key.label(), error.message)
                        self.stop.set()
                        continue
                    # Anything else, a refusal too (NOT_MASTER from a master without a valid
                    # lease or handing off, a SyncStateSet too small), is a condition of the
                    # sites that passes: counted, one line, and the task goes on. A task
                    # thread that died on it was restarted with its counters at zero.
                    self.stats.errors += 1
                    self.stats.last_error = error.message
                    log.warning(
                        "task %s: %s; resuming from the target's head", self.key.label(), error.message
                    )
                    # A missing target topic waits for an operator, not for a failover.
                    pause_s = attempts.failed()
                    self.stop.wait(max(MISSING_PAUSE_S, pause_s) if isinstance(error, NotFound) else pause_s)
        finally:
            source.close()
            target.close()

    def _wait_for_lease(self) -> None:
        """Past the worker's lease nothing is sent: wait until it is renewed (or the task stops)."""
        while self.lease is not None and not self.lease.valid() and not self.stop.is_set():
            self.stop.wait(LEASE_WAIT_S)

    # Where to go on ---------------------------------------------------------------------
    def _position(self, source: Site, target: Site) -> _Position:
        key = self.key
        source.routes.route(key.topic, refresh=True)
        cluster = source.cluster_of(key.topic, key.broker_name)
        origin = OriginKey(cluster, key.broker_name, key.topic, key.queue_id)
        target_topic = self.rule.target_topic_of(key.topic, cluster)
        queues = target.write_queues(target_topic)
        if not queues:
            raise NotFound(f"target topic {target_topic} has no writable queue")
        found = self._find_head(target, target_topic, origin, sorted({b for b, _ in queues}))
        if found is not None:
            broker, reply = found
            start = _Position(
                origin, reply.topic, broker, reply.queue_id, "", reply.offset + 1, reply.offset, 0
            )
            log.info("task %s resumes after origin offset %d", key.label(), reply.offset)
        else:
            # Source queues go to distinct target queues while there are enough of them, so
            # that a translated consumer offset (mode full) covers one origin queue only.
            broker, queue_id = queues[self._source_index(source) % len(queues)]
            first = self._start_offset(source)
            start = _Position(
                origin, target_topic, broker, queue_id, "", first, NO_PREVIOUS, self.rule.start_ms
            )
            log.info("task %s starts at source offset %d (%s)", key.label(), first, self.rule.start)
        start.target_cluster = target.cluster_of(start.target_topic, start.target_broker)
        if start.target_cluster == cluster:
            raise InvalidArgument(f"rule {self.rule.name}: its target is its source cluster {cluster}")
        self.acked_offset = start.next_offset  # nothing before it is left to copy
        return start

    def _source_index(self, source: Site) -> int:
        if self.source_index is None:
            queues = source.read_queues(self.key.topic)
            place = (self.key.broker_name, self.key.queue_id)
            self.source_index = queues.index(place) if place in queues else 0
        return self.source_index

    def _find_head(
        self, target: Site, target_topic: str, origin: OriginKey, brokers: list[str]
    ) -> tuple[str, Any] | None:
        request = bpb.QueryOriginRequest(
            cluster=origin.cluster,
            broker_name=origin.broker_name,
            topic=origin.topic,
            queue_id=origin.queue_id,
        )
        for broker in brokers:
            reply = target.call(target_topic, broker, "QueryOrigin", request, CALL_TIMEOUT_S)
            if reply.offset >= 0:
                return broker, reply
        return None

    def _start_offset(self, source: Site) -> int:
        """Where a task the target holds no copy of starts. Under a lease the controllers'
        checkpoint decides: the offset acknowledged last (every copy before it stored or
        skipped), else the start the first lessee recorded, so that `latest` means the
        end of the queue when the task first ran, not when it last restarted."""
        lease = self.lease
        if lease is not None and lease.checkpoint_applies(self.rule.digest):
            if max(lease.acked_offset, self.acked_offset) != NO_OFFSET:
                return max(lease.acked_offset, self.acked_offset)
            if lease.start_offset != NO_OFFSET:
                return lease.start_offset
        if self.rule.start != "latest":
            first = 0  # earliest, or a time: read from the start and skip what is older
        else:
            request = bpb.PullRequest(
                topic=self.key.topic, queue_id=self.key.queue_id, queue_offset=END_OF_QUEUE, max_count=1
            )
            reply = source.call(self.key.topic, self.key.broker_name, "Pull", request, CALL_TIMEOUT_S)
            first = int(reply.max_queue_offset)
        if lease is not None:
            first = lease.record_start(self, first, self.rule.digest)
            lease.start_offset = first
        return first

    # Copying ------------------------------------------------------------------------------------
    def _replicate(self, source: Site, target: Site, at: _Position) -> None:
        stub = target.master_stub(at.target_topic, at.target_broker, refresh=True)
        window: deque[_InFlight] = deque()
        offsets_due = time.monotonic()
        idle_s = IDLE_PAUSE_MIN_S
        try:
            while not self.stop.is_set():
                if self.lease is not None and not self.lease.valid():
                    if window:
                        self._settle(window.popleft())  # what is in flight lands; nothing new goes
                    else:
                        self.stop.wait(LEASE_WAIT_S)
                    continue
                if self.rule.mode == "full" and time.monotonic() >= offsets_due:
                    self._sync_offsets(source, target, at)
                    offsets_due = time.monotonic() + self.settings["offsets_interval_ms"] / 1000
                pulled = False
                if len(window) < self.settings["inflight_batches_max"]:
                    pulled = self._pull_and_send(source, stub, at, window)
                    idle_s = IDLE_PAUSE_MIN_S if pulled else idle_s
                if window and (not pulled or len(window) >= self.settings["inflight_batches_max"]):
                    self._settle(window.popleft())
                elif not pulled:
                    self.stats.last_sync_ms = int(time.time() * 1000)  # caught up: a quiet queue has no lag
                    self.stats.caught_up = True
                    self.stop.wait(idle_s)
                    idle_s = min(IDLE_PAUSE_MAX_S, idle_s * 2)
        finally:
            for sent in window:  # let them land before the head is asked again
                try:
                    sent.future.result()
                except grpc.RpcError:
                    pass

    def _pull_and_send(self, source: Site, stub: Any, at: _Position, window: deque[_InFlight]) -> bool:
        """Pulls one batch from the source and sends what the rule keeps; whether it pulled any."""
        request = bpb.PullRequest(
            topic=self.key.topic,
            queue_id=self.key.queue_id,
            queue_offset=at.next_offset,
            max_count=self.settings["batch_count_max"],
        )
        reply = source.call(self.key.topic, self.key.broker_name, "Pull", request, CALL_TIMEOUT_S)
        self.stats.lag_messages = max(0, reply.max_queue_offset - reply.next_queue_offset)
        if not reply.messages:
            return False
        self.stats.caught_up = False
        copies: list[bpb.Message] = []
        ends: list[int] = []  # the source offset after each copy
        for message in reply.messages:
            if self._keeps(message, at):
                copies.append(self._copy(message, at))
                ends.append(message.queue_offset + 1)
                at.previous = message.queue_offset
                at.since_ms = 0
            else:
                self.stats.skipped += 1
        at.next_offset = reply.next_queue_offset
        chunks = _chunks(copies, self.settings["batch_bytes_max"])
        sent = 0
        for number, chunk in enumerate(chunks):
            future = stub.Send.future(bpb.SendRequest(messages=chunk), timeout=SEND_TIMEOUT_S)
            body_bytes = sum(len(c.body) for c in chunk)
            last_store_ms = int(chunk[-1].properties[STORE_MS])
            sent += len(chunk)
            # the last chunk also covers the messages the rule skipped after it
            next_offset = at.next_offset if number == len(chunks) - 1 else ends[sent - 1]
            window.append(_InFlight(future, len(chunk), body_bytes, last_store_ms, next_offset))
        if not chunks:  # every message skipped: done once what is in flight is
            if window:
                window[-1].next_offset = at.next_offset
            else:
                self.acked_offset = at.next_offset
        return True

    def _keeps(self, message: bpb.StoredMessage, at: _Position) -> bool:
        if not self.rule.tags.matches(message.tags):
            return False
        if at.target_cluster in path_of(message.properties):
            return False  # it has been in the target cluster already: no loops
        return message.store_timestamp_ms >= at.since_ms

    def _copy(self, message: bpb.StoredMessage, at: _Position) -> bpb.Message:
        origin = Origin(at.origin, message.queue_offset, at.previous, message.store_timestamp_ms)
        properties = replicated_properties(
            message.properties, origin, message.store_timestamp_ms, message.msg_id
        )
        return bpb.Message(
            topic=at.target_topic,
            queue_id=at.target_queue,
            body=message.body,
            tags=message.tags,
            keys=message.keys,
            properties=properties,
            producer_id=message.producer_id,
            producer_seq=message.producer_seq,
        )

    def _sync_offsets(self, source: Site, target: Site, at: _Position) -> None:
        """Mode full: each source group's committed offset in this queue, translated by the
        target's origin table into the target queue, committed there when it moved."""
        key = self.key
        request = bpb.ListConsumerOffsetsRequest(topic=key.topic, queue_id=key.queue_id)
        reply = source.call(key.topic, key.broker_name, "ListConsumerOffsets", request, CALL_TIMEOUT_S)
        origin = at.origin
        for entry in reply.offsets:
            if not self.rule.groups.matches(entry.group):
                continue
            query = bpb.QueryOriginRequest(
                cluster=origin.cluster,
                broker_name=origin.broker_name,
                topic=origin.topic,
                queue_id=origin.queue_id,
                translate=entry.offset,
            )
            found = target.call(at.target_topic, at.target_broker, "QueryOrigin", query, CALL_TIMEOUT_S)
            if found.translated < 0 or self._synced.get(entry.group) == (entry.offset, found.translated):
                continue
            commit = bpb.CommitOffsetRequest(
                group=entry.group, topic=at.target_topic, queue_id=at.target_queue, offset=found.translated
            )
            target.call(at.target_topic, at.target_broker, "CommitOffset", commit, CALL_TIMEOUT_S)
            self._synced[entry.group] = (entry.offset, found.translated)

    def _settle(self, sent: _InFlight) -> None:
        try:
            reply = sent.future.result()
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from None
        if len(reply.results) != sent.count:
            raise InvalidArgument(f"the target answered {len(reply.results)} results for {sent.count} copies")
        stored = sum(1 for r in reply.results if not r.duplicate)
        self.stats.replicated += stored
        self.stats.replicated_bytes += sent.body_bytes if stored == sent.count else 0
        self.stats.last_store_ms = sent.last_store_ms
        self.stats.last_sync_ms = int(time.time() * 1000)
        self.acked_offset = sent.next_offset


def _chunks(copies: list[bpb.Message], bytes_max: int) -> list[list[bpb.Message]]:
    chunks: list[list[bpb.Message]] = []
    size = 0
    for copy in copies:
        length = copy.ByteSize()
        if not chunks or size + length > bytes_max:
            chunks.append([])
            size = 0
        chunks[-1].append(copy)
        size += length
    return chunks
