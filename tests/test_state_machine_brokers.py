"""The broker-set commands of the state machine, as RocketMQ's RIP-44 describes them
(docs/concepts.md, Election policy).

Properties checked:
- register_broker: ids 1, 2, 3 in order; idempotent per check code; compare-and-set on an
  explicit id; argument validation (a name or address with a trailing newline is refused:
  a regression this file's original found);
- elect_master: first election: the requester wins; an alive master is kept; otherwise the
  alive SyncStateSet member with the highest epoch, then max offset, then the smallest
  priority, then the smallest id; no unclean election unless enabled; no candidate clears
  and fences the dead master; admin preferred id; a handoff: only the master of the current
  epoch, to an alive in-sync slave; an election decided on an older term's view is refused;
- alter_sync_state_set: fencing by master epoch and SyncStateSet epoch, membership checks,
  an epoch bump per change;
- clean_broker_data: live brokers refused unless forced; epochs never go back; a clean that
  empties the SyncStateSet does not enable an unclean election (a regression).
"""

from __future__ import annotations

import copy

import pytest
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import (
    apply,
    broker_set_key,
)

from tests.support.state_machine import (
    CLUSTER,
    NAME,
    Controller,
    alive,
    clean,
    heartbeats,
    registered,
    roles,
    with_master,
)

# register_broker ------------------------------------------------------------------------
# elect_master ---------------------------------------------------------------------------
# alter_sync_state_set -------------------------------------------------------------------
# clean_broker_data ----------------------------------------------------------------------


def test_register_assigns_ids_in_order_per_broker_set():
    ctl = registered(3)
    bs = ctl.bs()
    assert bs["next_broker_id"] == 4 and sorted(bs["replicas"]) == ["1", "2", "3"]
    assert bs["replicas"]["2"] == {
        "address": "10.0.0.2:10911",
        "check_code": "check-2",
        "election_priority": 0,
    }
    assert (bs["master_broker_id"], bs["master_epoch"], bs["sync_state_set"], bs["sync_state_set_epoch"]) == (
        0,
        0,
        [],
        0,
    )
    assert ctl.last_events[0]["kind"] == "broker"
    # ids are counted per broker set
    assert ctl.register(1, name="other") == 1
    assert ctl.register(1, cluster="D") == 1
    assert ctl.register(4) == 4


def test_register_again_with_the_same_check_code_is_idempotent():
    ctl = registered(3)
    digest = ctl.state.digest
    result = ctl.ok(
        "register_broker",
        cluster=CLUSTER,
        broker_name=NAME,
        broker_id=0,
        address="10.0.0.2:10911",
        check_code="check-2",
    )
    assert result["broker_id"] == 2
    assert ctl.state.digest == digest and ctl.last_events == []
    # a restarted broker with a new address keeps its id; the address is updated
    result = ctl.ok(
        "register_broker", cluster=CLUSTER, broker_name=NAME, address="10.0.0.99:10911", check_code="check-2"
    )
    assert result["broker_id"] == 2
    assert ctl.bs()["replicas"]["2"]["address"] == "10.0.0.99:10911"
    assert ctl.bs()["next_broker_id"] == 4 and len(ctl.bs()["replicas"]) == 3
    assert ctl.last_events and ctl.last_events[0]["kind"] == "broker"


def test_register_explicit_id_is_a_compare_and_set_on_the_check_code():
    ctl = registered(3)
    ctl.rejected(
        "BROKER_ID_INVALID",
        "register_broker",
        cluster=CLUSTER,
        broker_name=NAME,
        address="10.0.0.9:10911",
        check_code="intruder",
        broker_id=2,
    )
    assert ctl.register(2, broker_id=2) == 2  # the holder may apply its own id again
    assert ctl.register(7, broker_id=7) == 7  # a free id is granted ...
    assert ctl.bs()["next_broker_id"] == 8  # ... and automatic ids continue past it
    assert ctl.register(8) == 8


