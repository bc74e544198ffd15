"""The broker's pure role core (broker_agent/core.py, broker_agent/ha.py), no network.

Properties checked:
- the lease runs from the SEND time of the acknowledged heartbeat and never shrinks; a
  heartbeat reply naming another master revokes it at once (and asks for a refresh);
- the confirm offset is the minimum over the counted set, master included, and a
  member that never acked holds it at 0; while a SyncStateSet change is in flight the
  union of the old and the new set counts (RocketMQ #5663), until the change commits,
  the set moves on, or a failed proposal's grace runs out;
- the SyncStateSet shrinks a member that has not caught up for the window and expands
  a registered slave that holds everything confirmed and the epoch start;
- role transitions return their effects in the fixed order: a new master begins its
  epoch (unless its log already did) and notes its confirm offset; a slave starts a
  fetch session and a new master epoch stops the old one; older epochs are ignored;
- a fetch is refused by a non-master, by a stale master (which asks for a refresh) and
  when it carries an older master epoch (a fetch delayed across elections is no ack);
  a handshake is answered with the consistent point, a fetch below the log start with
  the tiered store, otherwise the fetch offset counts as the slave's ack;
- a replica info older than an epoch a heartbeat reply already named is ignored, so a
  late decision never makes a writable master of a stale epoch;
- a slave ignores answers of an old session, truncates where told, appends otherwise,
  and takes the master's confirm offset capped at its own log end;
- ack policies: all of the set, or in_sync_replicas copies; min_in_sync_replicas and a
  missing lease refuse writes; a deposed master never reports a write acknowledged;
- a handoff (graceful departure of a master) refuses new writes at once, asks for the
  successor's election only once the successor holds every byte appended and the writes
  in flight are acknowledged (or, at the deadline, once it holds everything), prefers
  the named slave, gives up at once when no in-sync slave exists, keeps writes refused
  for the grace after a failed election call, and ends when the successor is elected
  (leaving, when shutting down); a leaving slave's fetches take it out of the set and
  keep it out;
- the shell (agent.py) carries the effects out: BeginEpoch reaches the epoch file, and a
  failure to begin the epoch fences the broker instead of leaving it master; a writer
  waiting for acknowledgement is woken by the ack that covers its end (no polling);
  concurrent sends are written together, and one send's invalid message fails only it.
"""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
from mqmeta.broker_agent import agent as agent_module
from mqmeta.broker_agent import core as core_module
from mqmeta.broker_agent import ha_fetch
from mqmeta.broker_agent.agent import BrokerAgent, BrokerConfig
from mqmeta.broker_agent.core import (
    AckPolicy,
    AnswerFetch,
    Appended,
    AppendReplicated,
    BeginEpoch,
    BrokerCore,
    CorruptionFound,
    Departure,
    DiskFailed,
    ElectSuccessor,
    FetchAnswered,
    FetchStillWaiting,
    HandoffFailed,
    HandoffStart,
    HandoffTick,
    HeartbeatAnswered,
    LeaseRevoked,
    Leave,
    LogView,
    MasterAnswered,
    NoteConfirm,
    ProposalOutcome,
    ProposeSyncStateSet,
    Refuse,
    Registered,
    ReplicaInfo,
    Replicated,
    RequestRefresh,
    SlaveFetch,
    StartFetching,
    Stop,
    StopFetching,
    Synced,
    SyncStarting,
    SyncStateSetChanged,
    SyncStateSetFailed,
    Tick,
    Truncate,
    UploadStarting,
    WakeWaiters,
    WriteOutcome,
    counted_members,
    truncation_point,
)
from mqmeta.broker_agent.ha import Lease, Role, SyncStateTracker, confirm_offset
from mqmeta.broker_agent.seams import log_view
from mqmeta.broker_agent.store import CONSUMER_OFFSET_TOPIC, PutResult
from mqmeta.cluster.wait import wait_for

from mqmeta.clock import now_ms
from mqmeta.errors import (
    FailedPrecondition,
    FencedEpoch,
    InvalidArgument,
    MqmetaError,
    NotFound,
    NotMaster,
    ResourceExhausted,
    Unavailable,
)
from mqmeta.formats.epochs import consistent_point
from mqmeta.formats.records import Message
from mqmeta.pb import broker_pb2 as bpb
from mqmeta.pb import controller_pb2 as cpb
from tests.support.sampling import sample_for

pytestmark = pytest.mark.timeout(30)


# ha.py: the lease, the confirm offset, the SyncStateSet plan ---------------------------
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


def test_counted_members_is_the_union_while_a_change_is_in_flight():
    assert counted_members(1, [1, 2], None) == {1, 2}
    assert counted_members(1, [2], None) == {1, 2}, "the master always counts"
    assert counted_members(1, [1], [1, 3]) == {1, 3}, "an expansion counts the newcomer at once"
    assert counted_members(1, [1, 2, 3], [1, 3]) == {1, 2, 3}, "a shrink counts the leaver until it commits"


def tracker_with(progress: dict[int, tuple[int, int, int]], window_ms: int = 1000):
    tracker = SyncStateTracker(max_not_catchup_ms=window_ms)
    for broker_id, (acked, last_fetch, caught_up) in progress.items():
        tracker.on_fetch(broker_id, acked, master_max_offset=10**9, now_ms=last_fetch)
        tracker.slaves[broker_id].last_caught_up_ms = caught_up
    return tracker


def test_sync_state_set_shrinks_a_member_that_stopped_catching_up():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (50, 5000, 3000)})
    shrink = dict(master_id=1, current_set=[1, 2, 3], confirm=50, epoch_start_offset=0, registered={1, 2, 3})
    assert tracker.plan(now_ms=5000, **shrink) == [1, 2]
    assert tracker.plan(now_ms=3900, **shrink) is None


def test_a_slow_but_alive_member_is_not_readded_by_its_own_low_confirm():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (50, 5000, 3000)})  # 3 fetches, lags
    plan = tracker.plan(
        now_ms=5000, master_id=1, current_set=[1, 2], confirm=50, epoch_start_offset=0, registered={1, 2, 3}
    )
    assert plan is None


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
    keep = dict(
        now_ms=5000, master_id=1, current_set=[1, 2], confirm=0, epoch_start_offset=0, registered={1, 2}
    )
    assert tracker.plan(**keep) is None, "evicted while keeping up"
    lagging = SyncStateTracker(max_not_catchup_ms=1000)  # fetches but never reaches it
    lagging.on_fetch(2, 0, master_max_offset=0, now_ms=0)
    for now in range(100, 5000, 100):
        lagging.on_answer(2, now * 10, now_ms=now - 50)
        lagging.on_fetch(2, now, master_max_offset=now * 10, now_ms=now)
    assert lagging.plan(**keep) == [1]


def test_sync_state_set_expands_only_with_everything_confirmed_and_the_epoch_start():
    tracker = tracker_with({2: (100, 5000, 5000), 3: (80, 5000, 5000)})
    grow = dict(now_ms=5000, master_id=1, current_set=[1, 2], registered={1, 2, 3})
    assert tracker.plan(confirm=80, epoch_start_offset=60, **grow) == [1, 2, 3]
    assert tracker.plan(confirm=90, epoch_start_offset=60, **grow) is None, "behind the confirm"
    assert tracker.plan(confirm=80, epoch_start_offset=85, **grow) is None, "before the epoch"
    unregistered = dict(grow, registered={1, 2})
    assert tracker.plan(confirm=80, epoch_start_offset=60, **unregistered) is None


# core.py: helpers -----------------------------------------------------------------------
EMPTY_LOG = LogView(0)


