"""The controller node's domain operations, independent of gRPC: a threaded service over
the Raft node (ControllerOperations; the pure rules are state_machine.py's apply).

Rules for where a call is served:
- Calls that depend on liveness (register, heartbeat, elect, alter SyncStateSet,
  sync-state data, clean broker data) are served by the leader only; a follower
  raises NotLeader with the leader's gRPC address.
- Every other write may go to any node: pysyncobj forwards it to the leader.
- Reads are linearizable: a leader whose lease covers the read answers from its state at
  once (pysyncobj_compat.ReadIndex says what the lease rests on); otherwise ReadIndex
  confirms the leader's commit index with one round to a majority (no log entry) and the
  node waits until it has applied it; when that cannot be confirmed, a barrier entry
  committed through the log does the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from mqmeta.controller import replicator_leases, replicator_liveness
from mqmeta.controller.commands import (
    AlterSyncStateSet,
    Barrier,
    CleanBrokerData,
    Command,
    ElectMaster,
    RegisterBroker,
    ReplicatorExpire,
    ReplicatorHeartbeat,
)
from mqmeta.controller.liveness import Heartbeat, Liveness, listener_gone
from mqmeta.controller.pysyncobj_compat import ReadNotConfirmed
from mqmeta.controller.raft_node import ControllerRaft, Peer, Proposer, RaftSettings, not_committed
from mqmeta.controller.state_machine import (
    ControllerState,
    broker_route,
    replica_view,
    topic_route,
)

from mqmeta.clock import now_ms, wall_ms
from mqmeta.errors import DeadlineExceeded, MqmetaError, NotFound, NotLeader, Unavailable, error_from_code

log = logging.getLogger(__name__)
Json = dict[str, Any]

SCAN_INTERVAL_S = 0.1
ELECTIONS_IN_FLIGHT_MAX = 16  # elections the liveness scan runs at once (one thread each)
WATCH_QUEUE_MAX = 1024
WATCH_STREAMS_MAX = 10_000  # per node; each is a queue on the event loop, not a thread
# While a node serves watch streams it confirms, every WATCH_CONFIRM_INTERVAL_S, that it
# still reaches a leader (WatchHub.confirm_contact: a lease or a ReadIndex round, no log
# entry); after WATCH_UNCONFIRMED_MAX_S without one it ends its streams, so their watchers
# follow another node. A node cut off from the others hears of no change: its streams went
# silent, and a route copy on one answered from what it held when the cut came.
WATCH_CONFIRM_INTERVAL_S = 1.0
WATCH_UNCONFIRMED_MAX_S = 3.0  # past any election (election_max_ms 600 by default)
READ_INDEX_TIMEOUT_S = 1.5  # then the read falls back to a barrier entry (a round fails after 1 s)
LEADERSHIP_TRANSFER_TIMEOUT_S = 2.0  # a stopping leader waits this long for a successor

Encode = Callable[[Json], Any]


# Linearizable reads by ReadIndex (pysyncobj_compat.ReadIndex) instead of a barrier entry.
# A read confirmed at index i reads the live state, which the Raft thread may be changing
# beside it: ControllerState.commit swaps each key's value in one store, so a read finds
# the old value or the new one, never none. False: every read commits a barrier entry.
READ_INDEX_READS = True


class WatchSubscription:
    """One watch stream: its filter and its queue of (event, encoded event), on the loop."""

    def __init__(self, cluster: str, broker_name: str) -> None:
        self.cluster = cluster
        self.broker_name = broker_name
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=WATCH_QUEUE_MAX)

    def wants(self, event: Json) -> bool:
        """A stream that names a broker set gets that set's events only (what a broker
        agent watches); topic and group events name no broker set, so they go to the
        streams that name none (config events name no cluster either). Otherwise every
        broker of a 300-set cluster would be sent every topic created (a batch of 1,024
        topics: 921,600 messages)."""
        if self.cluster and event.get("cluster") not in (self.cluster, ""):
            return False
        return not self.broker_name or event.get("broker_name") == self.broker_name

    def cut_off(self, error: MqmetaError | None = None) -> None:
        """Ends the stream: its queue is emptied and ends with None (it fell behind) or
        with `error` (the reason it ends); the client resubscribes and starts again from a
        snapshot."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(error)


