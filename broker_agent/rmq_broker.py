"""The state behind the broker's RocketMQ 5 service (rmq_service.py): the role it serves
in, the clients and their Telemetry streams, sending, the dead-letter queues, and the
hosts of the pop shell (rmq_pop.py) and the system queues (rmq_system.py).

Sends become records of our commit log like any other: the codec (mqmeta.codec.rocketmq5)
checks and converts each message; this module picks its queue (FIFO: by message group,
otherwise round-robin over the topic's write queues on this broker) and writes it to its
topic, or to the delay or half queue. Plain messages of concurrent sends are written
together (rmq_writes.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections.abc import Callable

from mqmeta.broker_agent.agent import BrokerAgent
from mqmeta.broker_agent.ha import Role
from mqmeta.broker_agent.rmq_metadata import Members, Metadata, fifo_queue
from mqmeta.broker_agent.rmq_pop import PopShell
from mqmeta.broker_agent.rmq_system import SystemQueues
from mqmeta.broker_agent.rmq_writes import PlainWrites

from mqmeta.clock import now_ms, wall_ms
from mqmeta.codec import rocketmq5
from mqmeta.codec.rocketmq5 import DLQ_ORIGIN, MESSAGE_ID
from mqmeta.errors import FailedPrecondition, MqmetaError, NotMaster
from mqmeta.formats.properties import DEAD_LETTER_PREFIX
from mqmeta.formats.records import Message, StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import ReceiptHandle, RmqError, TelemetryHub, answer_settings, code_of_error, status

log = logging.getLogger(__name__)

LONG_POLLS_MAX = 128
TELEMETRY_STREAMS_MAX = 128
# Plain sends of concurrent SendMessage calls written together (rmq_writes.py): one write
# in flight, as the proxy's merged sends of one client (measured: docs/benchmarks.md).
PLAIN_WRITES_IN_FLIGHT_MAX = 1
PLAIN_WRITE_RECORDS_MAX = 256
PLAIN_WRITE_BODY_BYTES_MAX = 8 << 20  # a single larger send goes alone


class RmqBroker:
    """The state behind the service: role, clients, Telemetry streams, cursors (the pop
    shell), system queues."""

    def __init__(self, agent: BrokerAgent, on_write: Callable[[], object] = lambda: None) -> None:
        self.agent = agent
        self.store = agent.store
        self.boot_id = uuid.uuid4().hex[:8]  # a handle from another process is stale
        self.metadata = Metadata(agent.call_controller, agent.broker_name)
        self.members = Members()
        self.hub = TelemetryHub(TELEMETRY_STREAMS_MAX, self._on_settings)
        self.polls = threading.BoundedSemaphore(LONG_POLLS_MAX)
        self.round_robin = itertools.count()
        self.pop = PopShell(self)
        self.system = SystemQueues(self)
        self.plain = PlainWrites(
            lambda records: agent.send(records)[0],
            PLAIN_WRITES_IN_FLIGHT_MAX,
            PLAIN_WRITE_RECORDS_MAX,
            PLAIN_WRITE_BODY_BYTES_MAX,
            agent.config.send_timeout_ms / 1000,
            on_write,
        )
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target, name in ((self.pop.flush_loop, "rmq-flush"), (self.system.run, "rmq-system")):
            thread = threading.Thread(target=target, args=(self._stopping,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=3)

    # Role ------------------------------------------------------------------------------------
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
    def to_record(self, message: rdef.Message, client_id: str, now_ms: int) -> rocketmq5.Send:
        """Checks one message of a SendMessage against its topic here and converts it into
        a record of the topic's queue it goes to."""
        topic = rocketmq5.send_topic(message)
        local = self.metadata.local(topic, now_ms)
        if "W" not in local.perm or not local.write_queues:
            raise RmqError(
                rdef.FORBIDDEN, f"topic {topic} is not writable on broker set {self.agent.broker_name}"
            )

        def queue_of(message_group: str) -> int:
            if message_group:
                return fifo_queue(message_group, local.write_queues)
            return next(self.round_robin) % local.write_queues

        return rocketmq5.to_record(message, local.message_type, client_id, now_ms, queue_of)

    def send(self, send: rocketmq5.Send) -> rsvc.SendResultEntry:
        """Writes one message (to its topic, or to the delay or half queue) and waits for the
        ack policy. Refused before writing -> HA_NOT_AVAILABLE; unknown outcome ->
        a persistence timeout, which the client retries with the same message id."""
        self._check_writable()
        record = send.record
        if send.message_type == rdef.TRANSACTION:
            return self.system.send_half(record)
        if send.deliver_at_ms:
            return self.system.send_delayed(record, send.deliver_at_ms)
        try:
            (result,) = self.plain.write([record])
        except NotMaster as error:
            raise RmqError(rdef.MASTER_PERSISTENCE_TIMEOUT, f"outcome unknown: {error.message}") from None
        return rsvc.SendResultEntry(
            status=status(), message_id=record.properties[MESSAGE_ID], offset=result.queue_offset
        )

    def send_plain(self, sends: list[rocketmq5.Send]) -> list[rsvc.SendResultEntry]:
        """Writes plain messages (no delay, no transaction) of one SendMessage together: one
        append, one wait for the ack policy. Refusals and an unknown outcome as send's, for
        all of them."""
        self._check_writable()
        records = [send.record for send in sends]
        try:
            results = self.plain.write(records)
        except NotMaster as error:
            raise RmqError(rdef.MASTER_PERSISTENCE_TIMEOUT, f"outcome unknown: {error.message}") from None
        return [
            rsvc.SendResultEntry(
                status=status(), message_id=record.properties[MESSAGE_ID], offset=result.queue_offset
            )
            for record, result in zip(records, results, strict=True)
        ]

    def send_many(self, records: list[Message]) -> list[int]:
        """Writes plain messages of one queue together (a remoting batch send); their queue
        offsets. Refusals and an unknown outcome as send's."""
        self._check_writable()
        try:
            results, _ = self.agent.send(records)
        except NotMaster as error:
            raise RmqError(rdef.MASTER_PERSISTENCE_TIMEOUT, f"outcome unknown: {error.message}") from None
        return [result.queue_offset for result in results]

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