def info(
    master: int,
    epoch: int,
    members: tuple[int, ...],
    set_epoch: int | None = None,
    log: LogView = EMPTY_LOG,
    at_ms: int = 0,
    registered: frozenset[int] = frozenset({1, 2, 3}),
) -> ReplicaInfo:
    return ReplicaInfo(
        at_ms, master, f"10.0.0.{master}:10911" if master else "", epoch, members,
        epoch if set_epoch is None else set_epoch, registered, log,
    )  # fmt: skip


def new_core(broker_id: int = 1, **policy) -> BrokerCore:
    core = BrokerCore("b", AckPolicy(**policy), max_not_catchup_ms=1000, pending_grace_ms=7000)
    assert core.handle(Registered(broker_id, lease_ms=2000)) == []
    return core


def master_core(
    members: tuple[int, ...] = (1, 2, 3), log: LogView = EMPTY_LOG, epoch: int = 1, **policy
) -> BrokerCore:
    core = new_core(**policy)
    core.handle(info(1, epoch, members, log=log))
    core.handle(
        HeartbeatAnswered(0, master_broker_id=1, master_epoch=epoch, sync_state_set_epoch=epoch, lease_ms=0)
    )
    assert core.role == Role.MASTER and core.writable(1)
    return core


def epoch1(end: int) -> LogView:
    return LogView(end, ((1, 0),))


def fetch(broker_id: int, offset: int, log: LogView, now_ms: int = 0, **fields) -> SlaveFetch:
    defaults = dict(master_epoch=1, handshake=False, epoch_entries=())
    return SlaveFetch(now_ms, broker_id, fetch_offset=offset, log=log, **{**defaults, **fields})


# core.py: role transitions --------------------------------------------------------------
def test_becoming_master_begins_the_epoch_and_notes_the_confirm_offset():
    core = new_core()
    effects = core.handle(info(1, 3, (1,), log=LogView(500, ((1, 0),))))
    assert effects == [
        BeginEpoch(3),
        NoteConfirm(Role.MASTER, 3, 500, (), force=True),
        WakeWaiters(),
    ], "alone in its set, a new master confirms everything it has"
    assert core.role == Role.MASTER and core.master_epoch == 3 and core.confirm_offset == 500
    again = new_core()
    effects = again.handle(info(1, 3, (1, 2), log=LogView(500, ((1, 0), (3, 400)))))
    assert not any(isinstance(e, BeginEpoch) for e in effects), "its log already began epoch 3"
    assert again.confirm_offset == 0, "with slaves in the set, nothing is confirmed yet"


def test_becoming_slave_starts_a_session_and_a_new_epoch_replaces_it():
    core = new_core()
    assert core.handle(info(2, 1, (2, 1))) == [StartFetching(1, 2, "10.0.0.2:10911", 1), WakeWaiters()]
    assert core.role == Role.SLAVE and core.follows(1)
    assert core.handle(info(2, 1, (2, 1))) == [], "the same decision again changes nothing"
    effects = core.handle(info(3, 2, (3,)))
    assert effects == [StopFetching(1), StartFetching(2, 3, "10.0.0.3:10911", 2), WakeWaiters()]
    assert not core.follows(1) and core.follows(2)
    assert core.handle(info(2, 1, (2, 1))) == [], "an older master epoch is ignored"
    assert core.master_epoch == 2
    assert core.handle(info(0, 3, (3,)))[-1] == WakeWaiters() and core.role == Role.FENCED
    assert not core.follows(2)


def test_a_slave_promoted_stops_fetching_first_and_keeps_only_what_it_knew_confirmed():
    core = new_core()
    core.handle(info(2, 1, (2, 1)))
    core.handle(Replicated(1, confirm_offset=300, log=epoch1(400)))
    effects = core.handle(info(1, 2, (1, 3), log=epoch1(400)))
    assert [type(e) for e in effects] == [StopFetching, BeginEpoch, NoteConfirm, WakeWaiters]
    assert core.confirm_offset == 300


def test_a_late_reply_of_the_same_epoch_does_not_forget_a_registration():
    """Within one master epoch, infos carry no order: the reply to the master's own
    AlterSyncStateSet, built before broker 3 registered, can arrive after the watch event
    that named 3. Broker 3 must stay registered, so its fetches count and it joins the set
    (CI: a fresh cluster's third replica stayed out of the SyncStateSet for good)."""
    core = master_core(members=(1,))  # the watch named brokers 1, 2 and 3
    core.handle(info(1, 1, (1, 2), set_epoch=2, registered=frozenset({1, 2})))  # the late reply
    core.handle(fetch(3, 0, EMPTY_LOG, now_ms=1))
    proposals = [e for e in core.handle(Tick(2, EMPTY_LOG)) if isinstance(e, ProposeSyncStateSet)]
    assert proposals and 3 in proposals[0].new_sync_state_set, proposals


def test_an_unregistered_broker_never_becomes_master():
    core = BrokerCore("b")
    core.handle(info(0, 1, ()))
    assert core.role == Role.FENCED


# core.py: the lease ---------------------------------------------------------------------
def test_heartbeat_replies_renew_the_lease_from_the_send_time():
    core = master_core()
    core.handle(HeartbeatAnswered(10_000, 1, 1, 1, lease_ms=500))
    assert core.writable(10_499) and not core.writable(10_500)


def test_a_master_whose_disk_fails_is_fenced_for_good_and_names_a_successor_holding_every_ack():
    """fsync-eio: the master stops writing at once, asks for the in-sync slave that holds
    everything acknowledged, and never takes the role back from a late ReplicaInfo."""
    log = epoch1(300)
    core = master_core(log=log)
    core.handle(fetch(2, 300, log))
    core.handle(fetch(3, 200, log))
    assert core.confirm_offset == 200
    effects = core.handle(DiskFailed("fdatasync failed: EIO"))
    assert ElectSuccessor(2, 1) in effects and effects[-1] == WakeWaiters(), effects
    assert core.role == Role.FENCED and not core.writable(1) and core.disk_failed
    assert core.write_outcome(100, 1) is WriteOutcome.DEPOSED, (
        "a writer waiting learns its outcome is unknown"
    )
    core.handle(info(1, 1, (1, 2, 3), log=log))
    assert core.role == Role.FENCED, "the controller's stale view naming it master is not obeyed"
    core.handle(info(2, 2, (2, 3), log=log))
    assert core.role == Role.FENCED, "nor does it follow the new master on a failed disk"


def test_a_failed_disk_names_no_successor_outside_the_sync_state_set():
    log = epoch1(300)
    core = master_core(members=(1,), log=log)
    core.handle(fetch(2, 100, log))  # registered, fetching, not in sync
    effects = core.handle(DiskFailed("EIO"))
    assert not any(isinstance(e, ElectSuccessor) for e in effects), effects
    assert core.role == Role.FENCED


def test_a_master_whose_fdatasync_outlasts_its_lease_refuses_writes_until_it_returns():
    """slow-disk (apache/rocketmq #6468): a group commit running longer than the lease
    (2000 ms here) makes the master refuse writes (and the shell stop heartbeating);
    the disk answering makes it writable again."""
    core = master_core(log=epoch1(100))
    core.handle(HeartbeatAnswered(11_000, 1, 1, 1, lease_ms=0))  # valid until 13_000
    core.handle(SyncStarting(10_000))
    core.handle(SyncStarting(10_500))  # a second writer's sync: the oldest counts
    assert core.writable(12_000) and not core.disk_stalled(12_000)
    assert core.disk_stalled(12_001) and not core.writable(12_001)
    with pytest.raises(NotMaster, match="waited 2001 ms for its disk"):
        core.check_writable(12_001)
    core.handle(Synced(epoch1(100)))
    core.handle(HeartbeatAnswered(12_001, 1, 1, 1, lease_ms=0))
    assert core.writable(12_002)


