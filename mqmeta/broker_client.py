"""Producer and consumer for the broker data plane.

Routes come from a nameserver. A write answered NOT_MASTER (or a master that cannot
be reached) refreshes the route and is retried on the current master until the
call's deadline. A retried send may store a message twice (at-least-once); every
message carries producer id + sequence so a checker can tell.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import grpc

from mqmeta import backoff, tls
from mqmeta.call_stream import CallStreamClient, grpc_timeout_s
from mqmeta.dialmap import dial
from mqmeta.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MqmetaError,
    NotFound,
    NotMaster,
    Unavailable,
)
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.pb import namesrv_pb2 as npb
from mqmeta.pb import namesrv_pb2_grpc as npb_grpc
from mqmeta.rpc import from_rpc_error
from mqmeta.validate import parse_addresses

BROKER_SERVICE = bpb.DESCRIPTOR.services_by_name["BrokerService"]
CALL_TIMEOUT_S = 10.0
ATTEMPT_TIMEOUT_S = 4.0


class _Channels:
    """One channel per address, and its broker stub: building a stub makes a callable for
    every method of the service (about 0.3 ms of Python), too much to pay per send. With
    `call_stream`, a broker's unary calls go over its call stream when it offers one
    (mqmeta/call_stream.py)."""

    def __init__(self, call_stream: bool = True) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._broker_stubs: dict[str, bpb_grpc.BrokerServiceStub] = {}
        self.streams = CallStreamClient(self.get, enabled=call_stream)

    def call_broker(self, address: str, method: str, request: Any, timeout_s: float) -> Any:
        """One attempt of a BrokerService call: over the broker's call stream when it offers
        one (a failure is then the typed error), else a gRPC call (grpc.RpcError)."""
        deadline = time.monotonic() + timeout_s
        reply = self.streams.call(address, BROKER_SERVICE, method, request, timeout_s, "", deadline)
        if reply is None:  # with what the stream's attempt left of the timeout
            reply = getattr(self.broker_stub(address), method)(request, timeout=grpc_timeout_s(deadline))
        return reply

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = tls.channel(dial(address))
            return channel

    def broker_stub(self, address: str) -> bpb_grpc.BrokerServiceStub:
        stub = self._broker_stubs.get(address)
        if stub is None:
            stub = bpb_grpc.BrokerServiceStub(self.get(address))
            with self._lock:
                stub = self._broker_stubs.setdefault(address, stub)
        return stub

    def close(self) -> None:
        self.streams.close()
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._broker_stubs.clear()


@dataclass(frozen=True)
class QueueRef:
    broker_name: str
    queue_id: int


class RouteCache:
    def __init__(self, namesrv: list[str] | str, channels: _Channels) -> None:
        self.namesrv = parse_addresses(namesrv, "nameserver address") if isinstance(namesrv, str) else namesrv
        self._channels = channels
        self._routes: dict[str, cpb.TopicRoute] = {}

    def route(self, topic: str, refresh: bool = False) -> cpb.TopicRoute:
        if refresh or topic not in self._routes:
            self._routes[topic] = self._query(topic)
        return self._routes[topic]

    def _query(self, topic: str) -> cpb.TopicRoute:
        last: MqmetaError | None = None
        for address in self.namesrv:
            try:
                stub = npb_grpc.NameServerStub(self._channels.get(address))
                return stub.QueryRoute(npb.QueryRouteRequest(topic=topic), timeout=ATTEMPT_TIMEOUT_S)
            except grpc.RpcError as rpc_error:
                last = from_rpc_error(rpc_error)
                if isinstance(last, NotFound):
                    raise NotFound(
                        f"topic {topic} does not exist; create it with "
                        f"`mqmeta admin --controllers ... topic create {topic}`"
                    ) from None
        raise Unavailable(f"no nameserver answered ({', '.join(self.namesrv)}): {last}")

    def master(self, topic: str, broker_name: str) -> str:
        for broker in self.route(topic).brokers:
            if broker.broker_name == broker_name and broker.master_address:
                return broker.master_address
        raise Unavailable(f"broker set {broker_name} of topic {topic} has no master right now")

    def queues(self, topic: str) -> list[QueueRef]:
        return [
            QueueRef(q.broker_name, i) for q in self.route(topic).queues for i in range(q.write_queue_count)
        ]


def _call_master(
    routes: RouteCache,
    channels: _Channels,
    topic: str,
    broker_name: str,
    method: str,
    request: Any,
    timeout_s: float,
) -> Any:
    """Calls the current master of a broker set, following role changes."""
    deadline = time.monotonic() + timeout_s
    attempts = backoff.Attempts(backoff.BROKER_CALL, deadline)
    last: MqmetaError | None = None
    refresh = False
    while not attempts.expired():
        try:
            if refresh:
                routes.route(topic, refresh=True)
            address = routes.master(topic, broker_name)
            return channels.call_broker(
                address, method, request, min(ATTEMPT_TIMEOUT_S, max(0.05, deadline - time.monotonic()))
            )
        except grpc.RpcError as rpc_error:
            last = from_rpc_error(rpc_error)
            if rpc_error.code() is grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                # We never cancel a call in flight, so the server did: gRPC cancels the calls
                # no handler has taken yet when a server stops (a master that handed off and
                # exits), where it would be UNAVAILABLE had they come a moment later. Tried
                # again as UNAVAILABLE is (a send is at least once, as after any lost answer).
                last = Unavailable(f"{method} was cancelled by the broker (it is stopping): {last}")
        except MqmetaError as error:  # refused on the call stream, or no master in the route
            last = error
        if not isinstance(last, NotMaster | Unavailable):
            raise last
        refresh = True
        time.sleep(attempts.failed())
    raise DeadlineExceeded(f"{method} to {broker_name} did not succeed in {timeout_s:.1f}s: {last}")


# The pieces a replicator (or any client of several clusters) builds its own calls from.
Channels = _Channels
call_master = _call_master


class Producer:
    """`call_stream`: send over a master's call stream when it offers one; False: gRPC only."""

    def __init__(
        self, namesrv: list[str] | str, timeout_s: float = CALL_TIMEOUT_S, call_stream: bool = True
    ) -> None:
        self._channels = _Channels(call_stream)
        self.routes = RouteCache(namesrv, self._channels)
        self.timeout_s = timeout_s
        self.producer_id = uuid.uuid4().hex[:16]
        self._sequence = 0
        self._next_queue = 0

    def next_queue(self, topic: str) -> QueueRef:
        queues = self.routes.queues(topic)
        if not queues:
            raise Unavailable(f"topic {topic} has no writable queue (no broker set yet)")
        self._next_queue += 1
        return queues[self._next_queue % len(queues)]

    def send(
        self,
        topic: str,
        bodies: list[bytes],
        queue: QueueRef | None = None,
        tags: str = "",
        keys: list[str] | None = None,
    ) -> list[bpb.SendResult]:
        """Sends a batch to one queue; returns when the broker set acknowledged it."""
        queue = queue or self.next_queue(topic)
        messages = []
        for i, body in enumerate(bodies):
            self._sequence += 1
            messages.append(
                bpb.Message(
                    topic=topic,
                    queue_id=queue.queue_id,
                    body=body,
                    tags=tags,
                    keys=(keys[i] if keys else ""),
                    producer_id=self.producer_id,
                    producer_seq=self._sequence,
                )
            )
        reply = _call_master(
            self.routes,
            self._channels,
            topic,
            queue.broker_name,
            "Send",
            bpb.SendRequest(messages=messages),
            self.timeout_s,
        )
        return list(reply.results)

    def close(self) -> None:
        self._channels.close()


