"""The controller core's watch fan-out and liveness scan (controller/operations.py), in process.

Properties checked:
- the Raft thread publishes with one hand-off to the event loop, where each event is
  encoded once whatever the number of streams, and every stream that wants it gets it;
  with no stream open it does not wake the loop at all, and an entry's events share the
  loop's wake-up with the answers to its writers, and one call that fails on the loop does
  not drop the answers posted after it;
- a stream that names a broker set gets that set's events only; topic and group events go
  to the streams that name none, in their cluster; config events (no cluster) to the
  streams that name no cluster either;
- a stream that falls WATCH_QUEUE_MAX events behind is cut off (its queue ends with
  None), while the others keep everything;
- while streams are open the node confirms, one check at a time whatever their number,
  that it reaches a leader; once it has not for WATCH_UNCONFIRMED_MAX_S every stream ends
  with UNAVAILABLE (a node cut off from the others hears of no change), and not before;
  with no stream left the checks stop;
- a liveness storm (every master silent at once) runs at most ELECTIONS_IN_FLIGHT_MAX
  elections at a time; the rest are started by later scans;
- results that another thread (the Raft thread) sets for many waiting coroutines wake
  the event loop once per burst, not once each, and each waiter gets its own outcome.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest
from mqmeta.cluster.wait import wait_for
from mqmeta.controller import operations as core_module
from mqmeta.controller import replicator_liveness
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.liveness import Liveness
from mqmeta.controller.operations import (
    ELECTIONS_IN_FLIGHT_MAX,
    WATCH_QUEUE_MAX,
    ControllerOperations,
    LoopFutures,
    WatchHub,
    _deliver,
    await_within,
)
from mqmeta.controller.state_machine import ControllerState, apply

from mqmeta.errors import Unavailable

pytestmark = pytest.mark.timeout(60)

ROLE_A = {"kind": "role", "cluster": "c", "broker_name": "a", "replica_info": {}}
ROLE_B = {"kind": "role", "cluster": "c", "broker_name": "b", "replica_info": {}}
ROLE_OTHER_CLUSTER = {"kind": "role", "cluster": "d", "broker_name": "a", "replica_info": {}}
TOPIC = {"kind": "topic", "name": "t", "cluster": "c"}
CONFIG = {"kind": "config"}


def drained(subscription) -> list:
    items = []
    while not subscription.queue.empty():
        items.append(subscription.queue.get_nowait())
    return items


def run_on_loop(body):
    """Runs body(hub, loop) on a fresh event loop; publishes happen from another thread."""

    async def main():
        hub = WatchHub()
        encoded: list[dict] = []

        def encode(event):
            encoded.append(event)
            return ("pb", event["kind"], event.get("broker_name"), event["index"])

        hub.attach(asyncio.get_running_loop(), encode)
        return await body(hub, encoded)

    return asyncio.run(main())


async def publish_from_thread(hub: WatchHub, index: int, events: list) -> None:
    thread = threading.Thread(target=hub.publish, args=(index, events))
    thread.start()
    thread.join()
    for _ in range(100):  # the hand-off runs on this loop's next iterations
        await asyncio.sleep(0)


def test_each_event_is_encoded_once_and_reaches_every_stream_that_wants_it():
    async def body(hub, encoded):
        streams = [hub.subscribe("c", "") for _ in range(50)]
        await publish_from_thread(hub, 7, [ROLE_A, TOPIC])
        assert len(encoded) == 2, "each event must be encoded once, not once per stream"
        for stream in streams:
            assert [item[1] for item in drained(stream)] == [("pb", "role", "a", 7), ("pb", "topic", None, 7)]

    run_on_loop(body)


class CountingLoop:
    """Records the wake-ups other threads ask of the loop."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def call_soon_threadsafe(self, *args) -> None:
        self.calls.append(args)


def test_with_no_stream_open_a_publish_does_not_wake_the_loop():
    hub, loop = WatchHub(), CountingLoop()
    hub.attach(loop, lambda event: event)  # type: ignore[arg-type]
    hub.publish(5, [TOPIC])
    assert loop.calls == [], "a publish with no stream open woke the loop"
    hub.subscribe("", "")
    hub.publish(6, [TOPIC])
    assert len(loop.calls) == 1


def test_an_entrys_events_and_its_writers_answers_share_one_wake_up_of_the_loop():
    loop = CountingLoop()
    bridge = LoopFutures(loop)  # type: ignore[arg-type]
    hub = WatchHub(lambda _: bridge)
    hub.attach(loop, lambda event: event)  # type: ignore[arg-type]
    hub.subscribe("", "")
    answered: list[str] = []
    hub.publish(5, [TOPIC])  # the Raft thread applies an entry: its events...
    bridge.post(answered.append, "writer")  # ...and its writer's answer, in the same tick
    assert len(loop.calls) == 1, "the events and the answer woke the loop separately"
    loop.calls[0][0]()  # the loop runs the drain: events first, then the answer
    assert answered == ["writer"]