def test_a_reply_naming_another_master_revokes_the_lease_at_once():
    core = master_core()
    effects = core.handle(
        HeartbeatAnswered(10_000, master_broker_id=2, master_epoch=2, sync_state_set_epoch=2, lease_ms=0)
    )
    assert effects == [RequestRefresh(), LeaseRevoked(2, 2), WakeWaiters()]
    assert not core.writable(1) and core.role == Role.MASTER, "the role changes when the refresh arrives"
    with pytest.raises(NotMaster, match="lease"):
        core.check_writable(1)


def test_a_stale_set_epoch_in_a_heartbeat_reply_asks_for_a_refresh():
    core = master_core()
    assert core.handle(HeartbeatAnswered(1, 1, 1, sync_state_set_epoch=2, lease_ms=0)) == [RequestRefresh()]
    assert core.writable(2), "the same master: the lease is renewed"


# core.py: the confirm offset and acknowledgement ------------------------------------------
def test_all_ack_waits_for_every_member():
    core = master_core()
    core.handle(Appended(epoch1(100)))
    assert core.write_outcome(100, 1) is WriteOutcome.WAITING
    effects = core.handle(fetch(2, 100, epoch1(100)))
    assert effects == [AnswerFetch(from_offset=100)], "broker 3 has not acked: no new confirm offset"
    assert core.confirm_offset == 0
    effects = core.handle(fetch(3, 100, epoch1(100)))
    assert effects == [
        NoteConfirm(Role.MASTER, 1, 100, ((2, 100), (3, 100))),
        WakeWaiters(),
        AnswerFetch(from_offset=100),
    ]
    assert core.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED


def test_in_sync_replicas_policy_counts_copies_and_wakes_the_writers_at_each_ack():
    """With acks from in_sync_replicas copies, the first slave's ack acknowledges the write
    while the confirm offset (every member's) has not moved: the writers are woken by that
    ack itself, not by the slowest member's or their wait's poll interval; a fetch that
    acks nothing new wakes nobody."""
    core = master_core(all_ack_in_sync_state_set=False, in_sync_replicas=2)
    core.handle(Appended(epoch1(100)))
    assert core.write_outcome(100, 1) is WriteOutcome.WAITING, "only the master holds it"
    effects = core.handle(fetch(3, 100, epoch1(100)))
    assert core.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED, "master + one slave = 2 copies"
    assert core.confirm_offset == 0, "broker 2 has not acked"
    assert effects == [WakeWaiters(), AnswerFetch(from_offset=100)]
    assert core.handle(fetch(3, 100, epoch1(100))) == [AnswerFetch(from_offset=100)], "no new ack"
    core.handle(info(1, 1, (1, 2), set_epoch=2, registered=frozenset({1, 2, 3})))  # broker 3 left the set
    assert core.view().sync_state_set == (1, 2)
    core.handle(Appended(epoch1(200)))
    assert core.handle(fetch(3, 200, epoch1(200))) == [AnswerFetch(from_offset=200)], (
        "a registered slave outside the set acknowledges nothing"
    )
    all_ack = master_core()
    all_ack.handle(Appended(epoch1(100)))
    assert all_ack.handle(fetch(3, 100, epoch1(100))) == [AnswerFetch(from_offset=100)], (
        "acks from the whole set: only a higher confirm offset can acknowledge a write"
    )


def test_in_sync_replicas_policy_needs_the_copies_in_the_set_and_in_a_proposed_one():
    """With acks from in_sync_replicas copies, while a SyncStateSet change is in flight a
    write needs that many copies in the set AND in the proposed set: the controller elects
    from whichever it holds. Counted over their union, a write held by the master and a
    member being added was acknowledged, then lost when the change never committed and
    the member without it was elected (the broker simulation at 2 of 3 copies, seed 30)."""
    core = master_core(members=(1, 3), log=epoch1(100), all_ack_in_sync_state_set=False, in_sync_replicas=2)
    core.handle(fetch(3, 100, epoch1(100), now_ms=5))
    core.handle(fetch(2, 100, epoch1(100), now_ms=10))  # broker 2 catches up: it is proposed
    assert core.handle(Tick(20, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2, 3))]
    core.handle(Appended(epoch1(200)))
    core.handle(fetch(2, 200, epoch1(200), now_ms=30))
    assert core.write_outcome(200, 1) is WriteOutcome.WAITING, "broker 3, in the set, does not hold it"
    core.handle(fetch(3, 200, epoch1(200), now_ms=40))
    assert core.write_outcome(200, 1) is WriteOutcome.ACKNOWLEDGED


def test_in_sync_replicas_policy_wakes_the_writers_when_the_sets_they_need_copies_in_change():
    """A change committed, refused or adopted may acknowledge a write with no ack to come
    (a caught-up slave's fetch waits for the next append): its writer is woken then, not
    after its wait's poll interval; under the default the confirm offset wakes them."""

    def proposing() -> BrokerCore:
        core = master_core(members=(1,), log=epoch1(100), all_ack_in_sync_state_set=False, in_sync_replicas=2)
        core.handle(fetch(2, 100, epoch1(100), now_ms=10))
        assert core.handle(Tick(20, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))], "no wake-up"
        assert core.write_outcome(100, 1) is WriteOutcome.WAITING, "the set [1] holds one copy"
        return core

    committed = proposing()
    effects = committed.handle(SyncStateSetChanged(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100))))
    assert WakeWaiters() in effects and committed.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED
    refused = proposing()
    assert refused.handle(SyncStateSetFailed(30, ProposalOutcome.REFUSED)) == [
        RequestRefresh(),
        WakeWaiters(),
    ]
    uncertain = proposing()
    assert uncertain.handle(SyncStateSetFailed(30)) == [RequestRefresh()], "still in flight: nothing changed"

    adopted = master_core(members=(1,), log=epoch1(100), all_ack_in_sync_state_set=False, in_sync_replicas=2)
    adopted.handle(fetch(3, 100, epoch1(100), now_ms=10))
    assert adopted.handle(info(1, 1, (1, 3), set_epoch=2, log=epoch1(100))) == [WakeWaiters()], (
        "a larger set in the controller's replica info"
    )
    assert adopted.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED
    assert adopted.handle(info(1, 1, (1, 3), set_epoch=2, log=epoch1(100))) == [], "the same set again"

    all_ack = master_core(members=(1,), log=epoch1(100))
    all_ack.handle(fetch(2, 100, epoch1(100), now_ms=10))
    all_ack.handle(Tick(20, epoch1(100)))
    assert all_ack.handle(SyncStateSetFailed(30, ProposalOutcome.REFUSED)) == [RequestRefresh()]


def test_an_unregistered_fetcher_is_served_but_never_counted():
    core = master_core(members=(1,))
    core.handle(info(1, 1, (1,), registered=frozenset({1})))
    assert core.handle(fetch(4, 0, epoch1(100))) == [AnswerFetch(from_offset=0)]
    assert core.acked_offsets() == {}


def test_a_deposed_master_never_reports_a_write_acknowledged():
    core = master_core(members=(1,))
    core.handle(Appended(epoch1(100)))
    assert core.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED
    core.handle(info(2, 2, (2,), log=epoch1(100)))
    core.handle(Replicated(core.fetch_session, confirm_offset=100, log=epoch1(100)))
    assert core.confirm_offset == 100
    assert core.write_outcome(100, 1) is WriteOutcome.DEPOSED, (
        "a slave's confirm offset may describe other bytes at the same offsets"
    )


def test_min_in_sync_replicas_and_the_lease_refuse_writes():
    small = master_core(members=(1, 2), min_in_sync_replicas=3)
    with pytest.raises(FailedPrecondition) as refused:
        small.check_writable(1)
    assert refused.value.code == "IN_SYNC_REPLICAS_NOT_ENOUGH"
    expired = master_core()
    with pytest.raises(NotMaster, match="lease"):
        expired.check_writable(2001)
    slave = new_core()
    slave.handle(info(2, 1, (2, 1)))
    with pytest.raises(NotMaster) as refused_slave:
        slave.check_writable(0)
    assert refused_slave.value.leader == "10.0.0.2:10911"


