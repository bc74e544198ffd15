"""The Proposer's command groups (a `Write` batch waits on one future for all its commands):
split across Raft entries, a failed entry failing only its own commands, a full queue
refusing the whole group, a timeout keeping what committed. The Raft node is a stand-in
that records each entry and lets the test answer it: the group logic is the Proposer's own,
and test_cluster.py's Write test runs it on a real cluster."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest
from mqmeta.controller.commands import DeleteTopic, decode_entry
from mqmeta.controller.raft_node import Proposer, RaftSettings
from pysyncobj import FAIL_REASON

from mqmeta.errors import DeadlineExceeded, Unavailable


class EntryRecorder:
    """Takes the Proposer's entries; the test answers each with the callback pysyncobj would call."""

    def __init__(self) -> None:
        self.entries: list[tuple[list[Any], Any]] = []
        self.arrived = threading.Condition()

    def _apply_entry(self, payload: str, callback: Any) -> None:
        with self.arrived:
            self.entries.append((decode_entry(payload), callback))
            self.arrived.notify_all()

    def wait_entries(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.entries) >= count, timeout=5), self.entries

    def commit(self, index: int) -> None:
        commands, callback = self.entries[index]
        callback([{"ok": True, "n": int(c.name[1:])} for c in commands], FAIL_REASON.SUCCESS)

    def fail(self, index: int) -> None:
        self.entries[index][1](None, FAIL_REASON.LEADER_CHANGED)


def proposer(**settings: int) -> tuple[Proposer, EntryRecorder]:
    raft = EntryRecorder()
    values = dict({"inflight_batches_max": 4}, **settings)
    return Proposer(raft, RaftSettings(**values)), raft  # type: ignore[arg-type]


def commands(count: int) -> list[Any]:
    """Commands numbered 0 to count - 1 (the recorder answers each with its number)."""
    return [DeleteTopic(name=f"t{n}") for n in range(count)]


def test_a_group_split_across_entries_settles_once_all_have_committed() -> None:
    p, raft = proposer(batch_commands_max=4)
    try:
        group = p.submit_group(commands(10))
        raft.wait_entries(3)
        assert [len(c) for c, _ in raft.entries] == [4, 4, 2]
        raft.commit(0)
        raft.commit(2)
        assert not group.future.done() and group.outcomes()[4:8] == [None] * 4
        raft.commit(1)
        assert [o["n"] for o in group.future.result(timeout=5)] == list(range(10))
    finally:
        p.stop()


def test_a_failed_entry_fails_only_its_own_commands() -> None:
    p, raft = proposer(batch_commands_max=3)
    try:
        group = p.submit_group(commands(6))
        raft.wait_entries(2)
        raft.fail(0)
        raft.commit(1)
        outcomes = group.future.result(timeout=5)
        assert all(isinstance(o, Unavailable) and "leader changed" in str(o) for o in outcomes[:3]), outcomes
        assert [o["n"] for o in outcomes[3:]] == [3, 4, 5]
    finally:
        p.stop()


def test_a_full_queue_refuses_the_whole_group_and_queues_none_of_it() -> None:
    p, raft = proposer(inflight_batches_max=1, batch_commands_max=2, queue_commands_max=5)
    try:
        first = p.submit_group(commands(2))
        raft.wait_entries(1)  # in flight; the next entries wait for it
        waiting = p.submit_group(commands(4))
        with pytest.raises(Unavailable, match="queue is full"):
            p.submit_group(commands(2))  # 4 + 2 > 5: none of the two is queued
        single: Future = p.submit(DeleteTopic(name="t99"))  # 4 + 1 fits
        for index in range(4):  # one entry in flight at a time: [first], [w0 w1], [w2 w3], [single]
            raft.wait_entries(index + 1)
            raft.commit(index)
        assert [o["n"] for o in first.future.result(timeout=5)] == [0, 1]
        assert [o["n"] for o in waiting.future.result(timeout=5)] == [0, 1, 2, 3]
        assert single.result(timeout=5)["n"] == 99
        assert sum(len(c) for c, _ in raft.entries) == 7
    finally:
        p.stop()


def test_an_entry_that_times_out_fails_its_commands_and_the_committed_ones_stay() -> None:
    p, raft = proposer(batch_commands_max=2, proposal_timeout_ms=200)
    try:
        group = p.submit_group(commands(4))
        raft.wait_entries(2)
        raft.commit(0)  # entry 1 never answers (pysyncobj may lose it in a leader change)
        outcomes = group.future.result(timeout=5)
        assert [o["n"] for o in outcomes[:2]] == [0, 1]
        assert all(isinstance(o, DeadlineExceeded) for o in outcomes[2:]), outcomes
        raft.commit(1)  # a late answer changes nothing
        assert all(isinstance(o, DeadlineExceeded) for o in group.outcomes()[2:])
    finally:
        p.stop()
