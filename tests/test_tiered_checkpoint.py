"""Tiered-storage checkpoints in the controller's pure state machine.

Properties checked:
- only the current master (id and epoch) can start or commit an upload;
- an upload starts at the checkpoint and its segments cover its range exactly;
- the checkpoint only moves forward (T4) and records the committing epoch;
- after a failover the old master's late commit is refused and its dangling upload is
  listed as abandoned for garbage collection, until the new master forgets it.
"""

from __future__ import annotations

from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import ControllerState, apply, tiered_key

CLUSTER, NAME = "C", "b"


def run(state: ControllerState, command: dict) -> dict:
    result, _, _ = apply(state, command_from_json(dict(command, cluster=CLUSTER, broker_name=NAME)), 1)
    return result


def broker_set_with_master(alive=(1, 2)) -> ControllerState:
    state = ControllerState()
    for i in (1, 2):
        assert run(
            state, {"type": "register_broker", "address": f"127.0.0.1:{9000 + i}", "check_code": f"c{i}"}
        )["ok"]
    assert run(
        state,
        {
            "type": "elect_master",
            "trigger": "broker",
            "requester_broker_id": 1,
            "alive": {str(i): {} for i in alive},
        },
    )["ok"]
    assert run(
        state,
        {
            "type": "alter_sync_state_set",
            "master_broker_id": 1,
            "master_epoch": 1,
            "sync_state_set_epoch": 1,
            "new_sync_state_set": [1, 2],
            "alive": {str(i): {} for i in alive},
        },
    )["ok"]
    return state


def segment(base: int, end: int) -> dict:
    return {
        "key": f"k{base}",
        "base_offset": base,
        "end_offset": end,
        "size": end - base,
        "sha256": "0" * 64,
        "record_count": 1,
        "first_epoch": 1,
        "last_epoch": 1,
    }


def start(state, upload_id, base, end, master=1, epoch=1) -> dict:
    return run(
        state,
        {
            "type": "tiered_upload_start",
            "master_broker_id": master,
            "master_epoch": epoch,
            "upload_id": upload_id,
            "base_offset": base,
            "end_offset": end,
        },
    )


def commit(state, upload_id, segments, master=1, epoch=1) -> dict:
    return run(
        state,
        {
            "type": "tiered_commit",
            "master_broker_id": master,
            "master_epoch": epoch,
            "upload_id": upload_id,
            "segments": segments,
            "epochs": [[epoch, 0]],
        },
    )


def test_only_the_current_master_uploads():
    state = broker_set_with_master()
    assert start(state, "u1", 0, 100, master=2)["code"] == "FENCED_MASTER_EPOCH"
    assert start(state, "u1", 0, 100, epoch=0)["code"] == "FENCED_MASTER_EPOCH"
    assert start(state, "u1", 0, 100)["ok"]


def test_commit_covers_the_started_range_exactly_and_moves_forward():
    state = broker_set_with_master()
    assert start(state, "u1", 50, 100)["code"] == "TIERED_RANGE_INVALID", "must start at 0"
    assert start(state, "u1", 0, 100)["ok"]
    assert commit(state, "other", [segment(0, 100)])["code"] == "TIERED_UPLOAD_UNKNOWN"
    assert commit(state, "u1", [segment(0, 40), segment(50, 100)])["code"] == "TIERED_RANGE_INVALID", "a gap"
    assert commit(state, "u1", [segment(0, 60), segment(40, 100)])["code"] == "TIERED_RANGE_INVALID", (
        "an overlap"
    )
    assert commit(state, "u1", [segment(0, 90)])["code"] == "TIERED_RANGE_INVALID", "short"
    done = commit(state, "u1", [segment(0, 40), segment(40, 100)])
    assert done["ok"] and done["checkpoint"]["uploaded_offset"] == 100
    assert commit(state, "u1", [segment(0, 100)])["code"] == "TIERED_UPLOAD_UNKNOWN", "twice"
    assert start(state, "u2", 0, 100)["code"] == "TIERED_RANGE_INVALID", "never backwards"
    assert start(state, "u2", 100, 100)["code"] == "TIERED_RANGE_INVALID", "empty range"
    assert start(state, "u2", 100, 180)["ok"]


def test_old_master_late_commit_is_refused_and_its_upload_abandoned():
    state = broker_set_with_master()
    assert start(state, "old", 0, 100)["ok"]
    # the master dies; broker 2 is elected (epoch 2)
    elected = run(state, {"type": "elect_master", "trigger": "controller", "alive": {"2": {}}})
    assert elected["ok"] and elected["replica_info"]["master_broker_id"] == 2
    assert commit(state, "old", [segment(0, 100)])["code"] == "FENCED_MASTER_EPOCH"
    fresh = start(state, "new", 0, 120, master=2, epoch=2)
    assert fresh["ok"] and fresh["checkpoint"]["abandoned"] == ["old"]
    assert commit(state, "new", [segment(0, 120)], master=2, epoch=2)["checkpoint"]["checkpoint_epoch"] == 2
    forgot = run(
        state,
        {"type": "tiered_forget_abandoned", "master_broker_id": 2, "master_epoch": 2, "upload_ids": ["old"]},
    )
    assert forgot["checkpoint"]["abandoned"] == []
    assert state.get(tiered_key(CLUSTER, NAME))["uploaded_offset"] == 120
    assert state.digest == state.recompute_digest()
