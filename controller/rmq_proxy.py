"""The nameserver as RocketMQ 5's proxy (cluster mode): apache.rocketmq.v2.MessagingService
for the whole data path, each call forwarded to the current master of its broker set.

Why: an official RocketMQ 5 client keeps sending to the endpoints its last QueryRoute gave
it until its next route refresh (every 30 s). With `--rocketmq-routes proxy` (the default)
QueryRoute names the nameservers themselves as every queue's endpoints, so what a client
holds stays valid across a failover: the nameserver picks the master from its watched
route copy per call. With several nameservers the endpoints list them all; the official
clients put every address of an Endpoints into one gRPC channel (pick-first), which moves
to the next address when the one it uses dies.

Which broker set a call belongs to: SendMessage picks one (a FIFO message group always
the same set; otherwise round-robin over the sets that have a master now); ReceiveMessage
names its queue's set; receipt handles and transaction ids carry the set's name; Heartbeat
and NotifyClientTermination go to every master; Telemetry streams are relayed to every
master of the cluster, so a master's orphaned-transaction check reaches the client.

A call whose set has no master (an election under way), whose master does not answer, or
that the master refused before writing (HA_NOT_AVAILABLE) is tried again as the route
copy changes, until the call's own deadline (less PROXY_MARGIN_MS) and never longer than
ELECTION_WAIT_MS_MAX; then the last refusal is answered. Receipt handles are not touched:
a handle from a deposed master is refused by the new one exactly as without the proxy.

Requests and answers travel as bytes: only the fields that choose a broker set are
parsed, and only QueryAssignment's answer is rewritten (its queues name the proxies too).
Everything runs on the nameserver's grpc.aio loop; a channel per master address is kept
(at most CHANNELS_MAX), with one registered multicallable per method on it. The hop costs
about 1 ms of CPU per call, nearly all of it grpc.aio's server and client calls (the
proxy's own Python is about 24 µs; docs/benchmarks.md). So calls that wait together go
upstream as one (controller/coalesce.py): AckMessages of one client, group and topic, and
plain one-message sends of one client (see mergeable_send), one merged send of a client
upstream at a time (SENDS_IN_FLIGHT_MAX); each caller gets its own entries back.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from mqmeta.controller.coalesce import Coalescer

from mqmeta import tls
from mqmeta.errors import MqmetaError, NotFound
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import (
    MESSAGING_SERVICE,
    ReceiptHandle,
    RmqError,
    accepted_types,
    answer_settings,
    check_name,
    endpoints_of,
    entries_status,
    status,
    status_of_error,
)

log = logging.getLogger(__name__)

ELECTION_WAIT_MS_MAX = 10_000
PROXY_MARGIN_MS = 150  # answer this long before the client's deadline
DEADLINE_DEFAULT_MS = 5_000  # a call without a deadline waits as if it had this one
RETRY_PAUSE_S = 0.02  # between two tries while a set has no reachable master
CHANNELS_MAX = 256
FANOUT_TIMEOUT_S = 2.0
TELEMETRY_RECONCILE_S = 0.25  # how often a relayed stream looks for new masters
TELEMETRY_ANSWER_WAIT_S = 2.0  # then a Settings is answered here, without a master's merge
TELEMETRY_OUTBOUND_MAX = 256
REQUEST_BYTES_MAX = 5 << 20
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_send_message_length", REQUEST_BYTES_MAX),
    ("grpc.max_receive_message_length", REQUEST_BYTES_MAX),
    ("grpc.enable_retries", 0),
]
# Answers that say "this set has no master that can take it now": tried again.
RETRY_CODES = frozenset({rdef.HA_NOT_AVAILABLE, rdef.MASTER_PERSISTENCE_TIMEOUT})
# gRPC failures of the hop to the master that a new master cures.
RETRY_GRPC = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
FORWARDED_HEADERS = ("x-mq-", "authorization")
# The header that differs on every call of a client. Calls whose other headers are all
# equal may be merged: the same client, and the same authorization (the official clients
# sign x-mq-date-time, which has one-second resolution, so a client's calls within a second
# carry the same signature).
REQUEST_ID_HEADER = "x-mq-request-id"
ACK_ENTRIES_MERGED_MAX = 256  # entries of one merged upstream AckMessage
# Merged calls of one key in flight at once: more merge less and wait less. Measured with
# 8 sending threads and a PushConsumer's 20 (docs/benchmarks.md): acks did best at 2. Sends
# at 1: a merged send carries about 3.8 messages (1.4 at 4 in flight) and a proxied send then
# costs the nameserver, the master and the slave together about 30% less CPU, which on a 2-core
# machine is what a send through the proxy waits for (the master's write path group-commits
# concurrent sends anyway, so the single flight costs no fsync).
ACKS_IN_FLIGHT_MAX = 2  # merged AckMessages of one client, group, topic and master
SEND_MESSAGES_MERGED_MAX = 32  # messages of one merged upstream SendMessage
SEND_MERGED_BODY_BYTES_MAX = 64 << 10  # a larger message goes alone
# and so does a larger request (its message's properties, fields we do not know): a merged
# send's request stays under SEND_MESSAGES_MERGED_MAX times this, below REQUEST_BYTES_MAX
SEND_MERGED_REQUEST_BYTES_MAX = 128 << 10
assert SEND_MESSAGES_MERGED_MAX * SEND_MERGED_REQUEST_BYTES_MAX < REQUEST_BYTES_MAX
SENDS_IN_FLIGHT_MAX = 1  # merged SendMessages of one client and master
PATH = f"/{MESSAGING_SERVICE}/"


@dataclass(frozen=True)
class RouteSource:
    """The nameserver's route copy as the proxy reads it. `route_now` and `masters_now`
    answer from memory or give None (never block); `route` may ask the controllers."""

    route_now: Callable[[str], cpb.TopicRoute | None]
    route: Callable[[str], cpb.TopicRoute]
    masters_now: Callable[[], dict[str, str] | None]  # broker set -> master address


def proxy_message_queues(route: cpb.TopicRoute, proxies: list[str]) -> list[rdef.MessageQueue]:
    """Every queue of the route, with or without a master now, each naming the proxies."""
    types = accepted_types(route.message_type)
    endpoints = endpoints_of(proxies)
    found: list[rdef.MessageQueue] = []
    for q in sorted(route.queues, key=lambda q: q.broker_name):
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
                    broker=rdef.Broker(name=q.broker_name, id=0, endpoints=endpoints),
                    accept_message_types=types,  # type: ignore[arg-type]
                )
            )
    return found


def master_of(route: cpb.TopicRoute, broker_name: str) -> str:
    for broker in route.brokers:
        if broker.broker_name == broker_name and broker.master_broker_id:
            return broker.master_address
    return ""


def transaction_broker(transaction_id: str) -> str:
    """The broker set a transaction id names ("SET/OFFSET.ID"); empty for an older id."""
    name, slash, _ = transaction_id.partition("/")
    return name if slash else ""


@dataclass(frozen=True)
class _Pending:
    """One forwarded call waiting to be merged with others (RocketMQProxy.upstream)."""

    parsed: Any  # an rsvc.AckMessageRequest (merged sends go as bytes: merged_send_request)
    request: bytes
    deadline: float  # time.monotonic()
    metadata: list[tuple[str, str]]


def coalescing_key(metadata: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The headers that must be equal for calls to be merged: all but the request id, so
    that every call of a merged one carries exactly the identity the master checks."""
    return tuple((k, v) for k, v in metadata if k != REQUEST_ID_HEADER)


