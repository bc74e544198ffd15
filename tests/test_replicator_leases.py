"""Replicator task leases in the controller's state machine (pure, no processes).

Properties checked:
- `assign` gives every task to exactly one live worker that has the task's rule (none when
  no such worker), with loads differing by at most one, keeps holders where that balance
  allows (a new worker takes only its share), and is deterministic;
- through `apply`: a heartbeat creates the tasks it reports and assigns them (epoch 1); a
  change of holder (a worker joins, expires, or restarts with a new incarnation) bumps the
  task's epoch; a commit under a stale epoch or from a worker not holding the task is
  refused FENCED_LEASE_EPOCH (FAILED_PRECONDITION) and changes nothing; the first recorded
  start stays (unless recorded under another definition of the rule: then its progress is
  dropped); the acknowledged offset never moves back; replicated counts survive moves;
- the status counts what the committed checkpoints say was replicated (acknowledged offset
  minus recorded start), not the workers' in-memory counts, which restart at zero with a
  task thread;
- the grant rule: a task moved away from a live worker is granted to its new holder only
  once the former holder heartbeated after the move without running it;
- the leader expires a worker silent past its dead-after, never within its own first
  dead-after as leader;
- a seeded simulation (joins, heartbeats in random order, crashes, restarts with a new
  incarnation, expiry, new tasks): no task ever runs on two live workers at once (exclusivity), and once the
  workers have heartbeated, every task of a rule some live worker has runs (liveness).
"""

from __future__ import annotations

import random

import pytest
from mqmeta.controller.commands import command_from_json
from mqmeta.controller.replicator_leases import FENCED, assign, live_workers, task_key_text
from mqmeta.controller.replicator_liveness import WorkerBeat, WorkerLiveness, granted, lease_view, status
from mqmeta.controller.state_machine import ControllerState, apply

from mqmeta.errors import FailedPrecondition, error_from_code

pytestmark = pytest.mark.timeout(60)

SEEDS = range(20)
STEPS = 300


def tasks_of(rule: str, count: int) -> list[tuple[str, str, str, int]]:
    return [(rule, "T", "broker-a", q) for q in range(count)]


def heartbeat(state, worker, rules, tasks, incarnation="i1", index=1):
    command = {
        "type": "replicator_heartbeat",
        "worker_id": worker,
        "incarnation": incarnation,
        "lease_ms": 1500,
        "dead_after_ms": 2500,
        "rules": rules,
        "tasks": [list(t) for t in tasks],
    }
    result, _, _ = apply(state, command_from_json(command), index)
    assert result["ok"], result
    return result


def record(state, task):
    return state.get(task_key_text(task))


def test_assign_gives_each_task_to_one_eligible_worker_balanced_and_stable():
    tasks = {t: "" for t in tasks_of("r", 10) + tasks_of("s", 3)}
    workers = {"w1": frozenset({"r"}), "w2": frozenset({"r", "s"}), "w3": frozenset({"r"})}
    decided = assign(tasks, workers)
    for task, holder in decided.items():
        assert holder in workers and task[0] in workers[holder]
    loads = [list(decided.values()).count(w) for w in workers]
    assert max(loads) - min(loads) <= 1, loads
    assert assign(decided, workers) == decided, "a balanced assignment must stay as it is"
    assert assign(dict(tasks), dict(reversed(list(workers.items())))) == decided, "not deterministic"
    assert set(assign({("x", "T", "b", 0): ""}, workers).values()) == {""}, "no worker has rule x"


def test_a_new_worker_takes_only_its_share():
    before = assign({t: "" for t in tasks_of("r", 12)}, {"w1": frozenset({"r"}), "w2": frozenset({"r"})})
    after = assign(before, {"w1": frozenset({"r"}), "w2": frozenset({"r"}), "w3": frozenset({"r"})})
    moved = [t for t in before if before[t] != after[t]]
    assert len(moved) == 4 and all(after[t] == "w3" for t in moved)


