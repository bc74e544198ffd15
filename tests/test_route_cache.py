"""The standalone nameserver's route copy (controller/route_cache.py), on a real 3-node cluster.

Properties checked:
- once live, the copy answers every topic exactly as the controller's barrier read
  (GetTopicRoute) does: a topic on every broker set of its cluster, one on named sets,
  one in another cluster; a topic it does not know is not answered (falls back);
- a change is seen within a bound (ROUTE_CHANGE_BOUND_S, measured from the call that made
  it): a new replica's address, a new broker set (gained by the topics on every set),
  an updated topic, a deleted topic; while a topic's new definition is not loaded yet
  the copy does not answer it (never the old definition after the event arrived); an
  event of a kind the copy does not know stops it answering any topic until it has
  reloaded the topics (the stream stays open);
- a copy that lost its watch falls back: when the node its stream is on is SIGSTOPped
  (no reset ever arrives: keepalive must notice) it stops answering within
  LOST_WATCH_BOUND_S, and after kill -9 of that node too; it answers again, equal to the
  barrier read, once it has resubscribed to a live node;
- a copy whose node is cut off from the other controllers (the copy still reaches it: the
  stream stays open, and the node hears of no change) answers a change made after the
  cut within CUT_OFF_BOUND_S: the node ends its streams once it has not reached a leader
  for WATCH_UNCONFIRMED_MAX_S, and the copy follows another node;
- WatchBatched sends at most one message per pace (WATCH_BATCH_PACE_S) while events keep
  coming: topics created one write at a time arrive, in order, in fewer messages;
- stop() is prompt when no controller answers (the whole cluster stopping at once: the loop
  is retrying GetMetadata against gone controllers), and a closed client refuses calls at
  once with FAILED_PRECONDITION instead of retrying them until its deadline.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest
from mqmeta.chaos.net import ProxiedNetwork
from mqmeta.chaos.toxiproxy import ToxiproxyServer
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.wait import wait_for
from mqmeta.controller import operations as core_module
from mqmeta.controller import route_cache
from mqmeta.controller.route_cache import RouteCache

from mqmeta.client import ControllerClient
from mqmeta.errors import FailedPrecondition, NotFound, Unavailable
from mqmeta.pb import controller_pb2 as pb
from mqmeta.timing import WATCH_KEEPALIVE_MS, WATCH_KEEPALIVE_TIMEOUT_MS

pytestmark = pytest.mark.timeout(150)

ROUTE_CHANGE_BOUND_S = 3.0  # a watch delivery, plus one topic reload (TOPIC_RELOAD_INTERVAL_S)
LOST_WATCH_BOUND_S = (WATCH_KEEPALIVE_MS + WATCH_KEEPALIVE_TIMEOUT_MS) / 1000 + 2.0
LIVE_TIMEOUT_S = 20.0
# The node's checks (an interval, the unconfirmed span, a ReadIndex round that fails), the
# copy's resubscription (maybe to the cut-off node first: its snapshot's barrier fails
# after READ_INDEX_TIMEOUT_S and a barrier entry's timeout), a load, and slack.
CUT_OFF_BOUND_S = (
    core_module.WATCH_CONFIRM_INTERVAL_S
    + core_module.WATCH_UNCONFIRMED_MAX_S
    + core_module.READ_INDEX_TIMEOUT_S
    + 2 * route_cache.RESUBSCRIBE_INTERVAL_S
    + 10.0
)
STOP_BOUND_S = 1.5  # a retried GetMetadata would hold stop() for its 5 s deadline


def _register(client: ControllerClient, cluster: str, broker_name: str, index: int) -> None:
    client.call(
        "RegisterBroker",
        pb.RegisterBrokerRequest(
            cluster=cluster,
            broker_name=broker_name,
            check_code=f"{broker_name}-{index}",
            address=f"127.0.0.1:{21000 + index}",
        ),
    )


def _barrier_route(client: ControllerClient, name: str) -> pb.TopicRoute:
    return client.call("GetTopicRoute", pb.NameRequest(name=name))


def _seen_within(cache: RouteCache, name: str, expected, started: float, what: str) -> float:
    """Waits until the copy answers `name` with `expected` (None: does not answer);
    returns the seconds since `started`, which must be within ROUTE_CHANGE_BOUND_S."""
    wait_for(lambda: cache.route(name), ROUTE_CHANGE_BOUND_S + 5, what, until=lambda r: r == expected)
    elapsed = time.monotonic() - started
    assert elapsed <= ROUTE_CHANGE_BOUND_S, f"{what}: {elapsed:.2f} s"
    return elapsed


@pytest.fixture
def loaded(cluster):
    with cluster.client() as client:
        for i, (c, b) in enumerate([("C1", "bs-a"), ("C1", "bs-a"), ("C1", "bs-b"), ("C2", "bs-x")]):
            _register(client, c, b, i)
        client.call("CreateTopic", pb.TopicSpec(name="Everywhere", cluster="C1", queue_count=4))
        client.call("CreateTopic", pb.TopicSpec(name="Named", cluster="C1", broker_names=["bs-b"], perm="R"))
        client.call("CreateTopic", pb.TopicSpec(name="Other", cluster="C2", message_type="FIFO"))
        cache = RouteCache(ControllerClient(cluster.addresses)).start()
        try:
            wait_for(lambda: cache.live, LIVE_TIMEOUT_S, "the route copy to go live")
            yield cluster, client, cache
        finally:
            cache.stop()
            cache.client.close()


def test_the_copy_answers_as_the_barrier_read_and_follows_changes(loaded):
    cluster, client, cache = loaded
    for name in ("Everywhere", "Named", "Other"):
        assert cache.route(name) == _barrier_route(client, name), name
    assert len(cache.route("Everywhere").brokers) == 2
    assert cache.route("Missing") is None  # the barrier read answers (NOT_FOUND)
    seen: dict[str, float] = {}
    started = time.monotonic()
    _register(client, "C1", "bs-b", 10)  # a new replica address
    expected = _barrier_route(client, "Named")
    assert len(expected.brokers[0].addresses) == 2
    seen["new replica"] = _seen_within(cache, "Named", expected, started, "a new replica's address")
    started = time.monotonic()
    _register(client, "C1", "bs-c", 11)  # a new broker set: topics on every set gain it
    expected = _barrier_route(client, "Everywhere")
    assert [q.broker_name for q in expected.queues] == ["bs-a", "bs-b", "bs-c"]
    seen["new broker set"] = _seen_within(cache, "Everywhere", expected, started, "a new broker set")
    assert cache.route("Named") == _barrier_route(client, "Named")  # not on bs-c
    started = time.monotonic()
    client.call(
        "UpdateTopic", pb.TopicSpec(name="Named", cluster="C1", queue_count=16, broker_names=["bs-b"])
    )
    updated = _barrier_route(client, "Named")
    assert updated.queues[0].read_queue_count == 16
    seen["topic update"] = _seen_within(cache, "Named", updated, started, "an updated topic")
    started = time.monotonic()
    client.call("DeleteTopic", pb.NameRequest(name="Other"))
    with pytest.raises(NotFound):
        _barrier_route(client, "Other")
    seen["topic delete"] = _seen_within(cache, "Other", None, started, "a deleted topic")
    client.call("CreateTopic", pb.TopicSpec(name="Later", cluster="C1"))
    wait_for(lambda: cache.route("Later"), ROUTE_CHANGE_BOUND_S + 5, "a created topic answered")
    assert cache.route("Later") == _barrier_route(client, "Later")
    assert cache.stats["hits"] > 0 and cache.stats["fallbacks"] > 0
    # an event kind this copy does not know: no topic answered until the next topic load
    started = time.monotonic()
    cache._apply(pb.WatchEvent(index=1, kind="a-future-kind"))
    assert cache.route("Everywhere") is None and cache.live
    seen["unknown event kind"] = _seen_within(
        cache, "Everywhere", _barrier_route(client, "Everywhere"), started, "topics after an unknown kind"
    )
    print("route change -> seen by the copy (s):", {k: round(v, 3) for k, v in seen.items()})


def test_watch_batched_paces_its_messages_while_events_keep_coming(loaded):
    from mqmeta.controller.service import WATCH_BATCH_PACE_S

    cluster, client, _ = loaded
    names = [f"Paced{i}" for i in range(40)]
    watcher = ControllerClient(cluster.addresses)
    stream = watcher.watch(timeout_s=30, batched=True)
    messages: list[list[str]] = []
    snapshot = threading.Event()

    def follow() -> None:
        for message in stream:
            snapshot.set()
            messages.append([e.name for e in message.events if e.kind == "topic"])
            if names[-1] in messages[-1]:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        assert snapshot.wait(10), "the stream's snapshot"
        messages.clear()
        started = time.monotonic()
        for name in names:  # one write each: one applied entry, one event, each
            client.call("CreateTopic", pb.TopicSpec(name=name, cluster="C1"))
        elapsed_s = time.monotonic() - started
        thread.join(20)
        assert not thread.is_alive()
    finally:
        stream.cancel()
        watcher.close()
    topics = [n for m in messages for n in m]
    assert topics == names
    sent = len([m for m in messages if m])
    assert sent <= elapsed_s / WATCH_BATCH_PACE_S + 2, (sent, elapsed_s)


def test_watch_batched_sends_watchs_events_in_order_several_per_message(loaded):
    """On one node, WatchBatched and Watch carry the same events in the same order; the
    topics of one Write, applied together, come in fewer WatchBatched messages than events."""
    cluster, client, _ = loaded
    names = [f"Batched{i}" for i in range(24)]
    got: dict[str, list[tuple[int, str, str]]] = {"single": [], "batched": []}
    watcher = ControllerClient(cluster.addresses)  # both streams on its target node
    streams = {
        "single": watcher.watch(timeout_s=30),
        "batched": watcher.watch(timeout_s=30, batched=True),
    }
    messages: list[int] = []

    def follow(kind: str) -> None:
        for message in streams[kind]:
            events = list(message.events) if kind == "batched" else [message]
            if kind == "batched":
                messages.append(len([e for e in events if e.kind == "topic"]))
            got[kind] += [(e.index, e.kind, e.name) for e in events]
            if any(e.name == names[-1] for e in events):
                return

    threads = [threading.Thread(target=follow, args=(kind,), daemon=True) for kind in streams]
    for thread in threads:
        thread.start()
    try:
        wait_for(  # both subscribed: the snapshot of the three broker sets arrived
            lambda: min(len(v) for v in got.values()), 10, "both streams' snapshots", until=lambda n: n >= 3
        )
        ops = [pb.WriteOp(create_topic=pb.TopicSpec(name=n, cluster="C1")) for n in names]
        assert not [r for r in client.call("Write", pb.WriteBatch(writes=ops)).results if r.error_code]
        for thread in threads:
            thread.join(20)
        assert not any(t.is_alive() for t in threads)
    finally:
        for stream in streams.values():
            stream.cancel()
        watcher.close()
    assert got["batched"] == got["single"]
    assert [name for _, kind, name in got["batched"] if kind == "topic"] == names
    assert len([m for m in messages if m]) < len(names), messages


def test_listeners_get_each_event_after_the_copy_applied_it_and_one_that_raises_is_kept(loaded):
    """The nameserver's console takes its live events from the copy's stream (no stream of
    its own): every listener gets every event, after the copy marked the topic it names,
    and a listener that raises ends neither the stream nor the other listeners' events."""
    _, client, cache = loaded
    got: list[tuple[str, str, bool]] = []
    raised: list[int] = []

    def failing(event: pb.WatchEvent) -> None:
        raised.append(event.index)
        raise RuntimeError("a listener's bug")

    def recording(event: pb.WatchEvent) -> None:
        got.append((event.kind, event.name, event.name in cache._dirty))

    cache.add_listener(failing)
    cache.add_listener(recording)
    for name in ("Heard1", "Heard2"):
        client.call("CreateTopic", pb.TopicSpec(name=name, cluster="C1"))
    wait_for(
        lambda: [g for g in got if g[0] == "topic"],
        ROUTE_CHANGE_BOUND_S + 5,
        "both topic events at the listener",
        until=lambda seen: [name for _, name, _ in seen] == ["Heard1", "Heard2"],
    )
    assert all(marked for kind, _, marked in got if kind == "topic"), got  # applied before the listener
    assert len(raised) >= 2 and cache.live
    assert cache.stats["subscriptions"] == 1  # the raising listener did not end the stream


