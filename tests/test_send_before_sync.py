"""SendBeforeSync (controller/pysyncobj_compat.py) with our journal, on three real
pysyncobj nodes in this process (real TCP on loopback, real files, ticks driven by the test).

Property checked, from one ordered record of every append, fdatasync, message and commit
index: for each new entry, the leader sends it before its own fdatasync (the two fsyncs
overlap), yet the leader has fdatasynced it before its commit index covers it, and each
follower has fdatasynced it before it acknowledges it. With the fix off, the first part
fails (the leader syncs, then sends); with the journal's deferral left on past the call,
the second does.

And a tick that commits an entry and proposes the next sends each follower one
append_entries carrying both (the new entry and the commit index that covers the first),
not one for the commit and one for the entry; and a tick that commits an entry with
nothing new to send sends no append at all (the followers learn the commit index from the
next append), while a follower's ReadIndex read still sees that entry at once (the leader
sends the commit index with its answer), and a write a follower forwarded is applied there
without a heartbeat (the leader sends the commit index once that write is committed).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqmeta.controller import pysyncobj_compat as compat
from mqmeta.controller.journal import DurableJournal
from mqmeta.controller.raft_node import install_pysyncobj_patches

from tests.support.raft_trio import CuttableTransport, Register, Trio, release_held_ports, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def _release_held_ports() -> Iterator[None]:
    yield
    release_held_ports()


class SyncAfterSendRegister(compat.SendBeforeSync, Register):
    pass


Event = (
    tuple  # ("write", node, index) | ("sync", node) | ("send", node, kind, value) | ("commit", node, index)
)


def record_everything(monkeypatch, trio: Trio, events: list[Event]) -> None:
    by_path = {str(compat.raft_journal(n).path): n.selfNode.address for n in trio.nodes}
    by_fd = {compat.raft_journal(n)._fd: n.selfNode.address for n in trio.nodes}
    real_add, real_fdatasync, real_send = DurableJournal.add, os.fdatasync, CuttableTransport.send

    def add(journal, command, index, term):
        events.append(("write", by_path[str(journal.path)], index))
        real_add(journal, command, index, term)

    def fdatasync(fd):
        real_fdatasync(fd)
        if fd in by_fd:
            events.append(("sync", by_fd[fd]))

    def send(transport, node, message):
        if isinstance(message, dict) and message.get("type") == "append_entries":
            for entry in message.get("entries", []):
                events.append(("send", transport.sender, "entry", entry[1]))
        elif isinstance(message, dict) and message.get("type") == "next_node_idx" and message.get("success"):
            events.append(("send", transport.sender, "ack", message["next_node_idx"] - 1))
        return real_send(transport, node, message)

    monkeypatch.setattr(DurableJournal, "add", add)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(CuttableTransport, "send", send)


def first(events: list[Event], after: int, match) -> int | float:
    """The position of the first event from `after` on that matches; infinity if none."""
    return next((i for i in range(after, len(events)) if match(events[i])), float("inf"))


def test_the_leader_sends_before_it_syncs_and_syncs_before_it_commits(tmp_path: Path, monkeypatch):
    install_pysyncobj_patches()
    trio = Trio(tmp_path, SyncAfterSendRegister)
    try:
        trio.settle()
        events: list[Event] = []
        record_everything(monkeypatch, trio, events)
        leader = trio.nodes[0].selfNode.address
        followers = [n.selfNode.address for n in trio.nodes[1:]]

        def tick_and_note_commits() -> None:
            trio.tick()
            for node in trio.nodes:
                events.append(("commit", node.selfNode.address, node.getStatus()["commit_idx"]))

        done: list[object] = []
        trio.nodes[0].put(5, callback=lambda result, error: done.append(error))
        wait_for(lambda: bool(done), 10.0, "the write to commit", step=tick_and_note_commits)
        assert done == [compat.FAIL_REASON.SUCCESS]
        wrote = first(events, 0, lambda e: e[:2] == ("write", leader))
        assert wrote != float("inf"), "the leader appended nothing"
        index = events[int(wrote)][2]
        sent = first(events, wrote, lambda e: e == ("send", leader, "entry", index))
        synced = first(events, wrote, lambda e: e == ("sync", leader))
        committed = first(events, wrote, lambda e: e[:2] == ("commit", leader) and e[2] >= index)
        assert sent < synced, "the leader synced its entry before sending it (two fsyncs in a row)"
        assert synced < committed, "the leader counted its entry toward a commit before syncing it"
        for follower in followers:
            held = first(events, 0, lambda e, f=follower: e == ("write", f, index))
            acked = first(events, held, lambda e, f=follower: e[:3] == ("send", f, "ack") and e[3] >= index)
            follower_synced = first(events, held, lambda e, f=follower: e == ("sync", f))
            assert follower_synced < acked, f"{follower} acknowledged entry {index} before syncing it"
    finally:
        trio.stop()


def record_appends(monkeypatch) -> list[tuple[str, dict]]:
    """From now on, every append_entries message sent: (the receiver's address, the message)."""
    sent: list[tuple[str, dict]] = []
    real_send = CuttableTransport.send

    def send(transport, node, message):
        if isinstance(message, dict) and message.get("type") == "append_entries":
            sent.append((node.address, message))
        return real_send(transport, node, message)

    monkeypatch.setattr(CuttableTransport, "send", send)
    return sent


def test_a_tick_that_commits_and_proposes_sends_each_follower_one_append(tmp_path: Path, monkeypatch):
    install_pysyncobj_patches()
    trio = Trio(tmp_path, SyncAfterSendRegister)
    try:
        trio.settle()
        leader, *followers = trio.nodes
        trio.write(leader, 1)  # the no-op of the term is behind us
        trio.settle()
        done: list[object] = []
        leader.put(5, callback=lambda result, error: done.append(error))
        leader.doTick(0.0)  # entry 5 is appended and sent
        index = compat.raft_journal(leader)[-1][1]
        wait_for(
            lambda: all(compat.raft_journal(f)[-1][1] == index for f in followers),
            10.0,
            "the followers to hold entry 5",
            step=lambda: trio.tick(followers),
        )
        wait_for(
            lambda: leader.getStatus()["match_idx_server_" + followers[0].selfNode.id] >= index,
            10.0,
            "the leader to read an acknowledgement",
            step=lambda: leader.doTick(0.01),
        )
        assert not done
        sent = record_appends(monkeypatch)
        leader.put(6, callback=lambda result, error: done.append(error))
        leader.doTick(0.0)  # commits and applies 5, proposes 6
        assert done == [compat.FAIL_REASON.SUCCESS], "entry 5 was not committed in this tick"
        for follower in followers:
            to_it = [m for address, m in sent if address == follower.selfNode.address]
            assert len(to_it) == 1, (
                f"{len(to_it)} appends to {follower.selfNode.address} in one tick: {to_it}"
            )
            assert [e[1] for e in to_it[0]["entries"]] == [index + 1] and to_it[0]["commit_index"] >= index
    finally:
        trio.stop()


def test_a_commit_alone_is_not_sent_and_a_follower_read_still_sees_it(tmp_path: Path, monkeypatch):
    install_pysyncobj_patches()
    trio = Trio(tmp_path, SyncAfterSendRegister)
    try:
        trio.settle()
        leader, *followers = trio.nodes
        trio.write(leader, 1)  # the no-op of the term is behind us
        trio.settle()
        done: list[object] = []
        leader.put(5, callback=lambda result, error: done.append(error))
        leader.doTick(0.0)  # entry 5 is appended and sent
        index = compat.raft_journal(leader)[-1][1]
        wait_for(
            lambda: all(leader.getStatus()["match_idx_server_" + f.selfNode.id] >= index for f in followers),
            10.0,
            "the leader to read both acknowledgements",
            step=lambda: trio.tick(),
        )
        sent = record_appends(monkeypatch)
        leader._SyncObj__newAppendEntriesTime = compat.monotonic_time() + 60.0  # no heartbeat due
        while not done:
            leader.doTick(0.0)  # commits and applies 5; nothing new to send
        assert done == [compat.FAIL_REASON.SUCCESS]
        assert sent == [], f"appends carrying only the commit index were sent: {sent}"
        follower, term = followers[1], leader.raftCurrentTerm
        assert follower.raftLastApplied < index  # it has not heard of the commit
        read = follower.read_index()
        wait_for(read.done, 10.0, "the follower's read", step=trio.tick)
        assert read.result() >= index and follower.raftLastApplied >= index and follower.value == 5
        assert compat.is_leader(leader) and leader.raftCurrentTerm == term, (
            "answered only by a new leader's append"
        )
    finally:
        trio.stop()


def test_a_write_a_follower_forwarded_is_applied_there_without_a_heartbeat(tmp_path: Path):
    """The follower's caller waits until the follower applies its forwarded write: the
    leader sends the commit index once that write is committed, not at the next heartbeat."""
    install_pysyncobj_patches()
    trio = Trio(tmp_path, SyncAfterSendRegister)
    try:
        trio.settle()
        leader, follower, _ = trio.nodes
        trio.write(leader, 1)  # the no-op of the term is behind us
        trio.settle()
        term = leader.raftCurrentTerm
        done: list[object] = []
        follower.put(7, callback=lambda result, error: done.append(error))

        def step() -> None:
            leader._SyncObj__newAppendEntriesTime = compat.monotonic_time() + 60.0  # no heartbeat due
            trio.tick()

        wait_for(lambda: bool(done), 5.0, "the forwarded write to be applied on its follower", step=step)
        assert done == [compat.FAIL_REASON.SUCCESS] and follower.value == 7
        assert compat.is_leader(leader) and leader.raftCurrentTerm == term, (
            "applied only once the follower, hearing no heartbeat, was elected"
        )
    finally:
        trio.stop()