def test_holders_epochs_and_fenced_commits_through_apply():
    state = ControllerState()
    tasks = tasks_of("r", 4)
    heartbeat(state, "w1", ["r"], tasks, index=1)
    assert {record(state, t)["worker"] for t in tasks} == {"w1"}
    assert {record(state, t)["epoch"] for t in tasks} == {1}
    heartbeat(state, "w2", ["r"], [], index=2)
    moved = [t for t in tasks if record(state, t)["worker"] == "w2"]
    assert len(moved) == 2
    assert all(record(state, t)["epoch"] == 2 and record(state, t)["moved_index"] == 2 for t in moved)
    task = moved[0]
    digest = state.digest
    for worker, epoch in (("w1", 1), ("w1", 2), ("w2", 1)):
        stale = {"type": "replicator_commit", "worker_id": worker, "task": list(task), "epoch": epoch}
        result, _, _ = apply(state, command_from_json(dict(stale, acked_offset=5)), 3)
        assert not result["ok"] and result["code"] == FENCED, result
        assert isinstance(error_from_code(result["code"], result["message"]), FailedPrecondition)
        assert state.digest == digest, "a refused commit changed the state"
    commit = {"type": "replicator_commit", "worker_id": "w2", "task": list(task), "epoch": 2}
    assert (
        apply(state, command_from_json(dict(commit, start_offset=7, rule_digest="d1")), 4)[0]["checkpoint"][
            "start_offset"
        ]
        == 7
    )
    assert (
        apply(state, command_from_json(dict(commit, start_offset=9, rule_digest="d1")), 5)[0]["checkpoint"][
            "start_offset"
        ]
        == 7
    )
    assert apply(state, command_from_json(dict(commit, acked_offset=20, replicated=13)), 6)[0]["ok"]
    assert (
        apply(state, command_from_json(dict(commit, acked_offset=10, replicated=3)), 7)[0]["checkpoint"][
            "acked_offset"
        ]
        == 20
    )
    changed = apply(
        ControllerState.from_items(state.freeze().items()),
        command_from_json(dict(commit, start_offset=3, rule_digest="d2")),
        7,
    )
    assert (changed[0]["checkpoint"]["start_offset"], changed[0]["checkpoint"]["acked_offset"]) == (3, -1), (
        "a rule changed in place must not resume from its old definition's progress"
    )
    result, _, _ = apply(state, command_from_json({"type": "replicator_expire", "worker_ids": ["w2"]}), 8)
    assert result["expired"] == ["w2"]
    after = record(state, task)
    assert (after["worker"], after["epoch"], after["moved_index"]) == ("w1", 3, 8)
    assert lease_view(after)["replicated"] == 13, "copies counted under the old lease were lost"
    assert (after["start_offset"], after["acked_offset"]) == (7, 20), "the checkpoint did not survive"
    epochs = {t: record(state, t)["epoch"] for t in tasks}
    heartbeat(state, "w1", ["r"], [], incarnation="i2", index=9)
    assert all(record(state, t)["epoch"] == epochs[t] + 1 for t in tasks), "a restart must fence the old one"


@pytest.mark.parametrize(
    "command",
    [
        {"type": "replicator_heartbeat", "worker_id": "w", "incarnation": "i", "lease_ms": 3000}
        | {"dead_after_ms": 2500, "rules": ["r"], "tasks": []},
        {"type": "replicator_heartbeat", "worker_id": "w", "incarnation": "i", "lease_ms": 1000}
        | {"dead_after_ms": 2500, "rules": ["r"], "tasks": [["s", "T", "b", 0]]},
        {"type": "replicator_commit", "worker_id": "w", "task": ["r", "T", "b", 0], "epoch": 1},
        {"type": "replicator_expire", "worker_ids": []},
    ],
    ids=["lease-over-dead-after", "task-of-another-rule", "unknown-task", "nobody"],
)
def test_bad_commands_are_refused_and_change_nothing(command):
    state = ControllerState()
    heartbeat(state, "w0", ["r"], tasks_of("r", 1)[:0])
    digest = state.digest
    result, _, changes = apply(state, command_from_json(command), 2)
    assert not result["ok"] and result["message"] and not changes and state.digest == digest