class WatchHub:
    """Fans applied events out to watch streams; a slow watcher is cut off, not waited on.

    The Raft thread hands each applied entry's events to the server's event loop through
    the loop's LoopFutures (nothing is published before attach, nor while no stream is
    open), in the same wake-up as the answers to the writers of that tick; there each
    event is encoded once and queued to every stream that wants it. Subscriptions live
    on the loop only, so they need no lock."""

    def __init__(self, bridge_for: Callable[[asyncio.AbstractEventLoop], LoopFutures] | None = None) -> None:
        self._bridge_for = bridge_for or LoopFutures
        self._bridge: LoopFutures | None = None
        self._encode: Encode = lambda event: event
        self._subscribers: list[WatchSubscription] = []
        self._confirm: Callable[[], Awaitable[bool]] | None = None
        self._confirming: asyncio.Task | None = None

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        encode: Encode,
        confirm: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """`confirm`: whether this node reaches a leader now (None: never checked)."""
        self._bridge = self._bridge_for(loop)
        self._encode = encode
        self._confirm = confirm

    def subscribe(self, cluster: str, broker_name: str) -> WatchSubscription:
        if len(self._subscribers) >= WATCH_STREAMS_MAX:
            raise Unavailable(
                f"this controller node serves {WATCH_STREAMS_MAX} watch streams already; "
                "retry later or watch another node"
            )
        subscription = WatchSubscription(cluster, broker_name)
        self._subscribers.append(subscription)
        if self._confirm is not None and (self._confirming is None or self._confirming.done()):
            self._confirming = asyncio.get_running_loop().create_task(self.confirm_contact(self._confirm))
        return subscription

    def unsubscribe(self, subscription: WatchSubscription) -> None:
        self._subscribers = [s for s in self._subscribers if s is not subscription]
        if not self._subscribers and self._confirming is not None:
            self._confirming.cancel()  # no stream left to confirm for (none pending at a stop)
            self._confirming = None

    @property
    def streams(self) -> int:
        return len(self._subscribers)

    async def confirm_contact(self, confirm: Callable[[], Awaitable[bool]]) -> None:
        """While streams are open: every WATCH_CONFIRM_INTERVAL_S, whether this node still
        reaches a leader; after WATCH_UNCONFIRMED_MAX_S without, every stream ends with
        UNAVAILABLE (see WATCH_CONFIRM_INTERVAL_S). One check per node, whatever the number
        of streams."""
        loop = asyncio.get_running_loop()
        confirmed_at = loop.time()
        while self._subscribers:
            await asyncio.sleep(WATCH_CONFIRM_INTERVAL_S)
            try:
                reached = await confirm()
            except Exception:  # noqa: BLE001 - a node stopping meanwhile: not confirmed, never a dead task
                log.debug("confirming a leader for the watch streams failed", exc_info=True)
                reached = False
            if reached:
                confirmed_at = loop.time()
                continue
            unconfirmed_s = loop.time() - confirmed_at
            if unconfirmed_s <= WATCH_UNCONFIRMED_MAX_S or not self._subscribers:
                continue
            error = Unavailable(
                f"this controller node has not reached a leader for {unconfirmed_s:.1f} s "
                "(cut off from the others?): its watch streams end; watch another node"
            )
            log.warning("ending %d watch streams: %s", len(self._subscribers), error.message)
            for subscription in list(self._subscribers):
                self.unsubscribe(subscription)
                subscription.cut_off(error)

    def publish(self, index: int, events: list[Json]) -> None:
        bridge = self._bridge
        if bridge is None or not events or not self._subscribers:
            # No stream to wake the loop for (a follower nobody watches: every entry's
            # events cost its loop a wake-up). A stream that subscribes after this check
            # reads its snapshot after the subscription, so after this entry's apply.
            return
        bridge.post(self._dispatch, index, events)

    def _dispatch(self, index: int, events: list[Json]) -> None:
        stamped = [dict(event, index=index) for event in events]
        encoded: dict[int, Any] = {}
        for subscription in list(self._subscribers):
            for position, event in enumerate(stamped):
                if not subscription.wants(event):
                    continue
                if position not in encoded:
                    encoded[position] = self._encode(event)
                try:
                    subscription.queue.put_nowait((event, encoded[position]))
                except asyncio.QueueFull:
                    self.unsubscribe(subscription)
                    subscription.cut_off()
                    break