def test_register_does_not_touch_roles():
    ctl = with_master((1, 2))
    before = roles(ctl)
    ctl.register(1, address="10.0.0.100:10911")  # the master moves to a new address
    ctl.register(4)
    assert roles(ctl) == before
    assert ctl.last_changes[broker_set_key(CLUSTER, NAME)]["replicas"]["4"]
    info = ctl.run(
        "register_broker", cluster=CLUSTER, broker_name=NAME, address="10.0.0.3:10911", check_code="check-3"
    )["replica_info"]
    assert info["master_broker_id"] == 1 and info["master_address"] == "10.0.0.100:10911"


def test_a_restarted_master_registering_as_a_new_process_begins_a_new_epoch():
    """A master's process that restarts before another is elected stays master, in a new
    epoch (its set and set epoch kept): a power loss may have taken bytes its earlier
    process served, which it must not write again differently inside the old epoch.
    A slave's new process, a registration without the flag (an older broker, or an entry
    written before it existed) and the master's next registration of the same process
    change no role."""
    ctl = with_master((1, 2))
    master, epoch, members, set_epoch = roles(ctl)
    ctl.register(2, new_process=True)
    ctl.register(master)
    assert roles(ctl) == (master, epoch, members, set_epoch)
    info = ctl.run(
        "register_broker",
        cluster=CLUSTER,
        broker_name=NAME,
        address=f"10.0.0.{master}:10911",
        check_code=f"check-{master}",
        new_process=True,
    )["replica_info"]
    assert roles(ctl) == (master, epoch + 1, members, set_epoch)
    assert info["master_broker_id"] == master and info["master_epoch"] == epoch + 1
    assert [e["kind"] for e in ctl.last_events] == ["role"], "the broker set's watchers hear of it"
    alone = registered(1)
    alone.register(1, new_process=True)
    assert roles(alone)[:2] == (0, 0), "no master yet: nothing to renew"


NEWLINE_CASES = [
    (
        "register_broker",
        {"cluster": CLUSTER + "\n", "broker_name": NAME, "check_code": "k", "address": "10.0.0.5:10911"},
    ),
    (
        "register_broker",
        {"cluster": CLUSTER, "broker_name": NAME + "\n", "check_code": "k", "address": "10.0.0.5:10911"},
    ),
    (
        "register_broker",
        {"cluster": CLUSTER, "broker_name": NAME, "check_code": "k", "address": "10.0.0.5:10911\n"},
    ),
    ("put_topic", {"name": "t\n"}),
    ("put_group", {"name": "g\n"}),
    ("update_config", {"values": {"default_cluster": "Prod\n"}}),
]


@pytest.mark.parametrize(
    "command_type,fields",
    NEWLINE_CASES,
    ids=["cluster", "broker-name", "address", "topic", "group", "config"],
)
def test_names_and_addresses_with_a_trailing_newline_are_rejected(command_type, fields):
    Controller().rejected("INVALID_ARGUMENT", command_type, **fields)


def test_register_accepts_boundary_names_and_addresses():
    ctl = Controller()
    long_name = "a" * 127
    result = ctl.ok(
        "register_broker",
        cluster="Prod_1-%|x",
        broker_name=long_name,
        address="[::1]:10911",
        check_code="c" * 128,
        election_priority=1_000_000,
        broker_id=2**62,
    )
    assert result["broker_id"] == 2**62


GOOD_REGISTRATION = {
    "cluster": CLUSTER,
    "broker_name": NAME,
    "address": "10.0.0.5:10911",
    "check_code": "check-5",
}


@pytest.mark.parametrize(
    "field,value",
    [
        ("cluster", ""),
        ("cluster", "a/b"),
        ("cluster", "x" * 128),
        ("cluster", None),
        ("cluster", 7),
        ("broker_name", "has space"),
        ("broker_name", ""),
        ("broker_name", "é"),
        ("address", "no-port"),
        ("address", "host:123456"),
        ("address", ""),
        ("address", "h ost:1"),
        ("address", None),
        ("check_code", ""),
        ("check_code", "x" * 129),
        ("check_code", 5),
        ("check_code", None),
        ("broker_id", -1),
        ("broker_id", True),
        ("broker_id", "1"),
        ("broker_id", 2**62 + 1),
        ("election_priority", -1),
        ("election_priority", 1_000_001),
        ("election_priority", 1.5),
        ("new_process", "yes"),
        ("new_process", 1),
    ],
)
def test_register_rejects_malformed_arguments(field, value):
    ctl = registered(1)
    ctl.rejected("INVALID_ARGUMENT", "register_broker", **{**GOOD_REGISTRATION, field: value})


