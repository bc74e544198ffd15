"""The broker's pure HA core (broker_agent/ha.py) and the agent's ack policies, no network.

Properties checked:
- the lease runs from the SEND time of the acknowledged heartbeat and never shrinks;
- the confirm offset is the minimum over the counted set, master included, and a
  member that never acked holds it at 0; while a change is pending the union counts;
- the SyncStateSet shrinks a member that has not caught up for the window and expands
  a registered slave that holds everything confirmed and the epoch start;
- ack policies: all of the set; or in_sync_replicas copies; min_in_sync_replicas refuses.
"""

from __future__ import annotations

import pytest

from broker_agent.agent import BrokerAgent, BrokerConfig
from broker_agent.ha import Lease, Role, SyncStateTracker, confirm_offset
from mqmeta.errors import FailedPrecondition, NotMaster
from mqmeta.formats.records import Message


def test_lease_counts_from_the_heartbeat_send_time():
    lease = Lease(lease_ms=500)
    assert not lease.valid(0)
    lease.renew(heartbeat_sent_ms=1000)
    assert lease.valid(1499) and not lease.valid(1500)
    lease.renew(heartbeat_sent_ms=900)  # a late ack of an older heartbeat never shortens it
    assert lease.valid(1499)
    lease.revoke()
    assert not lease.valid(1000)


def test_confirm_offset_is_the_minimum_over_the_counted_set():
    assert confirm_offset(1, 500, {2: 300, 3: 400}, {1, 2, 3}) == 300
    assert confirm_offset(1, 500, {2: 300, 3: 400}, {1, 3}) == 400
    assert confirm_offset(1, 500, {}, {1}) == 500, "alone in its set, the master confirms all"
    assert confirm_offset(1, 500, {2: 300}, {1, 2, 3}) == 0, "a silent member holds nothing"
    old, new = {1, 2, 3}, {1, 3}
    assert confirm_offset(1, 500, {2: 100, 3: 450}, old | new) == 100, (
        "a shrink in flight still waits for the member it removes (RocketMQ #5663)"
    )


def tracker_with(progress: dict[int, tuple[int, int, int]], window_ms: int = 1000):
    tracker = SyncStateTracker(max_not_catchup_ms=window_ms)
    for broker_id, (acked, last_fetch, caught_up) in progress.items():
        tracker.on_fetch(broker_id, acked, master_max_offset=10**9, now_ms=last_fetch)
        tracker.slaves[broker_id].last_caught_up_ms = caught_up
    return tracker


def test_sync_state_set_shrinks_a_member_that_stopped_catching_up():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (50, 5000, 3000)})
    plan = tracker.plan(
        now_ms=5000,
        master_id=1,
        current_set=[1, 2, 3],
        confirm=50,
        epoch_start_offset=0,
        registered={1, 2, 3},
    )
    assert plan == [1, 2]
    assert (
        tracker.plan(
            now_ms=3900,
            master_id=1,
            current_set=[1, 2, 3],
            confirm=50,
            epoch_start_offset=0,
            registered={1, 2, 3},
        )
        is None
    )


def test_a_slow_but_alive_member_is_not_readded_by_its_own_low_confirm():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (50, 5000, 3000)})  # 3 fetches, lags
    assert (
        tracker.plan(
            now_ms=5000,
            master_id=1,
            current_set=[1, 2],
            confirm=50,
            epoch_start_offset=0,
            registered={1, 2, 3},
        )
        is None
    )


