"""The RocketMQ 5 client protocol (apache.rocketmq.v2) on the server side: what the
nameserver and the broker both need.

Every MessagingService answer carries an apache.rocketmq.v2.Status inside a gRPC OK: the
official clients read that status, not the gRPC one (code 0 is "illegal" to them). So
the methods are wrapped by `rmq_call`, which turns our typed errors (mqmeta.errors) and
protocol refusals (`RmqError`) into one Status each, as mqmeta.rpc does for gRPC
statuses. Also here: routes as MessageQueues, the settings answered over Telemetry (and
the Telemetry streams themselves), tag filters, delivery times and receipt handles; the
record <-> Message conversion is the codec's (mqmeta.codec.rocketmq5). Only servers
import this module: the official client package registers the same proto symbols in the
default descriptor pool, so a process holds either it or these stubs, never both.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from mqmeta.errors import (
    ROCKETMQ5_CODE_OF_DOMAIN,
    WIRE_CODES,
    MqmetaError,
    listed_class,
)
from mqmeta.formats.records import RECORD_BODY_MAX, TAGS_BYTES_MAX
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rpc import internal_error
from mqmeta.validate import NAME_PATTERN

log = logging.getLogger(__name__)

MESSAGING_SERVICE = rsvc.DESCRIPTOR.services_by_name["MessagingService"].full_name
CLIENT_ID_KEY = "x-mq-client-id"

BODY_BYTES_MAX = RECORD_BODY_MAX
# Timestamp.seconds above this cannot be seconds (year 5138): the 5.1.2 Python client
# writes Message.delivery_timestamp, documented in milliseconds, into Timestamp.seconds.
SECONDS_MAX_PLAUSIBLE = 10**11
DELIVERY_MS_MIN = 946_684_800_000  # 2000-01-01: earlier is a relative delay by mistake
DELAY_MS_MAX = 3 * 24 * 3600 * 1000  # RocketMQ's default timer range (3 days)
TELEMETRY_OUTBOUND_MAX = 256
TELEMETRY_POLL_S = 1.0

TYPE_OF_TOPIC = {
    "NORMAL": rdef.NORMAL,
    "FIFO": rdef.FIFO,
    "DELAY": rdef.DELAY,
    "TRANSACTION": rdef.TRANSACTION,
}


class RmqError(Exception):
    """A refusal with an apache.rocketmq.v2.Code and a sentence for the client."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: int = rdef.OK, message: str = "OK") -> rdef.Status:
    return rdef.Status(code=code, message=message)  # type: ignore[arg-type]


# The RocketMQ 5 column of the one error map (mqmeta.errors), resolved at import: a name
# that is not an apache.rocketmq.v2.Code fails here.
_CODE_OF_CLASS: dict[type[MqmetaError], int] = {
    cls: rdef.Code.Value(codes.rocketmq5) for cls, codes in WIRE_CODES.items()
}
_CODE_OF_DOMAIN: dict[str, int] = {
    domain: rdef.Code.Value(name) for domain, name in ROCKETMQ5_CODE_OF_DOMAIN.items()
}


def code_of_error(error: MqmetaError) -> int:
    """The apache.rocketmq.v2 Code for one of our errors: its domain code's, else its class's."""
    code = _CODE_OF_DOMAIN.get(error.code)
    return code if code is not None else _CODE_OF_CLASS[listed_class(error)]


def entries_status(entries: Any) -> rdef.Status:
    """A response's status from its entries' (AckMessage, SendMessage): OK when all are, the failure
    when all failed, MULTIPLE_RESULTS otherwise (as RocketMQ's proxy answers)."""
    failed = [e.status for e in entries if e.status.code != rdef.OK]
    if not failed:
        return status()
    return failed[0] if len(failed) == len(entries) else status(rdef.MULTIPLE_RESULTS, "")


def status_of_error(error: MqmetaError) -> rdef.Status:
    return status(code_of_error(error), f"{error.code}: {error.message}")