def _stream_node(cluster, cache: RouteCache) -> str:
    return next(n.id for n in cluster.layout.controllers if n.grpc == cache.watched)


def test_the_stream_is_on_a_follower_and_the_next_follower_after_it_ends(loaded):
    """The leader answers the writers; the copy's stream costs it nothing (a gRPC message
    per applied entry on the leader's loop was 1.0 of its 3.6 ms of CPU per write)."""
    cluster, client, cache = loaded
    leader = client.get_metadata(pb.GetMetadataRequest()).leader_grpc
    assert cache.watched and cache.watched != leader and cache.watched in cluster.addresses
    first = cache.watched
    cache._stream.cancel()  # the stream ends: the copy drops and subscribes again
    wait_for(lambda: cache.stats["subscriptions"] == 2 and cache.live, LIVE_TIMEOUT_S, "a new subscription")
    assert cache.watched not in (first, leader)


# A heartbeat of 1 s: a follower that learned a commit index only from the next heartbeat
# would show a broker-set change to its watchers up to 1 s late.
SLOW_HEARTBEAT = {
    "heartbeat_ms": 1000,
    "election_min_ms": 3500,
    "election_max_ms": 4500,
    "leader_fallback_ms": 3000,
}
PROMPT_CHANGE_BOUND_S = 0.4  # a change by the leader's append at once, and a watch delivery
PROMPT_CHANGES = 4


