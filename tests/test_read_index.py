"""ReadIndex (controller/pysyncobj_compat.ReadIndex) on three real pysyncobj nodes in this
process (real TCP on loopback, ticks driven by the test, a transport that can cut links).

Properties checked:
- a read on the leader is answered after one round to a majority, at the commit index,
  once applied, and adds no entry to the log;
- reads waiting together share one round (one ping per follower);
- a read on a follower asks the leader and is answered once the follower has applied
  the leader's index (it sees a write acknowledged before the read);
- a partitioned old leader never answers: cut off from both followers, while they elect
  a new leader and commit a write, its read fails (ReadNotConfirmed), and a follower that
  has moved to the newer term does not confirm the old leader's round either;
- a read confirmed at index i reads the live state while the leader applies i + 1: at that
  moment (forced: inside the apply's commit of the key) the key holds its old value or its
  new one, never none (ControllerState.commit used to delete a key and add it back after
  hashing the new value; a GetTieredCheckpoint read in that gap answered an empty
  checkpoint after an earlier read had seen 100,000 bytes);
- followers' asks queued on a leader that loses its leadership are refused, not taken for
  the node's own reads (they broke its tick), and the asker hears so at once;
- an answer addressed to a previous run of the asking node (ask ids restart at 1 with the
  process) settles none of this run's reads;
- a read queued after the tick took its reads but before InputFirstFix's poll(0) read
  the wake-up byte is still started in that tick, and a round whose pongs that poll(0)
  read is answered in that tick, both before it sleeps in its last poll (each used to
  wait for the next message or heartbeat: 50 ms);
- the leader's lease: once a round's pongs promised vote holds, the leader answers reads
  with no round (no ping); a partitioned leader's lease ends before a follower whose timer
  ran out is elected (it neither stands for election nor gets a vote during its hold), and
  the old leader then no longer reads alone; a follower holding its vote ignores a
  candidate (not even taking its term) until the hold ends; a leader that hands over gives
  its lease up first, and its successor is not held by the hold it promised; a node
  restarted on a journal with a term holds its vote after it starts (the hold its previous
  run may have promised).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, ClassVar

import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.controller import pysyncobj_compat as compat
from mqmeta.controller import state_machine
from mqmeta.controller.raft_node import install_pysyncobj_patches
from mqmeta.controller.state_machine import ControllerState
from pysyncobj import SyncObj, SyncObjConf, replicated

from tests.support.raft_trio import CuttableTransport, Register, Trio, conf, release_held_ports, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def _release_held_ports() -> Iterator[None]:
    yield
    release_held_ports()


@pytest.fixture
def trio() -> Iterator[Trio]:
    made = Trio()
    try:
        made.settle()
        yield made
    finally:
        made.stop()


def answered(future: Future, trio: Trio, nodes: list[Register] | None = None) -> Any:
    wait_for(future.done, 10.0, "the read to be answered or refused", step=lambda: trio.tick(nodes))
    return future.result() if future.exception() is None else future.exception()


def test_a_leader_read_is_confirmed_by_a_majority_and_adds_no_entry(trio):
    leader = trio.nodes[0]
    trio.write(leader, 7)
    trio.settle()
    log_length = leader.getStatus()["log_len"]
    commit = leader.getStatus()["commit_idx"]
    CuttableTransport.pings.clear()
    index = answered(leader.read_index(), trio)
    assert index == commit
    assert leader.raftLastApplied >= index and leader.value == 7
    assert leader.getStatus()["log_len"] == log_length, "a read must not append to the log"
    assert {to for _, to in CuttableTransport.pings} == {n.selfNode.address for n in trio.nodes[1:]}


def test_reads_waiting_together_share_one_round(trio):
    leader = trio.nodes[0]
    CuttableTransport.pings.clear()
    reads = [leader.read_index() for _ in range(20)]
    for read in reads:
        answered(read, trio)
    assert all(isinstance(read.result(), int) for read in reads)
    assert len(CuttableTransport.pings) == 2, CuttableTransport.pings  # one round: one ping per follower


def test_a_follower_read_asks_the_leader_and_sees_an_acknowledged_write(trio):
    leader, follower = trio.nodes[0], trio.nodes[2]
    trio.cut(leader, follower)  # the follower misses the write and its commit...
    trio.write(leader, 11)
    assert follower.value != 11
    trio.heal(leader, follower)  # ...and reads right after the link is back
    index = answered(follower.read_index(), trio)
    assert isinstance(index, int) and follower.raftLastApplied >= index
    assert follower.value == 11


def test_a_partitioned_old_leader_never_answers(trio, monkeypatch):
    monkeypatch.setattr(compat, "READ_ROUND_TIMEOUT_S", 3.0)
    old, new, third = trio.nodes
    trio.write(old, 1)
    trio.settle()
    trio.cut(old, new)
    trio.cut(old, third)
    stale = old.read_index()
    # The others elect n1 and commit a write the old leader never sees.
    wait_for(lambda: compat.is_leader(new), 20.0, "n1 to take over", step=trio.tick)
    trio.write(new, 2)
    assert compat.is_leader(old) and old.value == 1  # it still believes, with a stale value
    # The third node now answers the old leader again, but it is in the newer term.
    trio.heal(old, third)
    outcome = answered(stale, trio)
    assert isinstance(outcome, compat.ReadNotConfirmed), f"the old leader answered a read: {outcome!r}"
    again = answered(old.read_index(), trio, [old, third])
    assert isinstance(again, compat.ReadNotConfirmed), f"the old leader answered a read: {again!r}"


# The state a confirmed read finds while the next write applies ------------------------------

CHECKPOINT_KEY = "tiered/DefaultCluster/broker-a"


class StateRegister(Register):
    """A register kept in a ControllerState, as the controller keeps its data: each write
    replaces one key's value (a tiered checkpoint's shape) through ControllerState.commit."""

    committing: ClassVar[StateRegister | None] = None  # the node whose apply is committing

    def __init__(self, address: str, peers: list[str], conf: SyncObjConf) -> None:
        self.state = ControllerState()
        super().__init__(address, peers, conf)

    @replicated
    def put(self, value: int) -> int:
        StateRegister.committing = self
        segments = [{"base_offset": k * 8192, "end_offset": (k + 1) * 8192} for k in range(value // 8192)]
        self.state.commit({CHECKPOINT_KEY: {"uploaded_offset": value, "segments": segments}})
        StateRegister.committing = None
        self.value = value
        return value


@pytest.fixture
def state_trio() -> Iterator[Trio]:
    made = Trio(node_class=StateRegister)
    try:
        made.settle()
        yield made
    finally:
        made.stop()


def test_a_confirmed_read_never_finds_the_key_missing_while_the_next_write_applies(state_trio, monkeypatch):
    leader = state_trio.nodes[0]
    assert isinstance(leader, StateRegister)
    state_trio.write(leader, 100_000)
    state_trio.settle()
    assert isinstance(answered(leader.read_index(), state_trio), int)
    assert leader.state.get(CHECKPOINT_KEY)["uploaded_offset"] == 100_000  # an earlier read saw this
    # A service thread reads the confirmed state while the Raft thread applies the next
    # write: forced here at the point the commit hashes the new value.
    seen: list[Any] = []
    real_hash = state_machine._entry_hash

    def hash_and_read(key: str, value: Any) -> int:
        if key == CHECKPOINT_KEY and StateRegister.committing is leader:
            seen.append(leader.state.get(CHECKPOINT_KEY))
        return real_hash(key, value)

    monkeypatch.setattr(state_machine, "_entry_hash", hash_and_read)
    state_trio.write(leader, 108_192)
    assert seen, "the leader's apply never committed the key"
    assert all(value is not None for value in seen), f"a read found the checkpoint missing: {seen}"
    assert {value["uploaded_offset"] for value in seen} <= {100_000, 108_192}


# Asks around a change of leader, and across a restart of the asker ---------------------------


def test_asks_queued_on_a_leader_that_steps_down_are_refused_at_once(trio, monkeypatch):
    old, new, asker = trio.nodes
    monkeypatch.setattr(compat, "READ_ROUNDS_INFLIGHT_MAX", 0)  # the leader queues what it is asked
    read = asker.read_index()
    wait_for(lambda: bool(old._reads_waiting), 10.0, "the leader to queue the follower's ask", step=trio.tick)
    old.transferLeadership(new.selfNode, lambda result, error: None)
    wait_for(lambda: compat.is_leader(new) and not compat.is_leader(old), 20.0, "n1 to take over", trio.tick)
    monkeypatch.setattr(compat, "READ_ROUNDS_INFLIGHT_MAX", 4)
    outcome = answered(read, trio)
    assert isinstance(outcome, compat.ReadNotConfirmed) and "not the leader" in str(outcome), outcome
    # the old leader, now a follower, still serves its own reads (its tick did not break)
    assert isinstance(answered(old.read_index(), trio), int)


def test_an_answer_for_a_previous_run_of_the_asker_settles_nothing(trio):
    leader, asker = trio.nodes[0], trio.nodes[2]
    trio.write(leader, 5)
    trio.settle()
    read = asker.read_index()
    asker.doTick(0.0)  # the ask is sent (ask id 1 of this run); the leader has not answered yet
    assert 1 in asker._read_asks
    previous_run = {"type": "read_index_answer", "asks": [1], "incarnation": "a-previous-run"}
    asker._SyncObj__onMessageReceived(None, dict(previous_run, index=1, error=None))
    assert not read.done(), "an answer for the previous run's ask 1 settled this run's read"
    assert answered(read, trio) >= leader.getStatus()["commit_idx"] - 1


# A read that arrives while the tick is under way -----------------------------------------------


class _QueueLateRead(SyncObj):
    """Queues one read (`late`) just after ReadIndex took this tick's reads and before
    InputFirstFix's poll(0) reads the wake-up byte that read wrote: what a gRPC thread
    does when it queues a read at that moment."""

    queue_late = False
    late: Future | None = None

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if self.queue_late:
            self.queue_late = False
            self.late = self.read_index()  # type: ignore[attr-defined]
        super()._onTick(timeToWait)


class LateReadRegister(Register, _QueueLateRead, compat.InputFirstFix):
    """MRO: ReadIndex._onTick (takes the reads), _QueueLateRead, InputFirstFix (poll(0)), SyncObj."""


@pytest.fixture
def late_trio() -> Iterator[Trio]:
    made = Trio(node_class=LateReadRegister)
    try:
        made.settle()
        yield made
    finally:
        made.stop()


def test_a_read_queued_during_the_tick_is_started_before_the_tick_sleeps(late_trio):
    leader = late_trio.nodes[0]
    assert isinstance(leader, LateReadRegister)
    CuttableTransport.pings.clear()
    leader.queue_late = True
    leader.doTick(0.3)  # the followers do not tick: nothing else wakes this poll
    assert leader.late is not None
    assert {to for _, to in CuttableTransport.pings} == {n.selfNode.address for n in late_trio.nodes[1:]}, (
        "the read was not started before the tick slept in its poll"
    )
    assert isinstance(answered(leader.late, late_trio), int)


def test_a_round_confirmed_at_the_start_of_a_tick_is_answered_before_the_tick_sleeps(late_trio):
    leader, *followers = late_trio.nodes
    late_trio.write(leader, 3)  # the no-op of the term is committed: a round can start at once
    read = leader.read_index()
    leader.doTick(0.0)  # the round starts: pings to both followers
    assert len(leader._read_rounds) == 1
    for _ in range(3):
        late_trio.tick(followers)  # they answer: the pongs wait in the leader's socket
    assert not read.done()
    answered_before_poll: list[bool] = []
    leader.addOnTickCallback(lambda: answered_before_poll.append(read.done()))  # runs after ReadIndex's
    leader.doTick(0.3)  # InputFirstFix's poll(0) reads the pongs
    assert answered_before_poll[:1] == [True], "the confirmed round waited for the tick's last poll"
    assert isinstance(read.result(), int)


# The leader's lease ---------------------------------------------------------------------------


def leased(trio: Trio) -> int:
    """n0 holds a lease: a read confirmed by a round whose pongs promised vote holds."""
    leader = trio.nodes[0]
    assert isinstance(answered(leader.read_index(), trio), int)
    return wait_for(leader.lease_read_index, 10.0, "n0 to hold a lease", step=trio.tick)


def test_a_leader_with_a_lease_answers_reads_without_a_round(trio):
    leader = trio.nodes[0]
    trio.write(leader, 4)
    trio.settle()
    leased(trio)
    CuttableTransport.pings.clear()
    for _ in range(20):
        assert leader.lease_read_index() == leader.getStatus()["commit_idx"]
    assert leader.value == 4
    assert CuttableTransport.pings == [], "a read under the lease sent a ping"


def test_a_partitioned_leaders_lease_ends_before_another_leader_is_elected(trio):
    old, new, third = trio.nodes
    trio.write(old, 1)
    trio.settle()
    leased(trio)
    lease_until = old._lease[0]
    trio.cut(old, new)
    trio.cut(old, third)
    new._SyncObj__raftElectionDeadline = 0.0  # its timer runs out now (a clock jump, a restart)
    term = new.raftCurrentTerm
    new.doTick(0.0)
    assert new.raftCurrentTerm == term, "a follower that promised a hold stood for election during it"
    wait_for(lambda: compat.is_leader(new), 20.0, "n1 to take over", step=lambda: trio.tick([new, third]))
    elected_at = compat.monotonic_time()
    assert elected_at >= lease_until, f"n1 was elected {lease_until - elected_at:.3f}s inside n0's lease"
    trio.write(new, 2)
    assert compat.is_leader(old) and old.value == 1  # it still believes, with a stale value
    assert old.lease_read_index() is None, "the old leader read alone after its lease"


def test_a_follower_holding_its_vote_ignores_a_candidate_until_the_hold_ends(trio):
    leader, candidate, voter = trio.nodes
    leased(trio)
    term = voter.raftCurrentTerm
    request = {"type": "request_vote", "term": term + 5, "last_log_index": 10**6, "last_log_term": term + 5}
    voter._SyncObj__onMessageReceived(candidate.selfNode, request)
    assert voter.raftCurrentTerm == term, (
        "a follower holding its vote for the leader moved to the candidate's term"
    )
    wait_for(
        lambda: compat.monotonic_time() > voter._vote_held_until, 5.0, "the hold to end", step=lambda: None
    )
    voter._SyncObj__onMessageReceived(candidate.selfNode, request)
    assert voter.raftCurrentTerm == term + 5  # once the hold is over it votes as before


def test_a_leader_gives_its_lease_up_before_it_hands_over(trio):
    old, new, _ = trio.nodes
    leased(trio)
    hold_until = new._vote_held_until
    old.transferLeadership(new.selfNode, lambda result, error: None)
    assert old.lease_read_index() is None, "a leader handing over still read alone"
    wait_for(lambda: compat.is_leader(new), 20.0, "n1 to take over", step=trio.tick)
    assert compat.monotonic_time() < hold_until, (
        "the successor waited for the hold it promised the old leader"
    )


def test_a_leader_handing_over_frees_every_followers_hold(trio):
    """In a cluster of four or more the successor needs votes of followers other than
    itself; those held their vote for the old leader's lease, and must not hold it now."""
    old, new, other = trio.nodes
    leased(trio)
    assert other._vote_held_until > compat.monotonic_time()
    old.transferLeadership(new.selfNode, lambda result, error: None)
    wait_for(
        lambda: other._vote_held_until == 0.0, 5.0, "the other follower to free its hold", step=trio.tick
    )


def test_a_node_restarted_with_a_term_holds_its_vote_as_it_may_have_promised(tmp_path):
    install_pysyncobj_patches()  # our journal: the term survives the restart
    trio = Trio(tmp_path)
    try:
        trio.settle()
        leased(trio)  # n2 promised n0 a hold just now
        term = trio.nodes[2].raftCurrentTerm
    finally:
        trio.stop()
    # n2 comes back at once (a kill -9 and a quick restart): it no longer remembers the ping
    port = PortReservation.pick(1)  # held while the node listens on it
    address = port.addresses[0]
    peers = [n.selfNode.address for n in trio.nodes[:2]]
    restarted = Register(address, peers, conf(address, 60.0, str(tmp_path / "n2.journal")))
    try:
        assert restarted.raftCurrentTerm == term > 0
        request = {
            "type": "request_vote",
            "term": term + 1,
            "last_log_index": 10**6,
            "last_log_term": term + 1,
        }
        restarted._SyncObj__onMessageReceived(trio.nodes[1].selfNode, request)
        assert restarted.raftCurrentTerm == term, (
            "a restarted node voted within the hold it may have promised"
        )
    finally:
        restarted.destroy()
        port.release()