def mergeable_send(request: rsvc.SendMessageRequest) -> bool:
    """Whether a send may go upstream with others: one plain message (NORMAL, no delivery
    time, no message group) of a modest size. FIFO, delay and transaction messages, and
    large bodies, go as they came."""
    if len(request.messages) != 1:
        return False
    message = request.messages[0]
    system = message.system_properties
    return (
        system.message_type == rdef.NORMAL
        and not system.HasField("delivery_timestamp")
        and not system.message_group
        and len(message.body) <= SEND_MERGED_BODY_BYTES_MAX
    )


# merged_send_request relies on it: a SendMessageRequest is its repeated messages and nothing else
assert [f.name for f in rsvc.SendMessageRequest.DESCRIPTOR.fields] == ["messages"]


def merged_send_request(requests: list[bytes]) -> bytes:
    """One SendMessageRequest with the message of each of `requests` (each a mergeable_send),
    in order, without decoding them: the request's only field is the repeated `messages`, and
    a repeated field's encodings concatenate."""
    return b"".join(requests)


def split_send_answer(raw: bytes, count: int) -> list[bytes]:
    """The answer of a merged SendMessage of `count` one-message calls, split back: each
    gets its message's entry with that entry's status; an answer without one entry per
    message (a refusal of the whole call) is everyone's answer."""
    answer = rsvc.SendMessageResponse.FromString(raw)
    if len(answer.entries) != count:
        return [raw] * count
    return [
        rsvc.SendMessageResponse(status=entry.status, entries=[entry]).SerializeToString()
        for entry in answer.entries
    ]