def rmq_call(response_type: Any) -> Callable:
    """Wraps a unary MessagingService method: a refusal or a domain error becomes the
    response's Status (gRPC OK); a bug becomes INTERNAL_SERVER_ERROR naming the method."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return method(self, request, context)
            except RmqError as error:
                return response_type(status=status(error.code, error.message))
            except MqmetaError as error:
                return response_type(status=status_of_error(error))
            except Exception:  # a bug: logged under an id; the client is told the id, not its text
                return response_type(
                    status=status(rdef.INTERNAL_SERVER_ERROR, internal_error(method.__name__))
                )

        return wrapper

    return decorate


def client_id_of(context: grpc.ServicerContext) -> str:
    """The x-mq-client-id every official client sends; CLIENT_ID_REQUIRED without it."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_KEY and value:
            return str(value)[:256]
    raise RmqError(rdef.CLIENT_ID_REQUIRED, f"the request carries no {CLIENT_ID_KEY} metadata")


def check_name(kind: str, resource: rdef.Resource, code: int) -> str:
    if resource.resource_namespace:
        raise RmqError(code, f"{kind} {resource.name!r}: namespaces are not supported; leave it empty")
    if not NAME_PATTERN.fullmatch(resource.name):
        raise RmqError(code, f"{kind} {resource.name!r} is malformed: use 1-127 of A-Z a-z 0-9 _ - % |")
    return resource.name


# Routes --------------------------------------------------------------------------------------
def endpoints(address: str) -> rdef.Endpoints:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = rdef.IPv4 if ipaddress.ip_address(host).version == 4 else rdef.IPv6
    except ValueError:
        scheme = rdef.DOMAIN_NAME
    return rdef.Endpoints(scheme=scheme, addresses=[rdef.Address(host=host, port=int(port))])  # type: ignore[arg-type]


def endpoints_of(addresses: list[str]) -> rdef.Endpoints:
    """One Endpoints naming several servers (the proxies): the official clients dial them
    as one gRPC channel. Its scheme is the first address's (the clients allow a single
    address only with DOMAIN_NAME)."""
    found = [endpoints(a) for a in addresses]
    merged = rdef.Endpoints(scheme=found[0].scheme)
    for one in found:
        merged.addresses.extend(one.addresses)
    return merged


def address_of(value: rdef.Endpoints) -> str:
    if not value.addresses:
        return ""
    first = value.addresses[0]
    host = f"[{first.host}]" if value.scheme == rdef.IPv6 else first.host
    return f"{host}:{first.port}"


def accepted_types(topic_type: str) -> list[int]:
    """A topic accepts the messages of its type only, as RocketMQ 5's typed topics do."""
    return [TYPE_OF_TOPIC.get(topic_type or "NORMAL", rdef.NORMAL)]


def message_queues(route: cpb.TopicRoute) -> list[rdef.MessageQueue]:
    """The route's queues on broker sets that have a master, each naming the master
    (broker id 0, which is all the official clients keep) and its address."""
    masters = {b.broker_name: b.master_address for b in route.brokers if b.master_broker_id}
    types = accepted_types(route.message_type)
    found: list[rdef.MessageQueue] = []
    for q in sorted(route.queues, key=lambda q: q.broker_name):
        address = masters.get(q.broker_name)
        if not address:
            continue
        for queue_id in range(max(q.read_queue_count, q.write_queue_count)):
            readable = queue_id < q.read_queue_count and "R" in q.perm
            writable = queue_id < q.write_queue_count and "W" in q.perm
            permission = {
                (True, True): rdef.READ_WRITE,
                (True, False): rdef.READ,
                (False, True): rdef.WRITE,
            }.get((readable, writable), rdef.NONE)
            found.append(
                rdef.MessageQueue(
                    topic=rdef.Resource(name=route.topic),
                    id=queue_id,
                    permission=permission,  # type: ignore[arg-type]
                    broker=rdef.Broker(name=q.broker_name, id=0, endpoints=endpoints(address)),
                    accept_message_types=types,  # type: ignore[arg-type]
                )
            )
    return found