def test_first_election_triggered_by_a_broker_elects_the_requester():
    ctl = registered(3)
    # broker 2 reports far more data, but on the first election the requester wins
    result = ctl.elect(
        heartbeats({1: (0, 0, 0), 2: (0, 500, 0), 3: (0, 0, 0)}), trigger="broker", requester_broker_id=3
    )
    assert result["ok"] is True and result["changed"] is True
    assert roles(ctl) == (3, 1, [3], 1)
    assert result["replica_info"]["master_address"] == "10.0.0.3:10911"
    assert ctl.last_events[0]["kind"] == "role"
    assert ctl.last_events[0]["replica_info"]["master_broker_id"] == 3


@pytest.mark.parametrize(
    "trigger,reports",
    [
        ("controller", {1: (0, 0, 0), 2: (0, 500, 0), 3: (0, 0, 0)}),  # not a broker request
        ("broker", {1: (0, 0, 0), 2: (0, 500, 0)}),  # the requester (3) is not alive
    ],
)
def test_first_election_otherwise_uses_the_ranking(trigger, reports):
    ctl = registered(3)
    result = ctl.elect(heartbeats(reports), trigger=trigger, requester_broker_id=3)
    assert result["ok"] is True and roles(ctl) == (2, 1, [2], 1)


def test_first_election_with_nobody_alive_fails_without_change():
    ctl = registered(3)
    digest = ctl.state.digest
    result = ctl.elect({}, trigger="broker", requester_broker_id=1)
    assert result["ok"] is False and result["code"] == "MASTER_NOT_AVAILABLE"
    assert ctl.state.digest == digest and ctl.last_changes == {}


def test_an_election_decided_on_an_older_terms_view_is_refused_without_change():
    """A resumed former leader's liveness view (every broker silent) must not depose a
    master: a command whose view term differs from its entry's term changes nothing."""
    ctl = with_master((1, 2, 3))
    digest = ctl.state.digest
    command = {"type": "elect_master", "cluster": CLUSTER, "broker_name": NAME, "alive": {}}
    command.update(trigger="controller", now_ms=1, leader_term=1)
    result, events, changes = apply(ctl.state, command_from_json(command), 99, term=3)
    assert result["ok"] is False and result["code"] == "NOT_LEADER", result
    assert "term 1" in result["message"] and "term 3" in result["message"]
    assert (events, changes, ctl.state.digest) == ([], {}, digest)
    same_term, _, _ = apply(ctl.state, command_from_json(dict(command, leader_term=3)), 99, term=3)
    assert same_term["code"] != "NOT_LEADER"  # judged on its merits in the term of its view


@pytest.mark.parametrize("trigger", ["controller", "broker"])
def test_alive_master_is_kept(trigger):
    ctl = with_master((1, 2, 3))
    digest = ctl.state.digest
    # broker 2 reports more data and a newer epoch; the alive master stays anyway
    result = ctl.elect(
        heartbeats({1: (1, 0, 9), 2: (5, 900, 0), 3: (1, 0, 0)}), trigger=trigger, requester_broker_id=2
    )
    assert result["ok"] is True and result["changed"] is False
    assert ctl.state.digest == digest and ctl.last_changes == {} and ctl.last_events == []
    assert roles(ctl) == (1, 1, [1, 2, 3], 2)


