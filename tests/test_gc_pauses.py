"""controller/gc_pauses.py: start() freezes what is there; what survived a full
garbage-collection pass is frozen, so the next pass does not examine it again; a full
pass runs once MIDDLE_PASSES_PER_FULL middle passes ran; a follower's thaw collects a
cycle that became garbage while frozen, the leader's (or a candidate's) does nothing;
the thread's turn thaws when due and otherwise runs the full pass when due, and does
neither while the collector is disabled; stop()
leaves nothing frozen and no callback behind; the controller process sets it up only
when gc_thaw_interval_s is not 0, asking whether it may pause (a follower that knows
its leader).

The pytest worker's own collector is what these tests drive: each stops what it
started, which thaws everything again."""

from __future__ import annotations

import gc
import time
import weakref
from types import SimpleNamespace

import pytest
from mqmeta.controller import gc_pauses
from mqmeta.controller.gc_pauses import FullPasses
from mqmeta.controller.raft_node import RaftSettings
from mqmeta.controller.server import raft_settings_from

from mqmeta.errors import InvalidArgument

pytestmark = pytest.mark.timeout(60)


class Cycle:
    def __init__(self) -> None:
        self.me = self


def _examined() -> set[int]:
    return {id(o) for o in gc.get_objects()}  # the frozen ones are left out


@pytest.fixture
def passes(monkeypatch):
    made: list[FullPasses] = []

    def make(leader: bool) -> FullPasses:
        monkeypatch.setattr(gc_pauses, "FULL_PASS_POLL_S", 3600.0)  # the tests call it themselves
        made.append(FullPasses(lambda: not leader, thaw_interval_s=3600))
        made[-1].start()
        return made[-1]

    yield make
    for each in made:
        each.stop()


def test_what_survived_a_full_pass_is_frozen_and_not_examined_again(passes):
    before = [{"value": [i]} for i in range(100)]
    full = passes(leader=True)
    assert id(before[0]) not in _examined(), "start() froze what was there"
    kept = [{"value": [i]} for i in range(2000)]
    assert id(kept[0]) in _examined()
    gc.collect()
    assert full.frozen_passes >= 1
    assert gc.get_freeze_count() >= len(kept)
    assert id(kept[0]) not in _examined() and id(kept) not in _examined()
    made_after = [{"value": [i]} for i in range(10)]
    assert id(made_after[0]) in _examined()  # a later pass examines only what is new


def test_a_full_pass_runs_once_enough_middle_passes_ran(passes):
    full = passes(leader=True)
    gc.collect()
    assert not full.pass_if_due()  # no middle pass since
    for _ in range(gc_pauses.MIDDLE_PASSES_PER_FULL):
        gc.collect(1)
    assert gc.get_count()[2] >= gc_pauses.MIDDLE_PASSES_PER_FULL
    kept = [{"value": [i]} for i in range(100)]
    assert full.pass_if_due() and full.early_passes == 1
    assert id(kept[0]) not in _examined()


def test_a_followers_thaw_collects_a_cycle_that_became_garbage_while_frozen(passes):
    full = passes(leader=False)
    cycle = Cycle()
    gone = weakref.ref(cycle)
    gc.collect()  # frozen with the rest
    del cycle
    gc.collect()
    assert gone() is not None, "a frozen cycle is not collected"
    assert full.thaw() and full.thaws == 1
    assert gone() is None, "the thaw's full pass collected it"
    assert gc.get_freeze_count() > 0, "and froze the survivors again"


def test_the_leader_does_not_thaw(passes):
    full = passes(leader=True)
    cycle = Cycle()
    gone = weakref.ref(cycle)
    gc.collect()
    del cycle
    assert not full.thaw() and full.thaws == 0
    gc.collect()
    assert gone() is not None


def test_the_threads_turn_thaws_when_due_else_runs_the_full_pass_when_due(passes):
    leader, follower = passes(leader=True), passes(leader=False)
    now = time.monotonic()
    later = now + 3600 * (1 - gc_pauses.THAW_JITTER)  # the earliest next thaw, jitter and all
    assert leader.turn(now - 1) >= later and leader.thaws == 0  # not now: an interval later
    assert follower.turn(now - 1) >= later and follower.thaws == 1
    for _ in range(gc_pauses.MIDDLE_PASSES_PER_FULL):
        gc.collect(1)
    gc.disable()  # as a snapshot's decode holds the collector off
    try:
        assert follower.turn(now - 1) == now - 1, "held off: no thaw, not even rescheduled"
        assert follower.turn(now + 3000) == now + 3000 and follower.early_passes == 0
    finally:
        gc.enable()
    assert follower.thaws == 1
    assert follower.turn(now + 3000) == now + 3000 and follower.early_passes == 1


def test_stop_thaws_everything_and_removes_its_callback():
    full = FullPasses(lambda: False, thaw_interval_s=3600)
    try:
        full.start()
        gc.collect()
        assert gc.get_freeze_count() > 0
    finally:
        full.stop()
    assert gc.get_freeze_count() == 0
    assert full._after_pass not in gc.callbacks
    gc.collect()
    assert gc.get_freeze_count() == 0, "nothing freezes after stop"


def test_the_controller_process_sets_it_up_unless_the_interval_is_zero(monkeypatch):
    from mqmeta.controller import cli

    started: list[FullPasses] = []
    monkeypatch.setattr(FullPasses, "start", lambda self: started.append(self))
    raft = SimpleNamespace(is_leader=lambda: False, leader_raft_address=lambda: "127.0.0.1:1")
    node = SimpleNamespace(core=SimpleNamespace(raft=raft), closers=[])
    config = SimpleNamespace(raft_settings=RaftSettings())
    assert cli._short_full_gc_passes(node, config) is node  # type: ignore[arg-type]
    assert len(started) == 1 and node.closers == [started[0].stop]
    assert started[0]._may_pause(), "a follower that knows its leader"
    raft.leader_raft_address = lambda: ""
    assert not started[0]._may_pause(), "a candidate"
    raft.is_leader = lambda: True
    assert not started[0]._may_pause(), "the leader"
    off = SimpleNamespace(raft_settings=RaftSettings(gc_thaw_interval_s=0))
    cli._short_full_gc_passes(SimpleNamespace(core=node.core, closers=[]), off)  # type: ignore[arg-type]
    assert len(started) == 1


def test_the_thaw_interval_is_checked():
    assert raft_settings_from({"gc_thaw_interval_s": 0}, None).gc_thaw_interval_s == 0
    with pytest.raises(InvalidArgument, match="gc_thaw_interval_s"):
        raft_settings_from({"gc_thaw_interval_s": -1}, None)
    with pytest.raises(InvalidArgument, match="gc_thaw_interval_s"):
        RaftSettings(gc_thaw_interval_s=86_401).validate()