def split_ack_answer(raw: bytes, counts: list[int]) -> list[bytes]:
    """The answer of a merged AckMessage, split into one answer per merged call holding
    `counts[i]` entries: each gets its own entries and the status they make; an answer
    without one entry per entry (a refusal of the whole call) is everyone's answer."""
    answer = rsvc.AckMessageResponse.FromString(raw)
    if len(answer.entries) != sum(counts):
        return [raw] * len(counts)
    parts: list[bytes] = []
    start = 0
    for count in counts:
        entries = answer.entries[start : start + count]
        start += count
        parts.append(
            rsvc.AckMessageResponse(status=entries_status(entries), entries=entries).SerializeToString()
        )
    return parts


class _Retry(Exception):
    """This try found no master that could take the call; `answer` is what to give the
    client if no later try does better."""

    def __init__(self, answer: bytes) -> None:
        super().__init__("retry")
        self.answer = answer


class RocketMQProxy:
    """apache.rocketmq.v2.MessagingService forwarded to the masters (see the module doc)."""

    def __init__(
        self,
        source: RouteSource,
        proxies: list[str],
        on_route: Callable[[], None],
        merge_calls: bool = True,
    ) -> None:
        self.source = source
        self.merge_calls = merge_calls
        self.proxies = proxies
        self._on_route = on_route
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._round_robin = itertools.count()
        # (address, method) -> (the channel it was made on, its multicallable)
        self._callables: dict[tuple[str, str], tuple[grpc.aio.Channel, Any]] = {}
        self.acks: Coalescer[_Pending, bytes] = Coalescer(
            self._send_acks, ACK_ENTRIES_MERGED_MAX, ACKS_IN_FLIGHT_MAX
        )
        self.sends: Coalescer[_Pending, bytes] = Coalescer(
            self._send_sends, SEND_MESSAGES_MERGED_MAX, SENDS_IN_FLIGHT_MAX
        )

    # Plumbing ------------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        unary = {
            "QueryRoute": self.query_route,
            "Heartbeat": self.heartbeat,
            "NotifyClientTermination": self.notify_termination,
            "SendMessage": self.send_message,
            "QueryAssignment": self.query_assignment,
            "AckMessage": self.ack_message,
            "ChangeInvisibleDuration": self.by_receipt_handle(rsvc.ChangeInvisibleDurationRequest),
            "ForwardMessageToDeadLetterQueue": self.by_receipt_handle(
                rsvc.ForwardMessageToDeadLetterQueueRequest
            ),
            "EndTransaction": self.end_transaction,
            "UpdateOffset": self.unsupported(rsvc.UpdateOffsetResponse, "UpdateOffset"),
            "GetOffset": self.unsupported(rsvc.GetOffsetResponse, "GetOffset"),
            "QueryOffset": self.unsupported(rsvc.QueryOffsetResponse, "QueryOffset"),
            "RecallMessage": self.unsupported(rsvc.RecallMessageResponse, "RecallMessage"),
            "SyncLiteSubscription": self.unsupported(rsvc.SyncLiteSubscriptionResponse, "lite topics"),
        }
        handlers: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in unary.items()
        }
        handlers["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(self.receive_message)
        handlers["PullMessage"] = grpc.unary_stream_rpc_method_handler(self.pull_message)
        handlers["Telemetry"] = grpc.stream_stream_rpc_method_handler(self.telemetry)
        return grpc.method_handlers_generic_handler(MESSAGING_SERVICE, handlers)

    def unary(self, address: str, method: str) -> Any:
        """The cached multicallable of the unary `method` on the channel to `address`."""
        return self.multicallable(address, method, "unary_unary")

    def multicallable(self, address: str, method: str, kind: str) -> Any:
        """`kind` ("unary_unary", "unary_stream", "stream_stream") of `method` on the
        channel to `address`, made once per channel: a registered method, so gRPC resolves
        its path once, not per call. Requests and answers stay bytes (no serializers)."""
        key = (address, method)
        found = self._callables.get(key)
        if found is None or found[0] is not self._channels.get(address):
            channel = self.channel(address)
            found = (channel, getattr(channel, kind)(PATH + method, _registered_method=True))
            self._callables[key] = found
        return found[1]

    def channel(self, address: str) -> grpc.aio.Channel:
        found = self._channels.get(address)
        if found is not None:
            self._channels.move_to_end(address)
            return found
        made = tls.aio_channel(address, CHANNEL_OPTIONS)
        self._channels[address] = made
        if len(self._channels) > CHANNELS_MAX:
            gone, oldest = self._channels.popitem(last=False)
            self._callables = {k: v for k, v in self._callables.items() if k[0] != gone}
            asyncio.get_running_loop().create_task(oldest.close(grace=FANOUT_TIMEOUT_S))
        return made

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def route(self, topic: str) -> cpb.TopicRoute:
        found = self.source.route_now(topic)
        if found is not None:
            return found
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.source.route, topic)
        except NotFound:
            raise RmqError(
                rdef.TOPIC_NOT_FOUND, f"topic {topic} does not exist: create it with mqmeta admin"
            ) from None

    async def masters(self) -> dict[str, str]:
        found = self.source.masters_now()
        if found is not None:
            return found
        return {}

    # Forwarding ----------------------------------------------------------------------------
    async def forward(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        request: bytes,
        master: Callable[[], Any],
        response_type: Any,
        parsed: Any = None,
    ) -> bytes:
        """`request` to the master `await master()` names, tried again (see the module doc)
        until the call's deadline; the answer's bytes. `parsed`: the request decoded, if
        the caller has it (upstream decodes it otherwise)."""
        deadline = _deadline(context)
        metadata = forwarded_metadata(context)
        answer = _no_master_answer(response_type)
        while True:
            try:
                address = await master()
                left = deadline - time.monotonic()
                if not address:
                    raise _Retry(answer)
                try:
                    raw = await self.upstream(address, method, request, max(left, 0.01), metadata, parsed)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in RETRY_GRPC:
                        raise
                    raise _Retry(answer) from None
                if response_type.FromString(raw).status.code in RETRY_CODES:
                    raise _Retry(raw)
                return raw
            except _Retry as retry:
                answer = retry.answer
                if time.monotonic() + RETRY_PAUSE_S >= deadline:
                    return answer
                await asyncio.sleep(RETRY_PAUSE_S)

    async def upstream(
        self,
        address: str,
        method: str,
        request: bytes,
        timeout_s: float,
        metadata: list[tuple[str, str]],
        parsed: Any = None,
    ) -> bytes:
        """One try of `request` at the master `address`. AckMessages of one client, group
        and topic that wait together go as one call (self.acks, controller/coalesce.py):
        a PushConsumer acknowledges each message with a call of its own."""
        if not self.merge_calls:
            return await self.unary(address, method)(request, timeout=timeout_s, metadata=metadata)
        if method == "AckMessage":
            if parsed is None:
                parsed = rsvc.AckMessageRequest.FromString(request)
            key: tuple = (
                address,
                parsed.group.SerializeToString(),
                parsed.topic.SerializeToString(),
                coalescing_key(metadata),
            )
            pending = _Pending(parsed, request, time.monotonic() + timeout_s, metadata)
            return await self.acks.call(key, pending, max(len(parsed.entries), 1))
        if method == "SendMessage":
            parsed_send = rsvc.SendMessageRequest.FromString(request) if parsed is None else parsed
            if mergeable_send(parsed_send) and len(request) <= SEND_MERGED_REQUEST_BYTES_MAX:
                pending = _Pending(None, request, time.monotonic() + timeout_s, metadata)
                return await self.sends.call((address, coalescing_key(metadata)), pending)
        return await self.unary(address, method)(request, timeout=timeout_s, metadata=metadata)

    async def _send_sends(self, key: Any, sends: list[_Pending]) -> list[bytes]:
        """Merged SendMessages (see upstream): one call with every message, in order; each
        caller gets its message's entry (a refusal of the whole call is everyone's)."""
        call = self.unary(key[0], "SendMessage")  # key[0]: the master's address
        timeout_s = max(min(p.deadline for p in sends) - time.monotonic(), 0.01)
        if len(sends) == 1:
            return [await call(sends[0].request, timeout=timeout_s, metadata=sends[0].metadata)]
        merged = merged_send_request([pending.request for pending in sends])
        raw = await call(merged, timeout=timeout_s, metadata=sends[0].metadata)
        return split_send_answer(raw, len(sends))

    async def _send_acks(self, key: Any, acks: list[_Pending]) -> list[bytes]:
        """Merged AckMessages (see upstream): one call with every entry, in order; its
        answer split back (each caller's entries, with their own overall status). A
        refusal of the whole call (no entries in the answer) is every caller's answer."""
        call = self.unary(key[0], "AckMessage")  # key[0]: the master's address
        timeout_s = max(min(a.deadline for a in acks) - time.monotonic(), 0.01)
        if len(acks) == 1:
            return [await call(acks[0].request, timeout=timeout_s, metadata=acks[0].metadata)]
        merged = rsvc.AckMessageRequest(group=acks[0].parsed.group, topic=acks[0].parsed.topic)
        for ack in acks:
            merged.entries.extend(ack.parsed.entries)
        raw = await call(merged.SerializeToString(), timeout=timeout_s, metadata=acks[0].metadata)
        return split_ack_answer(raw, [len(a.parsed.entries) for a in acks])

    async def answer(self, response_type: Any, work: Callable[[], Any]) -> bytes:
        """`await work()`, or the refusal it raised as `response_type`'s Status."""
        try:
            return await work()
        except RmqError as error:
            return response_type(status=status(error.code, error.message)).SerializeToString()
        except MqmetaError as error:
            return response_type(status=status_of_error(error)).SerializeToString()
        except grpc.aio.AioRpcError as exc:
            return response_type(
                status=status(rdef.PROXY_TIMEOUT, f"the master did not answer: {exc.code().name}")
            ).SerializeToString()

    def master_getter(self, topic: str, broker_name: str) -> Callable[[], Any]:
        """The master of `broker_name` for `topic`; with no name, the first set's that has one."""

        async def master() -> str:
            route = await self.route(topic)
            if broker_name:
                return master_of(route, broker_name)
            found = [master_of(route, name) for name in sorted(q.broker_name for q in route.queues)]
            return next((a for a in found if a), "")

        return master

    # Methods -------------------------------------------------------------------------------
    async def query_route(self, request: bytes, context) -> bytes:
        async def work() -> bytes:
            parsed = rsvc.QueryRouteRequest.FromString(request)
            topic = check_name("topic", parsed.topic, rdef.ILLEGAL_TOPIC)
            self._on_route()
            queues = proxy_message_queues(await self.route(topic), self.proxies)
            return rsvc.QueryRouteResponse(status=status(), message_queues=queues).SerializeToString()

        return await self.answer(rsvc.QueryRouteResponse, work)

    async def fan_out(self, method: str, request: bytes, context) -> None:
        metadata = forwarded_metadata(context)
        calls = [
            self.unary(address, method)(request, timeout=FANOUT_TIMEOUT_S, metadata=metadata)
            for address in (await self.masters()).values()
        ]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.debug("%s to a master failed: %s", method, outcome)

    async def heartbeat(self, request: bytes, context) -> bytes:
        await self.fan_out("Heartbeat", request, context)
        return rsvc.HeartbeatResponse(status=status()).SerializeToString()

    async def notify_termination(self, request: bytes, context) -> bytes:
        await self.fan_out("NotifyClientTermination", request, context)
        return rsvc.NotifyClientTerminationResponse(status=status()).SerializeToString()

    async def send_message(self, request: bytes, context) -> bytes:
        async def work() -> bytes:
            parsed = rsvc.SendMessageRequest.FromString(request)
            if len(parsed.messages) != 1:
                raise RmqError(rdef.BAD_REQUEST, f"a send carries one message, not {len(parsed.messages)}")
            message = parsed.messages[0]
            topic = check_name("topic", message.topic, rdef.ILLEGAL_TOPIC)
            group = message.system_properties.message_group
            turn = next(self._round_robin)

            async def master() -> str:
                route = await self.route(topic)
                writable = sorted(
                    q.broker_name for q in route.queues if "W" in q.perm and q.write_queue_count
                )
                if not writable:
                    raise RmqError(rdef.FORBIDDEN, f"topic {topic} has no writable broker set")
                if group:  # one message group, one set: its order is kept there
                    return master_of(route, writable[zlib.crc32(group.encode()) % len(writable)])
                alive = [a for a in (master_of(route, name) for name in writable) if a]
                return alive[turn % len(alive)] if alive else ""

            return await self.forward(
                context, "SendMessage", request, master, rsvc.SendMessageResponse, parsed
            )

        return await self.answer(rsvc.SendMessageResponse, work)

    async def query_assignment(self, request: bytes, context) -> bytes:
        async def work() -> bytes:
            parsed = rsvc.QueryAssignmentRequest.FromString(request)
            topic = check_name("topic", parsed.topic, rdef.ILLEGAL_TOPIC)

            master = self.master_getter(topic, "")  # the first set with a master: one member list
            raw = await self.forward(
                context, "QueryAssignment", request, master, rsvc.QueryAssignmentResponse
            )
            answer = rsvc.QueryAssignmentResponse.FromString(raw)
            endpoints = endpoints_of(self.proxies)
            for assignment in answer.assignments:
                assignment.message_queue.broker.endpoints.CopyFrom(endpoints)
            return answer.SerializeToString()

        return await self.answer(rsvc.QueryAssignmentResponse, work)

    async def ack_message(self, request: bytes, context) -> bytes:
        async def work() -> bytes:
            parsed = rsvc.AckMessageRequest.FromString(request)
            topic = check_name("topic", parsed.topic, rdef.ILLEGAL_TOPIC)
            names = {_handle_broker(e.receipt_handle) for e in parsed.entries}
            if len(names) <= 1:
                name = next(iter(names), "")
                return await self.forward(
                    context,
                    "AckMessage",
                    request,
                    self.master_getter(topic, name),
                    rsvc.AckMessageResponse,
                    parsed,
                )
            return await self._ack_split(parsed, topic, context)

        return await self.answer(rsvc.AckMessageResponse, work)

    async def _ack_split(self, parsed: rsvc.AckMessageRequest, topic: str, context) -> bytes:
        """A batch whose handles name several sets: one AckMessage per set, sent at once; the
        answers merged back into the request's order (each set's master answers its
        entries in the order it was given them)."""
        by_set: dict[str, list[rsvc.AckMessageEntry]] = {}
        for entry in parsed.entries:
            by_set.setdefault(_handle_broker(entry.receipt_handle), []).append(entry)

        async def one(name: str, entries: list[rsvc.AckMessageEntry]) -> list[rsvc.AckMessageResultEntry]:
            part = rsvc.AckMessageRequest(group=parsed.group, topic=parsed.topic, entries=entries)
            raw = await self.forward(
                context,
                "AckMessage",
                part.SerializeToString(),
                self.master_getter(topic, name),
                rsvc.AckMessageResponse,
            )
            answer = rsvc.AckMessageResponse.FromString(raw)
            if len(answer.entries) == len(entries):
                return list(answer.entries)
            # Refused as a whole (no master before the deadline, a bad group): each entry says so.
            return [
                rsvc.AckMessageResultEntry(
                    message_id=e.message_id, receipt_handle=e.receipt_handle, status=answer.status
                )
                for e in entries
            ]

        parts = await asyncio.gather(*(one(n, e) for n, e in by_set.items()))
        answered = {name: iter(part) for name, part in zip(by_set, parts, strict=True)}
        entries = [next(answered[_handle_broker(e.receipt_handle)]) for e in parsed.entries]
        overall = entries_status(entries)
        return rsvc.AckMessageResponse(status=overall, entries=entries).SerializeToString()

    def by_receipt_handle(self, request_type: Any):
        method = request_type.DESCRIPTOR.name.removesuffix("Request")
        response_type = getattr(rsvc, f"{method}Response")

        async def handle(request: bytes, context) -> bytes:
            async def work() -> bytes:
                parsed = request_type.FromString(request)
                topic = check_name("topic", parsed.topic, rdef.ILLEGAL_TOPIC)
                name = _handle_broker(parsed.receipt_handle)
                return await self.forward(
                    context, method, request, self.master_getter(topic, name), response_type
                )

            return await self.answer(response_type, work)

        return handle

    async def end_transaction(self, request: bytes, context) -> bytes:
        async def work() -> bytes:
            parsed = rsvc.EndTransactionRequest.FromString(request)
            topic = check_name("topic", parsed.topic, rdef.ILLEGAL_TOPIC)
            name = transaction_broker(parsed.transaction_id)  # none: any master refuses it
            return await self.forward(
                context,
                "EndTransaction",
                request,
                self.master_getter(topic, name),
                rsvc.EndTransactionResponse,
            )

        return await self.answer(rsvc.EndTransactionResponse, work)

    def unsupported(self, response_type: Any, what: str):
        async def handle(request: bytes, context) -> bytes:
            return response_type(
                status=status(rdef.UNSUPPORTED, f"{what} is not supported by mqmeta; use receive/ack")
            ).SerializeToString()

        return handle

    async def pull_message(self, request: bytes, context) -> AsyncIterator[bytes]:
        yield rsvc.PullMessageResponse(
            status=status(rdef.UNSUPPORTED, "PullMessage is not supported; use ReceiveMessage")
        ).SerializeToString()

    async def receive_message(self, request: bytes, context) -> AsyncIterator[bytes]:
        """Long polls forwarded whole: the master's answer is streamed back as it comes.
        Tried again only while the master has answered nothing (or HA_NOT_AVAILABLE)."""
        try:
            parsed = rsvc.ReceiveMessageRequest.FromString(request)
            topic = check_name("topic", parsed.message_queue.topic, rdef.ILLEGAL_TOPIC)
        except RmqError as error:
            yield rsvc.ReceiveMessageResponse(status=status(error.code, error.message)).SerializeToString()
            return
        master = self.master_getter(topic, parsed.message_queue.broker.name)
        deadline = _deadline(context)  # how long to look for a master
        call_deadline = _deadline(context, capped=False)  # a long poll keeps its whole length
        metadata = forwarded_metadata(context)
        answer = rsvc.ReceiveMessageResponse(
            status=status(
                rdef.HA_NOT_AVAILABLE, f"broker set {parsed.message_queue.broker.name} has no master now"
            )
        ).SerializeToString()
        while True:
            try:
                address = await master()
            except RmqError as error:
                yield rsvc.ReceiveMessageResponse(
                    status=status(error.code, error.message)
                ).SerializeToString()
                return
            except MqmetaError as error:  # the controllers could not be asked for the route
                yield rsvc.ReceiveMessageResponse(status=status_of_error(error)).SerializeToString()
                return
            if address:
                call = self.multicallable(address, "ReceiveMessage", "unary_stream")(
                    request, timeout=max(call_deadline - time.monotonic(), 0.01), metadata=metadata
                )
                first = True
                try:
                    async for raw in call:
                        if first:
                            first = False
                            if rsvc.ReceiveMessageResponse.FromString(raw).status.code in RETRY_CODES:
                                answer = raw
                                break
                        yield raw
                    else:
                        return
                except grpc.aio.AioRpcError as exc:
                    if not first or exc.code() not in RETRY_GRPC:
                        if first:
                            yield rsvc.ReceiveMessageResponse(
                                status=status(
                                    rdef.PROXY_TIMEOUT, f"the master did not answer: {exc.code().name}"
                                )
                            ).SerializeToString()
                        return
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                yield answer
                return
            await asyncio.sleep(RETRY_PAUSE_S)

    # Telemetry -----------------------------------------------------------------------------
    async def telemetry(self, requests: AsyncIterator[bytes], context) -> AsyncIterator[bytes]:
        relay = _TelemetryRelay(self, forwarded_metadata(context))
        async for raw in relay.run(requests):
            yield raw