@pytest.mark.parametrize(
    "reports,winner",
    [
        ({2: (5, 10, 0), 3: (4, 999, 0)}, 2),
        ({2: (5, 10, 0), 3: (5, 20, 0)}, 3),
        ({2: (5, 10, 3), 3: (5, 10, 1)}, 3),
        ({2: (5, 10, 1), 3: (5, 10, 3)}, 2),
        ({2: (5, 10, 1), 3: (5, 10, 1)}, 2),
        ({3: (0, 0, 0)}, 3),
    ],
    ids=[
        "higher-epoch-beats-more-data",
        "same-epoch-more-data",
        "smaller-priority",
        "smaller-priority-reversed",
        "tie-smallest-id",
        "only-one-alive",
    ],
)
def test_dead_master_is_replaced_by_the_best_alive_in_sync_replica(reports, winner):
    ctl = with_master((1, 2, 3))
    _, master_epoch, _, sync_epoch = roles(ctl)
    result = ctl.elect(heartbeats(reports), trigger="controller")
    assert result["ok"] is True and result["changed"] is True
    assert roles(ctl) == (winner, master_epoch + 1, [winner], sync_epoch + 1)
    assert result["replica_info"]["master_epoch"] == master_epoch + 1


def test_election_priority_falls_back_to_the_registered_priority():
    ctl = Controller()
    ctl.register(1)
    ctl.register(2, election_priority=5)
    ctl.register(3, election_priority=1)
    ctl.elect(alive(1, 2, 3), trigger="broker", requester_broker_id=1)
    ctl.ok("alter_sync_state_set", **ctl.alter_command([1, 2, 3], alive(1, 2, 3)))
    no_priority = {"2": {"epoch": 1, "max_offset": 7}, "3": {"epoch": 1, "max_offset": 7}}
    ctl.elect(no_priority, trigger="controller")
    assert ctl.bs()["master_broker_id"] == 3


def test_replica_outside_the_sync_state_set_is_not_elected_by_default():
    ctl = with_master((1, 2))
    # 3 has newer data but is not in sync; 2 is
    ctl.elect(heartbeats({2: (1, 5, 0), 3: (9, 900, 0)}), trigger="controller")
    assert roles(ctl) == (2, 2, [2], 3)


def test_unclean_election_only_when_enabled():
    ctl = with_master((1, 2))
    result = ctl.elect(heartbeats({3: (1, 900, 0)}), trigger="controller")
    assert result["ok"] is False and result["code"] == "MASTER_NOT_AVAILABLE"
    assert roles(ctl) == (0, 2, [1, 2], 2)
    ctl.ok("update_config", values={"enable_unclean_master_election": "true"})
    result = ctl.elect(heartbeats({3: (1, 900, 0)}), trigger="controller")
    assert result["ok"] is True and roles(ctl) == (3, 3, [3], 3)


def test_unclean_election_still_prefers_an_alive_in_sync_replica():
    ctl = with_master((1, 2))
    ctl.ok("update_config", values={"enable_unclean_master_election": True})
    ctl.elect(heartbeats({2: (1, 5, 0), 3: (9, 900, 0)}), trigger="controller")
    assert roles(ctl) == (2, 2, [2], 3)


def test_no_candidate_clears_the_dead_master_and_fences_it():
    ctl = with_master((1, 2, 3))
    result = ctl.elect({}, trigger="controller")
    assert result["ok"] is False and result["code"] == "MASTER_NOT_AVAILABLE"
    assert result["replica_info"]["master_broker_id"] == 0
    assert roles(ctl) == (0, 2, [1, 2, 3], 2)
    assert ctl.last_events and ctl.last_events[0]["kind"] == "role"
    # asking again while nothing is alive changes nothing more
    digest = ctl.state.digest
    result = ctl.elect({}, trigger="controller")
    assert result["ok"] is False and result["code"] == "MASTER_NOT_AVAILABLE"
    assert ctl.state.digest == digest and ctl.last_changes == {}
    # an in-sync replica that comes back is elected at the next epoch
    result = ctl.elect(alive(3), trigger="controller")
    assert result["ok"] is True and roles(ctl) == (3, 3, [3], 3)