def test_a_slave_keeping_up_with_steady_writes_stays_caught_up():
    """Under steady writes no fetch ever equals the master's end of that instant: reaching
    the end the master had when it last answered must count (Kafka's rule)."""
    tracker = SyncStateTracker(max_not_catchup_ms=1000)
    tracker.on_fetch(2, 0, master_max_offset=0, now_ms=0)
    master_end = 0
    for now in range(100, 5000, 100):  # the master grows 100 bytes between fetches
        tracker.on_answer(2, master_end, now_ms=now - 50)
        master_end += 100
        tracker.on_fetch(2, master_end - 100, master_max_offset=master_end, now_ms=now)
    assert (
        tracker.plan(
            now_ms=5000, master_id=1, current_set=[1, 2], confirm=0, epoch_start_offset=0, registered={1, 2}
        )
        is None
    ), "evicted while keeping up"
    lagging = SyncStateTracker(max_not_catchup_ms=1000)  # fetches but never reaches it
    lagging.on_fetch(2, 0, master_max_offset=0, now_ms=0)
    for now in range(100, 5000, 100):
        lagging.on_answer(2, now * 10, now_ms=now - 50)
        lagging.on_fetch(2, now, master_max_offset=now * 10, now_ms=now)
    assert lagging.plan(
        now_ms=5000, master_id=1, current_set=[1, 2], confirm=0, epoch_start_offset=0, registered={1, 2}
    ) == [1]


def test_sync_state_set_expands_only_with_everything_confirmed_and_the_epoch_start():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (80, 5000, 5000)})
    grow = dict(now_ms=5000, master_id=1, current_set=[1, 2], registered={1, 2, 3})
    assert tracker.plan(confirm=80, epoch_start_offset=60, **grow) == [1, 2, 3]
    assert tracker.plan(confirm=90, epoch_start_offset=60, **grow) is None, "behind the confirm"
    assert tracker.plan(confirm=80, epoch_start_offset=85, **grow) is None, "before the epoch"
    unregistered = dict(grow, registered={1, 2})
    assert tracker.plan(confirm=80, epoch_start_offset=60, **unregistered) is None


@pytest.fixture
def agent(tmp_path):
    def make(**overrides) -> BrokerAgent:
        config = BrokerConfig(
            cluster="C",
            broker_name="b",
            listen="127.0.0.1:1",
            controllers=["127.0.0.1:1"],
            data_dir=tmp_path / "b",
            **overrides,
        )
        made = BrokerAgent(config)  # nothing touches the network before start()
        made.broker_id = 1
        made.master_epoch = 1
        made.store.begin_epoch(1)
        made.role = Role.MASTER
        made.lease.renew(heartbeat_sent_ms=10**12)
        made.sync_state_set = [1, 2, 3]
        return made

    return make


def put_one(agent: BrokerAgent) -> int:
    agent.store.put_messages([Message(topic="T", queue_id=0, body=b"x")], 1, 0)
    return agent.store.max_offset


def test_all_ack_waits_for_every_member(agent):
    a = agent()
    end = put_one(a)
    a.tracker.on_fetch(2, end, end, 0)
    with a.lock:
        a._recompute_confirm()
    assert not a._acknowledged(end) and a.confirm < end, "broker 3 has not acked"
    a.tracker.on_fetch(3, end, end, 0)
    with a.lock:
        a._recompute_confirm()
    assert a._acknowledged(end) and a.confirm == end


def test_in_sync_replicas_policy_counts_copies(agent):
    a = agent(all_ack_in_sync_state_set=False, in_sync_replicas=2)
    end = put_one(a)
    assert not a._acknowledged(end), "only the master holds it"
    a.tracker.on_fetch(3, end, end, 0)
    assert a._acknowledged(end), "master + one slave = 2 copies"


def test_min_in_sync_replicas_refuses_writes_of_a_small_set(agent):
    a = agent(min_in_sync_replicas=3)
    a.sync_state_set = [1, 2]
    with pytest.raises(FailedPrecondition) as refused:
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    assert refused.value.code == "IN_SYNC_REPLICAS_NOT_ENOUGH"


def test_no_lease_or_not_master_means_no_write(agent):
    a = agent()
    a.lease.revoke()
    with pytest.raises(NotMaster, match="lease"):
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    a.lease.renew(heartbeat_sent_ms=10**12)
    a.role = Role.SLAVE
    a.master_address = "10.0.0.2:10911"
    with pytest.raises(NotMaster) as refused:
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    assert refused.value.leader == "10.0.0.2:10911"