# Filters, delivery times, receipt handles ----------------------------------------------------
def tag_filter(expression: rdef.FilterExpression) -> frozenset[str] | None:
    """The tags a TAG expression ("*", "A", "A || B") selects; None selects every message."""
    if expression.type == rdef.SQL:
        raise RmqError(rdef.UNSUPPORTED, "SQL92 filter expressions are not supported; use a TAG expression")
    text = expression.expression.strip()
    if text in ("", "*"):
        return None
    if len(text.encode()) > TAGS_BYTES_MAX:
        raise RmqError(
            rdef.ILLEGAL_FILTER_EXPRESSION, f"the filter expression is over {TAGS_BYTES_MAX} bytes"
        )
    tags = [t.strip() for t in text.split("||")]
    if any(not t or "|" in t or t == "*" for t in tags):
        raise RmqError(
            rdef.ILLEGAL_FILTER_EXPRESSION,
            f"filter expression {text!r} is malformed: use '*' or 'TagA || TagB'",
        )
    return frozenset(tags)


def delivery_ms(timestamp: Timestamp, now_ms: int) -> int:
    """The delivery time a send asks for, in epoch milliseconds.

    Timestamp.seconds above SECONDS_MAX_PLAUSIBLE is taken as milliseconds: the 5.1.2
    Python client copies Message.delivery_timestamp (documented in ms) into it. A time
    before 2000 is refused (a relative delay sent as a timestamp), as is one more than
    DELAY_MS_MAX ahead; a past time delivers at once."""
    if timestamp.seconds > SECONDS_MAX_PLAUSIBLE:
        value = timestamp.seconds
    else:
        value = timestamp.seconds * 1000 + timestamp.nanos // 1_000_000
    if value < DELIVERY_MS_MIN:
        raise RmqError(
            rdef.ILLEGAL_DELIVERY_TIME,
            f"delivery time {timestamp.seconds}s is before 2000: give an absolute time, not a delay",
        )
    if value > now_ms + DELAY_MS_MAX:
        raise RmqError(
            rdef.ILLEGAL_DELIVERY_TIME, f"delivery time is more than {DELAY_MS_MAX // 3_600_000} h ahead"
        )
    return value


@dataclass(frozen=True)
class ReceiptHandle:
    """Names one delivery: the broker set, the master's epoch and process (a handle from
    another role or incarnation is stale), the queue, the offset and the lease."""

    broker_name: str
    epoch: int
    boot_id: str
    topic: str
    queue_id: int
    offset: int
    lease: int

    def encode(self) -> str:
        text = ".".join(
            ["v1", self.broker_name, str(self.epoch), self.boot_id, self.topic]
            + [str(self.queue_id), str(self.offset), str(self.lease)]
        )
        return f"{text}.{zlib.crc32(text.encode()):08x}"

    @staticmethod
    def decode(text: str) -> ReceiptHandle:
        parts = text.split(".")
        body, _, crc = text.rpartition(".")
        try:
            if len(parts) != 9 or parts[0] != "v1" or f"{zlib.crc32(body.encode()):08x}" != crc:
                raise ValueError(text)
            _, broker, epoch, boot, topic, queue_id, offset, lease, _ = parts
            return ReceiptHandle(broker, int(epoch), boot, topic, int(queue_id), int(offset), int(lease))
        except ValueError:
            raise RmqError(
                rdef.INVALID_RECEIPT_HANDLE, f"receipt handle {text[:80]!r} is malformed"
            ) from None