class LoopFutures:
    """Completes asyncio futures on one event loop from futures that other threads set,
    and runs the calls other threads post to it (WatchHub.publish), waking the loop once
    per burst instead of once per future or call.

    asyncio.wrap_future wakes the loop from the thread that sets the result, one
    call_soon_threadsafe (a write to the loop's self-pipe, with a GIL hand-off) per
    future. The Raft thread sets every result of a committed batch: when 900 watch
    streams opened at once, it made 900 such writes per barrier, each waiting for the
    GIL behind the busy loop, and missed its own heartbeats (leader changes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # calls, in order
        self._wake_scheduled = False

    def wrap(self, future: Future) -> asyncio.Future:
        """An asyncio future (of this loop) that gets `future`'s outcome; call on the loop."""
        waiter = self._loop.create_future()
        future.add_done_callback(lambda done: self.post(_complete, done, waiter))
        return waiter

    def post(self, call: Callable[..., None], *args: Any) -> None:  # any thread
        """Runs call(*args) on the loop, after the calls posted before it."""
        with self._lock:
            self._ready.append((call, args))
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    def _drain(self) -> None:  # on the loop
        with self._lock:
            ready, self._ready, self._wake_scheduled = self._ready, [], False
        for call, args in ready:
            try:
                call(*args)
            except Exception:  # one failing call (a watch dispatch) must not drop the rest
                log.exception("a call posted to the server's loop failed: %r", call)


async def await_within(waiter: asyncio.Future, timeout_s: float) -> Any:
    """`waiter`'s outcome, or TimeoutError once `timeout_s` has passed (`waiter` then holds
    that TimeoutError: a late outcome finds it done and is dropped, as _deliver and
    _complete do). asyncio.wait_for, but the caller resumes in the loop turn after the
    outcome is set, not one turn later: wait_for waits on a second future of its own,
    which the first one's done-callback completes in a turn between (a loop iteration,
    with its epoll call, per metadata write and per confirmed read)."""
    timer = asyncio.get_running_loop().call_later(timeout_s, _time_out, waiter)
    try:
        return await waiter
    finally:
        timer.cancel()


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _deliver(waiter: asyncio.Future, outcome: Json | MqmetaError) -> None:
    """On the loop: `waiter` gets `outcome`, unless its caller stopped waiting."""
    if waiter.done():
        return
    if isinstance(outcome, MqmetaError):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)


def _complete(future: Future, waiter: asyncio.Future) -> None:
    """On the loop: `waiter` gets the outcome of `future` (done), unless its caller stopped
    waiting (a timeout, a client gone)."""
    if waiter.done():
        return
    error = future.exception()
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(future.result())


