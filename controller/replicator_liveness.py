"""The leader's side of replicator leases: worker heartbeats (in memory, chatter), which
leases a heartbeat's answer grants, expiry of silent workers, and the status view.

A heartbeat is kept in memory only; the leader proposes a Raft entry when it changes the
replicated state: a worker joined or restarted (new incarnation), reported new tasks, or
left. The liveness scan (controller.operations, every 0.1 s) proposes `replicator_expire` for
workers silent past their dead-after, by this leader's monotonic clock. A node that has
just become leader has heard nobody: for the longest dead-after of the live workers it
expires nobody (as controller.liveness does for brokers).

A task that moved (or is new) is granted to its holder only once every other live worker
has heartbeated after the move without running it: a former holder stops it when its next
heartbeat's answer leaves it out, so no task is run under two leases at once (a worker
that died keeps that waiting until it expires). A worker cut off from the controllers
stops its tasks when its lease (lease_ms from its last answered heartbeat) ends, before
dead_after_ms lets the leader give them away.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqmeta.controller import replicator_leases as leases
from mqmeta.controller.replicator_leases import TaskKey

from mqmeta.errors import error_from_code
from mqmeta.validate import validate_name

Json = dict[str, Any]
STATS_FIELDS = ("replicated", "replicated_bytes", "errors", "lag_messages", "delay_ms", "last_sync_ms")


@dataclass
class WorkerBeat:
    seen_ms: int  # the leader's monotonic clock
    seen_index: int  # the Raft index the leader had applied when it got this heartbeat
    dead_after_ms: int
    running: dict[TaskKey, int] = field(default_factory=dict)  # task -> lease epoch it runs under
    stats: dict[TaskKey, Json] = field(default_factory=dict)


class WorkerLiveness:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: dict[str, WorkerBeat] = {}
        self._leader_since_ms: int | None = None

    def on_leadership(self, is_leader: bool, now_ms: int) -> None:
        with self._lock:
            if not is_leader:
                self._leader_since_ms = None
                self._beats.clear()
            elif self._leader_since_ms is None:
                self._leader_since_ms = now_ms

    def record(self, worker_id: str, beat: WorkerBeat) -> None:
        with self._lock:
            self._beats[worker_id] = beat

    def forget(self, worker_id: str) -> None:
        with self._lock:
            self._beats.pop(worker_id, None)

    def beat(self, worker_id: str) -> WorkerBeat | None:
        with self._lock:
            return self._beats.get(worker_id)

    def silent(self, workers: dict[str, Json], now_ms: int) -> list[str]:
        """The live workers (by the state) this leader has not heard from within their
        dead-after; nobody while it is new (see the module's note)."""
        with self._lock:
            since = self._leader_since_ms
            if since is None or not workers:
                return []
            if now_ms - since < max(w["dead_after_ms"] for w in workers.values()):
                return []
            gone = []
            for worker_id, record in sorted(workers.items()):
                beat = self._beats.get(worker_id)
                seen_ms = beat.seen_ms if beat is not None else since
                if now_ms - seen_ms >= record["dead_after_ms"]:
                    gone.append(worker_id)
            return gone


def granted(record: Json, worker_id: str, workers: dict[str, Json], beat_of: Callable) -> bool:
    """Does `worker_id` get `record`'s lease now? Only once every other live worker has
    heartbeated since the task last moved (`moved_index`) without running it: the answer
    to that heartbeat left the task out, so that worker will not start it again, and any
    worker that ran it has stopped (however many times it moved meanwhile)."""
    if record["worker"] != worker_id:
        return False
    task = leases.task_of(record)
    for other in workers:
        if other == worker_id:
            continue
        beat = beat_of(other)
        if beat is None or beat.seen_index < record["moved_index"] or task in beat.running:
            return False
    return True


def lease_view(record: Json) -> Json:
    return {
        "task": leases.task_of(record),
        "worker_id": record["worker"],
        "epoch": record["epoch"],
        "start_offset": record["start_offset"],
        "acked_offset": record["acked_offset"],
        "rule_digest": record.get("rule_digest", ""),
        "replicated": record["replicated_base"] + record["replicated_epoch"],
    }


def needs_proposal(state: Any, request: Json) -> bool:
    """Whether a heartbeat changes the replicated state (else it is answered from memory)."""
    stored = state.get(leases.worker_key(request["worker_id"]))
    if stored is None or stored["incarnation"] != request["incarnation"]:
        return True
    if (stored["lease_ms"], stored["dead_after_ms"]) != (request["lease_ms"], request["dead_after_ms"]):
        return True
    if stored["rules"] != sorted(set(request["rules"])):
        return True
    return any(state.get(leases.task_key_text(tuple(t))) is None for t in request["tasks"])


def status(state: Any, beat_of: Callable, rule: str = "") -> Json:
    """Every task by rule, with its holder, epoch, checkpoint and the stats its holder last
    reported under that epoch; per rule the sums (replicated, lag, rate) and the worst
    (largest delay, oldest sync)."""
    rules: dict[str, list[Json]] = {}
    for _, record in state.with_prefix(leases.TASK_PREFIX):
        if rule and record["rule"] != rule:
            continue
        rules.setdefault(record["rule"], []).append(_task_status(record, beat_of))
    documents = []
    for name in sorted(rules):
        tasks = rules[name]
        documents.append(
            {
                "name": name,
                "tasks": tasks,
                "replicated": sum(t["replicated"] for t in tasks),
                "lag_messages": sum(t["lag_messages"] for t in tasks),
                "delay_ms": max(t["delay_ms"] for t in tasks),
                "last_sync_ms": min(t["last_sync_ms"] for t in tasks),
                "messages_per_s": round(sum(t["messages_per_s"] for t in tasks), 3),
            }
        )
    workers = []
    for worker_id in sorted(leases.live_workers(state)):
        beat = beat_of(worker_id)
        workers.append({"worker_id": worker_id, "running": sorted(beat.running) if beat else []})
    return {"rules": documents, "workers": workers}


def _task_status(record: Json, beat_of: Callable) -> Json:
    view = lease_view(record)
    rule, topic, broker_name, queue_id = view.pop("task")
    stats: Json = {}
    beat = beat_of(record["worker"]) if record["worker"] else None
    if beat is not None and beat.running.get(leases.task_of(record)) == record["epoch"]:
        stats = beat.stats.get(leases.task_of(record), {})
    return {
        "rule": rule,
        "topic": topic,
        "broker_name": broker_name,
        "queue_id": queue_id,
        **view,
        "running": bool(stats),
        "replicated": replicated(record, stats),
        "replicated_bytes": stats.get("replicated_bytes", 0),
        "errors": stats.get("errors", 0),
        "lag_messages": stats.get("lag_messages", 0),
        "delay_ms": stats.get("delay_ms", 0),
        "last_sync_ms": stats.get("last_sync_ms", 0),
        "messages_per_s": float(stats.get("messages_per_s", 0.0)),
    }


def replicated(record: Json, stats: Json) -> int:
    """What a task has replicated by its committed checkpoint: the source offsets from the
    start the first lessee recorded to the one below which the target acknowledged every
    copy (a message the rule's tags left out is counted with them). A count kept by the
    workers went back to zero in every task thread that restarted under the same lease
    (the commit keeps the larger of two counts), so it fell behind what the target held.
    Before a start is recorded (a task resumed from copies made without leases), the
    workers' counts."""
    start, acked = record["start_offset"], record["acked_offset"]
    if start != leases.NO_OFFSET and acked >= start:
        return int(acked - start)
    return int(
        max(
            record["replicated_base"] + record["replicated_epoch"],
            record["replicated_base"] + stats.get("replicated", 0),
        )
    )


def validate_heartbeat(request: Json) -> Json:
    """The request's fields checked as the state machine will (INVALID_ARGUMENT before any
    proposal), with the tasks as tuples."""
    leases.validate_worker_id(request["worker_id"])
    leases.validate_timings(request["lease_ms"], request["dead_after_ms"])
    if not 1 <= len(request["incarnation"]) <= leases.INCARNATION_CHARS_MAX:
        raise error_from_code(
            "INVALID_ARGUMENT", f"incarnation must be 1-{leases.INCARNATION_CHARS_MAX} characters"
        )
    if not 1 <= len(request["rules"]) <= leases.RULES_PER_WORKER_MAX:
        raise error_from_code("INVALID_ARGUMENT", f"a worker names 1 to {leases.RULES_PER_WORKER_MAX} rules")
    for count, what in ((len(request["tasks"]), "tasks"), (len(request["running"]), "running tasks")):
        if count > leases.TASKS_PER_HEARTBEAT_MAX:
            raise error_from_code(
                "INVALID_ARGUMENT", f"a heartbeat reports at most {leases.TASKS_PER_HEARTBEAT_MAX} {what}"
            )
    rules = set(request["rules"])
    for rule in rules:
        validate_name("rule name", rule)
    for task in [*request["tasks"], *(r["task"] for r in request["running"])]:
        leases.validate_task(list(task))
        if task[0] not in rules:
            raise error_from_code(
                "INVALID_ARGUMENT", f"task of rule {task[0]} is not of one of the worker's rules"
            )
    return request