def test_a_broker_set_change_reaches_a_copy_on_a_follower_without_waiting_for_a_heartbeat(cluster_factory):
    """After an entry that changed a broker set (a new master, a new replica), the leader
    sends the followers its commit index at once, not with the next heartbeat: a copy
    following a follower sees each of several changes within PROMPT_CHANGE_BOUND_S (with
    the heartbeat's lag alone, all four within it would happen about once in 40 runs)."""
    cluster = cluster_factory(raft_settings=SLOW_HEARTBEAT).start()
    with cluster.client() as client:
        _register(client, "C1", "bs-a", 0)
        client.call("CreateTopic", pb.TopicSpec(name="Everywhere", cluster="C1"))
        cache = RouteCache(ControllerClient(cluster.addresses)).start()
        try:
            wait_for(lambda: cache.live, LIVE_TIMEOUT_S, "the route copy to go live")
            assert cache.watched != client.get_metadata(pb.GetMetadataRequest()).leader_grpc
            lags = []
            for k in range(1, PROMPT_CHANGES + 1):
                time.sleep(1.1)  # past a heartbeat: nothing else carries the commit index
                started = time.monotonic()
                _register(client, "C1", "bs-a", k)  # a new replica address
                expected = _barrier_route(client, "Everywhere")
                assert len(expected.brokers[0].addresses) == k + 1
                wait_for(
                    lambda: cache.route("Everywhere"),
                    5.0,
                    "the new replica",
                    until=lambda r, e=expected: r == e,
                )
                lags.append(time.monotonic() - started)
            assert max(lags) <= PROMPT_CHANGE_BOUND_S, lags
        finally:
            cache.stop()
            cache.client.close()