def test_a_posted_call_that_fails_does_not_drop_the_calls_after_it():
    """A watch dispatch that raises must not cost the writers answered in the same drain
    their answers (they would wait out their timeout and retry)."""
    loop = CountingLoop()
    bridge = LoopFutures(loop)  # type: ignore[arg-type]
    answered: list[str] = []

    def broken_dispatch() -> None:
        raise ValueError("an event that does not encode")

    bridge.post(broken_dispatch)
    bridge.post(answered.append, "writer")
    loop.calls[0][0]()
    assert answered == ["writer"]


def test_a_stream_naming_a_broker_set_gets_that_sets_events_only():
    async def body(hub, encoded):
        broker_a = hub.subscribe("c", "a")
        cluster = hub.subscribe("c", "")
        everything = hub.subscribe("", "")
        await publish_from_thread(hub, 3, [ROLE_A, ROLE_B, ROLE_OTHER_CLUSTER, TOPIC, CONFIG])
        kinds = {
            name: [(e["kind"], e.get("broker_name")) for e, _ in drained(s)]
            for name, s in (("broker_a", broker_a), ("cluster", cluster), ("everything", everything))
        }
        assert kinds["broker_a"] == [("role", "a")]
        assert kinds["cluster"] == [("role", "a"), ("role", "b"), ("topic", None)]  # config names no cluster
        assert len(kinds["everything"]) == 5

    run_on_loop(body)


def test_a_stream_that_falls_behind_is_cut_off_and_the_others_are_not():
    async def body(hub, encoded):
        slow = hub.subscribe("c", "")
        fast = hub.subscribe("c", "")
        for index in range(WATCH_QUEUE_MAX + 5):
            hub._dispatch(index, [TOPIC])  # on the loop, as the hand-off runs it
            if index < WATCH_QUEUE_MAX:
                drained(fast)  # the fast stream keeps up
        assert list(drained(slow)) == [None], "an overflowing stream must end with None only"
        assert len(drained(fast)) == 5
        assert hub.streams == 1

    run_on_loop(body)


def test_streams_end_once_the_node_has_not_reached_a_leader_for_a_while(monkeypatch):
    monkeypatch.setattr(core_module, "WATCH_CONFIRM_INTERVAL_S", 0.02)
    monkeypatch.setattr(core_module, "WATCH_UNCONFIRMED_MAX_S", 0.3)
    checks: list[float] = []
    reaches = [True]

    async def confirm() -> bool:
        checks.append(time.monotonic())
        return reaches[0]

    async def main():
        hub = WatchHub()
        hub.attach(asyncio.get_running_loop(), lambda event: event, confirm)
        streams = [hub.subscribe("c", "") for _ in range(20)]
        await asyncio.sleep(0.5)
        assert hub.streams == 20 and all(s.queue.empty() for s in streams), "a node that reaches a leader"
        assert 10 <= len(checks) <= 30, f"one check per interval for all 20 streams: {len(checks)}"
        reaches[0] = False
        cut_at = time.monotonic()
        await asyncio.sleep(0.2)
        assert hub.streams == 20, "ended before WATCH_UNCONFIRMED_MAX_S"
        while hub.streams and time.monotonic() < cut_at + 5:
            await asyncio.sleep(0.01)
        ended_after = time.monotonic() - cut_at
        # counted from the last confirmed check, at most one interval before the cut
        assert hub.streams == 0 and 0.3 - 0.05 <= ended_after < 1.0, ended_after
        for stream in streams:
            (item,) = drained(stream)
            assert isinstance(item, Unavailable) and "not reached a leader" in item.message, item
        checks_at_end = len(checks)
        await asyncio.sleep(0.2)
        assert len(checks) == checks_at_end, "no stream left: no more checks"

    asyncio.run(main())


class _Raft:
    def is_leader(self) -> bool:
        return True

    def current_term(self) -> int:
        return 1


