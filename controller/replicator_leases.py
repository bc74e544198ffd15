"""Replicator workers, task leases and task checkpoints in the controller's Raft state (P7).

A task is (rule, source topic, source broker set, queue). Workers heartbeat to the leader
(chatter, kept in memory by controller.replicator_liveness); the leader proposes what
changes the replicated state, with the times and the live set decided by it, so `apply`
stays pure:

- `replicator_heartbeat`: a worker joined (or restarted: a new incarnation), or reported
  tasks the state does not know yet; its tasks are created and every task reassigned.
- `replicator_expire`: the leader saw these workers silent past their dead-after (or they
  left); their tasks go to the others.
- `replicator_commit`: a lessee records a task's start position (first writer wins) and the
  source offset the target acknowledged, fenced by the lease epoch.

State keys: replworker/{worker_id}, repltask/{rule}/{topic}/{broker_name}/{queue_id}.
Every change of a task's holder bumps its epoch, so a commit from the former holder (or a
former incarnation of the same worker) is refused FENCED_LEASE_EPOCH.

`assign` is the pure balancing function: each task goes to exactly one live worker whose
config has the task's rule, keeping current holders where the balance allows (a move
interrupts a running task), so that loads differ by at most one where eligibility allows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from mqmeta.controller.commands import Applied, ReplicatorCommit, ReplicatorExpire, ReplicatorHeartbeat

from mqmeta.errors import error_from_code
from mqmeta.validate import QUEUE_ID_MAX, REQUEST_INT_MAX, validate_int, validate_name

Json = dict[str, Any]
TaskKey = tuple[str, str, str, int]  # rule, topic, broker set, queue id

WORKER_PREFIX = "replworker/"
TASK_PREFIX = "repltask/"
TASKS_PER_HEARTBEAT_MAX = 4096  # what one worker may report at once (its thread bound)
TASKS_TOTAL_MAX = 8192  # every worker's tasks together (assign runs on the Raft thread)
RULES_PER_WORKER_MAX = 256  # mqmeta.formats.replication_rules.RULES_MAX
WORKERS_PER_COMMAND_MAX = 1024
# Worker-declared timings (its [replicator] lease_ms / dead_after_ms) are held to these.
LEASE_MS_MIN, LEASE_MS_MAX = 100, 600_000
DEAD_AFTER_MS_MIN, DEAD_AFTER_MS_MAX = 200, 600_000
INCARNATION_CHARS_MAX = 64
RULE_DIGEST_CHARS_MAX = 64
NO_OFFSET = -1
FENCED = "FENCED_LEASE_EPOCH"


class StateView(Protocol):
    def get(self, key: str) -> Json | None: ...

    def with_prefix(self, prefix: str) -> Iterable[tuple[str, Json]]: ...


def task_key_text(task: TaskKey) -> str:
    rule, topic, broker_name, queue_id = task
    return f"{TASK_PREFIX}{rule}/{topic}/{broker_name}/{queue_id}"


def worker_key(worker_id: str) -> str:
    return f"{WORKER_PREFIX}{worker_id}"


def task_of(record: Json) -> TaskKey:
    return (record["rule"], record["topic"], record["broker_name"], record["queue_id"])


def validate_task(value: Any) -> TaskKey:
    """(rule, topic, broker set, queue id) from a command's list; InvalidArgument otherwise."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise error_from_code("INVALID_ARGUMENT", "a task is [rule, topic, broker_name, queue_id]")
    rule, topic, broker_name, queue_id = value
    return (
        validate_name("rule name", rule),
        validate_name("topic name", topic),
        validate_name("broker name", broker_name),
        validate_int("queue_id", queue_id, 0, QUEUE_ID_MAX),
    )


def validate_worker_id(value: Any) -> str:
    return validate_name("worker_id", value)


def validate_timings(lease_ms: Any, dead_after_ms: Any) -> tuple[int, int]:
    lease = validate_int("lease_ms", lease_ms, LEASE_MS_MIN, LEASE_MS_MAX)
    dead_after = validate_int("dead_after_ms", dead_after_ms, DEAD_AFTER_MS_MIN, DEAD_AFTER_MS_MAX)
    if lease >= dead_after:
        raise error_from_code(
            "INVALID_ARGUMENT",
            "lease_ms must be below dead_after_ms, so that a worker cut off from the "
            "controllers stops before its tasks are given to another",
        )
    return lease, dead_after


# The pure assignment ------------------------------------------------------------------------