def test_a_copy_that_lost_its_watch_falls_back(loaded):
    cluster, client, cache = loaded
    for fault in ("pause", "kill"):
        node = _stream_node(cluster, cache)
        started = time.monotonic()
        getattr(cluster, fault)(node)
        try:
            wait_for(lambda: not cache.live, LOST_WATCH_BOUND_S + 5, f"the copy to drop after {fault} {node}")
            elapsed = time.monotonic() - started
            assert elapsed <= LOST_WATCH_BOUND_S, f"{fault}: the copy answered {elapsed:.2f} s"
            assert cache.route("Everywhere") is None  # the barrier read answers meanwhile
        finally:
            if fault == "pause":
                cluster.resume(node)
            else:
                cluster.restart(node)
        with ControllerClient(cluster.addresses) as fresh:
            wait_for(lambda: cache.live, LIVE_TIMEOUT_S, f"the copy to resubscribe after {fault}")
            for name in ("Everywhere", "Named", "Other"):
                assert cache.route(name) == _barrier_route(fresh, name), name
    assert cache.stats["subscriptions"] >= 3


def test_a_copy_on_a_node_cut_off_from_the_others_follows_another_node(tmp_path):
    """The copy's node loses its Raft links to both other controllers (ProxiedNetwork: the
    controllers dial each other through proxies; this process dials them directly, so
    its stream stays open). A replica registered after the cut reaches the copy within
    CUT_OFF_BOUND_S. Without the node's check the stream stays open and silent, and the
    copy answers the route as it was before the cut for as long as the cut lasts."""
    with (
        ToxiproxyServer("127.0.0.1:0") as toxiproxy,
        Cluster(tmp_path / "c") as cluster,
    ):
        network = ProxiedNetwork(cluster, toxiproxy.url)
        network.create()
        cluster.start()
        leader_id = cluster.leader_id()
        leader = cluster.node(leader_id).grpc
        with ControllerClient([leader]) as client:
            _register(client, "C1", "bs-a", 0)
            client.call("CreateTopic", pb.TopicSpec(name="Everywhere", cluster="C1"))
            cache = RouteCache(ControllerClient(cluster.addresses)).start()
            watcher: ControllerClient | None = None
            try:
                wait_for(lambda: cache.live, LIVE_TIMEOUT_S, "the route copy to go live")
                cut_off = next(c.id for c in cluster.layout.controllers if c.grpc == cache.watched)
                assert cut_off != leader_id
                others = [c.id for c in cluster.layout.controllers if c.id != cut_off]
                # A watcher of our own on that node, open before the cut: it must hear why it ends.
                watcher = ControllerClient([cache.watched])
                stream = watcher.watch(target=cache.watched, timeout_s=CUT_OFF_BOUND_S + 20)
                ended: list[grpc.RpcError] = []
                opened = threading.Event()  # its first message (bs-a): past the stream's opening barrier

                def follow() -> None:
                    try:
                        for _ in stream:
                            opened.set()
                    except grpc.RpcError as error:
                        ended.append(error)

                following = threading.Thread(target=follow, daemon=True)
                following.start()
                # Cut before that, the stream's own opening read fails instead (DEADLINE_EXCEEDED:
                # its barrier cannot commit), not the node's check this test is about.
                assert opened.wait(LIVE_TIMEOUT_S), "our stream on that node sent no first message"
                assert network.cut([(cut_off, other) for other in others]) == 4, "Raft, both ways, to each"
                started = time.monotonic()
                _register(client, "C1", "bs-a", 1)  # committed by the two others alone
                expected = _barrier_route(client, "Everywhere")
                assert len(expected.brokers[0].addresses) == 2
                wait_for(
                    lambda: cache.route("Everywhere"),
                    CUT_OFF_BOUND_S + 10,
                    "the copy answering the replica registered after the cut",
                    until=lambda route: route == expected,
                )
                elapsed = time.monotonic() - started
                assert elapsed <= CUT_OFF_BOUND_S, f"the copy answered the pre-cut route for {elapsed:.1f} s"
                assert cache.watched != cluster.node(cut_off).grpc
                following.join(timeout=CUT_OFF_BOUND_S)
                assert ended, "our stream on the cut-off node did not end"
                assert ended[0].code() == grpc.StatusCode.UNAVAILABLE, ended[0]
                assert "has not reached a leader" in ended[0].details(), ended[0].details()
            finally:
                if watcher is not None:
                    watcher.close()
                cache.stop()
                cache.client.close()