def test_a_moved_task_is_granted_once_every_other_worker_let_it_go():
    state = ControllerState()
    tasks = tasks_of("r", 3)
    heartbeat(state, "w1", ["r"], tasks, index=1)
    heartbeat(state, "w2", ["r"], [], index=2)
    heartbeat(state, "w3", ["r"], [], index=3)
    workers = live_workers(state)
    moved = next(record(state, t) for t in tasks if record(state, t)["worker"] == "w3")
    task = tuple(moved[k] for k in ("rule", "topic", "broker_name", "queue_id"))
    let_go = WorkerBeat(0, 3, 2500)
    beats = {"w1": WorkerBeat(0, 2, 2500), "w2": let_go}
    assert not granted(moved, "w3", workers, beats.get), "granted before w1 heard of the move"
    beats["w1"] = WorkerBeat(0, 3, 2500, running={task: 1})
    assert not granted(moved, "w3", workers, beats.get), "granted while w1 runs it"
    beats["w1"] = WorkerBeat(0, 3, 2500)
    assert granted(moved, "w3", workers, beats.get)
    assert not granted(moved, "w3", workers, {"w1": let_go}.get), "granted while w2 was not heard"


def test_a_rebalanced_task_waits_for_its_former_holder():
    state = ControllerState()
    tasks = tasks_of("r", 2)
    heartbeat(state, "w1", ["r"], tasks, index=1)
    heartbeat(state, "w2", ["r"], [], index=2)
    (moved,) = [record(state, t) for t in tasks if record(state, t)["worker"] == "w2"]
    workers = live_workers(state)
    running = {tuple(moved[k] for k in ("rule", "topic", "broker_name", "queue_id")): 1}
    old_beat = WorkerBeat(0, 1, 2500, running=running)
    assert not granted(moved, "w2", workers, {"w1": old_beat}.get)
    assert granted(moved, "w2", workers, {"w1": WorkerBeat(0, 2, 2500, running={})}.get)
    document = status(state, {"w1": old_beat}.get)
    (rule,) = document["rules"]
    assert rule["name"] == "r" and len(rule["tasks"]) == 2
    assert document["workers"] == [
        {"worker_id": "w1", "running": sorted(running)},
        {"worker_id": "w2", "running": []},
    ]


def test_status_counts_what_the_checkpoints_say_was_replicated():
    state = ControllerState()
    (task,) = tasks_of("r", 1)
    heartbeat(state, "w1", ["r"], [task], index=1)
    commit = {"type": "replicator_commit", "worker_id": "w1", "task": list(task), "epoch": 1}
    assert apply(state, command_from_json(dict(commit, start_offset=100, rule_digest="d1")), 2)[0]["ok"]
    assert apply(state, command_from_json(dict(commit, acked_offset=1_100, replicated=1_000)), 3)[0]["ok"]
    # the task's thread restarted under the same lease: its count began again at zero
    assert apply(state, command_from_json(dict(commit, acked_offset=1_600, replicated=500)), 4)[0]["ok"]
    restarted = WorkerBeat(0, 4, 2500, running={task: 1}, stats={task: {"replicated": 500}})
    (rule,) = status(state, {"w1": restarted}.get)["rules"]
    assert rule["tasks"][0]["replicated"] == 1_500 and rule["replicated"] == 1_500, rule


