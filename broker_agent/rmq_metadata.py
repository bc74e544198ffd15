"""What the broker's RocketMQ 5 service knows about the world: topic routes and
subscription groups (from the controller, cached briefly), the clients it hears from
(heartbeats, Telemetry settings, receives), and how a group's queues are shared among its
live PushConsumers.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqmeta.errors import AlreadyExists, MqmetaError, NotFound
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.rocketmq import ConsumerSettings, RmqError, message_queues

ROUTE_TTL_MS = 1000  # a topic change reaches sends and receives within this
GROUPS_TTL_MS = 2000
CLIENT_EXPIRY_MS = 30_000  # three missed 10 s heartbeats: the client is gone
CLIENTS_MAX = 10_000
RETRY_MAX_TIMES_DEFAULT = 16  # RocketMQ's: 17 deliveries in all
BACKOFF_CAP_MS = 3_600_000


@dataclass(frozen=True)
class LocalTopic:
    """A topic as this broker set serves it."""

    name: str
    message_type: str
    read_queues: int
    write_queues: int
    perm: str


class Metadata:
    """Topic routes and groups from the controller, each cached for a short time."""

    def __init__(self, call_controller: Callable[[str, Any], Any], broker_name: str) -> None:
        self._call = call_controller
        self.broker_name = broker_name
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[int, cpb.TopicRoute | None]] = {}
        self._groups: tuple[int, dict[str, cpb.Group]] = (-GROUPS_TTL_MS, {})
        self._dead_letter_topics: set[str] = set()

    def route(self, topic: str, now_ms: int) -> cpb.TopicRoute:
        with self._lock:
            cached = self._routes.get(topic)
        if cached is None or now_ms - cached[0] >= ROUTE_TTL_MS:
            try:
                route: cpb.TopicRoute | None = self._call("GetTopicRoute", cpb.NameRequest(name=topic))
            except NotFound:
                route = None
            with self._lock:
                if len(self._routes) > CLIENTS_MAX:
                    self._routes.clear()
                self._routes[topic] = (now_ms, route)
            cached = (now_ms, route)
        if cached[1] is None:
            raise RmqError(rdef.TOPIC_NOT_FOUND, f"topic {topic} does not exist: create it with mqmeta admin")
        return cached[1]

    def local(self, topic: str, now_ms: int) -> LocalTopic:
        route = self.route(topic, now_ms)
        for q in route.queues:
            if q.broker_name == self.broker_name:
                return LocalTopic(
                    topic, route.message_type or "NORMAL", q.read_queue_count, q.write_queue_count, q.perm
                )
        raise RmqError(rdef.TOPIC_NOT_FOUND, f"topic {topic} has no queues on broker set {self.broker_name}")

    def queues(self, topic: str, now_ms: int) -> list[rdef.MessageQueue]:
        """Every readable queue of the topic, on every broker set with a master."""
        return [
            q
            for q in message_queues(self.route(topic, now_ms))
            if q.permission in (rdef.READ, rdef.READ_WRITE)
        ]

    def group(self, name: str, now_ms: int) -> cpb.Group | None:
        with self._lock:
            fetched_ms, groups = self._groups
        if now_ms - fetched_ms >= GROUPS_TTL_MS:
            try:
                listed = self._call("ListGroups", cpb.ListGroupsRequest()).groups
                groups = {g.name: g for g in listed}
            except MqmetaError:
                pass  # keep the last known groups; try again on the next call
            with self._lock:
                self._groups = (now_ms, groups)
        return groups.get(name)

    def consumer_settings(self, group: str, topics: list[str], now_ms: int) -> ConsumerSettings:
        """What a consumer of `group` is told: retries and backoff from the group (defaults
        for a group the controller does not know), FIFO when every topic is a FIFO topic."""
        config = self.group(group, now_ms)
        retries = (
            config.retry_max_times
            if config is not None and config.retry_max_times
            else RETRY_MAX_TIMES_DEFAULT
        )
        if config is not None and config.retry_policy == "FIXED":
            backoff: tuple[int, ...] = (1000,)
        else:
            backoff = tuple(min(1000 << i, BACKOFF_CAP_MS) for i in range(max(1, retries)))
        fifo = bool(topics)
        for topic in topics:
            try:
                fifo = fifo and self.route(topic, now_ms).message_type == "FIFO"
            except RmqError:
                fifo = False
        return ConsumerSettings(fifo=fifo, max_attempts=retries + 1, backoff_ms=backoff)

    def ensure_dead_letter_topic(self, topic: str) -> None:
        """RocketMQ creates %DLQ%{group} on first use; so do we (one queue per broker set)."""
        if topic in self._dead_letter_topics:
            return
        try:
            self._call("CreateTopic", cpb.TopicSpec(name=topic, queue_count=1))
        except AlreadyExists:
            pass
        self._dead_letter_topics.add(topic)


@dataclass
class Client:
    client_id: str
    client_type: int = rdef.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    topics: frozenset[str] = field(default_factory=frozenset)  # subscribed or published
    last_seen_ms: int = 0


class Members:
    """The clients this broker hears from; a client is alive until CLIENT_EXPIRY_MS of
    silence or its NotifyClientTermination. A terminated client stays gone: its own requests
    that arrive after the termination (a receive or heartbeat still in flight, forwarded by
    another proxy connection) do not bring it back (a client id names one client instance,
    which never starts again), so its queues go to the other members at their next
    QueryAssignment instead of after CLIENT_EXPIRY_MS."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._terminated: dict[str, int] = {}  # client id -> when (ms), oldest first

    def seen(self, client_id: str, now_ms: int, client_type: int = 0, group: str = "") -> None:
        with self._lock:
            self._seen(client_id, now_ms, client_type, group)

    def _seen(self, client_id: str, now_ms: int, client_type: int, group: str) -> Client | None:
        if client_id in self._terminated:
            return None
        client = self._clients.get(client_id)
        if client is None:
            if len(self._clients) >= CLIENTS_MAX:
                self._drop_expired(now_ms)
            client = self._clients[client_id] = Client(client_id)
        client.last_seen_ms = now_ms
        if client_type:
            client.client_type = client_type
        if group:
            client.group = group
        return client

    def settings(self, client_id: str, settings: rdef.Settings, now_ms: int) -> None:
        if settings.WhichOneof("pub_sub") == "subscription":
            group = settings.subscription.group.name
            topics = frozenset(s.topic.name for s in settings.subscription.subscriptions)
        else:
            group = ""
            topics = frozenset(t.name for t in settings.publishing.topics)
        with self._lock:
            client = self._seen(client_id, now_ms, settings.client_type, group)
            if client is not None:
                client.topics = topics

    def remove(self, client_id: str, now_ms: int) -> None:
        """NotifyClientTermination: gone now, and not brought back by its late requests
        (remembered for CLIENT_EXPIRY_MS, at most CLIENTS_MAX of them)."""
        with self._lock:
            self._clients.pop(client_id, None)
            self._terminated.pop(client_id, None)
            self._terminated[client_id] = now_ms
            for old, when in list(self._terminated.items()):  # oldest first
                if now_ms - when < CLIENT_EXPIRY_MS and len(self._terminated) <= CLIENTS_MAX:
                    break
                del self._terminated[old]

    def _drop_expired(self, now_ms: int) -> None:
        for client_id, client in list(self._clients.items()):
            if now_ms - client.last_seen_ms >= CLIENT_EXPIRY_MS:
                del self._clients[client_id]

    def alive(self, now_ms: int) -> frozenset[str]:
        with self._lock:
            return frozenset(
                c for c, v in self._clients.items() if now_ms - v.last_seen_ms < CLIENT_EXPIRY_MS
            )

    def of_group(self, group: str, now_ms: int) -> list[tuple[str, str, int]]:
        """(client id, "rocketmq5", last seen ms) of the group's live clients."""
        with self._lock:
            return [
                (c.client_id, "rocketmq5", c.last_seen_ms)
                for c in self._clients.values()
                if c.group == group and now_ms - c.last_seen_ms < CLIENT_EXPIRY_MS
            ]

    def client_type(self, client_id: str) -> int:
        """What the client said it is in its Settings (CLIENT_TYPE_UNSPECIFIED if not yet)."""
        with self._lock:
            client = self._clients.get(client_id)
            return client.client_type if client is not None else rdef.CLIENT_TYPE_UNSPECIFIED

    def push_consumers(self, group: str, topic: str, now_ms: int) -> list[str]:
        with self._lock:
            return sorted(
                c.client_id
                for c in self._clients.values()
                if c.group == group
                and c.client_type == rdef.PUSH_CONSUMER
                and topic in c.topics
                and now_ms - c.last_seen_ms < CLIENT_EXPIRY_MS
            )

    def producers(self, topic: str, now_ms: int) -> list[str]:
        with self._lock:
            return sorted(
                c.client_id
                for c in self._clients.values()
                if c.client_type == rdef.PRODUCER
                and topic in c.topics
                and now_ms - c.last_seen_ms < CLIENT_EXPIRY_MS
            )


def allocate(members: list[str], queues: list[rdef.MessageQueue], client_id: str) -> list[rdef.MessageQueue]:
    """RocketMQ's averaging allocation: queues sorted by (broker, id), members by id; member
    i of n takes a contiguous share. Every broker computes the same answer from the same
    member list (consumers heartbeat every broker of their topics)."""
    if client_id not in members:
        members = sorted([*members, client_id])
    ordered = sorted(queues, key=lambda q: (q.broker.name, q.id))
    index, count = members.index(client_id), len(members)
    if not ordered or index >= len(ordered):
        return []
    share, extra = divmod(len(ordered), count)
    size = share + (1 if index < extra else 0)
    start = index * share + min(index, extra)
    return ordered[start : start + size]


def fifo_queue(message_group: str, write_queues: int) -> int:
    """A message group always goes to one queue (so its order is the queue's)."""
    return zlib.crc32(message_group.encode()) % write_queues