# The topic reload, driven by hand against a scripted controller (no threads, no cluster):
# what it asks for and which marks it clears. The cluster tests above cover the same copy live.
class ScriptedController:
    """Answers ListBrokerSets (none) and ListTopics from `topics`; runs `during` inside the
    next ListTopics, after its answer was read (an event arriving while a reload is under way)."""

    def __init__(self, *names: str) -> None:
        self.topics = {name: pb.Topic(name=name, cluster="C1", message_type="NORMAL") for name in names}
        self.asked: list[list[str]] = []
        self.during = None
        self.fail_next = False
        self.events: list[pb.WatchEvent] = []  # what watch() streams
        self.batches_unimplemented = False  # an older controller: WatchBatched is UNIMPLEMENTED
        self.watched: list[bool] = []  # `batched` of each watch()

    addresses = ["127.0.0.1:1"]  # RouteCache watches a follower of these

    def watch(self, keepalive_ms=None, batched=False, target=None):
        assert target in self.addresses
        self.watched.append(batched)
        if not batched:
            return iter(self.events)
        if self.batches_unimplemented:
            return _raising(Unimplemented())
        return iter([pb.WatchBatch(events=self.events)])

    def call(self, method: str, request):
        if method == "GetMetadata":
            return pb.ControllerMetadata()
        if method == "ListBrokerSets":
            return pb.ListBrokerSetsResponse()
        assert method == "ListTopics", method
        if self.fail_next:
            self.fail_next = False
            raise Unavailable("the leader is busy")
        names = list(request.names)
        self.asked.append(names)
        answer = pb.ListTopicsResponse(
            topics=[t for n, t in sorted(self.topics.items()) if not names or n in names]
        )
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return answer

    # the typed methods RouteCache calls (mqmeta.client.ControllerClient's)
    def get_metadata(self, request):
        return self.call("GetMetadata", request)

    def list_broker_sets(self, request):
        return self.call("ListBrokerSets", request)

    def list_topics(self, request):
        return self.call("ListTopics", request)