# core.py: the SyncStateSet plan and the pending union --------------------------------------
def caught_up_expansion() -> BrokerCore:
    """A master alone in its set whose slave 2 has caught up: it proposes [1, 2]."""
    core = master_core(members=(1,), log=epoch1(100))
    core.handle(fetch(2, 100, epoch1(100), now_ms=10))
    effects = core.handle(Tick(20, epoch1(100)))
    assert effects == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    assert core.pending_sync_state_set == (1, 2)
    return core


def test_an_expansion_in_flight_counts_the_newcomer_at_once():
    """RocketMQ #5663: the controller may commit [1, 2] before this master hears of it."""
    core = caught_up_expansion()
    core.handle(Appended(epoch1(150)))
    assert core.confirm_offset == 100 and core.write_outcome(150, 1) is WriteOutcome.WAITING
    assert core.handle(Tick(30, epoch1(150))) == [], "one change at a time"
    core.handle(fetch(2, 150, epoch1(150), now_ms=40))
    assert core.confirm_offset == 150


def test_without_the_pending_union_the_master_confirms_alone(monkeypatch):
    """The planted bug of test_broker_simulation, seen in one step."""
    monkeypatch.setattr(core_module, "counted_members", lambda master, members, pending: {master, *members})
    core = caught_up_expansion()
    core.handle(Appended(epoch1(150)))
    assert core.confirm_offset == 150


def test_a_committed_change_is_adopted_and_the_union_dropped():
    core = caught_up_expansion()
    effects = core.handle(SyncStateSetChanged(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100))))
    assert effects == [] and core.sync_state_set == (1, 2) and core.pending_sync_state_set is None


def test_an_uncertain_proposal_is_sent_again_and_counted_until_definitive():
    """P16: a proposal with no answer may commit at any later time, so the union is never
    dropped on a timer: the same proposal goes out again until one outcome is definitive."""
    core = caught_up_expansion()
    assert core.handle(SyncStateSetFailed(100)) == [RequestRefresh()]
    retry_ms = 100 + core_module.PROPOSAL_RETRY_INTERVAL_MS
    assert core.handle(Tick(retry_ms - 1, epoch1(100))) == [], "not before the retry interval"
    assert core.handle(Tick(retry_ms, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    assert core.handle(Tick(retry_ms + 1, epoch1(100))) == [], "one copy in flight at a time"
    for failed_ms in range(retry_ms, 60_000, core_module.PROPOSAL_RETRY_INTERVAL_MS):
        core.handle(SyncStateSetFailed(failed_ms))  # a minute of timeouts (past any grace)
        resent = core.handle(Tick(failed_ms + core_module.PROPOSAL_RETRY_INTERVAL_MS, epoch1(100)))
        assert resent == [ProposeSyncStateSet(1, 1, 1, (1, 2))], "the same proposal, same base epoch"
        assert core.pending_sync_state_set == (1, 2)
    core.handle(info(1, 1, (1,), set_epoch=1, log=epoch1(100)))
    assert core.pending_sync_state_set == (1, 2), "a refresh of the same set epoch keeps it"
    core.handle(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100)))
    assert core.pending_sync_state_set is None and core.sync_state_set == (1, 2)


def test_a_fenced_proposal_is_counted_until_the_refresh_shows_the_newer_epoch():
    """FENCED_SYNC_STATE_SET_EPOCH may mean an earlier copy of it committed: keep counting."""
    core = caught_up_expansion()
    fenced = ProposalOutcome.of_code("FENCED_SYNC_STATE_SET_EPOCH")
    assert fenced is ProposalOutcome.FENCED
    assert core.handle(SyncStateSetFailed(100, fenced)) == [RequestRefresh()]
    assert core.pending_sync_state_set == (1, 2)
    core.handle(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100)))
    assert core.pending_sync_state_set is None and core.sync_state_set == (1, 2)


def test_a_refused_proposal_is_dropped_and_a_new_epoch_ends_any():
    """Refused by the state machine at its base epoch, no copy can ever apply; nor can one
    of an older master epoch once a newer master was elected."""
    core = caught_up_expansion()
    refused = ProposalOutcome.of_code("MASTER_NOT_AVAILABLE")
    assert refused is ProposalOutcome.NOT_ALIVE
    core.handle(SyncStateSetFailed(100, refused))
    assert core.pending_sync_state_set is None
    pause_end_ms = 100 + core_module.PROPOSAL_RETRY_INTERVAL_MS
    assert core.handle(Tick(pause_end_ms - 1, epoch1(100))) == [], "no refusal loop"
    core.handle(fetch(2, 100, epoch1(100), now_ms=pause_end_ms))  # still caught up
    assert core.handle(Tick(pause_end_ms, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))], (
        "planned again at once after the pause, not after a 7 s grace (the quarantined lease test)"
    )
    assert ProposalOutcome.of_code("DEADLINE_EXCEEDED") is ProposalOutcome.UNCERTAIN
    assert ProposalOutcome.of_code("NOT_LEADER") is ProposalOutcome.UNCERTAIN
    other = caught_up_expansion()
    other.handle(SyncStateSetFailed(100))
    other.handle(info(2, 2, (2,), set_epoch=1, log=epoch1(100)))
    assert other.pending_sync_state_set is None