def test_admin_preferred_broker_wins_only_if_alive_and_in_sync():
    ctl = with_master((1, 2))
    everyone = alive(1, 2, 3)
    fields = {"cluster": CLUSTER, "broker_name": NAME, "trigger": "admin"}
    ctl.rejected("MASTER_NOT_AVAILABLE", "elect_master", alive=everyone, preferred_broker_id=3, **fields)
    ctl.rejected("MASTER_NOT_AVAILABLE", "elect_master", alive=alive(1, 3), preferred_broker_id=2, **fields)
    ctl.rejected("INVALID_ARGUMENT", "elect_master", alive=everyone, preferred_broker_id=9, **fields)
    ctl.rejected("INVALID_ARGUMENT", "elect_master", alive=everyone, preferred_broker_id=-1, **fields)
    result = ctl.elect(everyone, trigger="admin", preferred_broker_id=1)
    assert result["ok"] is True and result["changed"] is False and ctl.last_changes == {}
    # the preferred broker replaces even an alive master
    result = ctl.elect(everyone, trigger="admin", preferred_broker_id=2)
    assert result["ok"] is True and result["changed"] is True
    assert roles(ctl) == (2, 2, [2], 3)
    ctl.ok("update_config", values={"enable_unclean_master_election": "yes"})
    result = ctl.elect(everyone, trigger="admin", preferred_broker_id=3)
    assert result["ok"] is True and roles(ctl) == (3, 3, [3], 4)


def test_a_handoff_replaces_the_alive_master_by_an_alive_in_sync_slave_only():
    """Property: only the master at its current epoch hands off, to an alive SyncStateSet
    member (the preferred one when named), never unclean; a refusal changes nothing."""
    ctl = with_master((1, 2))
    everyone = alive(1, 2, 3)
    fields = {"cluster": CLUSTER, "broker_name": NAME, "trigger": "handoff"}
    ctl.rejected(
        "FENCED_MASTER_EPOCH", "elect_master", alive=everyone, requester_broker_id=2, master_epoch=1, **fields
    )
    ctl.rejected(
        "FENCED_MASTER_EPOCH", "elect_master", alive=everyone, requester_broker_id=1, master_epoch=0, **fields
    )
    ctl.rejected(
        "NO_IN_SYNC_SLAVE", "elect_master", alive=everyone, requester_broker_id=1, master_epoch=1,
        preferred_broker_id=3, **fields,
    )  # fmt: skip
    ctl.rejected(
        "NO_IN_SYNC_SLAVE", "elect_master", alive=alive(1, 3), requester_broker_id=1, master_epoch=1, **fields
    )
    ctl.ok("update_config", values={"enable_unclean_master_election": "yes"})
    ctl.rejected(
        "NO_IN_SYNC_SLAVE", "elect_master", alive=alive(1, 3), requester_broker_id=1, master_epoch=1, **fields
    )
    result = ctl.elect(everyone, trigger="handoff", requester_broker_id=1, master_epoch=1)
    assert result["ok"] is True and result["changed"] is True and roles(ctl) == (2, 2, [2], 3)
    ctl.rejected(
        "FENCED_MASTER_EPOCH", "elect_master", alive=everyone, requester_broker_id=1, master_epoch=1, **fields
    )  # a retried handoff after it committed


def test_elect_on_an_unknown_broker_set_is_refused():
    ctl = with_master()
    ctl.rejected(
        "BROKER_SET_NOT_FOUND",
        "elect_master",
        cluster=CLUSTER,
        broker_name="nope",
        alive={},
        trigger="controller",
    )
    ctl.rejected(
        "BROKER_SET_NOT_FOUND", "elect_master", cluster="D", broker_name=NAME, alive={}, trigger="controller"
    )
    ctl.rejected(
        "INVALID_ARGUMENT",
        "elect_master",
        cluster="bad name",
        broker_name=NAME,
        alive={},
        trigger="controller",
    )


