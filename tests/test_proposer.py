"""The Proposer's command groups (a `Write` batch waits on one future for all its commands):
split across Raft entries, a failed entry failing only its own commands, a full queue
refusing the whole group, a timeout keeping what committed. The Raft node is a stand-in
that records each entry and lets the test answer it: the group logic is the Proposer's own,
and test_cluster.py's Write test runs it on a real cluster.

On three real ControllerRaft nodes (real TCP and journals, ticks driven by the test): the
Raft tick itself takes the Proposer's commands (no proposer thread), so a command is
appended and sent in the tick it woke, and the commands that waited while an entry was in
flight are proposed in the very tick that commits it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.wait import wait_for
from mqmeta.controller import raft_node
from mqmeta.controller.commands import DeleteTopic, decode_entry
from mqmeta.controller.raft_node import ControllerRaft, Peer, Proposer, RaftSettings
from pysyncobj import FAIL_REASON

from mqmeta.errors import DeadlineExceeded, Unavailable


class EntryRecorder:
    """Takes the Proposer's entries; the test answers each with the callback pysyncobj would
    call. A thread stands in for the Raft tick: it pumps the Proposer when woken, and at
    least every 10 ms (the real tick runs at least every autoTickPeriod)."""

    def __init__(self) -> None:
        self.entries: list[tuple[list[Any], Any]] = []
        self.arrived = threading.Condition()
        self.woken = threading.Event()
        self.stopped = threading.Event()
        self.pump: Any = None

    def start_ticks(self, pump: Any) -> None:
        self.pump = pump
        threading.Thread(target=self._ticks, name="ticks", daemon=True).start()

    def _ticks(self) -> None:
        for _ in range(10_000):  # 100 s at most
            if self.stopped.is_set():
                return
            self.woken.wait(0.01)
            self.woken.clear()
            self.pump()

    def wake(self) -> None:
        self.woken.set()

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
    made = Proposer(raft, RaftSettings(**values), raft.wake)  # type: ignore[arg-type]
    raft.start_ticks(made.pump)
    return made, raft


def stop(p: Proposer, raft: EntryRecorder) -> None:
    p.stop()
    raft.stopped.set()


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
        stop(p, raft)


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
        stop(p, raft)


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (FAIL_REASON.NOT_LEADER, "nothing was written, retry"),
        (FAIL_REASON.MISSING_LEADER, "nothing was written, retry"),
        (FAIL_REASON.LEADER_CHANGED, "its outcome may be unknown, retry"),
        (FAIL_REASON.DISCARDED, "its outcome may be unknown, retry"),
    ],
)
def test_a_failed_entry_says_whether_anything_may_have_been_written(reason, said) -> None:
    """A write refused before any log took it (a leader handing over refuses a forwarded
    one as NOT_LEADER) is known not to be written; one whose entry was appended is not."""
    p, raft = proposer(batch_commands_max=3)
    try:
        group = p.submit_group(commands(1))
        raft.wait_entries(1)
        raft.entries[0][1](None, reason)
        (outcome,) = group.future.result(timeout=5)
        assert isinstance(outcome, Unavailable) and said in str(outcome), outcome
    finally:
        stop(p, raft)


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
        stop(p, raft)


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
        stop(p, raft)


def test_a_command_handed_a_function_gets_its_outcome_once_committed_failed_or_timed_out() -> None:
    """A coroutine's write (propose_async) gives the Proposer a function instead of a Future:
    it is called exactly once with the result, or with the error that ended the command."""
    p, raft = proposer(proposal_timeout_ms=300)
    outcomes: dict[str, list[Any]] = {"t1": [], "t2": [], "t3": []}
    try:
        p.submit_to(DeleteTopic(name="t1"), outcomes["t1"].append)
        raft.wait_entries(1)
        raft.commit(0)
        p.submit_to(DeleteTopic(name="t2"), outcomes["t2"].append)
        raft.wait_entries(2)
        raft.fail(1)
        p.submit_to(DeleteTopic(name="t3"), outcomes["t3"].append)
        raft.wait_entries(3)  # never answered: fails once proposal_timeout_ms has passed
        wait_for(lambda: outcomes["t3"], 5.0, "the unanswered command to time out")
        raft.commit(1)  # late answers change nothing
        raft.commit(2)
        assert outcomes["t1"] == [{"ok": True, "n": 1}]
        assert len(outcomes["t2"]) == 1 and isinstance(outcomes["t2"][0], Unavailable), outcomes
        assert len(outcomes["t3"]) == 1 and isinstance(outcomes["t3"][0], DeadlineExceeded), outcomes
    finally:
        stop(p, raft)


# On three ControllerRaft nodes, ticked by the test ------------------------------------------


def _manual_ticks(original: Any) -> Any:
    def conf(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        made.autoTick = False
        return made

    return conf


@pytest.fixture
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[ControllerRaft, Proposer]]]:
    monkeypatch.setattr(raft_node, "_syncobj_conf", _manual_ticks(raft_node._syncobj_conf))
    ports = PortReservation.pick(3)
    peers = [Peer(f"n{k}", address, "") for k, address in enumerate(ports.addresses)]
    made: list[tuple[ControllerRaft, Proposer]] = []
    try:
        for k, peer in enumerate(peers):
            election_ms = 300 if k == 0 else 30_000  # n0 leads
            settings = RaftSettings(
                election_min_ms=election_ms, election_max_ms=election_ms + 100, inflight_batches_max=1
            )
            node = ControllerRaft(peer.id, peer.raft, peers, tmp_path / peer.id, settings, lambda i, e: None)
            proposer = Proposer(node, settings, node.wake_tick)
            node.attach_pump(proposer.pump)
            made.append((node, proposer))
        yield made  # the reservation holds the ports while the nodes bind them (SO_REUSEADDR)
    finally:
        for node, proposer in made:
            proposer.stop()
            node.close()
        ports.release()


def tick_until(nodes: list[ControllerRaft], predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 20.0
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for node in nodes:
            node.doTick(0.005)


def test_the_tick_proposes_at_once_and_in_the_tick_that_commits_the_entry_before(nodes) -> None:
    rafts = [node for node, _ in nodes]
    leader, proposer = nodes[0]
    followers = rafts[1:]
    tick_until(rafts, lambda: leader.is_leader(), "n0 to lead")
    warm = proposer.submit(DeleteTopic(name="warm-up"))  # the term's no-op commits with it
    tick_until(rafts, warm.done, "the first write to commit")
    tick_until(rafts, lambda: all(r.raftLastApplied == leader.raftLastApplied for r in rafts), "every apply")
    log_length = leader.getStatus()["log_len"]

    first = proposer.submit(DeleteTopic(name="a"))
    leader.doTick(0.0)  # woken by the submit: the tick takes the command, appends and sends it
    assert leader.getStatus()["log_len"] == log_length + 1, "the tick did not propose the waiting command"
    second = proposer.submit(DeleteTopic(name="b"))  # waits: one entry in flight at a time
    leader.doTick(0.0)
    assert leader.getStatus()["log_len"] == log_length + 1
    tick_until(followers, lambda: all(f.getStatus()["log_len"] == log_length + 1 for f in followers), "acks")
    for follower in followers:
        follower.doTick(0.005)  # their acknowledgements are on their way
    tick_until([leader], first.done, "the first entry to commit")  # ...and in that same tick:
    assert not second.done()
    assert leader.getStatus()["log_len"] == log_length + 2, (
        "the waiting command was not proposed in the commit's tick"
    )
    tick_until(rafts, second.done, "the second entry to commit")
    assert first.result()["ok"] is False and second.result()["ok"] is False  # no such topics: answered
    assert all(t.name != "proposer" for t in threading.enumerate())


def test_a_command_the_tick_proposes_does_not_wake_the_tick_again(nodes, monkeypatch) -> None:
    """pysyncobj writes a byte to the tick's wake-up pipe for every command queued; for the
    commands the tick proposes itself (the pump) that byte only cost an empty tick."""
    rafts = [node for node, _ in nodes]
    leader, proposer = nodes[0]
    tick_until(rafts, lambda: leader.is_leader(), "n0 to lead")
    warm = proposer.submit(DeleteTopic(name="warm-up"))
    tick_until(rafts, warm.done, "the first write to commit")
    log_length = leader.getStatus()["log_len"]
    notifier = leader._SyncObj__pipeNotifier
    wake_ups: list[str] = []
    original = notifier.notify

    def counted() -> None:
        wake_ups.append(threading.current_thread().name)
        original()

    monkeypatch.setattr(notifier, "notify", counted)
    first = proposer.submit(DeleteTopic(name="a"))
    assert len(wake_ups) == 1, wake_ups  # the submit wakes the tick (from this thread)
    leader.doTick(0.0)
    assert leader.getStatus()["log_len"] == log_length + 1, "the tick did not propose the waiting command"
    assert len(wake_ups) == 1, f"the tick's own proposal woke the tick again: {wake_ups}"
    tick_until(rafts, first.done, "the write to commit")
    assert first.result()["ok"] is False  # no such topic: answered


def test_an_entry_is_answered_before_its_applied_line_is_written_and_the_line_in_the_same_tick(
    nodes, tmp_path: Path
) -> None:
    """The applied-entry line is encoded and written after pysyncobj has called the entry's
    callbacks (the answer goes to the event loop first), and by the end of that tick."""
    rafts = [node for node, _ in nodes]
    leader, proposer = nodes[0]
    tick_until(rafts, lambda: leader.is_leader(), "n0 to lead")
    warm = proposer.submit(DeleteTopic(name="warm-up"))
    tick_until(rafts, warm.done, "the first write to commit")
    applied = tmp_path / "n0" / "applied.jsonl"

    def lines() -> int:
        return applied.read_text().count("\n")

    before = lines()
    answered_at: list[int] = []
    proposer.submit_to(DeleteTopic(name="a"), lambda outcome: answered_at.append(lines()))
    tick_until(rafts, lambda: answered_at, "the answer")
    assert answered_at == [before], "the applied line was written before the answer"
    assert lines() == before + 1, "the tick that answered did not write the applied line"