def test_a_member_not_alive_after_an_unanswered_copy_keeps_the_union_counted():
    """A copy refused because a member was not alive says nothing of an earlier copy that
    timed out: that one carries the liveness of its own moment and may still commit (the
    simulation's seed 4 once saw it commit after the refusal, adding a lagging member)."""
    core = caught_up_expansion()
    core.handle(SyncStateSetFailed(100))  # no answer: the first copy may still commit
    retry_ms = 100 + core_module.PROPOSAL_RETRY_INTERVAL_MS
    assert core.handle(Tick(retry_ms, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    core.handle(SyncStateSetFailed(retry_ms + 1, ProposalOutcome.of_code("MASTER_NOT_AVAILABLE")))
    assert core.pending_sync_state_set == (1, 2), "still counted: the first copy may commit"
    again_ms = retry_ms + 1 + core_module.PROPOSAL_RETRY_INTERVAL_MS
    assert core.handle(Tick(again_ms, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    core.handle(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100)))
    assert core.pending_sync_state_set is None and core.sync_state_set == (1, 2)


def test_a_lagging_member_is_shrunk_by_a_proposal_but_counted_until_it_commits():
    core = master_core(members=(1, 2, 3), log=epoch1(100))
    core.handle(fetch(2, 100, epoch1(100), now_ms=900))
    core.handle(fetch(3, 50, epoch1(100), now_ms=900))
    assert core.handle(Tick(1500, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    assert core.confirm_offset == 50, "3 still counts while its removal is in flight"
    core.handle(SyncStateSetChanged(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100))))
    assert core.confirm_offset == 100


# core.py: fetches on the master -----------------------------------------------------------
def test_fetch_refusals():
    slave = new_core()
    slave.handle(info(2, 1, (2, 1)))
    refused = slave.handle(fetch(3, 0, epoch1(0)))
    assert len(refused) == 1 and isinstance(refused[0], Refuse) and isinstance(refused[0].error, NotMaster)
    stale = master_core()
    refused = stale.handle(fetch(2, 0, epoch1(0), master_epoch=2))
    assert refused[0] == RequestRefresh() and isinstance(refused[1].error, FencedEpoch)
    assert stale.handle(FetchStillWaiting(master_epoch=1)) == []
    assert isinstance(stale.handle(FetchStillWaiting(master_epoch=5))[-1], Refuse)


def test_a_handshake_is_answered_with_the_consistent_point():
    master_log = LogView(300, ((1, 0), (3, 200)))
    core = master_core(log=master_log, epoch=3)
    divergent = ((1, 0), (2, 150))  # epoch 2 never reached this master
    effects = core.handle(fetch(2, 260, master_log, master_epoch=3, handshake=True, epoch_entries=divergent))
    assert effects == [AnswerFetch(truncate_to=150)]
    assert core.acked_offsets() == {2: 0, 3: 0}, "a truncation answer acknowledges nothing"
    agreeing = core.handle(fetch(2, 120, master_log, master_epoch=3, handshake=True, epoch_entries=((1, 0),)))
    assert agreeing == [AnswerFetch(from_offset=120)] and core.acked_offsets()[2] == 120
    beyond = core.handle(fetch(2, 400, master_log, master_epoch=3))
    assert beyond == [AnswerFetch(truncate_to=0)], "past the master's end without a lineage: from 0"
    moved = core.handle(fetch(2, 10, LogView(300, ((1, 0), (3, 200)), min_offset=100), master_epoch=3))
    assert moved == [AnswerFetch(moved_to_tiered=True)]


def test_truncation_point_is_the_consistent_point_when_something_must_go():
    cases = [
        (((1, 0), (2, 150)), 260, ((1, 0), (3, 200)), 300),
        (((1, 0),), 120, ((1, 0), (3, 200)), 300),
        (((1, 0),), 250, ((1, 0), (3, 200)), 300),
        ((), 0, ((1, 0),), 10),
    ]
    for slave, slave_max, master, master_max in cases:
        point = consistent_point(slave, master, master_max, slave_max)
        assert truncation_point(slave, slave_max, master, master_max) == (
            point if point < slave_max else None
        )
    assert truncation_point(((1, 0),), 250, ((1, 0), (3, 200)), 300) == 200


def test_fetch_answered_marks_the_slave_caught_up_as_of_the_answer():
    core = master_core(members=(1, 2), log=epoch1(100))
    core.handle(fetch(2, 0, epoch1(100), now_ms=0))
    core.handle(FetchAnswered(now_ms=50, broker_id=2, log=epoch1(100)))
    core.handle(fetch(2, 100, epoch1(200), now_ms=900))  # reached what the answer held
    assert core.handle(Tick(1040, epoch1(200))) == [], "caught up as of 50 ms: still in the window"
    assert core.handle(Tick(1051, epoch1(200))) == [ProposeSyncStateSet(1, 1, 1, (1,))]


# core.py: the slave's side ----------------------------------------------------------------
def test_the_slave_truncates_or_appends_and_caps_the_confirm_offset():
    core = new_core()
    core.handle(info(2, 2, (2, 1)))
    session = core.fetch_session
    log = LogView(260, ((1, 0), (2, 150)))
    assert core.handle(MasterAnswered(session + 1, 2, 150, 0, b"", log)) == [], "another session"
    assert core.handle(MasterAnswered(session, 2, 150, 0, b"", log)) == [Truncate(150, 2)]
    assert core.handle(MasterAnswered(session, 2, 300, 0, b"", log)) == [], "nothing above its end to cut"
    assert core.handle(MasterAnswered(session, 3, -1, 260, b"xy", log)) == [
        AppendReplicated(260, b"xy"),
        RequestRefresh(),
    ], "a newer epoch in the answer: refresh too"
    assert core.handle(Replicated(session, 999, LogView(262, ((1, 0),)))) == [
        NoteConfirm(Role.SLAVE, 2, 262, ())
    ]
    assert core.handle(Replicated(session + 1, 5, log)) == [] and core.confirm_offset == 262


# core.py: tiered uploads, stopping ----------------------------------------------------------
def test_an_upload_past_the_confirm_offset_is_refused():
    core = master_core(members=(1,), log=epoch1(100))
    assert core.handle(UploadStarting(100)) == [NoteConfirm(Role.MASTER, 1, 100, (), force=True)]
    refused = core.handle(UploadStarting(101))
    assert isinstance(refused[0], Refuse) and "past the confirm offset" in str(refused[0].error)


def test_after_stop_every_event_is_ignored():
    core = new_core()
    core.handle(info(2, 1, (2, 1)))
    assert core.handle(Stop()) == [StopFetching(1), WakeWaiters()]
    assert core.handle(info(1, 2, (1,))) == [] and core.role == Role.FENCED


# core.py: graceful handoff and leaving -----------------------------------------------------
def handing_off(preferred: int = 0, deadline_ms: int = 3000) -> BrokerCore:
    """Master 1 of (1, 2, 3) with 100 bytes appended, acked by 2 (80) and 3 (60)."""
    core = master_core(log=epoch1(100))
    core.handle(fetch(2, 80, epoch1(100)))
    core.handle(fetch(3, 60, epoch1(100)))
    assert core.handle(HandoffStart(0, deadline_ms, preferred)) == [WakeWaiters()]
    return core


def test_a_handoff_refuses_writes_at_once_and_elects_only_a_successor_holding_everything():
    core = handing_off()
    assert not core.writable(1) and core.view().departure is Departure.HANDING_OFF
    with pytest.raises(NotMaster, match="handing off"):
        core.check_writable(1)
    assert core.handle(HandoffTick(10, epoch1(100))) == [], "nobody holds all 100 bytes yet"
    core.handle(fetch(2, 100, epoch1(100)))
    assert core.handle(HandoffTick(20, epoch1(100))) == [], "broker 3 has not acked: a write is in flight"
    core.handle(fetch(3, 100, epoch1(100)))
    assert core.write_outcome(100, 1) is WriteOutcome.ACKNOWLEDGED
    assert core.handle(HandoffTick(30, epoch1(100))) == [ElectSuccessor(2, 1)], "the first that holds it all"
    assert core.handle(HandoffTick(40, epoch1(100))) == [], "asked once"
    core.handle(info(2, 2, (2,)))
    assert core.role == Role.SLAVE and core.view().departure is Departure.STAYING


def test_at_the_deadline_a_successor_holding_everything_is_elected_else_the_handoff_gives_up():
    core = handing_off(deadline_ms=100)
    core.handle(fetch(3, 100, epoch1(100)))
    assert core.handle(HandoffTick(100, epoch1(100))) == [ElectSuccessor(3, 1)], "2 still lags: 3 holds all"
    stuck = handing_off(deadline_ms=100)
    effects = stuck.handle(HandoffTick(100, epoch1(100)))
    assert isinstance(effects[-1], Refuse) and "did not catch up" in str(effects[-1].error)
    assert stuck.writable(101), "nothing was asked: writes resume at once"


def test_a_handoff_prefers_the_named_slave_and_needs_an_in_sync_one():
    core = handing_off(preferred=3)
    core.handle(fetch(2, 100, epoch1(100)))
    core.handle(fetch(3, 100, epoch1(100)))
    assert core.handle(HandoffTick(10, epoch1(100))) == [ElectSuccessor(3, 1)]
    alone = master_core(members=(1,), log=epoch1(100))
    alone.handle(HandoffStart(0, 3000))
    effects = alone.handle(HandoffTick(1, epoch1(100)))
    assert isinstance(effects[-1], Refuse) and effects[-1].error.code == "NO_IN_SYNC_SLAVE"
    assert alone.writable(2)
    slave = new_core()
    slave.handle(info(2, 1, (2, 1)))
    assert isinstance(slave.handle(HandoffStart(0, 3000))[0], Refuse), "only the master hands off"


def test_after_a_failed_election_call_writes_stay_refused_for_the_grace():
    core = handing_off()
    for broker_id in (2, 3):
        core.handle(fetch(broker_id, 100, epoch1(100)))
    assert core.handle(HandoffTick(10, epoch1(100))) == [ElectSuccessor(2, 1)]
    assert core.handle(HandoffFailed(20, "deadline exceeded")) == [RequestRefresh()]
    assert not core.writable(25)
    again = core.handle(HandoffStart(30, 3000))
    assert isinstance(again[0], Refuse) and "may still commit" in str(again[0].error)
    core.handle(Tick(20 + 7000, epoch1(100)))
    assert not core.writable(20 + 7000), "the grace (7000 ms) has not passed"
    core.handle(HeartbeatAnswered(7000, 1, 1, 1, lease_ms=0))  # still the master: the lease runs on
    core.handle(Tick(20 + 7001, epoch1(100)))
    assert core.writable(20 + 7001) and core.view().departure is Departure.STAYING


def test_a_master_shutting_down_leaves_after_its_handoff_and_a_leaving_slave_is_dropped():
    core = master_core(log=epoch1(100))
    core.handle(HandoffStart(0, 3000, then_leave=True))
    core.handle(info(2, 2, (2,)))
    assert core.role == Role.SLAVE and core.view().departure is Departure.LEAVING
    master = master_core(log=epoch1(100))
    for broker_id in (2, 3):
        master.handle(fetch(broker_id, 100, epoch1(100), now_ms=10))
    master.handle(fetch(3, 100, epoch1(100), now_ms=20, leaving=True))
    assert master.handle(Tick(30, epoch1(100))) == [ProposeSyncStateSet(1, 1, 1, (1, 2))]
    master.handle(SyncStateSetChanged(info(1, 1, (1, 2), set_epoch=2, log=epoch1(100))))
    master.handle(fetch(3, 100, epoch1(100), now_ms=40, leaving=True))
    assert master.handle(Tick(50, epoch1(100))) == [], "a leaving slave is not added back"
    master.handle(fetch(3, 100, epoch1(100), now_ms=60))  # restarted: it stays now
    assert master.handle(Tick(70, epoch1(100))) == [ProposeSyncStateSet(1, 1, 2, (1, 2, 3))]
    alone_master = master_core()
    assert isinstance(alone_master.handle(Leave())[0], Refuse), "a master hands off instead"


# agent.py: the shell carries the effects out ----------------------------------------------
@pytest.fixture
def agent(tmp_path):
    made: list[BrokerAgent] = []

    def make(**overrides) -> BrokerAgent:
        config = BrokerConfig(
            cluster="C",
            broker_name="b",
            listen="127.0.0.1:1",
            controllers=["127.0.0.1:1"],
            data_dir=tmp_path / f"b{len(made)}",
            **overrides,
        )
        made.append(BrokerAgent(config))  # nothing touches the network before start()
        return made[-1]

    yield make
    for each in made:
        each.stop()


def replica_info(master: int, epoch: int, members: list[int]) -> cpb.ReplicaInfo:
    return cpb.ReplicaInfo(
        master_broker_id=master,
        master_address="10.0.0.2:10911",
        master_epoch=epoch,
        sync_state_set=members,
        sync_state_set_epoch=epoch,
        replicas=[cpb.Replica(broker_id=i) for i in (1, 2, 3)],
    )


def test_the_agent_begins_the_epoch_in_its_store_and_writes_as_master(agent):
    a = agent()
    a.feed(Registered(1, lease_ms=60_000))
    a.apply_replica_info(replica_info(1, 4, [1]))
    assert a.store.epochs.entries == [(4, 0)]
    a.feed(
        HeartbeatAnswered(now_ms(), master_broker_id=1, master_epoch=4, sync_state_set_epoch=4, lease_ms=0)
    )
    results, epoch = a.send([Message(topic="T", queue_id=0, body=b"x")])
    assert epoch == 4 and a.view().confirm_offset == a.store.max_offset > 0


def test_the_agent_refuses_writes_without_a_lease_or_a_big_enough_set(agent):
    a = agent(min_in_sync_replicas=3)
    a.feed(Registered(1, lease_ms=60_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2]))
    with pytest.raises(NotMaster, match="lease"):
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    with pytest.raises(FailedPrecondition) as refused:
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    assert refused.value.code == "IN_SYNC_REPLICAS_NOT_ENOUGH"
    assert a.store.max_offset == 0, "a refused write appends nothing"


def test_a_failed_epoch_begin_fences_the_broker(agent, monkeypatch):
    a = agent()
    a.feed(Registered(1, lease_ms=60_000))

    def broken(epoch: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(a.store, "begin_epoch", broken)
    with pytest.raises(ResourceExhausted) as full:
        a.apply_replica_info(replica_info(1, 1, [1]))
    assert full.value.code == "DISK_FULL" and "is full" in full.value.message
    assert a.view().role == Role.FENCED, "never master without its epoch entry"
    monkeypatch.undo()
    a.apply_replica_info(replica_info(1, 1, [1]))
    assert a.view().role == Role.MASTER and a.store.epochs.entries == [(1, 0)]


def test_a_waiting_writer_is_woken_when_the_confirm_offset_covers_it_and_only_then(agent, monkeypatch):
    """Writers wait for acknowledgement on their own conditions (agent._wake_writers):
    with the periodic re-check made longer than the test, a writer returns only because
    the slave's ack that covers its end woke it; a writer whose end is not covered yet
    keeps waiting (an append acknowledges nothing) until an ack covers it too."""
    monkeypatch.setattr(agent_module, "ACK_POLL_INTERVAL_S", 60.0)
    a = agent(send_timeout_ms=60_000)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    ends: list[int] = []
    for i in range(2):
        _, end, epoch = a.append(lambda e, i=i: a.store.put_messages([Message("T", 0, b"x" * (i + 1))], e, 1))
        ends.append(end)
    done: list[int] = []
    writers = [
        threading.Thread(
            target=lambda end=end: (a.wait_acknowledged(end, epoch), done.append(end)), daemon=True
        )
        for end in ends
    ]
    for writer in writers:
        writer.start()
    wait_for(lambda: len(a._writers) == 2, 10, "both writers waiting")
    _, third, _ = a.append(lambda e: a.store.put_messages([Message("T", 0, b"z")], e, 1))
    assert done == [], "an append acknowledges nothing while the slave has acked nothing"
    a.feed(fetch(2, ends[0], LogView(a.store.max_offset, ((1, 0),)), now_ms=now_ms()))
    writers[0].join(10)
    assert done == [ends[0]] and writers[1].is_alive(), "only the covered writer returned"
    a.feed(fetch(2, third, LogView(a.store.max_offset, ((1, 0),)), now_ms=now_ms()))
    writers[1].join(10)
    assert done == ends and not a._writers


def test_the_master_serves_unsynced_bytes_but_acks_only_what_it_synced(agent):
    """Group commit overlapped with replication: an append is written at once and synced
    later; a slave is served it before the master's fsync (its own write and fsync run
    meanwhile), but a write counts as acknowledged only once the master's own fsync
    covers it too, whatever the slaves hold."""
    a = agent(fsync=True)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    _, end, _ = a.append(lambda e: a.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    assert a.store.durable_offset == 0 < end

    def fetch_from(offset: int) -> bpb.HaFetchResponse:
        request = bpb.HaFetchRequest(broker_id=2, master_epoch=1, fetch_offset=offset, wait_ms=0)
        return ha_fetch.serve_fetch(a, request)

    assert len(fetch_from(0).data) == end, "served before the master's fsync"
    fetch_from(end)  # the slave holds it all
    assert a.view().confirm_offset == 0, "the master has not synced it: not acknowledged"
    assert a.core.write_outcome(end, 1) is WriteOutcome.WAITING
    a.store.sync(end)
    a.feed(Synced(log_view(a.store)))
    assert a.view().confirm_offset == end
    assert a.core.write_outcome(end, 1) is WriteOutcome.ACKNOWLEDGED


def test_a_long_poll_is_answered_by_the_append_not_the_sync(agent):
    """A fetch waiting for data is woken by the append itself: the master's fsync is not
    on the way to the slaves."""
    a = agent(fsync=True)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    request = bpb.HaFetchRequest(broker_id=2, master_epoch=1, fetch_offset=0, wait_ms=5_000)
    answers: list[bpb.HaFetchResponse] = []
    poll = threading.Thread(target=lambda: answers.append(ha_fetch.serve_fetch(a, request)), daemon=True)
    started = time.monotonic()
    poll.start()
    wait_for(lambda: a._fetchers, 5, "the fetch waiting for data")
    _, end, _ = a.append(lambda e: a.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    poll.join(timeout=5)
    assert answers and len(answers[0].data) == end
    assert a.store.durable_offset == 0, "answered before any fsync"
    assert time.monotonic() - started < 2.5, "woken by the append, not by the end of its wait"


def test_a_long_poll_sleeps_through_syncs_and_other_slaves_acks(agent):
    """A fetch waiting for data is woken by what it waits for (the log growing), not by
    the master's sync or another slave's acknowledgement: each such wake-up cost the
    master a thread switch on every send's path."""
    a = agent(fsync=True)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2, 3]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    _, end, _ = a.append(lambda e: a.store.put_messages([Message("T", 0, b"x" * 100)], e, 1))
    fed: list[object] = []
    feed = a.feed
    a.feed = lambda event: fed.append(event) or feed(event)  # type: ignore[method-assign]
    request = bpb.HaFetchRequest(broker_id=2, master_epoch=1, fetch_offset=end, wait_ms=5_000)
    answers: list[bpb.HaFetchResponse] = []
    poll = threading.Thread(target=lambda: answers.append(ha_fetch.serve_fetch(a, request)), daemon=True)
    poll.start()
    wait_for(lambda: a._fetchers, 5, "the fetch waiting for data")
    a.store.sync(end)
    a.feed(Synced(log_view(a.store)))  # the master's own sync: the confirm offset may move
    ha_fetch.serve_fetch(a, bpb.HaFetchRequest(broker_id=3, master_epoch=1, fetch_offset=end, wait_ms=0))
    assert a.view().confirm_offset == end, "the sync and broker 3's ack moved the confirm offset"
    for _ in sample_for(0.3, 0.05):  # the waiting fetch's thread had the time to run
        assert not any(isinstance(e, FetchStillWaiting) for e in fed), "the waiting fetch was woken"
    _, grown, _ = a.append(lambda e: a.store.put_messages([Message("T", 0, b"y" * 100)], e, 1))
    poll.join(timeout=5)
    assert answers and answers[0].data_offset == end and len(answers[0].data) == grown - end


def test_a_master_that_re_adopts_its_epoch_cuts_slaves_back_to_what_it_found_durable():
    """A power loss took from the master bytes its slaves were served (they are served
    unsynced bytes). Restarted as master of the same epoch, it writes other bytes at those
    offsets: a slave that holds more than the durable end found must cut there before it
    is served or counted, whatever the master's log end is by then; a slave that holds no
    more is trusted at once; a new epoch cuts by the consistent point as before."""
    durable_found = 300
    core = new_core()
    core.handle(info(1, 1, (1, 2, 3), log=LogView(durable_found, ((1, 0),), 0, durable_found)))
    core.handle(HeartbeatAnswered(0, 1, 1, 1, lease_ms=0))
    assert core.role == Role.MASTER
    assert not core.trusts(2) and not core.trusts(3)
    grown = LogView(900, ((1, 0),), 0, 900)  # written again past 300 since the restart
    entries = ((1, 0),)
    # handshake from a slave holding 500 bytes of epoch 1: the old bytes 300..500
    cut = core.handle(fetch(2, 500, grown, handshake=True, epoch_entries=entries))
    assert cut == [AnswerFetch(truncate_to=durable_found)]
    assert core.acked_offsets()[2] == 0, "its fetch offset acknowledged nothing"
    assert not core.trusts(2)
    served = core.handle(fetch(2, durable_found, grown))
    assert served[-1] == AnswerFetch(from_offset=durable_found) and core.trusts(2)
    later = core.handle(fetch(2, 600, grown, handshake=True, epoch_entries=entries))
    assert later[-1] == AnswerFetch(from_offset=600), "bytes past 300 are this process's now"
    # a slave that never held more is trusted at its first fetch
    assert core.handle(fetch(3, 200, grown))[-1] == AnswerFetch(from_offset=200) and core.trusts(3)
    # a master that begins its epoch cuts nobody beyond the consistent point
    fresh = new_core()
    fresh.handle(info(1, 2, (1, 2), log=LogView(durable_found, ((1, 0),), 0, durable_found)))
    fresh.handle(HeartbeatAnswered(0, 1, 2, 2, lease_ms=0))
    assert fresh.trusts(2)
    begun = LogView(900, ((1, 0), (2, durable_found)), 0, 900)
    answer = fresh.handle(fetch(2, 250, begun, master_epoch=2, handshake=True, epoch_entries=entries))
    assert answer[-1] == AnswerFetch(from_offset=250)


def test_a_full_disk_refuses_the_write_keeps_nothing_and_the_master_goes_on(agent, monkeypatch):
    """disk-full: ENOSPC from the commit log's write is RESOURCE_EXHAUSTED/DISK_FULL (a
    definite refusal), the log is as before, and the next write after space returns works."""
    a = agent(fsync=True)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    a.send([Message(topic="T", queue_id=0, body=b"first")])
    end = a.store.max_offset
    real = os.pwrite
    monkeypatch.setattr(agent_module, "exit_at_once", lambda status: None)  # were it taken for EIO

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(ResourceExhausted) as refused:
        a.send([Message(topic="T", queue_id=0, body=b"refused")])
    assert refused.value.code == "DISK_FULL" and "nothing of it kept" in refused.value.message
    assert a.store.max_offset == end and a.view().role == Role.MASTER and not a.core.disk_failed
    monkeypatch.setattr(os, "pwrite", real)
    a.send([Message(topic="T", queue_id=0, body=b"after")])
    bodies = [r.body for r in a.store.get_messages("T", 0, 0, 10, a.view().confirm_offset)]
    assert bodies == [b"first", b"after"]


def test_a_failed_group_commit_fences_the_master(agent, monkeypatch):
    """The fdatasync failure is injected (no real EIO can be made here): the write is
    not acknowledged, and the broker writes nothing more as master."""
    a = agent(fsync=True)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))

    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    exits: list[int] = []
    monkeypatch.setattr(agent_module, "exit_at_once", exits.append)  # the process would end here
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(Unavailable, match="fenced"):
        a.send([Message(topic="T", queue_id=0, body=b"x")])
    monkeypatch.setattr(os, "fdatasync", real)
    assert a.view().role == Role.FENCED and a.view().confirm_offset == 0
    with pytest.raises(MqmetaError):
        a.send([Message(topic="T", queue_id=0, body=b"y")])
    a._manage_sync_state_set()  # the controller loop's tick goes on: nothing left to sync
    wait_for(lambda: exits == [agent_module.EXIT_DISK_FAILED], 10, "the broker to exit")
    a.apply_replica_info(replica_info(1, 1, [1]))
    assert a.view().role == Role.FENCED, "never master again in this process"


# core.py: stale messages from the controller and from slaves -------------------------------
def test_a_stale_replica_info_after_a_newer_heartbeat_reply_never_makes_a_master():
    """The watch stream and the heartbeat are separate streams (maybe to different
    controller nodes): a broker told by a heartbeat reply that the set is at epoch 4
    (renewing its lease as a slave) must not then become a writable master at epoch 3
    from a late replica info."""
    core = new_core()
    core.handle(info(2, 2, (2, 1)))
    assert RequestRefresh() in core.handle(HeartbeatAnswered(100, 3, 4, 4, lease_ms=0))
    assert core.lease_valid(101)
    assert core.handle(info(1, 3, (1,))) == [], "older than the epoch the controller already named"
    assert core.role == Role.SLAVE and not core.writable(101)
    core.handle(info(3, 4, (3, 1)))
    assert core.master_epoch == 4 and core.follows(core.fetch_session)


def test_a_fetch_of_an_older_epoch_is_refused_and_acknowledges_nothing():
    """A fetch delayed across elections (a held TCP stream) says nothing about the slave's
    log now: it must not count as an ack of this epoch's bytes."""
    core = master_core(members=(1, 2), log=epoch1(300), epoch=3)
    refused = core.handle(fetch(2, 300, epoch1(300), master_epoch=2))
    assert len(refused) == 1 and isinstance(refused[0].error, FencedEpoch)
    assert core.acked_offsets() == {2: 0} and core.confirm_offset == 0


# core.py: a corrupt record found in the local log (P16) ----------------------------------
def test_a_slave_with_a_corrupt_record_cuts_there_and_fetches_again_a_master_does_not():
    slave = new_core()
    started = slave.handle(info(2, 1, (2, 1)))
    session = next(e for e in started if isinstance(e, StartFetching)).session
    effects = slave.handle(CorruptionFound(4096))
    assert effects == [
        StopFetching(session),
        Truncate(4096, 1),
        StartFetching(session + 1, 2, "10.0.0.2:10911", 1),
    ], "the old fetcher stops before the cut; the new session's handshake starts at it"
    assert not slave.follows(session) and slave.follows(session + 1)
    master = master_core()
    assert master.handle(CorruptionFound(4096)) == [], "a master hands off in the shell; no cut"


class _RefusingFirstElection:
    """A controller that refuses the broker's first election, as a leader does for a broker
    that registered under load before any heartbeat of it reached that leader."""

    def __init__(self) -> None:
        self.elections = 0

    def register_broker(self, request: cpb.RegisterBrokerRequest) -> cpb.RegisterBrokerResponse:
        return cpb.RegisterBrokerResponse(broker_id=1, replica_info=cpb.ReplicaInfo())

    def get_config(self, request: cpb.GetConfigRequest) -> cpb.ControllerConfig:
        return cpb.ControllerConfig()

    def get_replica_info(self, request: cpb.BrokerSetRef) -> cpb.ReplicaInfo:
        return cpb.ReplicaInfo()  # no master yet

    def elect_master(self, request: cpb.ElectMasterRequest) -> cpb.ReplicaInfo:
        self.elections += 1
        if self.elections == 1:
            raise FailedPrecondition("no alive in-sync replica can become master of C/b")
        return replica_info(1, 1, [1])

    def heartbeat(self, request: cpb.HeartbeatRequest) -> cpb.HeartbeatResponse:
        return cpb.HeartbeatResponse(master_broker_id=0, master_epoch=0, sync_state_set_epoch=0)

    def close(self) -> None:
        pass


def test_a_refused_first_election_is_asked_again_until_the_set_has_a_master(agent):
    """Before the fix the loop asked once: the refusal left the set masterless for good,
    since heartbeat replies matching the broker's own view never call for a refresh."""
    a = agent()
    a.controller = _RefusingFirstElection()
    loop = threading.Thread(target=a._controller_loop, daemon=True)
    loop.start()
    try:
        wait_for(
            lambda: a.view().role,
            10,
            "the broker to become master after a refused election",
            until=lambda role: role == Role.MASTER,
        )
        assert a.controller.elections == 2
    finally:
        a.stopping.set()
        loop.join(timeout=5)


class _ForgettingController(_RefusingFirstElection):
    """A controller that records each registration and answers the first heartbeat
    NOT_FOUND (the broker set was cleaned), so the broker registers again in one process."""

    def __init__(self) -> None:
        super().__init__()
        self.registrations: list[cpb.RegisterBrokerRequest] = []
        self.heartbeats = 0

    def register_broker(self, request: cpb.RegisterBrokerRequest) -> cpb.RegisterBrokerResponse:
        self.registrations.append(request)
        return cpb.RegisterBrokerResponse(broker_id=1, replica_info=replica_info(1, 1, [1]))

    def heartbeat(self, request: cpb.HeartbeatRequest) -> cpb.HeartbeatResponse:
        self.heartbeats += 1
        if self.heartbeats == 1:
            raise NotFound("broker set C/b is not registered")
        return cpb.HeartbeatResponse(master_broker_id=1, master_epoch=1, sync_state_set_epoch=1)


def test_only_a_processs_first_registration_says_it_is_a_new_process(agent):
    """The controller gives the set's master a new epoch when its registration says it is
    a new process (a restart): the agent says so once; registering again in the same
    process (after NOT_FOUND) does not, so it changes no role."""
    a = agent()
    a.controller = _ForgettingController()
    loop = threading.Thread(target=a._controller_loop, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(a.controller.registrations), 10, "a second registration", until=lambda n: n >= 2)
        assert [r.new_process for r in a.controller.registrations[:2]] == [True, False]
    finally:
        a.stopping.set()
        loop.join(timeout=5)


def test_concurrent_sends_are_written_together_and_a_bad_message_fails_only_its_send(agent, monkeypatch):
    """Sends that arrive while another's write is in flight go together in the next write
    (one append, one group commit, one replication round); when that write is refused
    (a message of one send is invalid: nothing was written), each send is written alone,
    so the others succeed and only the bad one fails."""
    monkeypatch.setattr(agent_module, "ACK_POLL_INTERVAL_S", 60.0)
    a = agent(send_timeout_ms=60_000)
    a.feed(Registered(1, lease_ms=600_000))
    a.apply_replica_info(replica_info(1, 1, [1, 2]))
    a.feed(HeartbeatAnswered(now_ms(), 1, 1, 1, lease_ms=0))
    outcomes: dict[str, object] = {}

    def send(name: str, message: Message) -> threading.Thread:
        def run() -> None:
            try:
                outcomes[name] = a.send([message])[0][0]
            except MqmetaError as error:
                outcomes[name] = error

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def ack_everything() -> None:
        a.feed(fetch(2, a.store.max_offset, LogView(a.store.max_offset, ((1, 0),)), now_ms=now_ms()))

    def written_together(names: list[str], messages: list[Message]) -> list[threading.Thread]:
        """`names` sent while a first send's write waits for the slave, then acked."""
        first = send(f"first-{names[0]}", Message("T", 0, b"first"))
        wait_for(lambda: len(a._writers) == 1, 10, "the first send waiting for its acknowledgement")
        threads = [send(n, m) for n, m in zip(names, messages, strict=True)]
        waiting = a._sends._waiting
        wait_for(lambda: len(waiting) == 1 and len(waiting[0].records) == len(names), 10, "the next write")
        for _ in sample_for(10, 0.02):  # the slave acknowledges what it has, as it fetches
            ack_everything()
            if not any(t.is_alive() for t in [first, *threads]):
                break
        return threads

    writes = a._sends.writes
    written_together(["a", "b"], [Message("T", 0, b"a"), Message("T", 0, b"b")])
    a_result, b_result = outcomes["a"], outcomes["b"]
    assert a._sends.writes == writes + 2, "the two sends went in one write after the first's"
    assert isinstance(a_result, PutResult) and isinstance(b_result, PutResult)
    assert b_result.queue_offset == a_result.queue_offset + 1
    written_together(["good", "bad"], [Message("T", 0, b"good"), Message(CONSUMER_OFFSET_TOPIC, 0, b"x")])
    assert isinstance(outcomes["good"], PutResult), outcomes["good"]
    assert isinstance(outcomes["bad"], InvalidArgument), outcomes["bad"]
    bodies = [r.body for r in a.store.get_messages("T", 0, 0, 10, a.store.max_offset)]
    assert bodies == [b"first", b"a", b"b", b"first", b"good"]