@pytest.mark.parametrize(
    "overrides,code",
    [
        ({"master_epoch": 0}, "FENCED_MASTER_EPOCH"),
        ({"master_epoch": 2}, "FENCED_MASTER_EPOCH"),
        ({"master_broker_id": 2}, "FENCED_MASTER_EPOCH"),
        ({"master_broker_id": None}, "FENCED_MASTER_EPOCH"),
        ({"sync_state_set_epoch": 0}, "FENCED_SYNC_STATE_SET_EPOCH"),
        ({"sync_state_set_epoch": 2}, "FENCED_SYNC_STATE_SET_EPOCH"),
        ({"new_sync_state_set": [2, 3]}, "INVALID_ARGUMENT"),
        ({"new_sync_state_set": []}, "INVALID_ARGUMENT"),
        ({"new_sync_state_set": [1, 9]}, "INVALID_ARGUMENT"),
        ({"alive": alive(1, 3)}, "MASTER_NOT_AVAILABLE"),
        ({"alive": alive(2, 3)}, "MASTER_NOT_AVAILABLE"),
    ],
    ids=[
        "stale-master-epoch",
        "future-master-epoch",
        "not-the-master",
        "no-master",
        "stale-sync-epoch",
        "future-sync-epoch",
        "master-missing",
        "empty-set",
        "unregistered",
        "member-dead",
        "master-dead",
    ],
)
def test_alter_sync_state_set_rejections(overrides, code):
    ctl = with_master((1,))
    ctl.rejected(code, "alter_sync_state_set", **ctl.alter_command([1, 2], alive(1, 2, 3), **overrides))


def test_alter_sync_state_set_on_an_unknown_broker_set_is_refused():
    ctl = with_master((1,))
    ctl.rejected(
        "BROKER_SET_NOT_FOUND", "alter_sync_state_set", **ctl.alter_command([1], alive(1), broker_name="nope")
    )


def test_alter_sync_state_set_changes_bump_the_epoch_and_no_ops_do_not():
    ctl = with_master((1,))
    result = ctl.ok("alter_sync_state_set", **ctl.alter_command([3, 1, 2, 2], alive(1, 2, 3)))
    assert result["changed"] is True and result["replica_info"]["sync_state_set_epoch"] == 2
    assert roles(ctl) == (1, 1, [1, 2, 3], 2)
    assert ctl.last_events[0]["kind"] == "sync_state_set"
    digest = ctl.state.digest
    result = ctl.ok("alter_sync_state_set", **ctl.alter_command([2, 3, 1], alive(1, 2, 3)))
    assert result["changed"] is False and ctl.state.digest == digest
    assert ctl.last_changes == {} and roles(ctl) == (1, 1, [1, 2, 3], 2)
    ctl.ok("alter_sync_state_set", **ctl.alter_command([1], alive(1)))
    assert roles(ctl) == (1, 1, [1], 3)
    # the request that read epoch 2 is now stale
    ctl.rejected(
        "FENCED_SYNC_STATE_SET_EPOCH",
        "alter_sync_state_set",
        **ctl.alter_command([1, 2], alive(1, 2), sync_state_set_epoch=2),
    )


def test_a_deposed_master_is_fenced():
    ctl = with_master((1, 2))
    stale = ctl.alter_command([1, 2, 3], alive(1, 2, 3))
    ctl.elect(alive(2, 3), trigger="controller")
    assert roles(ctl) == (2, 2, [2], 3)
    # the old master comes back with what it believed; it must not change the set
    ctl.rejected("FENCED_MASTER_EPOCH", "alter_sync_state_set", **stale)
    ctl.rejected("FENCED_MASTER_EPOCH", "alter_sync_state_set", **{**stale, "sync_state_set_epoch": 3})


def test_clean_refuses_alive_brokers_unless_forced():
    ctl = with_master((1, 2, 3))
    fields = {"cluster": CLUSTER, "broker_name": NAME}
    ctl.rejected("BROKER_ALIVE", "clean_broker_data", broker_ids=[3], alive=alive(1, 2, 3), **fields)
    ctl.rejected("BROKER_ALIVE", "clean_broker_data", broker_ids=[], alive=alive(3), **fields)
    ctl.rejected("INVALID_ARGUMENT", "clean_broker_data", broker_ids=[3, 9], alive={}, **fields)
    ctl.rejected("BROKER_SET_NOT_FOUND", "clean_broker_data", cluster=CLUSTER, broker_name="nope", alive={})
    result = clean(ctl, alive(1, 2, 3), broker_ids=[3], force=True)
    assert result["cleaned_broker_ids"] == [3] and result["broker_set_removed"] is False
    assert sorted(ctl.bs()["replicas"]) == ["1", "2"]
    assert roles(ctl) == (1, 1, [1, 2], 3)


