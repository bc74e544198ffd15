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

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.controller import pysyncobj_compat as compat
from pysyncobj import SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.transport import TCPTransport

pytestmark = pytest.mark.timeout(60)

BIND_ATTEMPTS_MAX = 5


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, step: Callable[[], None]) -> Any:
    """Runs `step` (manual Raft ticks) until `predicate` holds; fails saying what it waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        step()


class CuttableTransport(TCPTransport):
    """Drops every message from one address to another while the link is cut; counts pings."""

    cut: set[tuple[str, str]] = set()
    pings: list[tuple[str, str]] = []

    def __init__(self, syncObj, selfNode, otherNodes) -> None:  # noqa: N803 - pysyncobj's names
        self.sender = selfNode.address
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node, message) -> bool:
        if (self.sender, node.address) in CuttableTransport.cut:
            return True
        if isinstance(message, dict) and message.get("type") == "read_index_ping":
            CuttableTransport.pings.append((self.sender, node.address))
        return bool(super().send(node, message))


class Register(compat.ReadIndex, SyncObj):
    def __init__(self, address: str, peers: list[str], conf: SyncObjConf) -> None:
        super().__init__(address, peers, conf, transportClass=CuttableTransport)
        self.value = 0

    @replicated
    def put(self, value: int) -> int:
        self.value = value
        return value


def conf(address: str, election_s: float, journal_file: str | None = None) -> SyncObjConf:
    return SyncObjConf(
        journalFile=journal_file,
        autoTick=False,
        appendEntriesUseBatch=False,
        appendEntriesPeriod=0.05,
        raftMinTimeout=election_s,
        raftMaxTimeout=election_s * 1.5,
        leaderFallbackTimeout=30.0,  # the old leader keeps believing: only ReadIndex protects the read
        connectionTimeout=max(5.0, election_s * 1.5),
        bindAddress=address,
        maxBindRetries=1,
    )


_HELD: list[PortReservation] = []


@pytest.fixture(scope="module", autouse=True)
def _release_held_ports() -> Iterator[None]:
    yield
    while _HELD:
        _HELD.pop().release()


class Trio:
    """n0 becomes the leader (short election timeout); n1 can take over (medium); n2 never
    runs out of time."""

    def __init__(self, journal_dir: Path | None = None, node_class: type[Register] = Register) -> None:
        self.journal_dir = journal_dir  # None: pysyncobj's memory journal
        CuttableTransport.cut.clear()
        CuttableTransport.pings.clear()
        for _ in range(BIND_ATTEMPTS_MAX):
            _HELD.append(PortReservation.pick(3))
            addresses = _HELD[-1].addresses
            try:
                self.nodes = self._start(addresses, journal_dir, node_class)
                return
            except SyncObjException:
                continue
        pytest.fail(f"could not bind three loopback ports in {BIND_ATTEMPTS_MAX} attempts")

    @staticmethod
    def _start(addresses: list[str], journal_dir: Path | None, node_class: type[Register]) -> list[Register]:
        started: list[Register] = []
        try:
            for k, (address, election_s) in enumerate(zip(addresses, (0.2, 1.0, 60.0), strict=True)):
                others = [a for a in addresses if a != address]
                journal = None if journal_dir is None else str(journal_dir / f"n{k}.journal")
                started.append(node_class(address, others, conf(address, election_s, journal)))
        except SyncObjException:
            for node in started:
                node.destroy()
            raise
        return started

    def tick(self, nodes: list[Register] | None = None) -> None:
        for node in nodes or self.nodes:
            node.doTick(0.002)

    def settle(self) -> None:
        """n0 leads, and every node has applied everything."""

        def settled() -> bool:
            leader = self.nodes[0]
            commit = leader.getStatus()["commit_idx"]
            return compat.is_leader(leader) and all(n.raftLastApplied == commit for n in self.nodes)

        wait_for(settled, 20.0, "n0 to lead with every node caught up", step=self.tick)

    def write(self, node: Register, value: int) -> None:
        done: list[Any] = []
        node.put(value, callback=lambda result, error: done.append((result, error)))
        wait_for(lambda: bool(done), 10.0, f"the write of {value} to commit", step=self.tick)
        assert done[0][1] == compat.FAIL_REASON.SUCCESS, done

    def cut(self, a: Register, b: Register) -> None:
        CuttableTransport.cut |= {
            (a.selfNode.address, b.selfNode.address),
            (b.selfNode.address, a.selfNode.address),
        }

    def heal(self, a: Register, b: Register) -> None:
        CuttableTransport.cut -= {
            (a.selfNode.address, b.selfNode.address),
            (b.selfNode.address, a.selfNode.address),
        }

    def stop(self) -> None:
        for node in self.nodes:
            node.destroy()


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