class Unimplemented(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self):
        return "Method not found!"


def _raising(error: Exception):
    raise error
    yield  # a generator: raises at its first next(), as a gRPC stream does


def _scripted_cache(*names: str) -> tuple[RouteCache, ScriptedController]:
    controller = ScriptedController(*names)
    cache = RouteCache(controller)  # type: ignore[arg-type]
    cache._load()  # what the first stream message does; no broker set: live at once
    assert cache.live and controller.asked == [[]]
    return cache, controller


def _topic_event(name: str) -> pb.WatchEvent:
    return pb.WatchEvent(index=1, kind="topic", name=name)


def test_a_topic_changed_during_the_first_load_is_not_answered_until_reloaded():
    """The first load runs when the stream's first message arrives, on the thread that
    applies the events: an event of a change made while the load ran waits in the stream and
    is applied after it, so the topic it names is not answered from the load's older read."""
    controller = ScriptedController("A", "B")
    snapshot = pb.WatchEvent(
        index=1, kind="snapshot", replica_info=pb.ReplicaInfo(cluster="C1", broker_name="b")
    )
    controller.events = [snapshot, _topic_event("A")]

    def change_a() -> None:  # after the load's ListTopics read its answer
        controller.topics["A"] = pb.Topic(name="A", cluster="C1", message_type="FIFO")

    controller.during = change_a
    cache = RouteCache(controller)  # type: ignore[arg-type]
    cache._follow()  # the snapshot, then the change's event; the stream then ends
    assert controller.asked == [[]] and cache.live
    assert cache.route("A") is None, "served the first load's older answer"
    assert cache.route("B").message_type == "NORMAL"
    cache._reload_dirty_topics()
    assert controller.asked[-1] == ["A"]
    assert cache.route("A").message_type == "FIFO"


def test_the_copy_follows_batched_events_and_an_older_controllers_watch():
    """The copy follows WatchBatched (several events per message, applied in order); a
    controller that answers it UNIMPLEMENTED is followed with Watch from the next
    subscription on, and the copy's listeners hear the same events either way."""
    controller = ScriptedController("A", "B")
    snapshot = pb.WatchEvent(
        index=1, kind="snapshot", replica_info=pb.ReplicaInfo(cluster="C1", broker_name="b")
    )
    controller.events = [snapshot, _topic_event("A"), _topic_event("B")]
    cache = RouteCache(controller)  # type: ignore[arg-type]
    heard: list[str] = []
    cache.add_listener(lambda event: heard.append(event.kind + ":" + event.name))
    cache._follow()
    assert controller.watched == [True] and cache.live
    assert heard == ["snapshot:", "topic:A", "topic:B"]
    assert cache.route("A") is None and cache.route("B") is None  # both marked, in one message
    older = ScriptedController("A")
    older.events, older.batches_unimplemented = [snapshot, _topic_event("A")], True
    cache = RouteCache(older)  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError):
        cache._follow()
    cache._follow()  # the next subscription
    assert older.watched == [True, False] and cache.live and cache.route("A") is None