def test_cleaning_a_replica_outside_the_set_keeps_the_epochs():
    ctl = with_master((1, 2))
    clean(ctl, alive(1, 2), broker_ids=[3])
    assert roles(ctl) == (1, 1, [1, 2], 2) and "3" not in ctl.bs()["replicas"]
    assert ctl.register(9) == 4  # ids are never reused


def test_cleaning_the_master_clears_it_and_bumps_master_epoch():
    ctl = with_master((1, 2, 3))
    clean(ctl, alive(2, 3), broker_ids=[1])
    assert roles(ctl) == (0, 2, [2, 3], 3) and "1" not in ctl.bs()["replicas"]
    # the cleaned master's last request is fenced
    ctl.rejected(
        "FENCED_MASTER_EPOCH",
        "alter_sync_state_set",
        **ctl.alter_command([1, 2], alive(1, 2), master_broker_id=1, master_epoch=1),
    )
    ctl.elect(heartbeats({2: (1, 4, 0), 3: (1, 5, 0)}), trigger="controller")
    assert roles(ctl) == (3, 3, [3], 4)


def test_cleaning_every_replica_keeps_the_record_and_its_epochs():
    ctl = with_master((1, 2, 3))
    ctl.elect(alive(2), trigger="controller")
    old = copy.deepcopy(ctl.bs())
    assert (old["master_broker_id"], old["master_epoch"]) == (2, 2)
    result = clean(ctl, {}, broker_ids=[])
    assert result["cleaned_broker_ids"] == [1, 2, 3] and result["broker_set_removed"] is True
    record = ctl.state.get(broker_set_key(CLUSTER, NAME))
    assert record is not None and record["replicas"] == {}
    assert record["master_broker_id"] == 0 and record["sync_state_set"] == []
    assert record["master_epoch"] == old["master_epoch"] + 1
    assert record["sync_state_set_epoch"] == old["sync_state_set_epoch"] + 1
    assert ctl.state.broker_sets() == [] and ctl.state.broker_sets(CLUSTER) == []
    ctl.rejected(
        "BROKER_SET_NOT_FOUND",
        "elect_master",
        cluster=CLUSTER,
        broker_name=NAME,
        alive={},
        trigger="controller",
    )
    ctl.rejected("BROKER_SET_NOT_FOUND", "clean_broker_data", cluster=CLUSTER, broker_name=NAME, alive={})
    ctl.rejected("BROKER_SET_NOT_FOUND", "put_topic", name="t", cluster=CLUSTER, broker_names=[NAME])
    # registering again continues the old epochs and never reuses an id
    new_id = ctl.register(5, check_code="fresh")
    assert new_id == 4
    assert ctl.bs()["master_epoch"] >= record["master_epoch"] > old["master_epoch"]
    assert ctl.bs()["sync_state_set_epoch"] >= record["sync_state_set_epoch"]
    assert [bs["broker_name"] for bs in ctl.state.broker_sets(CLUSTER)] == [NAME]
    ctl.elect(alive(new_id), trigger="broker", requester_broker_id=new_id)
    assert roles(ctl) == (4, record["master_epoch"] + 1, [4], record["sync_state_set_epoch"] + 1)


def test_clean_that_empties_the_sync_state_set_must_not_enable_an_unclean_election():
    ctl = with_master((1,))  # 2 and 3 are registered but not in sync
    clean(ctl, alive(2, 3), broker_ids=[1])  # the master's disk is lost; the admin cleans it
    assert roles(ctl) == (0, 2, [], 2)
    assert ctl.state.config()["enable_unclean_master_election"] is False
    result = ctl.elect(heartbeats({2: (1, 3, 0), 3: (1, 7, 0)}), trigger="controller")
    assert result["ok"] is False and result["code"] == "MASTER_NOT_AVAILABLE"
    assert ctl.bs()["master_broker_id"] == 0