class Simulation:
    """The leader (state + in-memory beats, as controller.operations does it) and workers that
    run exactly what their last heartbeat's answer granted."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.state = ControllerState()
        self.index = 0
        self.beats: dict[str, WorkerBeat] = {}
        self.running: dict[str, dict] = {}  # live worker -> task -> epoch
        self.rules: dict[str, list[str]] = {}
        self.incarnation: dict[str, int] = {}
        self.crashed: set[str] = set()
        self.tasks: list[tuple[str, str, str, int]] = []

    def propose(self, command: dict) -> None:
        self.index += 1
        result, _, _ = apply(self.state, command_from_json(command), self.index)
        assert result["ok"], result

    def heartbeat(self, worker: str, report_all: bool = False) -> None:
        self.beats[worker] = WorkerBeat(0, self.index, 2500, running=dict(self.running[worker]))
        mine = [t for t in self.tasks if t[0] in self.rules[worker]]
        reported = mine if report_all else self.random.sample(mine, k=self.random.randint(0, len(mine)))
        self.propose(
            {
                "type": "replicator_heartbeat",
                "worker_id": worker,
                "incarnation": str(self.incarnation[worker]),
                "lease_ms": 1500,
                "dead_after_ms": 2500,
                "rules": self.rules[worker],
                "tasks": [list(t) for t in reported],
            }
        )
        workers = live_workers(self.state)
        self.running[worker] = {
            (r["rule"], r["topic"], r["broker_name"], r["queue_id"]): r["epoch"]
            for _, r in self.state.with_prefix("repltask/")
            if granted(r, worker, workers, self.beats.get)
        }

    def step(self) -> None:
        choice = self.random.random()
        live = sorted(self.running)
        if choice < 0.1 and len(self.running) < 5:
            worker = f"w{self.random.randint(1, 7)}"
            if worker not in self.running and worker not in self.crashed:
                self.running[worker] = {}
                self.rules[worker] = sorted(self.random.sample(["r", "s"], k=self.random.randint(1, 2)))
                self.incarnation[worker] = self.incarnation.get(worker, 0) + 1
        elif choice < 0.15 and live:
            worker = self.random.choice(live)  # kill -9: it runs nothing from now on
            del self.running[worker]
            self.crashed.add(worker)
        elif choice < 0.2 and self.crashed:
            gone = sorted(self.crashed)  # silent past dead-after: the leader expires them
            self.propose({"type": "replicator_expire", "worker_ids": gone})
            self.crashed.clear()
        elif choice < 0.22 and live:
            worker = self.random.choice(live)  # killed and started again at once: a new incarnation
            self.running[worker] = {}
            self.incarnation[worker] += 1
        elif choice < 0.27:
            rule = self.random.choice(["r", "s"])
            self.tasks.append((rule, f"T{len(self.tasks)}", "broker-a", 0))
        elif live:
            self.heartbeat(self.random.choice(live))

    def check_exclusive(self, seed: int) -> None:
        seen: dict = {}
        for worker, tasks in self.running.items():
            for task in tasks:
                assert task not in seen, f"seed {seed}: {task} runs on {seen[task]} and {worker}"
                seen[task] = worker

    def settle_and_check_live(self, seed: int) -> None:
        if self.crashed:
            self.propose({"type": "replicator_expire", "worker_ids": sorted(self.crashed)})
            self.crashed.clear()
        for round_number in range(3):  # the first reports every task: no new one after it
            for worker in sorted(self.running):
                self.heartbeat(worker, report_all=round_number == 0)
                self.check_exclusive(seed)
        running = {t for tasks in self.running.values() for t in tasks}
        for _, task in self.state.with_prefix("repltask/"):
            key = (task["rule"], task["topic"], task["broker_name"], task["queue_id"])
            holders = [w for w in self.running if task["rule"] in self.rules[w]]
            assert (key in running) == bool(holders), f"seed {seed}: {key} not run though {holders} could"


@pytest.mark.parametrize("seed", SEEDS)
def test_simulation_exclusive_and_live(seed):
    sim = Simulation(seed)
    for _ in range(STEPS):
        sim.step()
        sim.check_exclusive(seed)
    sim.settle_and_check_live(seed)


def test_the_leader_expires_silent_workers_only_after_its_grace():
    """A new leader has heard nobody: for the longest dead-after it expires nobody; then a
    worker silent for its own dead-after is expired, one heard recently is not."""
    workers = {"w1": {"dead_after_ms": 1000}, "w2": {"dead_after_ms": 3000}}
    liveness = WorkerLiveness()
    assert liveness.silent(workers, 10_000) == [], "a follower expires nobody"
    liveness.on_leadership(True, 10_000)
    assert liveness.silent(workers, 12_999) == [], "expired within the grace"
    liveness.record("w2", WorkerBeat(12_500, 1, 3000))
    assert liveness.silent(workers, 13_000) == ["w1"]
    assert liveness.silent(workers, 15_500) == ["w1", "w2"]
    liveness.on_leadership(False, 15_600)
    liveness.on_leadership(True, 15_700)
    assert liveness.silent(workers, 16_000) == [], "a leader again starts a new grace"