def test_a_reload_reads_only_the_changed_topics_and_drops_the_deleted_ones():
    cache, controller = _scripted_cache("A", "B", "C")
    controller.topics["A"] = pb.Topic(name="A", cluster="C1", message_type="FIFO")
    del controller.topics["C"]
    cache._apply(_topic_event("A"))
    cache._apply(_topic_event("C"))
    assert cache.route("A") is None and cache.route("C") is None  # changed: not answered
    cache._reload_dirty_topics()
    assert controller.asked[-1] == ["A", "C"]  # not the whole list again
    assert cache.route("A").message_type == "FIFO"
    assert cache.route("C") is None and "C" not in cache._topics
    assert cache.route("B").message_type == "NORMAL"
    assert cache.stats["topics_read"] == 1


def test_a_reload_naming_more_than_its_request_bound_lists_every_topic(monkeypatch):
    """The names are bounded in bytes, not in count: gRPC refuses a request over 4 MiB."""
    cache, controller = _scripted_cache("Aaaa", "Bbbb", "Cccc")
    monkeypatch.setattr(
        route_cache, "TOPIC_RELOAD_NAMES_BYTES_MAX", 2 * (4 + route_cache.NAME_ENCODING_BYTES)
    )
    for name in ("Aaaa", "Bbbb"):
        cache._apply(_topic_event(name))
    cache._reload_dirty_topics()
    assert controller.asked[-1] == ["Aaaa", "Bbbb"]  # exactly at the bound: named
    for name in ("Aaaa", "Bbbb", "Cccc"):
        cache._apply(_topic_event(name))
    cache._reload_dirty_topics()
    assert controller.asked[-1] == []  # past it: every topic
    assert all(cache.route(name) is not None for name in ("Aaaa", "Bbbb", "Cccc"))


def test_a_topic_changed_again_during_its_reload_stays_unanswered():
    cache, controller = _scripted_cache("A", "B")
    cache._apply(_topic_event("A"))

    def changed_meanwhile() -> None:  # the reload's answer may predate this change
        controller.topics["A"] = pb.Topic(name="A", cluster="C1", message_type="FIFO")
        cache._apply(_topic_event("A"))

    controller.during = changed_meanwhile
    cache._reload_dirty_topics()
    assert cache.route("A") is None, "answered a definition older than the last event"
    cache._reload_dirty_topics()
    assert cache.route("A").message_type == "FIFO"


def test_an_unknown_event_kind_makes_the_next_reload_list_every_topic_even_after_a_failure():
    cache, controller = _scripted_cache("A", "B")
    cache._apply(pb.WatchEvent(index=1, kind="a-future-kind"))
    assert cache.route("A") is None and cache.route("B") is None
    controller.fail_next = True
    with pytest.raises(Unavailable):
        cache._reload_dirty_topics()
    controller.topics["D"] = pb.Topic(name="D", cluster="C1")  # made by the unknown kind, say
    cache._reload_dirty_topics()
    assert controller.asked[-1] == []  # every topic
    assert cache.route("A") is not None and cache.route("D") is not None
    cache._apply(_topic_event("B"))
    cache._reload_dirty_topics()
    assert controller.asked[-1] == ["B"]  # named again once the full reload is done


def _refused_address() -> str:
    """A loopback address nothing listens on (a stopped controller's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_stop_is_prompt_while_the_copy_retries_gone_controllers():
    cache = RouteCache(ControllerClient([_refused_address(), _refused_address()])).start()
    time.sleep(0.5)  # the watch loop is inside GetMetadata's retries (5 s deadline)
    started = time.monotonic()
    cache.stop()
    took_s = time.monotonic() - started
    assert took_s < STOP_BOUND_S, f"stop() took {took_s:.2f} s"
    assert not any(thread.is_alive() for thread in cache._threads)


def test_a_closed_client_refuses_calls_at_once():
    client = ControllerClient([_refused_address()])
    client.close()
    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match="closed"):
        client.get_metadata(pb.GetMetadataRequest())
    assert time.monotonic() - started < 0.5
