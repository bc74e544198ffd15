"""Tests of the controller's pure state machine (controller/state_machine.py): the handler
table and the digest.

Properties checked:
- HANDLERS covers exactly the command types;
- the running digest always equals a full re-hash (recompute_digest()), whatever the order
  of the changes; a barrier changes nothing; an unknown command type is invalid and
  changes nothing.

The other properties are in test_state_machine_brokers.py (register, elect, SyncStateSet,
clean), test_state_machine_topics.py (topics, groups, configuration),
test_state_machine_properties.py (random command logs) and test_state_machine_simulation.py
(the seeded simulation); their shared helpers are in tests/support/state_machine.py.
"""

from __future__ import annotations

import copy

import pytest
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import (
    HANDLERS,
    ControllerState,
    apply,
)

from tests.support.state_machine import (
    CLUSTER,
    with_master,
)

# Digest ---------------------------------------------------------------------------------


def test_handlers_are_the_covered_command_types():
    # one handler per command class; the undecodable one only refuses (tests/test_commands.py)
    assert {kind.TYPE for kind in HANDLERS} - {"undecodable"} == {
        "barrier",
        "register_broker",
        "elect_master",
        "alter_sync_state_set",
        "clean_broker_data",
        "put_topic",
        "delete_topic",
        "put_group",
        "delete_group",
        "update_config",
        # covered by tests/test_tiered_checkpoint.py
        "tiered_upload_start",
        "tiered_commit",
        "tiered_forget_abandoned",
        # covered by tests/test_replicator_leases.py
        "replicator_heartbeat",
        "replicator_expire",
        "replicator_commit",
    }


def test_digest_is_incremental_order_independent_and_matches_a_full_rehash():
    a = ControllerState()
    empty = a.digest
    assert empty == "0" * 64
    a.commit({"x": {"v": 1}})
    a.commit({"y": {"v": 2}})
    b = ControllerState()
    b.commit({"y": {"v": 2}, "x": {"v": 1}})
    assert a.digest == b.digest == a.recompute_digest() == b.recompute_digest()
    a.commit({"x": {"v": 3}})
    assert a.digest != b.digest and a.digest == a.recompute_digest()
    a.commit({"x": {"v": 1}})
    assert a.digest == b.digest
    a.commit({"x": None, "y": None, "never-there": None})
    assert a.digest == empty == a.recompute_digest() and a.entries == {}


def test_barrier_changes_nothing():
    ctl = with_master()
    digest = ctl.state.digest
    assert ctl.ok("barrier") == {"ok": True}
    assert ctl.last_changes == {} and ctl.last_events == [] and ctl.state.digest == digest


@pytest.mark.parametrize(
    "command", [{"type": "frobnicate"}, {}, {"type": ""}, {"type": "Register_Broker", "cluster": CLUSTER}]
)
def test_unknown_command_type_is_invalid_and_changes_nothing(command):
    ctl = with_master()
    entries = copy.deepcopy(ctl.state.entries)
    digest = ctl.state.digest
    result, events, changes = apply(ctl.state, command_from_json(command), 99)
    assert result["ok"] is False and result["code"] == "INVALID_ARGUMENT"
    assert events == [] and changes == {}
    assert ctl.state.digest == digest and ctl.state.entries == entries