class ControllerOperations:
    def __init__(self, node_id: str, peers: list[Peer], data_dir, settings: RaftSettings) -> None:
        self.node_id = node_id
        self.peers = peers
        self.self_peer = next(p for p in peers if p.id == node_id)
        self.settings = settings
        self._bridges: dict[asyncio.AbstractEventLoop, LoopFutures] = {}  # one per server loop
        self.watch_hub = WatchHub(self._loop_futures)  # events share the loop's wake-ups
        self.liveness = Liveness()
        self.workers = replicator_liveness.WorkerLiveness()  # replicator workers' heartbeats
        self._expiring = threading.Event()  # a replicator_expire proposal is in flight
        self.raft = ControllerRaft(
            node_id, self.self_peer.raft, peers, data_dir, settings, self.watch_hub.publish
        )
        self.proposer = Proposer(self.raft, settings, self.raft.wake_tick)
        self.raft.attach_pump(self.proposer.pump)
        self._grpc_by_raft = {p.raft: p.grpc for p in peers}
        self._stop = threading.Event()
        self._electing: set[tuple[str, str]] = set()
        self._scanner = threading.Thread(target=self._scan_loop, name="liveness", daemon=True)
        self._scanner.start()

    # Plumbing ---------------------------------------------------------------------
    @property
    def state(self) -> ControllerState:
        return self.raft.state

    def config(self) -> Json:
        return self.state.config()

    def leader_grpc(self) -> str:
        return self._grpc_by_raft.get(self.raft.leader_raft_address(), "")

    def require_leader(self) -> None:
        if not self.raft.is_leader():
            leader = self.leader_grpc()
            where = f"the leader is {leader}" if leader else "no leader is known yet"
            raise NotLeader(f"controller {self.node_id} is not the leader; {where}", leader=leader)

    def propose(self, command: Command, timeout_s: float = 5.0) -> Json:
        result = self.proposer.propose(command, timeout_s)
        if not result.get("ok"):
            raise error_from_code(result["code"], result["message"])
        return result

    async def propose_many_async(
        self, commands: list[Command], timeout_s: float = 5.0
    ) -> list[Json | MqmetaError]:
        """Independent writes sharing the group commit, one result or error each; for a
        coroutine on the server's event loop (no thread waits)."""
        group = self.proposer.submit_group(commands)
        waiter = self._loop_futures(asyncio.get_running_loop()).wrap(group.future)
        try:
            settled = await await_within(waiter, timeout_s)
        except TimeoutError:
            settled = group.outcomes()  # those committed in time are reported as such
        return _group_outcomes(commands, settled, timeout_s)

    def read_barrier(self, timeout_s: float = 5.0) -> ControllerState:
        """The state as of a linearizable read: confirmed by ReadIndex (no log entry), or,
        when that cannot be (no leader known, leadership changing, a round that timed
        out), by a barrier entry committed through the log, as before."""
        started = time.monotonic()
        if READ_INDEX_READS:
            if self.raft.lease_read_index() is not None:
                return self.state
            try:
                self.raft.read_index().result(timeout=min(timeout_s, READ_INDEX_TIMEOUT_S))
                return self.state
            except (ReadNotConfirmed, TimeoutError):
                pass
        self.proposer.propose(Barrier(), max(0.05, timeout_s - (time.monotonic() - started)))
        return self.state

    async def propose_async(self, command: Command, timeout_s: float = 5.0) -> Json:
        """propose() for a coroutine on the server's event loop: no thread waits. The
        outcome goes from the Raft thread straight to the loop (LoopFutures.post), without
        a concurrent Future in between (its Condition, lock and callbacks cost more than
        the rest of the hand-over)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        post = self._loop_futures(loop).post
        self.proposer.submit_to(command, lambda outcome: post(_deliver, waiter, outcome))
        try:
            result = await await_within(waiter, timeout_s)
        except TimeoutError:
            raise not_committed(command, timeout_s) from None
        if not result.get("ok"):
            raise error_from_code(result["code"], result["message"])
        return result

    def _loop_futures(self, loop: asyncio.AbstractEventLoop) -> LoopFutures:
        bridge = self._bridges.get(loop)
        if bridge is None:
            bridge = self._bridges[loop] = LoopFutures(loop)
        return bridge

    async def reaches_leader(self, timeout_s: float = READ_INDEX_TIMEOUT_S) -> bool:
        """Whether this node reaches a leader of its term now: its own lease as leader, or
        a ReadIndex round confirmed (a follower's asks the leader). Writes no log entry."""
        if self.raft.lease_read_index() is not None:
            return True
        waiter = self._loop_futures(asyncio.get_running_loop()).wrap(self.raft.read_index())
        try:
            await await_within(waiter, timeout_s)
        except (ReadNotConfirmed, TimeoutError):
            return False
        return True

    async def read_barrier_async(self, timeout_s: float = 5.0) -> ControllerState:
        """read_barrier() for a coroutine on the server's event loop: no thread waits."""
        started = time.monotonic()
        if READ_INDEX_READS:
            if self.raft.lease_read_index() is not None:
                return self.state  # the leader's lease: no round, no hand-off to the tick
            waiter = self._loop_futures(asyncio.get_running_loop()).wrap(self.raft.read_index())
            try:
                await await_within(waiter, min(timeout_s, READ_INDEX_TIMEOUT_S))
                return self.state
            except (ReadNotConfirmed, TimeoutError):
                pass
        await self.propose_async(Barrier(), max(0.05, timeout_s - (time.monotonic() - started)))
        return self.state

    def step_down(self, timeout_s: float = LEADERSHIP_TRANSFER_TIMEOUT_S) -> None:
        """Before stopping (SIGTERM): a leader hands its role to a caught-up follower, so
        writes pause for one vote rather than an election timeout. Bounded; a node that
        could not hand over stops anyway (the others elect after their timeout)."""
        if self.raft.is_leader():
            # Writes in flight finish first, so the successor holds every entry (pysyncobj
            # hands over only to a follower that does) and none is lost in the change.
            drained = self.proposer.drain(timeout_s / 2)
            handed = self.raft.hand_over_leadership(timeout_s / 2)
            self.proposer.stop()  # the writes still queued fail now (never proposed): retried elsewhere
            log.info(
                "leadership %s before stopping (writes in flight %s)",
                "handed over" if handed else "NOT handed over",
                "finished" if drained else "still unanswered",
            )

    def close(self) -> None:
        self._stop.set()
        self._scanner.join(timeout=2)
        self.proposer.stop()
        self.raft.close()

    # Liveness-dependent calls (leader only) -----------------------------------------
    def alive_ids(self, cluster: str, broker_name: str) -> Json:
        """Who is alive by this leader's liveness (what an election would be given)."""
        return self._alive(cluster, broker_name)

    def _alive(self, cluster: str, broker_name: str) -> Json:
        bs = self.state.broker_set(cluster, broker_name)
        ids = [int(i) for i in bs["replicas"]] if bs else []
        beats = self.liveness.alive(
            cluster, broker_name, ids, now_ms(), self.state.config_value("broker_dead_after_ms")
        )
        return {
            str(i): {"epoch": b.epoch, "max_offset": b.max_offset, "priority": b.priority}
            for i, b in beats.items()
        }

    def _without_a_gone_master(self, cluster: str, broker_name: str, alive: Json) -> Json:
        """A slave could not reach its master: if the master's port refuses connections its
        process is gone (liveness.listener_gone), so it is dead now rather than after
        dead-after. This keeps the lease argument (broker_agent/ha.py): a gone process
        accepts no write, whatever its lease said."""
        bs = self.state.broker_set(cluster, broker_name)
        if bs is None:
            return alive
        master = str(bs["master_broker_id"])
        if master not in alive or master not in bs["replicas"]:
            return alive
        address = bs["replicas"][master]["address"]
        if not listener_gone(address):
            return alive
        log.warning(
            "master %s of %s/%s at %s refuses connections: its process is gone",
            master,
            cluster,
            broker_name,
            address,
        )
        return {i: info for i, info in alive.items() if i != master}

    def register_broker(self, command: RegisterBroker) -> Json:
        self.require_leader()
        result = self.propose(dataclasses.replace(command, now_ms=wall_ms()))
        key = (command.cluster, command.broker_name, result["broker_id"])
        self.liveness.record(key, Heartbeat(seen_ms=now_ms(), priority=command.election_priority))
        return dict(result, replica_info=self._with_alive(result["replica_info"]))

    def heartbeat(self, request: Json) -> Json:
        self.require_leader()
        bs = self.state.broker_set(request["cluster"], request["broker_name"])
        if bs is None or str(request["broker_id"]) not in bs["replicas"]:
            raise NotFound(
                f"broker {request['broker_id']} of {request['cluster']}/"
                f"{request['broker_name']} is not registered; register first"
            )
        self.liveness.record(
            (request["cluster"], request["broker_name"], request["broker_id"]),
            Heartbeat(
                seen_ms=now_ms(),
                epoch=request["epoch"],
                max_offset=request["max_offset"],
                confirm_offset=request["confirm_offset"],
                priority=request["election_priority"],
            ),
        )
        return {
            "master_broker_id": bs["master_broker_id"],
            "master_epoch": bs["master_epoch"],
            "sync_state_set_epoch": bs["sync_state_set_epoch"],
            "lease_ms": self.state.config_value("lease_ms"),
        }

    def elect_master(self, command: ElectMaster, master_unreachable: bool = False) -> Json:
        """Proposes the election with this leader's view of who is alive; with
        `master_unreachable` (a slave could not reach the master), a master whose port
        refuses connections counts as dead now."""
        self.require_leader()
        term = self.raft.current_term()  # before the view: see state_machine.stale_view
        alive = self._alive(command.cluster, command.broker_name)
        if master_unreachable:
            alive = self._without_a_gone_master(command.cluster, command.broker_name, alive)
        command = dataclasses.replace(command, now_ms=wall_ms(), alive=alive, leader_term=term)
        result = self.proposer.propose(command, 5.0)
        if not result.get("ok"):
            raise error_from_code(result["code"], result["message"])
        return self._with_alive(result["replica_info"])

    def alter_sync_state_set(self, command: AlterSyncStateSet) -> Json:
        self.require_leader()
        command = dataclasses.replace(
            command,
            leader_term=self.raft.current_term(),  # before the view: see state_machine.stale_view
            now_ms=wall_ms(),
            alive=self._alive(command.cluster, command.broker_name),
        )
        return self._with_alive(self.propose(command)["replica_info"])

    def clean_broker_data(self, command: CleanBrokerData) -> Json:
        self.require_leader()
        command = dataclasses.replace(
            command,
            leader_term=self.raft.current_term(),  # before the view: see state_machine.stale_view
            now_ms=wall_ms(),
            alive=self._alive(command.cluster, command.broker_name),
        )
        result = self.propose(command)
        for broker_id in result["cleaned_broker_ids"]:
            self.liveness.forget((command.cluster, command.broker_name, broker_id))
        return result

    def replica_info(self, cluster: str, broker_name: str) -> Json:
        self.require_leader()
        state = self.read_barrier()
        bs = state.broker_set(cluster, broker_name)
        if bs is None or not bs["replicas"]:
            raise NotFound(
                f"broker set {cluster}/{broker_name} is not registered; check the cluster and broker name"
            )
        return self._with_alive(replica_view(bs))

    def _with_alive(self, view: Json) -> Json:
        alive = self._alive(view["cluster"], view["broker_name"]) if self.raft.is_leader() else {}
        for broker_id, replica in view["replicas"].items():
            replica["alive"] = broker_id in alive
        return view

    def broker_sets(self, cluster: str) -> list[Json]:
        state = self.read_barrier()
        return [self._with_alive(replica_view(bs)) for bs in state.broker_sets(cluster)]

    # Calls any node serves ----------------------------------------------------------
    def topic_route(self, name: str) -> Json:
        state = self.read_barrier()
        return topic_route(state, name)

    async def topic_route_async(self, name: str) -> Json:
        return topic_route(await self.read_barrier_async(), name)

    async def cluster_routes_async(self, cluster: str) -> list[Json]:
        return [broker_route(bs) for bs in (await self.read_barrier_async()).broker_sets(cluster)]

    def metadata(self) -> Json:
        status = self.raft.status()
        leader_raft = self.raft.leader_raft_address()
        nodes = []
        for peer in self.peers:
            if peer.id == self.node_id:
                healthy = True
            else:
                healthy = status.get(f"partner_node_status_server_{peer.raft}") == 2
            role = "leader" if peer.raft == leader_raft else ("follower" if leader_raft else "unknown")
            nodes.append(
                {"id": peer.id, "grpc": peer.grpc, "raft": peer.raft, "role": role, "healthy": healthy}
            )
        leader = next((p for p in self.peers if p.raft == leader_raft), None)
        return {
            "node_id": self.node_id,
            "leader_id": leader.id if leader else "",
            "leader_grpc": leader.grpc if leader else "",
            "term": status["raft_term"],
            "commit_index": status["commit_idx"],
            "last_applied": status["last_applied"],
            "nodes": nodes,
            "state_digest": self.state.digest,
        }

    # The controller's own elections --------------------------------------------------
    def _scan_loop(self) -> None:
        while not self._stop.wait(SCAN_INTERVAL_S):
            try:
                self._scan_once()
            except MqmetaError as exc:
                log.warning("liveness scan: %s", exc)
            except Exception:  # the scanner must survive anything one round throws
                log.exception("liveness scan failed")

    def _scan_once(self) -> None:
        now = now_ms()
        is_leader = self.raft.is_leader()
        self.liveness.on_leadership(is_leader, now)
        self.workers.on_leadership(is_leader, now)
        if is_leader:
            self._expire_silent_workers(now)
        dead_after_ms = self.state.config_value("broker_dead_after_ms")
        if not is_leader or self.liveness.in_grace(now, dead_after_ms):
            return
        for bs in self.state.broker_sets():
            if len(self._electing) >= ELECTIONS_IN_FLIGHT_MAX:
                return  # the rest wait for the next scan (a storm must not start 300 threads)
            key = (bs["cluster"], bs["broker_name"])
            master = bs["master_broker_id"]
            if key in self._electing or bs["master_epoch"] == 0:
                continue
            alive = self._alive(*key)
            if master and str(master) in alive:
                continue
            if not master and not any(str(i) in alive for i in bs["sync_state_set"]):
                continue
            self._electing.add(key)
            threading.Thread(target=self._elect_dead, args=(key,), daemon=True).start()

    # Replicator workers (controller.replicator_liveness) ------------------------------------
    def replicator_heartbeat(self, request: Json) -> list[Json]:
        """Records a worker's heartbeat; proposes what it changes; its granted leases."""
        self.require_leader()
        worker_id = request["worker_id"]
        if request["leaving"]:
            self.workers.forget(worker_id)
            if self.state.get(replicator_leases.worker_key(worker_id)) is not None:
                self.propose(ReplicatorExpire(worker_ids=[worker_id], trigger="leaving"))
            return []
        beat = replicator_liveness.WorkerBeat(
            seen_ms=now_ms(),
            seen_index=self.raft.raftLastApplied,
            dead_after_ms=request["dead_after_ms"],
            running={r["task"]: r["epoch"] for r in request["running"]},
            stats={r["task"]: r for r in request["running"]},
        )
        self.workers.record(worker_id, beat)
        if replicator_liveness.needs_proposal(self.state, request):
            command = ReplicatorHeartbeat(
                worker_id=request["worker_id"],
                incarnation=request["incarnation"],
                lease_ms=request["lease_ms"],
                dead_after_ms=request["dead_after_ms"],
                rules=request["rules"],
                tasks=[list(t) for t in request["tasks"]],
            )
            self.propose(command)
        state = self.state
        workers = replicator_leases.live_workers(state)
        return [
            replicator_liveness.lease_view(record)
            for _, record in state.with_prefix(replicator_leases.TASK_PREFIX)
            if replicator_liveness.granted(record, worker_id, workers, self.workers.beat)
        ]

    def replicator_status(self, rule: str) -> Json:
        self.require_leader()  # the tasks' stats are in this leader's memory
        return replicator_liveness.status(self.read_barrier(), self.workers.beat, rule)

    def _expire_silent_workers(self, now: int) -> None:
        if self._expiring.is_set():
            return
        term = self.raft.current_term()  # before the view: see state_machine.stale_view
        gone = self.workers.silent(replicator_leases.live_workers(self.state), now)
        if not gone:
            return
        self._expiring.set()
        threading.Thread(target=self._expire, args=(gone, term), name="expire-workers", daemon=True).start()

    def _expire(self, gone: list[str], term: int) -> None:
        try:
            result = self.propose(ReplicatorExpire(worker_ids=gone, trigger="silent", leader_term=term))
            log.warning("replicator workers %s expired (silent past their dead-after)", result["expired"])
        except MqmetaError as exc:
            log.warning("could not expire replicator workers %s: %s", gone, exc)
        finally:
            self._expiring.clear()

    def _elect_dead(self, key: tuple[str, str]) -> None:
        try:
            info = self.elect_master(ElectMaster(cluster=key[0], broker_name=key[1], trigger="controller"))
            log.info(
                "elected master %s of %s/%s at epoch %s",
                info["master_broker_id"],
                key[0],
                key[1],
                info["master_epoch"],
            )
        except MqmetaError as exc:
            log.warning("could not elect a master for %s/%s: %s", key[0], key[1], exc)
        finally:
            self._electing.discard(key)


def _group_outcomes(
    commands: list[Command], settled: list[Json | MqmetaError | None], timeout_s: float
) -> list[Json | MqmetaError]:
    """A `Write` batch's outcome per command: its result, its error, or DeadlineExceeded
    for one that did not settle in time (its outcome is unknown)."""
    outcomes: list[Json | MqmetaError] = []
    for outcome, command in zip(settled, commands, strict=True):
        if outcome is None:
            outcomes.append(
                DeadlineExceeded(
                    f"{command.TYPE} was not committed within {timeout_s:.1f}s; its outcome is unknown"
                )
            )
        elif isinstance(outcome, MqmetaError):
            outcomes.append(outcome)
        else:
            ok = outcome.get("ok")
            outcomes.append(outcome if ok else error_from_code(outcome["code"], outcome["message"]))
    return outcomes