class _TelemetryRelay:
    """One client's Telemetry stream, relayed to an upstream stream per master: the
    client's commands go to every master (a new master gets the last Settings at once);
    for each client Settings the first master's answer comes back (or, after
    TELEMETRY_ANSWER_WAIT_S without one, our own); every other command a master sends
    (orphaned-transaction checks) comes back as it is."""

    def __init__(self, proxy: RocketMQProxy, metadata: list[tuple[str, str]]) -> None:
        self.proxy = proxy
        self.metadata = metadata
        self.outbound: asyncio.Queue[bytes | None] = asyncio.Queue(TELEMETRY_OUTBOUND_MAX)
        self.upstreams: dict[str, tuple[Any, asyncio.Task]] = {}
        self.last_settings: bytes | None = None
        self.pending_answers = 0
        self.asked_at = 0.0

    async def run(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        tasks = [
            asyncio.ensure_future(self._read_client(requests)),
            asyncio.ensure_future(self._reconcile_loop()),
        ]
        try:
            while True:
                item = await self.outbound.get()
                if item is None:
                    return
                yield item
        finally:
            for task in tasks:
                task.cancel()
            for call, reader in self.upstreams.values():
                reader.cancel()
                call.cancel()
            self.upstreams.clear()

    async def _read_client(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                if rsvc.TelemetryCommand.FromString(raw).WhichOneof("command") == "settings":
                    self.last_settings = raw
                    self.pending_answers += 1
                    self.asked_at = time.monotonic()
                for address, (call, _) in list(self.upstreams.items()):
                    await self._write(address, call, raw)
                await self._reconcile()
        except grpc.aio.AioRpcError as exc:
            log.debug("a relayed Telemetry stream ended: %s", exc.code().name)
        finally:
            await self.outbound.put(None)

    async def _write(self, address: str, call: Any, raw: bytes) -> None:
        try:
            await call.write(raw)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, RuntimeError) as exc:
            log.debug("Telemetry to %s failed: %s", address, exc)
            self._drop(address)

    def _drop(self, address: str) -> None:
        found = self.upstreams.pop(address, None)
        if found is not None:
            found[0].cancel()
            found[1].cancel()

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(TELEMETRY_RECONCILE_S)
            await self._reconcile()
            if self.pending_answers and time.monotonic() - self.asked_at > TELEMETRY_ANSWER_WAIT_S:
                self.pending_answers = 0  # no master merged it: answer the client's own settings
                await self.outbound.put(_own_settings_answer(self.last_settings))

    async def _reconcile(self) -> None:
        masters = set((await self.proxy.masters()).values())
        for address in set(self.upstreams) - masters:
            self._drop(address)
        for address in masters - set(self.upstreams):
            call = self.proxy.multicallable(address, "Telemetry", "stream_stream")(metadata=self.metadata)
            reader = asyncio.ensure_future(self._read_upstream(address, call))
            self.upstreams[address] = (call, reader)
            if self.last_settings is not None:
                await self._write(address, call, self.last_settings)

    async def _read_upstream(self, address: str, call: Any) -> None:
        try:
            async for raw in call:
                if rsvc.TelemetryCommand.FromString(raw).WhichOneof("command") == "settings":
                    if self.pending_answers <= 0:
                        continue  # another master answered this Settings already
                    self.pending_answers -= 1
                await self.outbound.put(raw)
        except grpc.aio.AioRpcError as exc:
            log.debug("Telemetry from %s ended: %s", address, exc.code().name)
        if self.upstreams.get(address, (None, None))[0] is call:
            del self.upstreams[address]  # the next reconcile opens it again if it is a master


@functools.cache
def _no_master_answer(response_type: Any) -> bytes:
    """What a forwarded call is answered when no try found a master that could take it."""
    return response_type(
        status=status(rdef.HA_NOT_AVAILABLE, "no master is reachable for this broker set now")
    ).SerializeToString()


def _own_settings_answer(raw: bytes | None) -> bytes:
    settings = rsvc.TelemetryCommand.FromString(raw or b"").settings
    return rsvc.TelemetryCommand(
        status=status(), settings=answer_settings(settings, None)
    ).SerializeToString()


def _handle_broker(text: str) -> str:
    """The set a receipt handle names; empty for a malformed one (any master of the topic
    refuses it, as without the proxy)."""
    try:
        return ReceiptHandle.decode(text).broker_name
    except RmqError:
        return ""


def _deadline(context: grpc.aio.ServicerContext, capped: bool = True) -> float:
    """When the call must be answered: its own deadline less PROXY_MARGIN_MS, and (capped)
    no later than ELECTION_WAIT_MS_MAX from now."""
    remaining = context.time_remaining()
    left_ms = DEADLINE_DEFAULT_MS if remaining is None else remaining * 1000
    wait_ms = max(left_ms - PROXY_MARGIN_MS, 0)
    if capped:
        wait_ms = min(wait_ms, ELECTION_WAIT_MS_MAX)
    return time.monotonic() + wait_ms / 1000


def forwarded_metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str]]:
    """The client's own headers (client id, signature, language...), passed on unchanged."""
    return [(k, v) for k, v in context.invocation_metadata() or () if k.startswith(FORWARDED_HEADERS)]