def assign(tasks: Mapping[TaskKey, str], workers: Mapping[str, frozenset[str]]) -> dict[TaskKey, str]:
    """Each task's holder: a live worker (a key of `workers`) whose rules hold the task's
    rule, or "" when none does. Current holders (`tasks`' values) keep what they may while
    the loads stay balanced: no eligible worker holds two more tasks than another could
    take. Deterministic: the same inputs give the same answer on every node."""
    load = dict.fromkeys(workers, 0)
    held: dict[str, list[TaskKey]] = {w: [] for w in workers}
    result: dict[TaskKey, str] = {}
    for task in sorted(tasks):
        holder = tasks[task]
        keep = holder in workers and task[0] in workers[holder]
        result[task] = holder if keep else ""
        if keep:
            load[holder] += 1
            held[holder].append(task)
    for task in sorted(t for t, h in result.items() if not h):
        eligible = [w for w in workers if task[0] in workers[w]]
        if eligible:
            chosen = min(eligible, key=lambda w: (load[w], w))
            result[task] = chosen
            load[chosen] += 1
            held[chosen].append(task)
    for _ in range(len(tasks)):  # each move lowers the sum of squared loads: bounded
        if not _move_one(workers, load, held, result):
            break
    return result


def _move_one(
    workers: Mapping[str, frozenset[str]],
    load: dict[str, int],
    held: dict[str, list[TaskKey]],
    result: dict[TaskKey, str],
) -> bool:
    """Moves one task from the most loaded worker that can give one to an eligible worker
    holding at least two fewer; whether it moved one."""
    for donor in sorted(workers, key=lambda w: (-load[w], w)):
        for task in reversed(held[donor]):  # the last taken goes first
            takers = [w for w in workers if task[0] in workers[w] and load[w] <= load[donor] - 2]
            if not takers:
                continue
            taker = min(takers, key=lambda w: (load[w], w))
            held[donor].remove(task)
            held[taker].append(task)
            load[donor] -= 1
            load[taker] += 1
            result[task] = taker
            return True
    return False


def live_workers(state: StateView) -> dict[str, Json]:
    return {value["worker_id"]: value for _, value in state.with_prefix(WORKER_PREFIX)}


def _reassign(
    state: StateView, workers: dict[str, Json], new_tasks: dict[str, Json], index: int
) -> dict[str, Json | None]:
    """Task records (existing and new) whose holder changed, with the epoch bumped."""
    records = {key: value for key, value in state.with_prefix(TASK_PREFIX)}
    records.update(new_tasks)
    current = {task_of(r): r["worker"] for r in records.values()}
    eligible = {w: frozenset(v["rules"]) for w, v in workers.items()}
    decided = assign(current, eligible)
    changes: dict[str, Json | None] = dict(new_tasks)
    for task, holder in decided.items():
        key = task_key_text(task)
        record = records[key]
        if record["worker"] == holder:
            continue
        record = copy.deepcopy(record)
        record["moved_index"] = index
        _new_epoch(record, holder)
        changes[key] = record
    return changes


def _new_epoch(record: Json, holder: str) -> None:
    record["worker"] = holder
    record["epoch"] += 1
    record["replicated_base"] += record["replicated_epoch"]
    record["replicated_epoch"] = 0


def _new_task(task: TaskKey, index: int) -> Json:
    rule, topic, broker_name, queue_id = task
    return {
        "rule": rule,
        "topic": topic,
        "broker_name": broker_name,
        "queue_id": queue_id,
        "worker": "",
        "epoch": 0,
        "moved_index": index,  # every worker hears of it before it is granted
        "start_offset": NO_OFFSET,
        "acked_offset": NO_OFFSET,
        "rule_digest": "",
        "replicated_base": 0,
        "replicated_epoch": 0,
    }


# Command handlers (state, command, index) -> Applied(result, events, changes) ---------------


def heartbeat_handler(state: StateView, command: ReplicatorHeartbeat, index: int) -> Applied:
    worker_id = validate_worker_id(command.worker_id)
    incarnation = command.incarnation
    if not isinstance(incarnation, str) or not 1 <= len(incarnation) <= INCARNATION_CHARS_MAX:
        raise error_from_code("INVALID_ARGUMENT", f"incarnation must be 1-{INCARNATION_CHARS_MAX} characters")
    lease_ms, dead_after_ms = validate_timings(command.lease_ms, command.dead_after_ms)
    rules = command.rules
    if not isinstance(rules, list) or not 1 <= len(rules) <= RULES_PER_WORKER_MAX:
        raise error_from_code("INVALID_ARGUMENT", f"a worker names 1 to {RULES_PER_WORKER_MAX} rules")
    rules = sorted({validate_name("rule name", r) for r in rules})
    reported = command.tasks or []
    if not isinstance(reported, list) or len(reported) > TASKS_PER_HEARTBEAT_MAX:
        raise error_from_code(
            "INVALID_ARGUMENT", f"a heartbeat reports at most {TASKS_PER_HEARTBEAT_MAX} tasks"
        )
    new_tasks: dict[str, Json] = {}
    for raw in reported:
        task = validate_task(raw)
        if task[0] not in rules:
            raise error_from_code(
                "INVALID_ARGUMENT", f"task {task_key_text(task)} names a rule the worker has not"
            )
        key = task_key_text(task)
        if state.get(key) is None:
            new_tasks[key] = _new_task(task, index)
    known = sum(1 for _ in state.with_prefix(TASK_PREFIX))
    if known + len(new_tasks) > TASKS_TOTAL_MAX:
        raise error_from_code(
            "REPLICATOR_TASKS_FULL", f"the controllers hold at most {TASKS_TOTAL_MAX} replicator tasks"
        )
    workers = live_workers(state)
    previous = workers.get(worker_id)
    record = {
        "worker_id": worker_id,
        "incarnation": incarnation,
        "lease_ms": lease_ms,
        "dead_after_ms": dead_after_ms,
        "rules": rules,
    }
    workers[worker_id] = record
    changes = _reassign(state, workers, new_tasks, index)
    if previous is not None and previous["incarnation"] != incarnation:
        _fence_former_incarnation(state, worker_id, changes, index)
    if previous != record:
        changes[worker_key(worker_id)] = record
    return Applied({"ok": True, "moved": sum(1 for k in changes if k.startswith(TASK_PREFIX))}, [], changes)


