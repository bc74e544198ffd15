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
  has moved to the newer term does not confirm the old leader's round either.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from mqmeta.controller import pysyncobj_compat as compat

from tests.support.raft_trio import CuttableTransport, Register, Trio, release_held_ports, wait_for

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