class Consumer:
    """Pulls every queue of a topic from its committed offsets; commits as it goes.

    `share=(i, n)` makes it member i of n consumers of the group splitting the queues
    statically: it pulls the queues at positions i, i + n, ... of the topic's queues in
    (broker, queue id) order (RocketMQ's averaging allocation with a fixed member list;
    there is no rebalancing when a member leaves)."""

    def __init__(
        self,
        namesrv: list[str] | str,
        topic: str,
        group: str,
        timeout_s: float = CALL_TIMEOUT_S,
        share: tuple[int, int] | None = None,
        call_stream: bool = True,
    ) -> None:
        if share is not None and not 0 <= share[0] < share[1]:
            raise InvalidArgument(f"consumer share {share} must be (i, n) with 0 <= i < n")
        self.share = share
        self._channels = _Channels(call_stream)
        self.routes = RouteCache(namesrv, self._channels)
        self.topic = topic
        self.group = group
        self.timeout_s = timeout_s
        self._offsets: dict[QueueRef, int] = {}
        self._uncommitted: set[QueueRef] = set()

    def _call(self, queue: QueueRef, method: str, request: Any) -> Any:
        return _call_master(
            self.routes, self._channels, self.topic, queue.broker_name, method, request, self.timeout_s
        )

    def _offset(self, queue: QueueRef) -> int:
        if queue not in self._offsets:
            reply = self._call(
                queue,
                "QueryOffset",
                bpb.QueryOffsetRequest(group=self.group, topic=self.topic, queue_id=queue.queue_id),
            )
            self._offsets[queue] = max(0, reply.offset)
        return self._offsets[queue]

    def poll(self, max_count: int = 256) -> list[bpb.StoredMessage]:
        """What every queue has past this consumer's offsets. A queue that fails is skipped
        (what other queues returned is never thrown away); the error is raised only when
        nothing was received. Offsets are committed after the caller has the messages."""
        self._commit_pending()
        received: list[bpb.StoredMessage] = []
        failure: MqmetaError | None = None
        for queue in self.queues():
            try:
                reply = self._call(
                    queue,
                    "Pull",
                    bpb.PullRequest(
                        topic=self.topic,
                        queue_id=queue.queue_id,
                        queue_offset=self._offset(queue),
                        max_count=max_count,
                        group=self.group,
                    ),
                )
            except MqmetaError as error:
                failure = error
                continue
            if reply.messages:
                received.extend(reply.messages)
                self._offsets[queue] = reply.next_queue_offset
                self._uncommitted.add(queue)
        if failure is not None and not received:
            raise failure
        return received

    def queues(self) -> list[QueueRef]:
        """The queues this consumer pulls (all of the topic's, or its share of them)."""
        queues = sorted(self.routes.queues(self.topic), key=lambda q: (q.broker_name, q.queue_id))
        if self.share is None:
            return queues
        index, count = self.share
        return queues[index::count]

    def _commit_pending(self) -> None:
        for queue in sorted(self._uncommitted, key=lambda q: (q.broker_name, q.queue_id)):
            self._call(
                queue,
                "CommitOffset",
                bpb.CommitOffsetRequest(
                    group=self.group, topic=self.topic, queue_id=queue.queue_id, offset=self._offsets[queue]
                ),
            )
            self._uncommitted.discard(queue)

    def commit(self) -> None:
        """Commits the offsets of everything poll() returned so far."""
        self._commit_pending()

    def refresh(self) -> None:
        self.routes.route(self.topic, refresh=True)

    def close(self) -> None:
        self._channels.close()