def _fence_former_incarnation(state: StateView, worker_id: str, changes: dict[str, Json | None], index: int):
    """A restarted worker keeps its tasks under new epochs: the old process (if it is only
    stopped, not dead) can no longer commit."""
    for key, value in state.with_prefix(TASK_PREFIX):
        if key not in changes and value["worker"] == worker_id:
            record = copy.deepcopy(value)
            record["moved_index"] = index
            _new_epoch(record, worker_id)
            changes[key] = record


def expire_handler(state: StateView, command: ReplicatorExpire, index: int) -> Applied:
    gone = command.worker_ids
    if not isinstance(gone, list) or not 1 <= len(gone) <= WORKERS_PER_COMMAND_MAX:
        raise error_from_code("INVALID_ARGUMENT", f"name 1 to {WORKERS_PER_COMMAND_MAX} workers to expire")
    workers = live_workers(state)
    removed = sorted({validate_worker_id(w) for w in gone} & set(workers))
    if not removed:
        return Applied({"ok": True, "expired": []}, [], {})
    for worker_id in removed:
        del workers[worker_id]
    changes = _reassign(state, workers, {}, index)
    for worker_id in removed:
        changes[worker_key(worker_id)] = None
    return Applied({"ok": True, "expired": removed}, [], changes)


def commit_handler(state: StateView, command: ReplicatorCommit, index: int) -> Applied:
    worker_id = validate_worker_id(command.worker_id)
    task = validate_task(command.task)
    epoch = validate_int("epoch", command.epoch, 1, REQUEST_INT_MAX)
    start = validate_int("start_offset", command.start_offset, NO_OFFSET, REQUEST_INT_MAX)
    acked = validate_int("acked_offset", command.acked_offset, NO_OFFSET, REQUEST_INT_MAX)
    replicated = validate_int("replicated", command.replicated, 0, REQUEST_INT_MAX)
    digest = command.rule_digest
    if not isinstance(digest, str) or len(digest) > RULE_DIGEST_CHARS_MAX:
        raise error_from_code(
            "INVALID_ARGUMENT", f"rule_digest is at most {RULE_DIGEST_CHARS_MAX} characters"
        )
    key = task_key_text(task)
    stored = state.get(key)
    if stored is None:
        raise error_from_code(
            "NOT_FOUND", f"replicator task {key[len(TASK_PREFIX) :]} is not known; heartbeat it first"
        )
    if stored["worker"] != worker_id or stored["epoch"] != epoch:
        holder = stored["worker"] or "no worker"
        raise error_from_code(
            FENCED,
            f"worker {worker_id} at lease epoch {epoch} does not hold task {key[len(TASK_PREFIX) :]} "
            f"({holder} holds it at epoch {stored['epoch']}); stop the task",
        )
    record = copy.deepcopy(stored)
    if start != NO_OFFSET and record["start_offset"] != NO_OFFSET and record["rule_digest"] != digest:
        # the rule was changed (another target, another start): its old progress does not apply
        record["start_offset"], record["acked_offset"] = NO_OFFSET, NO_OFFSET
    if start != NO_OFFSET and record["start_offset"] == NO_OFFSET:
        record["start_offset"] = start  # the first lessee's choice stays: `latest` is durable
        record["rule_digest"] = digest
    if acked != NO_OFFSET:
        record["acked_offset"] = max(record["acked_offset"], acked)
    record["replicated_epoch"] = max(record["replicated_epoch"], replicated)
    changes: dict[str, Json | None] = {key: record} if record != stored else {}
    return Applied({"ok": True, "checkpoint": copy.deepcopy(record)}, [], changes)