def duration_ms(value: Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# Settings ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConsumerSettings:
    fifo: bool = False
    max_attempts: int = 17  # deliveries: the first plus retry_max_times (RocketMQ: 16)
    backoff_ms: tuple[int, ...] = (1000,)
    long_polling_ms: int = 30_000
    batch_size: int = 32


PRODUCER_MAX_ATTEMPTS = 3


def answer_settings(settings: rdef.Settings, consumer: ConsumerSettings | None) -> rdef.Settings:
    """The client's settings merged with ours: what a Telemetry Settings is answered with."""
    merged = rdef.Settings()
    merged.CopyFrom(settings)
    merged.metric.on = False
    if settings.WhichOneof("pub_sub") == "publishing":
        merged.publishing.max_body_size = BODY_BYTES_MAX  # 0 would fail every send
        merged.publishing.validate_message_type = True
        merged.backoff_policy.CopyFrom(
            rdef.RetryPolicy(
                max_attempts=PRODUCER_MAX_ATTEMPTS,
                exponential_backoff=rdef.ExponentialBackoff(
                    initial=Duration(nanos=10_000_000), max=Duration(seconds=1), multiplier=2.0
                ),
            )
        )
    elif settings.WhichOneof("pub_sub") == "subscription":
        own = consumer or ConsumerSettings()
        merged.subscription.fifo = own.fifo
        merged.subscription.receive_batch_size = own.batch_size
        if not settings.subscription.HasField("long_polling_timeout"):
            merged.subscription.long_polling_timeout.CopyFrom(Duration(seconds=own.long_polling_ms // 1000))
        merged.backoff_policy.CopyFrom(
            rdef.RetryPolicy(
                max_attempts=own.max_attempts,
                customized_backoff=rdef.CustomizedBackoff(
                    next=[
                        Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000) for ms in own.backoff_ms
                    ]
                ),
            )
        )
    return merged


class TelemetryHub:
    """The Telemetry streams of one server: each is answered Settings for Settings and kept
    open, and the server may push commands down it (orphaned-transaction checks).

    With the synchronous gRPC server a stream holds a worker thread for its lifetime (and
    a reader thread), so at most `streams_max` are held; past that a stream gets its first
    Settings answered and is closed (the client re-opens it on its next settings sync)."""

    def __init__(
        self,
        streams_max: int,
        on_settings: Callable[[str, rdef.Settings], rdef.Settings],
        on_close: Callable[[str], None] = lambda client_id: None,
    ) -> None:
        self._slots = threading.BoundedSemaphore(streams_max)
        self._on_settings = on_settings
        self._on_close = on_close
        self._lock = threading.Lock()
        self._streams: dict[str, queue.Queue] = {}  # client id -> its outbound commands

    def _answer(self, client_id: str, command: rsvc.TelemetryCommand) -> rsvc.TelemetryCommand | None:
        if command.WhichOneof("command") != "settings":
            return None  # thread stack traces, verify results: nothing to answer
        try:
            merged = self._on_settings(client_id, command.settings)
            return rsvc.TelemetryCommand(status=status(), settings=merged)
        except RmqError as error:
            return rsvc.TelemetryCommand(status=status(error.code, error.message))
        except MqmetaError as error:
            return rsvc.TelemetryCommand(status=status_of_error(error))

    def serve(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            client_id = client_id_of(context)
        except RmqError as error:
            yield rsvc.TelemetryCommand(status=status(error.code, error.message))
            return
        if not self._slots.acquire(blocking=False):
            for command in requests:  # over the bound: answer the first Settings, then close
                answer = self._answer(client_id, command)
                if answer is not None:
                    yield answer
                    return
            return
        outbound: queue.Queue = queue.Queue(TELEMETRY_OUTBOUND_MAX)
        with self._lock:
            self._streams[client_id] = outbound
        reader = threading.Thread(
            target=self._read, args=(client_id, requests, outbound), name="telemetry-reader", daemon=True
        )
        reader.start()
        try:
            while context.is_active():
                try:
                    item = outbound.get(timeout=TELEMETRY_POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    break
                yield item
        finally:
            with self._lock:
                if self._streams.get(client_id) is outbound:
                    del self._streams[client_id]
            self._slots.release()
            self._on_close(client_id)

    def _read(self, client_id: str, requests: Iterator[Any], outbound: queue.Queue) -> None:
        try:
            for command in requests:
                answer = self._answer(client_id, command)
                if answer is not None:
                    outbound.put(answer, timeout=TELEMETRY_POLL_S)
        except (grpc.RpcError, queue.Full, ValueError) as exc:
            log.debug("telemetry stream of %s ended: %s", client_id, exc)
        finally:
            try:
                outbound.put_nowait(None)
            except queue.Full:
                pass

    def push(self, client_id: str, command: rsvc.TelemetryCommand) -> bool:
        """Queues `command` on the client's stream; False when it has none (or it is full)."""
        with self._lock:
            outbound = self._streams.get(client_id)
        if outbound is None:
            return False
        try:
            outbound.put_nowait(command)
            return True
        except queue.Full:
            return False

    def connected(self) -> list[str]:
        with self._lock:
            return list(self._streams)
