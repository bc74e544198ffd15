"""The standalone nameserver's copy of the routing metadata, fed by the controller's watch stream.

A route read used to be a linearizable read in the controller (a Raft barrier: a fsynced
entry on a majority, 10-36 ms at p99 here). The nameserver now answers from a copy of
the two things a route is made of - every topic's definition and every broker set's
master, epoch and addresses - that one watch stream keeps current, and falls back to
the barrier read whenever the copy cannot answer.

Why a copy that may lag is safe. A route only tells a client where to send; it grants
nothing. Every write a client then makes goes to a broker master, and masters are fenced
by epoch (DESIGN: at most one master accepts writes per broker set at any instant: the
controller's epoch plus the master lease). A stale route names either a broker that is no
longer master, which refuses the send (it is a slave, or fenced, or dead), or misses a
broker set the topic was just given, which loses nothing either. Either way the client
asks again, and the copy has caught up within one watch delivery (milliseconds; measured
by tests/test_route_cache.py and bench/metadata_scale/). So the nameserver's answers
were never the thing that made writes safe: fencing is, in the brokers and the
controller, and neither changed. What does change: a route read is no longer
linearizable - a client may see a route up to one watch delivery old (RocketMQ's own
nameservers are eventually consistent, refreshed every 30 s; this is milliseconds). The
stream is on a follower (`_watch_target`), which applies a broker-set change as soon as
the leader does (the leader sends it the commit index at once) and a topic change within
a heartbeat.

When the copy answers, and when it does not (then: the barrier read, as before):
- only while its watch stream is open and it has loaded every broker set the
  controller listed after subscribing, and every topic (ListTopics after subscribing:
  any change after that read comes on the stream);
- a topic it does not know (just created, or absent: the barrier read answers
  NOT_FOUND properly) or whose definition changed since its last topic load (a "topic"
  event marks it; a refresher reloads the topics at most every TOPIC_RELOAD_INTERVAL_S);
- broker sets are updated from the stream itself (every broker-set event carries the set
  as it is at that Raft index; an event older than what the copy holds is ignored, since
  the stream may repeat a change already in its opening snapshot);
- when the stream ends or fails (the controller node died, the stream fell behind, the
  network broke, the node has not reached a leader for a few seconds: cut off from the
  other controllers, it hears of no change; operations.WATCH_UNCONFIRMED_MAX_S) the copy
  is dropped at once and every read falls back until a new stream has loaded
  everything again (retried every RESUBSCRIBE_INTERVAL_S). With a majority of the
  controllers gone no node reaches a leader, so the copy answers nothing, as the
  barrier reads it falls back to cannot either. A stream
  that is silently cut (a stopped process, a black-holed link: no reset ever arrives)
  is noticed by gRPC keepalive: the stream's channel pings every WATCH_KEEPALIVE_MS and
  fails the stream when a ping is not answered within WATCH_KEEPALIVE_TIMEOUT_MS, so the
  copy answers at most about their sum after its stream stopped delivering.
- no broker set at all: no stream message ever proves the subscription, so the copy
  never goes live (every read is a barrier read, as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from mqmeta.timing import WATCH_KEEPALIVE_MS, WATCH_KEEPALIVE_TIMEOUT_MS

log = logging.getLogger(__name__)

RESUBSCRIBE_INTERVAL_S = 1.0
STOP_JOIN_TIMEOUT_S = 5.0  # per thread; their calls end when stop() closes the client
TOPIC_RELOAD_INTERVAL_S = 1.0  # at most one ListTopics per interval while topics change
# ...and at most this share of the time: a ListTopics of 100,000 topics is 6.8 MB and takes
# the leader a while; while topics are created in bulk the reloads must not double its load
TOPIC_RELOAD_DUTY_MAX = 0.1
# A named reload's request stays far below gRPC's 4 MiB request limit (100,000 names of up
# to 127 characters would not fit); more marked names than this: one ListTopics of every topic.
TOPIC_RELOAD_NAMES_BYTES_MAX = 1 << 20
NAME_ENCODING_BYTES = 3  # per repeated string: its tag and length (names are ASCII)
BrokerKey = tuple[str, str]  # (cluster, broker name)


class RouteCache:
    """Routes from a watched copy; `route(name)` is None when the barrier read must answer."""

    def __init__(self, client: ControllerClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._live = False
        self._topics: dict[str, pb.Topic] = {}
        self._listeners: list[Callable[[pb.WatchEvent], None]] = []
        self._batched = True  # WatchBatched, until a controller answers it UNIMPLEMENTED
        # Topics changed since the last load (not answered), each with the mark of its last
        # change: a reload clears only the marks it read after (an event that arrives while
        # the reload is under way may be newer than what the reload read).
        self._dirty: dict[str, int] = {}
        self._marks = 0
        self._reload_all = 0  # the mark of an unknown event kind: the next reload lists every topic
        self._brokers: dict[BrokerKey, tuple[int, pb.BrokerRoute]] = {}  # (index, route)
        self._cluster_sets: dict[str, list[str]] | None = None  # sorted names, per cluster
        self._awaited: set[BrokerKey] = set()  # listed by ListBrokerSets, not yet streamed
        self._stream: Any = None
        self._loaded = False  # topics and the broker-set list were read after subscribing
        self._generation = 0  # bumped when the copy is dropped: older reloads are discarded
        self._unknown_kinds: set[str] = set()
        self._subscribed = 0  # subscriptions made: the next one asks the next follower
        self.watched = ""  # the controller address the stream is on ("" before the first)
        self.stats = {
            "hits": 0,
            "fallbacks": 0,
            "events": 0,
            "subscriptions": 0,
            "topic_loads": 0,
            "topics_read": 0,  # by the reloads after the first load: what they cost the leader
        }
        self._threads = [
            threading.Thread(target=self._follow_loop, name="route-cache-watch", daemon=True),
            threading.Thread(target=self._refresh_loop, name="route-cache-refresh", daemon=True),
        ]

    def add_listener(self, listener: Callable[[pb.WatchEvent], None]) -> None:
        """`listener` gets every event of the copy's watch stream, on its thread, after the
        copy applied it (the nameserver's console keeps its timeline from them instead of a
        watch stream of its own: each stream costs the controller serving it and this
        process a gRPC message per applied entry). Events applied while the stream was
        down are not replayed (a stream of the console's own missed them too). A listener
        added while the copy runs gets the events from then on; one that raises is logged
        and kept."""
        self._listeners.append(listener)

    def start(self) -> RouteCache:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stops both threads and closes the client (the copy's own): a call they are
        waiting in ends at once. (When the whole cluster stops, the watch stream ends first
        and the loop's next GetMetadata retried the gone controllers for its 5 s deadline.)"""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        self.client.close()
        for thread in self._threads:
            thread.join(timeout=STOP_JOIN_TIMEOUT_S)

    @property
    def live(self) -> bool:
        with self._lock:
            return self._live

    # Reads ------------------------------------------------------------------------------
    def route(self, name: str) -> pb.TopicRoute | None:
        with self._lock:
            topic = self._topics.get(name) if self._live and name not in self._dirty else None
            if topic is None:
                self.stats["fallbacks"] += 1
                return None
            self.stats["hits"] += 1
            return self._build(topic)

    def masters(self) -> dict[str, str] | None:
        """Every broker set's master address by set name (sets without one left out);
        None while the copy is not live."""
        with self._lock:
            if not self._live:
                return None
            return {
                name: route.master_address
                for (_, name), (_, route) in self._brokers.items()
                if route.master_broker_id and route.master_address
            }

    def broker(self, broker_name: str) -> pb.BrokerRoute | None:
        """The set's route (master and replica addresses; empty when the set is unknown);
        None when the copy cannot answer."""
        with self._lock:
            if not self._live:
                return None
            found = [route for (_, name), (_, route) in self._brokers.items() if name == broker_name]
        return found[0] if found else pb.BrokerRoute(broker_name=broker_name)

    def _build(self, topic: pb.Topic) -> pb.TopicRoute:
        """The route the controller's topic_route builds from the same state."""
        if topic.broker_names:
            names = list(topic.broker_names)
        else:
            if self._cluster_sets is None:
                sets: dict[str, list[str]] = {}
                for (cluster, name), (_, route) in self._brokers.items():
                    if route.addresses:
                        sets.setdefault(cluster, []).append(name)
                self._cluster_sets = {c: sorted(n) for c, n in sets.items()}
            names = self._cluster_sets.get(topic.cluster, [])
        queues, brokers = [], []
        for name in names:
            found = self._brokers.get((topic.cluster, name))
            if found is None or not found[1].addresses:
                continue
            queues.append(
                pb.QueueRoute(
                    broker_name=name,
                    read_queue_count=topic.queue_count,
                    write_queue_count=topic.queue_count,
                    perm=topic.perm,
                )
            )
            brokers.append(found[1])
        return pb.TopicRoute(
            topic=topic.name, message_type=topic.message_type, queues=queues, brokers=brokers
        )

    # The watch stream -----------------------------------------------------------------------
    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except (grpc.RpcError, MqmetaError) as error:
                if not self._stop.is_set():
                    log.info("route cache: watch stream ended (%s); reads fall back", _describe(error))
            except Exception:  # the nameserver must outlive any one failure here
                log.exception("route cache: watch stream failed; reads fall back")
            self._drop()
            self._stop.wait(RESUBSCRIBE_INTERVAL_S)

    def _follow(self) -> None:
        """Follows one stream: WatchBatched (the events waiting together in one message);
        Watch, one event per message, from a controller that answers it UNIMPLEMENTED."""
        meta = self.client.get_metadata(pb.GetMetadataRequest())  # points the client at a live node
        batched = self._batched
        self.watched = self._watch_target(meta.leader_grpc)
        stream = self.client.watch(
            keepalive_ms=(WATCH_KEEPALIVE_MS, WATCH_KEEPALIVE_TIMEOUT_MS),
            batched=batched,
            target=self.watched,
        )
        self._stream = stream
        self.stats["subscriptions"] += 1
        loaded = False
        try:
            for message in stream:
                if self._stop.is_set():
                    return
                if not loaded:  # the first message proves the subscription is registered
                    self._load()
                    loaded = True
                for event in message.events if batched else [message]:
                    self._apply(event)
                    self._tell(event)
        except grpc.RpcError as error:
            if batched and error.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                self._batched = False  # an older controller: Watch from the next subscription on
                log.info("route cache: the controller has no WatchBatched; following Watch")
            raise

    def _watch_target(self, leader: str) -> str:
        """A follower, the next one at each subscription (one that died is passed over at
        the next); the leader only when no other node is configured. Serving the stream
        cost the leader a gRPC message per applied entry, on the thread that answers the
        writers: with one writer, 1.0 of its 3.6 ms of CPU per write. A follower applies
        an entry once it learns the commit index, from the next append or heartbeat; the
        leader sends it at once after an entry that changed a broker set (a new master:
        `ControllerRaft._apply_entry`), so failovers reach this copy as promptly as from
        the leader, and a topic change within a heartbeat (its route is read from the
        controller until the reload anyway)."""
        followers = [a for a in self.client.addresses if a != leader] or list(self.client.addresses)
        self._subscribed += 1
        return followers[(self._subscribed - 1) % len(followers)]

    def _tell(self, event: pb.WatchEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a listener's bug must not end the copy's stream
                log.exception("route cache: a watch event listener failed")

    def _load(self) -> None:
        """Everything read after subscribing: a change after these reads comes on the stream."""
        listed = self.client.list_broker_sets(pb.ListBrokerSetsRequest())
        topics = self.client.list_topics(pb.ListTopicsRequest())
        with self._lock:
            self._topics = {t.name: t for t in topics.topics}
            self._dirty.clear()
            self._reload_all = 0
            self._awaited = {(s.cluster, s.broker_name) for s in listed.broker_sets} - set(self._brokers)
            self._loaded = True
            self._live = not self._awaited
            self.stats["topic_loads"] += 1

    def _apply(self, event: pb.WatchEvent) -> None:
        with self._lock:
            self.stats["events"] += 1
            if event.HasField("replica_info"):
                key = (event.replica_info.cluster, event.replica_info.broker_name)
                held = self._brokers.get(key)
                if held is None or event.index >= held[0]:
                    self._brokers[key] = (event.index, _broker_route(event.replica_info))
                    self._cluster_sets = None
                self._awaited.discard(key)
                if not self._awaited and self._loaded:
                    self._live = True
            elif event.kind == "topic":
                self._marks += 1
                self._dirty[event.name] = self._marks
            elif event.kind not in ("group", "config", "tiered"):
                # A kind this copy does not know (a newer controller): it may change a topic,
                # so no topic is answered until the next topic load (broker-set changes
                # carry replica_info, handled above whatever their kind).
                if event.kind not in self._unknown_kinds:
                    self._unknown_kinds.add(event.kind)
                    log.warning("route cache: unknown watch event kind %r; reloading topics", event.kind)
                self._marks += 1
                self._dirty.update(dict.fromkeys(self._topics, self._marks))
                self._reload_all = self._marks

    def _drop(self) -> None:
        with self._lock:
            self._live = False
            self._stream = None
            self._topics, self._brokers, self._dirty = {}, {}, {}
            self._cluster_sets, self._awaited = None, set()
            self._loaded, self._reload_all = False, 0
            self._generation += 1

    # Refresher -------------------------------------------------------------------------
    def _refresh_loop(self) -> None:
        pause_s = TOPIC_RELOAD_INTERVAL_S
        while not self._stop.wait(pause_s):
            started = time.monotonic()
            try:
                self._reload_dirty_topics()
            except (grpc.RpcError, MqmetaError) as error:
                log.info("route cache: topic reload failed (%s)", _describe(error))
            except Exception:
                log.exception("route cache: topic reload failed")
            took_s = time.monotonic() - started
            pause_s = max(TOPIC_RELOAD_INTERVAL_S, took_s / TOPIC_RELOAD_DUTY_MAX - took_s)

    def _reload_dirty_topics(self) -> None:
        """One ListTopics naming the topics marked since the last load (all of them when
        too many are marked): a bulk creation costs the leader the new topics, not the whole
        list again. The read is a barrier read made after the events that marked them, so
        it holds those changes; a named topic it lacks was deleted."""
        with self._lock:
            if not self._live or not self._dirty:
                return
            dirty, generation, reload_all = dict(self._dirty), self._generation, self._reload_all
        named = not reload_all and (
            sum(len(name) + NAME_ENCODING_BYTES for name in dirty) <= TOPIC_RELOAD_NAMES_BYTES_MAX
        )
        request = pb.ListTopicsRequest(names=sorted(dirty)) if named else pb.ListTopicsRequest()
        topics = self.client.list_topics(request)
        with self._lock:
            if generation != self._generation:
                return  # the copy was dropped meanwhile
            listed = {t.name: t for t in topics.topics}
            if named:
                for name in dirty:
                    if name in listed:
                        self._topics[name] = listed[name]
                    else:
                        self._topics.pop(name, None)
            else:
                self._topics = listed
                if self._reload_all == reload_all:
                    self._reload_all = 0
            for name, mark in dirty.items():  # a topic marked again meanwhile stays dirty
                if self._dirty.get(name) == mark:
                    del self._dirty[name]
            self.stats["topic_loads"] += 1
            self.stats["topics_read"] += len(listed)


def _broker_route(info: pb.ReplicaInfo) -> pb.BrokerRoute:
    return pb.BrokerRoute(
        cluster=info.cluster,
        broker_name=info.broker_name,
        master_broker_id=info.master_broker_id,
        master_address=info.master_address,
        master_epoch=info.master_epoch,
        addresses={r.broker_id: r.address for r in info.replicas},
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"  # type: ignore[attr-defined]
    return str(error)
