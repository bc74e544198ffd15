"""Three real pysyncobj nodes in one process for the Raft patches' tests: real TCP on
loopback, ticks driven by the test (`Trio.tick`), a transport that can cut links and
records ReadIndex pings, and an optional journal directory (our DurableJournal once
install_pysyncobj_patches() has run). Used by tests/test_read_index.py and
tests/test_send_before_sync.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.controller import pysyncobj_compat as compat
from pysyncobj import SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.transport import TCPTransport

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


_HELD: list[PortReservation] = []  # held until release_held_ports(): never handed out twice


def release_held_ports() -> None:
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