def test_a_liveness_storm_runs_a_bounded_number_of_elections_at_once(monkeypatch):
    state = ControllerState()
    sets = ELECTIONS_IN_FLIGHT_MAX * 3
    for s in range(sets):
        for replica in (1, 2):
            register = {
                "type": "register_broker",
                "cluster": "c",
                "broker_name": f"b{s}",
                "address": f"127.0.0.1:{9000 + replica}",
                "check_code": f"b{s}-{replica}",
            }
            assert apply(state, command_from_json(register), 1)[0]["ok"]
        elect = {"type": "elect_master", "cluster": "c", "broker_name": f"b{s}", "alive": {"1": {}, "2": {}}}
        assert apply(state, command_from_json(elect), 2)[0]["ok"]
    core = ControllerOperations.__new__(ControllerOperations)  # the scan alone: no Raft, no server
    core.raft = _Raft()  # type: ignore[assignment]
    core.liveness = Liveness()
    core.workers = replicator_liveness.WorkerLiveness()  # no replicator workers
    core._expiring = threading.Event()
    core._electing = set()
    monkeypatch.setattr(ControllerOperations, "state", property(lambda self: state))
    release = threading.Event()
    running: list[tuple[str, str]] = []

    def elect_dead(self, key):
        running.append(key)
        release.wait(10.0)
        self._electing.discard(key)

    monkeypatch.setattr(ControllerOperations, "_elect_dead", elect_dead)
    start = core_module.now_ms() - 10_000  # leader long enough: no grace; nobody heard from
    core.liveness.on_leadership(True, start)
    core._scan_once()
    core._scan_once()
    wait_for(
        lambda: len(running), 10, "the first elections to run", until=lambda n: n >= ELECTIONS_IN_FLIGHT_MAX
    )
    time.sleep(0.2)  # the sleep is the property: no further election may start meanwhile
    assert len(running) == ELECTIONS_IN_FLIGHT_MAX, "a storm must not start an election per set at once"
    release.set()

    def scan() -> int:
        core._scan_once()
        return len(set(running))

    wait_for(scan, 10.0, "every set's election", until=lambda n: n >= sets, interval_s=0.05)
    assert len(set(running)) == sets, "later scans must elect the remaining sets"


def test_results_set_by_another_thread_wake_the_loop_once_per_burst():
    async def main():
        loop = asyncio.get_running_loop()
        wakes = []
        real = loop.call_soon_threadsafe

        def counted(callback, *args):
            wakes.append(callback)
            return real(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        bridge = LoopFutures(loop)
        futures = [Future() for _ in range(900)]
        for future in futures:
            future.set_running_or_notify_cancel()
        waiters = [bridge.wrap(f) for f in futures]
        gone = waiters[1]
        gone.cancel()  # a caller that stopped waiting

        def commit() -> None:  # the Raft thread completing one batch
            futures[0].set_exception(RuntimeError("not committed"))
            for i, future in enumerate(futures[1:], start=1):
                future.set_result({"ok": True, "i": i})

        thread = threading.Thread(target=commit)
        thread.start()
        thread.join()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert len(wakes) == 1, f"{len(wakes)} wake-ups of the loop for one burst"
        assert isinstance(results[0], RuntimeError)
        assert isinstance(results[1], asyncio.CancelledError)
        assert [r["i"] for r in results[2:]] == list(range(2, 900))

    asyncio.run(main())


async def _turns_until_resumed(wait) -> int:
    """Loop turns between a waiter's result being set and `wait(waiter)` returning it."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    turns = [0, -1]  # turns counted; the count when the waiting coroutine resumed

    async def waiting() -> None:
        assert await wait(waiter) == "done"
        turns[1] = turns[0]

    task = loop.create_task(waiting())
    for _ in range(3):  # the waiting coroutine is parked on its future
        await asyncio.sleep(0)
    _deliver(waiter, "done")
    while turns[1] < 0 and turns[0] < 10:
        await asyncio.sleep(0)  # one loop turn
        turns[0] += 1
    await task
    return turns[1]


def test_a_write_waiting_within_a_timeout_resumes_in_the_turn_after_its_outcome():
    """await_within resumes its caller in the loop turn after the outcome is set (a turn
    sooner than asyncio.wait_for, which a metadata write and a confirmed read used)."""

    async def main():
        ours = await _turns_until_resumed(lambda w: await_within(w, 5.0))
        theirs = await _turns_until_resumed(lambda w: asyncio.wait_for(w, 5.0))
        assert ours < theirs, (ours, theirs)
        assert ours == await _turns_until_resumed(lambda w: w)  # as soon as a plain await

    asyncio.run(main())


def test_a_wait_within_a_timeout_times_out_leaves_no_timer_and_drops_the_late_outcome():
    async def main():
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await await_within(waiter, 0.05)
        assert time.monotonic() - started >= 0.05
        _deliver(waiter, "late")  # the Raft thread's outcome after the caller gave up
        assert isinstance(waiter.exception(), TimeoutError)

        answered = loop.create_future()
        loop.call_soon(_deliver, answered, "done")
        assert await await_within(answered, 30.0) == "done"
        cancelled = loop.create_task(await_within(loop.create_future(), 30.0))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not [h for h in loop._scheduled if not h.cancelled()], "a timer outlived its wait"  # type: ignore[attr-defined]

    asyncio.run(main())
