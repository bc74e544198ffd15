"""The command history's ring (controller/command_history.py), without a cluster.

Properties checked:
- every applied command is kept with its entry's index and term, its key fields (not the
  leader's liveness view nor a broker's check code) and its time; barriers are not kept;
- outcomes: ok is "applied", a FENCED_* code or a stale leader's NOT_LEADER is "fenced",
  any other code "refused", each with its code and sentence;
- pages are newest first, below before_index, of the types asked for; next_before_index
  walks every command exactly once, and a page never splits an entry;
- the ring is bounded: past its size the oldest go, and oldest_index says where it starts;
- the real state machine's answer to an AlterSyncStateSet with a stale epoch is "fenced".
"""

from __future__ import annotations

import pytest
from mqmeta.controller.command_history import CommandHistory, outcome
from mqmeta.controller.commands import AlterSyncStateSet, Barrier, ElectMaster, PutTopic, RegisterBroker
from mqmeta.controller.state_machine import ControllerState, apply

pytestmark = pytest.mark.timeout(30)
OK = {"ok": True}


def topic(name: str) -> PutTopic:
    return PutTopic(name=name, cluster="c", queue_count=2)


def walk(history: CommandHistory, limit: int, types: tuple[str, ...] = ()) -> list[list[tuple[int, int]]]:
    pages, before = [], 0
    for _ in range(1000):
        page = history.page(limit, before, types)
        pages.append([(c["index"], c["position"]) for c in page["commands"]])
        before = page["next_before_index"]
        if not before:
            return pages
    raise AssertionError("paging did not end")


def test_a_command_is_kept_with_its_key_fields_outcome_and_time():
    history = CommandHistory()
    register = RegisterBroker(
        cluster="c", broker_name="b", address="127.0.0.1:1", check_code="secret", now_ms=7
    )
    elect = ElectMaster(cluster="c", broker_name="b", alive={"1": {"epoch": 1}}, now_ms=9, leader_term=2)
    fenced = {"ok": False, "code": "FENCED_MASTER_EPOCH", "message": "master 1 at epoch 1 is stale"}
    history.record(5, 2, [Barrier(), register, elect], [OK, OK, fenced])
    commands = history.page(10)["commands"]
    assert [(c["index"], c["position"], c["command"]) for c in commands] == [
        (5, 2, "elect_master"),
        (5, 1, "register_broker"),
    ]
    by_type = {c["command"]: c for c in commands}
    assert by_type["register_broker"]["fields"] == {
        "cluster": "c",
        "broker_name": "b",
        "address": "127.0.0.1:1",
        "broker_id": "0",
        "election_priority": "0",
    }
    assert "check_code" not in by_type["register_broker"]["fields"]
    assert (
        "alive" not in by_type["elect_master"]["fields"]
        and "leader_term" not in by_type["elect_master"]["fields"]
    )
    assert by_type["elect_master"]["time_ms"] == 9 and by_type["elect_master"]["term"] == 2
    assert (by_type["elect_master"]["result"], by_type["elect_master"]["code"]) == (
        "fenced",
        "FENCED_MASTER_EPOCH",
    )
    assert by_type["elect_master"]["message"] == "master 1 at epoch 1 is stale"
    assert by_type["register_broker"]["result"] == "applied"
    assert history.page(10, command_types=["barrier"])["commands"] == []
    history.record(6, 2, [topic("T")], [OK])
    assert history.page(1)["commands"][0]["fields"] == {
        "name": "T",
        "cluster": "c",
        "queue_count": "2",
        "mode": "create",
        "if_queue_count": "0",
    }


def test_outcomes():
    assert outcome({"ok": True, "changed": False}) == ("applied", "", "")
    assert outcome({"ok": False, "code": "FENCED_LEASE_EPOCH", "message": "m"}) == (
        "fenced",
        "FENCED_LEASE_EPOCH",
        "m",
    )
    assert outcome({"ok": False, "code": "NOT_LEADER", "message": "m"})[0] == "fenced"
    assert outcome({"ok": False, "code": "ALREADY_EXISTS", "message": "m"}) == (
        "refused",
        "ALREADY_EXISTS",
        "m",
    )


def test_pages_walk_every_command_once_newest_first_and_keep_entries_whole():
    history = CommandHistory()
    expected = []
    for index in range(1, 41):
        size = 3 if index % 7 == 0 else 1  # some entries carry a batch
        history.record(index, 1, [topic(f"t{index}-{i}") for i in range(size)], [OK] * size)
        expected += [(index, i) for i in range(size)]
    for limit in (1, 2, 5, 100):
        pages = walk(history, limit)
        flat = [c for page in pages for c in page]
        assert sorted(flat) == expected and len(set(flat)) == len(flat), limit
        assert [c[0] for c in flat] == sorted((c[0] for c in flat), reverse=True)
        for page in pages[:-1]:
            # whole entries: at least `limit`, more only to finish the last entry
            assert len(page) >= limit and len([c for c in page if c[0] != page[-1][0]]) < limit
    assert history.page(3, before_index=10)["commands"][0]["index"] == 9


def test_a_type_filter_pages_too():
    history = CommandHistory()
    for index in range(1, 21):
        command = topic(f"t{index}") if index % 2 else ElectMaster(cluster="c", broker_name=f"b{index}")
        history.record(index, 1, [command], [OK])
    pages = walk(history, 3, ("elect_master",))
    assert [i for page in pages for i, _ in page] == list(range(20, 0, -2))


def test_the_ring_is_bounded():
    history = CommandHistory(commands_max=10)
    for index in range(1, 26):
        history.record(index, 1, [topic(f"t{index}")], [OK])
    page = history.page(100)
    assert [c["index"] for c in page["commands"]] == list(range(25, 15, -1))
    assert page["oldest_index"] == 16 and page["next_before_index"] == 0


def test_the_state_machines_answer_to_a_stale_epoch_is_fenced():
    state = ControllerState()
    history = CommandHistory()
    commands = [
        RegisterBroker(cluster="c", broker_name="b", address="127.0.0.1:1", check_code="x", now_ms=1),
        ElectMaster(
            cluster="c",
            broker_name="b",
            trigger="broker",
            requester_broker_id=1,
            alive={"1": {"epoch": 0}},
            now_ms=2,
        ),
        AlterSyncStateSet(
            cluster="c",
            broker_name="b",
            master_broker_id=1,
            master_epoch=0,
            sync_state_set_epoch=1,
            new_sync_state_set=[1],
            alive={"1": {"epoch": 1}},
            now_ms=3,
        ),
    ]
    for index, command in enumerate(commands, start=1):
        history.record(index, 1, [command], [apply(state, command, index, 1).result])
    newest = history.page(1)["commands"][0]
    assert (newest["command"], newest["result"], newest["code"]) == (
        "alter_sync_state_set",
        "fenced",
        "FENCED_MASTER_EPOCH",
    )
    assert "epoch 0 is not the current master" in newest["message"]
    assert newest["fields"]["master_epoch"] == "0"
