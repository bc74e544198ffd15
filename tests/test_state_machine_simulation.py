"""A seeded simulation (TigerBeetle VOPR style) of the state machine.

3 brokers per set crash, restart, write, shrink and expand their SyncStateSet, get cleaned
and re-register, with a leader that elects a new master when the master dies, and masters
that hand off to a caught-up in-sync slave (or retry a handoff that already committed).
Properties checked: M1-M4 after every command, zombie masters are fenced, and with unclean
election off no acknowledged offset is lost. A failure message names the seed.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass

import pytest
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.state_machine import (
    ControllerState,
    apply,
)

from mqmeta.formats.checksummed import canonical_json
from tests.support.state_machine import (
    HistoryChecker,
    Json,
)

# Seeded simulation ----------------------------------------------------------------------


SIM_CLUSTER = "SIM"


SIM_SETS = ("s0", "s1")


SIM_SLOTS = 3


SIM_SEEDS = (1, 2, 3, 5, 8, 13, 21, 34)


SIM_STEPS = 300


@dataclass
class SimBroker:
    slot: int
    generation: int = 0
    broker_id: int = 0  # 0 = not registered (yet, or again after a clean)
    alive: bool = True
    epoch: int = 0  # master epoch of the newest data it holds
    max_offset: int = 0

    @property
    def check_code(self) -> str:
        return f"slot{self.slot}-gen{self.generation}"


class Simulation:
    """3 brokers per broker set, a controller leader, random crashes, writes and cleans."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.state = ControllerState()
        self.checker = HistoryChecker()
        self.index = 0
        self.step = 0
        self.unclean = False
        self.brokers = {name: [SimBroker(slot) for slot in range(SIM_SLOTS)] for name in SIM_SETS}
        self.acked = dict.fromkeys(SIM_SETS, 0)  # highest offset the set has confirmed
        self.deposed: dict[str, tuple[int, int, int]] = {}  # last master's id and epochs
        self.trace: list[str] = []
        self.elections = 0
        self.handoffs = 0

    def where(self) -> str:
        recent = "\n  ".join(self.trace[-8:])
        return f"seed={self.seed} step={self.step}; last commands:\n  {recent}"

    def apply(self, command: Json) -> Json:
        self.index += 1
        result, _events, _changes = apply(
            self.state, command_from_json(json.loads(canonical_json(command))), self.index
        )
        self.trace.append(
            f"{command['type']} {command.get('broker_name', '')} -> "
            f"ok={result['ok']} {result.get('code', '')}"
        )
        assert self.state.digest == self.state.recompute_digest(), self.where()
        self.checker.observe(self.state, self.where())
        return result

    def bs(self, name: str) -> Json | None:
        return self.state.broker_set(SIM_CLUSTER, name)

    def by_id(self, name: str, broker_id: int) -> SimBroker | None:
        return next((b for b in self.brokers[name] if broker_id and b.broker_id == broker_id), None)

    def alive_map(self, name: str) -> Json:
        return {
            str(b.broker_id): {"epoch": b.epoch, "max_offset": b.max_offset, "priority": b.slot}
            for b in self.brokers[name]
            if b.alive and b.broker_id
        }

    # Actions --------------------------------------------------------------------------
    def run(self) -> None:
        actions = [
            (self.crash, 12),
            (self.restart, 15),
            (self.write, 30),
            (self.change_sync_state_set, 20),
            (self.zombie_alter, 5),
            (self.admin_switch, 3),
            (self.handoff, 12),
            (self.toggle_unclean, 2),
            (self.clean_dead, 4),
        ]
        for self.step in range(SIM_STEPS):
            action = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
            name = self.rng.choice(SIM_SETS)
            action(name)
            self.register_alive(name)
            if self.rng.random() < 0.6:
                self.leader_scan(name)

    def crash(self, name: str) -> None:
        candidates = [b for b in self.brokers[name] if b.alive]
        if candidates:
            self.rng.choice(candidates).alive = False

    def restart(self, name: str) -> None:
        candidates = [b for b in self.brokers[name] if not b.alive]
        if candidates:
            self.rng.choice(candidates).alive = True

    def register_alive(self, name: str) -> None:
        for broker in self.brokers[name]:
            if not broker.alive:
                continue
            result = self.apply(
                {
                    "type": "register_broker",
                    "cluster": SIM_CLUSTER,
                    "broker_name": name,
                    "address": f"10.1.0.{broker.slot}:{10911 + broker.generation}",
                    "check_code": broker.check_code,
                    "broker_id": broker.broker_id,
                    "election_priority": broker.slot,
                }
            )
            assert result["ok"], (result, self.where())
            if broker.broker_id:
                assert result["broker_id"] == broker.broker_id, self.where()
            broker.broker_id = result["broker_id"]

    def master(self, name: str) -> SimBroker | None:
        bs = self.bs(name)
        return self.by_id(name, bs["master_broker_id"]) if bs else None

    def write(self, name: str) -> None:
        master = self.master(name)
        if master is None or not master.alive:
            return
        master.max_offset += self.rng.randint(1, 3)
        for follower in self.brokers[name]:
            if follower is master or not follower.alive or not follower.broker_id:
                continue
            if self.rng.random() < 0.6:
                follower.max_offset, follower.epoch = master.max_offset, master.epoch
        bs = self.bs(name)
        assert bs is not None
        confirm = min(self.by_id(name, i).max_offset for i in bs["sync_state_set"])
        self.acked[name] = max(self.acked[name], confirm)

    def change_sync_state_set(self, name: str) -> None:
        master, bs = self.master(name), self.bs(name)
        if master is None or not master.alive or bs is None:
            return
        caught_up = sorted(
            b.broker_id
            for b in self.brokers[name]
            if b.alive and b.broker_id and b.max_offset == master.max_offset
        )
        command = {
            "type": "alter_sync_state_set",
            "cluster": SIM_CLUSTER,
            "broker_name": name,
            "master_broker_id": master.broker_id,
            "master_epoch": bs["master_epoch"],
            "sync_state_set_epoch": bs["sync_state_set_epoch"],
            "new_sync_state_set": caught_up,
            "alive": self.alive_map(name),
        }
        stale = self.rng.random() < 0.15
        if stale:  # a delayed request from before the last change
            command["sync_state_set_epoch"] -= 1
        result = self.apply(command)
        if stale:
            assert result["code"] == "FENCED_SYNC_STATE_SET_EPOCH", (result, self.where())
        else:
            assert result["ok"], (result, self.where())
            assert self.bs(name)["sync_state_set"] == caught_up, self.where()

    def zombie_alter(self, name: str) -> None:
        """A master deposed by an election (or a clean) tries to act on its old epoch."""
        bs = self.bs(name)
        if name not in self.deposed or bs is None:
            return
        broker_id, master_epoch, sync_epoch = self.deposed[name]
        result = self.apply(
            {
                "type": "alter_sync_state_set",
                "cluster": SIM_CLUSTER,
                "broker_name": name,
                "master_broker_id": broker_id,
                "master_epoch": master_epoch,
                "sync_state_set_epoch": sync_epoch,
                "new_sync_state_set": [broker_id],
                "alive": self.alive_map(name),
            }
        )
        # a fully cleaned set is not even registered any more
        expected = "FENCED_MASTER_EPOCH" if bs["replicas"] else "BROKER_SET_NOT_FOUND"
        assert result["code"] == expected, (result, self.where())

    def admin_switch(self, name: str) -> None:
        bs = self.bs(name)
        candidates = [b for b in self.brokers[name] if b.broker_id]
        if bs is None or not bs["replicas"] or not candidates:
            return
        preferred = self.rng.choice(candidates).broker_id
        self.elect(name, {"trigger": "admin", "preferred_broker_id": preferred})

    def handoff(self, name: str) -> None:
        """The master hands off to a slave holding all it has (what broker_agent/core.py
        waits for), sometimes late (a retry after the handoff committed: a stale epoch)."""
        master, bs = self.master(name), self.bs(name)
        if master is None or not master.alive or bs is None:
            return
        caught_up = [
            b.broker_id
            for b in self.brokers[name]
            if b is not master and b.broker_id in bs["sync_state_set"] and b.max_offset == master.max_offset
        ]
        if not caught_up:
            return  # the broker gives up before asking (core.py: no successor holds it all)
        stale = self.rng.random() < 0.2
        fields = {
            "trigger": "handoff",
            "requester_broker_id": master.broker_id,
            "master_epoch": bs["master_epoch"] - (1 if stale else 0),
            "preferred_broker_id": self.rng.choice(caught_up),
        }
        before = copy.deepcopy(bs)
        result = self.apply(
            {
                "type": "elect_master",
                "cluster": SIM_CLUSTER,
                "broker_name": name,
                "alive": self.alive_map(name),
                **fields,
            }
        )
        if stale:
            assert result["code"] == "FENCED_MASTER_EPOCH", (result, self.where())
            return
        successor = self.by_id(name, fields["preferred_broker_id"])
        alive_successor = successor is not None and successor.alive
        assert result["ok"] is alive_successor, (result, self.where())
        if not result["ok"]:
            assert result["code"] == "NO_IN_SYNC_SLAVE", (result, self.where())
            return
        self.elections += 1
        self.handoffs += 1
        self.deposed[name] = (
            before["master_broker_id"],
            before["master_epoch"],
            before["sync_state_set_epoch"],
        )
        new_master = self.by_id(name, self.bs(name)["master_broker_id"])
        assert new_master is not None and new_master.max_offset >= self.acked[name], self.where()
        new_master.epoch = self.bs(name)["master_epoch"]

    def toggle_unclean(self, name: str) -> None:
        self.unclean = not self.unclean
        value = "true" if self.unclean else "false"
        result = self.apply({"type": "update_config", "values": {"enable_unclean_master_election": value}})
        assert result["ok"] and self.state.config()["enable_unclean_master_election"] is (self.unclean), (
            self.where()
        )

    def clean_dead(self, name: str) -> None:
        bs = self.bs(name)
        dead = [b for b in self.brokers[name] if not b.alive and b.broker_id]
        if bs is None or not dead:
            return
        targets = self.rng.sample(dead, self.rng.randint(1, len(dead)))
        target_ids = {b.broker_id for b in targets}
        registered = {int(i) for i in bs["replicas"]}
        if set(bs["sync_state_set"]) <= target_ids and target_ids != registered:
            # Would empty the SyncStateSet while other replicas remain: the known bug in
            # test_clean_that_empties_the_sync_state_set_must_not_enable_an_unclean_election.
            return
        result = self.apply(
            {
                "type": "clean_broker_data",
                "cluster": SIM_CLUSTER,
                "broker_name": name,
                "broker_ids": sorted(target_ids),
                "alive": self.alive_map(name),
            }
        )
        assert result["ok"] and result["cleaned_broker_ids"] == sorted(target_ids), (result, self.where())
        if bs["master_broker_id"] in target_ids:
            self.deposed[name] = (bs["master_broker_id"], bs["master_epoch"], bs["sync_state_set_epoch"])
        for broker in targets:  # its disk is wiped; it comes back as a new broker
            broker.generation += 1
            broker.broker_id, broker.epoch, broker.max_offset = 0, 0, 0
        if target_ids == registered:
            assert result["broker_set_removed"] is True, self.where()
            self.acked[name] = 0

    # The controller leader ------------------------------------------------------------
    def leader_scan(self, name: str) -> None:
        bs = self.bs(name)
        if bs is None or not bs["replicas"]:
            return
        master = self.master(name)
        if master is not None and master.alive:
            followers = [b for b in self.brokers[name] if b.alive and b.broker_id and b is not master]
            if followers and self.rng.random() < 0.2:  # a follower that lost its master asks
                result = self.apply(
                    {
                        "type": "elect_master",
                        "cluster": SIM_CLUSTER,
                        "broker_name": name,
                        "alive": self.alive_map(name),
                        "trigger": "broker",
                        "requester_broker_id": self.rng.choice(followers).broker_id,
                    }
                )
                assert result["ok"] and result["changed"] is False, (result, self.where())
            return
        if bs["master_epoch"] == 0 or not bs["sync_state_set"]:
            requesters = [b for b in self.brokers[name] if b.alive and b.broker_id]
            if requesters:  # a broker that sees no master asks for the first election
                requester = self.rng.choice(requesters).broker_id
                self.elect(name, {"trigger": "broker", "requester_broker_id": requester})
            return
        self.elect(name, {"trigger": "controller"})

    def elect(self, name: str, fields: Json) -> None:
        before = copy.deepcopy(self.bs(name))
        result = self.apply(
            {
                "type": "elect_master",
                "cluster": SIM_CLUSTER,
                "broker_name": name,
                "alive": self.alive_map(name),
                **fields,
            }
        )
        after = self.bs(name)
        if not result["ok"]:
            assert result["code"] == "MASTER_NOT_AVAILABLE", (result, self.where())
            if before["master_broker_id"] and not after["master_broker_id"]:
                self.deposed[name] = (
                    before["master_broker_id"],
                    before["master_epoch"],
                    before["sync_state_set_epoch"],
                )
            return
        if not result["changed"]:
            return
        self.elections += 1
        if before["master_broker_id"]:
            self.deposed[name] = (
                before["master_broker_id"],
                before["master_epoch"],
                before["sync_state_set_epoch"],
            )
        new_master = self.by_id(name, after["master_broker_id"])
        assert new_master is not None and new_master.alive, self.where()
        if fields.get("preferred_broker_id"):
            assert new_master.broker_id == fields["preferred_broker_id"], self.where()
        if not self.unclean:
            assert new_master.max_offset >= self.acked[name], (
                f"acknowledged offset {self.acked[name]} of {name} lost: new master "
                f"{new_master.broker_id} has {new_master.max_offset}; {self.where()}"
            )
        self.acked[name] = min(self.acked[name], new_master.max_offset)
        new_master.epoch = after["master_epoch"]
        for broker in self.brokers[name]:  # followers truncate a divergent tail
            broker.max_offset = min(broker.max_offset, new_master.max_offset)


@pytest.mark.parametrize("seed", SIM_SEEDS)
def test_seeded_simulation_keeps_m1_to_m4_and_acknowledged_offsets(seed):
    sim = Simulation(seed)
    sim.run()
    assert sim.index > SIM_STEPS, f"seed={seed}: too few commands applied"
    assert sim.elections > 0, f"seed={seed}: no election ever happened"
    assert sim.handoffs > 0, f"seed={seed}: no handoff ever happened"
    for name in SIM_SETS:
        bs = sim.bs(name)
        assert bs is not None and bs["master_epoch"] > 0, f"seed={seed}: {name} never elected"
