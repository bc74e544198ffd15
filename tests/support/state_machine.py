"""What the state machine's tests share: a Controller driving apply(), broker-set setups, and the
history checks of M1-M4 (tests/test_state_machine*.py)."""

from __future__ import annotations

import copy
from typing import Any

from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import (
    ControllerState,
    apply,
)

Json = dict[str, Any]


CLUSTER = "C"


NAME = "b"


def heartbeats(reports: dict[int, tuple[int, int, int]]) -> Json:
    """An `alive` map as the service builds it: id -> (epoch, max_offset, priority)."""
    return {
        str(broker_id): {"epoch": epoch, "max_offset": max_offset, "priority": priority}
        for broker_id, (epoch, max_offset, priority) in reports.items()
    }


def alive(*broker_ids: int) -> Json:
    return heartbeats({broker_id: (0, 0, 0) for broker_id in broker_ids})


class Controller:
    """A state and a log index; checks the running digest after every command."""

    def __init__(self) -> None:
        self.state = ControllerState()
        self.index = 0
        self.last_events: list[Json] = []
        self.last_changes: dict[str, Any] = {}

    def run(self, command_type: str, **fields: Any) -> Json:
        self.index += 1
        result, events, changes = apply(
            self.state, command_from_json({"type": command_type, **fields}), self.index
        )
        assert self.state.digest == self.state.recompute_digest()
        self.last_events, self.last_changes = events, changes
        return result

    def ok(self, command_type: str, **fields: Any) -> Json:
        result = self.run(command_type, **fields)
        assert result["ok"] is True, result
        return result

    def rejected(self, code: str, command_type: str, **fields: Any) -> Json:
        entries_before = copy.deepcopy(self.state.entries)
        digest_before = self.state.digest
        result = self.run(command_type, **fields)
        assert result["ok"] is False and result["code"] == code, result
        assert result["message"]
        assert self.last_changes == {} and self.last_events == []
        assert self.state.digest == digest_before
        assert self.state.entries == entries_before
        return result

    def bs(self, cluster: str = CLUSTER, name: str = NAME) -> Json:
        bs = self.state.broker_set(cluster, name)
        assert bs is not None
        return bs

    def register(self, n: int, cluster: str = CLUSTER, name: str = NAME, **fields: Any) -> int:
        fields.setdefault("address", f"10.0.0.{n}:10911")
        fields.setdefault("check_code", f"check-{n}")
        result = self.ok("register_broker", cluster=cluster, broker_name=name, **fields)
        return result["broker_id"]

    def elect(self, alive_map: Json, cluster: str = CLUSTER, name: str = NAME, **fields: Any) -> Json:
        return self.run("elect_master", cluster=cluster, broker_name=name, alive=alive_map, **fields)

    def alter_command(self, new_set: list[int], alive_map: Json, **overrides: Any) -> Json:
        bs = self.bs()
        command = {
            "cluster": CLUSTER,
            "broker_name": NAME,
            "master_broker_id": bs["master_broker_id"],
            "master_epoch": bs["master_epoch"],
            "sync_state_set_epoch": bs["sync_state_set_epoch"],
            "new_sync_state_set": new_set,
            "alive": alive_map,
        }
        command.update(overrides)
        return command


def registered(count: int = 3) -> Controller:
    ctl = Controller()
    for n in range(1, count + 1):
        assert ctl.register(n) == n
    return ctl


def with_master(in_sync: tuple[int, ...] = (1, 2, 3)) -> Controller:
    """Brokers 1-3 registered, 1 elected master (epoch 1), SyncStateSet = in_sync."""
    ctl = registered(3)
    assert ctl.elect(alive(1, 2, 3), trigger="broker", requester_broker_id=1)["ok"]
    if sorted(in_sync) != [1]:
        ctl.ok("alter_sync_state_set", **ctl.alter_command(list(in_sync), alive(1, 2, 3)))
    bs = ctl.bs()
    assert (bs["master_broker_id"], bs["master_epoch"], bs["sync_state_set"]) == (1, 1, sorted(in_sync))
    return ctl


def roles(ctl: Controller) -> tuple[int, int, list[int], int]:
    bs = ctl.bs()
    return (bs["master_broker_id"], bs["master_epoch"], bs["sync_state_set"], bs["sync_state_set_epoch"])


def clean(ctl: Controller, alive_map: Json, name: str = NAME, **fields: Any) -> Json:
    return ctl.ok("clean_broker_data", cluster=CLUSTER, broker_name=name, alive=alive_map, **fields)


class HistoryChecker:
    """M1-M4 over a whole history of states, plus the shape of each broker set record."""

    def __init__(self) -> None:
        self.last: dict[str, Json] = {}
        self.masters: dict[tuple[str, int], int] = {}

    def observe(self, state: ControllerState, where: str) -> None:
        for key in self.last:
            assert key in state.entries, f"broker set record {key} was removed; {where}"
        for key, bs in state.entries.items():
            if key.startswith("brokerset/"):
                self._check(key, bs, where)
                self.last[key] = copy.deepcopy(bs)

    def _check(self, key: str, bs: Json, where: str) -> None:
        master, epoch = bs["master_broker_id"], bs["master_epoch"]
        sync_set, sync_epoch = bs["sync_state_set"], bs["sync_state_set_epoch"]
        prev = self.last.get(
            key, {"master_broker_id": 0, "master_epoch": 0, "sync_state_set": [], "sync_state_set_epoch": 0}
        )
        assert epoch >= prev["master_epoch"], f"M1 master_epoch went back in {key}; {where}"
        if master != prev["master_broker_id"]:
            assert epoch > prev["master_epoch"], (
                f"M1 master {prev['master_broker_id']}->{master} at the same epoch {epoch} in {key}; {where}"
            )
        if master:
            holder = self.masters.setdefault((key, epoch), master)
            assert holder == master, f"M2 two masters ({holder}, {master}) at epoch {epoch} in {key}; {where}"
            assert master in sync_set, f"M3 master {master} not in {sync_set} ({key}); {where}"
            assert str(master) in bs["replicas"], f"master {master} not registered; {where}"
        assert sync_epoch >= prev["sync_state_set_epoch"], (
            f"M4 sync_state_set_epoch went back in {key}; {where}"
        )
        if sorted(sync_set) != sorted(prev["sync_state_set"]):
            assert sync_epoch > prev["sync_state_set_epoch"], (
                f"M4 SyncStateSet {prev['sync_state_set']}->{sync_set} without an epoch bump "
                f"in {key}; {where}"
            )
        assert len(set(sync_set)) == len(sync_set), f"duplicate ids in {sync_set}; {where}"
        assert all(str(i) in bs["replicas"] for i in sync_set), (
            f"unregistered id in SyncStateSet {sync_set} ({key}); {where}"
        )
        assert all(int(i) < bs["next_broker_id"] for i in bs["replicas"]), (
            f"next_broker_id {bs['next_broker_id']} not past every id in {key}; {where}"
        )
