"""Tests of the controller's pure state machine (controller/state_machine.py): the handler
table and the digest.

Properties checked:
- HANDLERS covers exactly the command types;
- the running digest always equals a full re-hash (recompute_digest()), whatever the order
  of the changes; a barrier changes nothing; an unknown command type is invalid and
  changes nothing;
- reads on other threads while commit() runs (the service reads the live state beside the
  Raft thread): a key that exists is never found missing while its value is replaced, and
  listing a kind never fails or names a deleted key.

The other properties are in test_state_machine_brokers.py (register, elect, SyncStateSet,
clean), test_state_machine_topics.py (topics, groups, configuration),
test_state_machine_properties.py (random command logs) and test_state_machine_simulation.py
(the seeded simulation); their shared helpers are in tests/support/state_machine.py.
"""

from __future__ import annotations

import copy
import threading
import time

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


CONCURRENT_RUN_S = 0.3


def test_readers_beside_commit_never_find_an_existing_key_missing():
    state = ControllerState()
    key = "tiered/DefaultCluster/broker-a"
    state.commit({key: {"uploaded_offset": 0, "segments": []}})
    stop = threading.Event()
    reads: list[int] = [0]
    missing: list[int] = [0]
    failures: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                reads[0] += 1
                if state.get(key) is None:
                    missing[0] += 1
                listed = list(state.with_prefix("topic/"))
                assert all(value is not None for _, value in listed)
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + CONCURRENT_RUN_S
    writes = 0
    try:
        while time.monotonic() < deadline:
            writes += 1
            # a big value: hashing it (sha256 releases the GIL) takes long enough to be read in
            segments = [{"base_offset": k, "end_offset": k + 1, "name": "s" * 40} for k in range(60)]
            state.commit({key: {"uploaded_offset": writes, "segments": segments}})
            state.commit({f"topic/t{writes % 50}": {"name": f"t{writes % 50}"}})
            state.commit({f"topic/t{(writes + 25) % 50}": None})
    finally:
        stop.set()
        reader.join()
    assert not failures, failures
    assert reads[0] > 0 and writes > 0
    assert missing[0] == 0, f"{missing[0]} of {reads[0]} reads found the key missing during {writes} writes"
    assert state.digest == state.recompute_digest()


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
