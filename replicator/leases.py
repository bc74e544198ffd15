"""A worker's side of task leases (`[replicator] controllers`): heartbeats, commits, fencing.

Every heartbeat_interval_ms the keeper first commits each running task's progress when it
moved (at most every commit_interval_ms: the source offset below which the target
acknowledged every copy, and its copies so far) under the task's lease epoch, then
heartbeats the controllers' leader with the tasks its discovery found and the ones it
runs, with their stats. The answer lists the leases granted to it; the worker starts
what it was granted and stops the rest.

A lease holds for lease_ms from the moment the answered heartbeat was *sent* (this
process's monotonic clock); the leader gives a worker's tasks away only after
dead_after_ms of silence from when it *received* a heartbeat (later), and lease_ms <
dead_after_ms leaves the difference as the margin for clock rates. Past its lease a task
stops sending until the keeper is answered again, and then it first commits: a commit
refused (FENCED_LEASE_EPOCH: another worker holds the task, e.g. after this process was
stopped with SIGSTOP past its lease) ends the task. The targets' origin tables keep the
copies exactly once whatever a stale worker sends; the fencing keeps it from working on.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from mqmeta.client import ControllerClient
from mqmeta.errors import FailedPrecondition, MqmetaError, NotFound
from mqmeta.formats.replication_rules import ReplicatorConfig
from mqmeta.pb import controller_pb2 as cpb

log = logging.getLogger(__name__)

RATE_SAMPLES_MAX = 10  # heartbeats over which messages/s is averaged (5 s at the default interval)
NO_OFFSET = -1


class Task(Protocol):
    """What the keeper reads of a running task (replicator.task.Task)."""

    key: Any  # replicator.task.TaskKey: rule, topic, broker_name, queue_id
    stats: Any  # replicator.task.TaskStats
    stop: threading.Event
    lease: TaskLease | None
    acked_offset: int

    @property
    def lease_id(self) -> tuple[Any, int]: ...


class Worker(Protocol):
    """What the keeper needs of its worker (replicator.worker.Worker)."""

    config: ReplicatorConfig
    discovered: set[Any]

    def running(self) -> list[Any]: ...

    def reconcile(self, leases: list, keeper: LeaseKeeper) -> None: ...


@dataclass
class TaskLease:
    """What a task needs of its lease: its epoch, the checkpoint when granted, and whether
    the worker's lease still holds."""

    epoch: int
    start_offset: int
    acked_offset: int
    rule_digest: str  # the rule definition the checkpoint was made under
    keeper: LeaseKeeper

    def valid(self) -> bool:
        return self.keeper.valid()

    def checkpoint_applies(self, rule_digest: str) -> bool:
        """A checkpoint made under another definition of the rule (changed in place: another
        target, another start) is not this rule's progress."""
        return self.rule_digest == rule_digest

    def record_start(self, task: Task, start_offset: int, rule_digest: str) -> int:
        """Records the task's start (first writer wins, per rule definition); the start to use."""
        checkpoint = self.keeper.commit(task, start_offset=start_offset, rule_digest=rule_digest)
        self.rule_digest = rule_digest
        self.acked_offset = int(checkpoint.acked_offset)  # dropped if made under another definition
        return int(checkpoint.start_offset)


class LeaseKeeper:
    def __init__(self, worker: Worker, controllers: tuple[str, ...], worker_id: str) -> None:
        self.worker = worker
        self.worker_id = worker_id
        self.incarnation = secrets.token_hex(8)
        self.settings = worker.config.settings
        self.client = ControllerClient(list(controllers), timeout_s=self._call_timeout_s())
        self._valid_until = 0.0  # monotonic
        self._lapsed = False  # the lease ran out since the last answer: re-check before going on
        self._commit_due = 0.0  # monotonic: progress is committed every commit_interval_ms
        self._committed: dict[tuple[Any, int], tuple[int, int]] = {}
        self._rates: dict[Any, deque[tuple[float, int]]] = {}

    def _call_timeout_s(self) -> float:
        return max(0.2, self.settings["lease_ms"] / 1000)

    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def run(self, stop: threading.Event) -> None:
        interval_s = self.settings["heartbeat_interval_ms"] / 1000
        while not stop.is_set():
            try:
                self.round()
            except MqmetaError as error:
                log.warning("worker %s: controllers: %s", self.worker_id, error.message)
            except Exception:  # the keeper must outlive whatever one round throws
                log.exception("worker %s: lease round failed", self.worker_id)
            stop.wait(interval_s)

    def round(self) -> None:
        if not self.valid() and self._valid_until:
            self._lapsed = True
        if self._lapsed or time.monotonic() >= self._commit_due:
            self._commit_due = time.monotonic() + self.settings["commit_interval_ms"] / 1000
            self._commit_running(force=self._lapsed)
        sent = time.monotonic()
        reply = self.client.replicator_heartbeat(self._heartbeat_request())
        self._valid_until = sent + self.settings["lease_ms"] / 1000
        self._lapsed = False
        self.worker.reconcile(list(reply.leases), self)

    def _heartbeat_request(self) -> cpb.ReplicatorHeartbeatRequest:
        return cpb.ReplicatorHeartbeatRequest(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            lease_ms=self.settings["lease_ms"],
            dead_after_ms=self.settings["dead_after_ms"],
            rules=[rule.name for rule in self.worker.config.rules],
            tasks=[task_key_pb(key) for key in sorted(self.worker.discovered, key=str)],
            running=[self._stats(task) for task in self.worker.running()],
        )

    def _stats(self, task: Task) -> cpb.ReplicatorTaskStats:
        stats = task.stats
        now_ms = int(time.time() * 1000)
        caught_up = stats.caught_up or not stats.last_store_ms
        samples = self._rates.setdefault(task.key, deque(maxlen=RATE_SAMPLES_MAX))
        samples.append((time.monotonic(), stats.replicated))
        first_s, first_count = samples[0]
        elapsed_s = samples[-1][0] - first_s
        rate = (stats.replicated - first_count) / elapsed_s if elapsed_s > 0 else 0.0
        return cpb.ReplicatorTaskStats(
            task=task_key_pb(task.key),
            epoch=task.lease.epoch if task.lease else 1,
            replicated=stats.replicated,
            replicated_bytes=stats.replicated_bytes,
            errors=stats.errors,
            lag_messages=stats.lag_messages,
            delay_ms=0 if caught_up else max(0, now_ms - stats.last_store_ms),
            last_sync_ms=stats.last_sync_ms,
            messages_per_s=max(0.0, rate),
        )

    def _commit_running(self, force: bool) -> None:
        for task in self.worker.running():
            if task.stop.is_set() or task.lease is None:
                continue
            progress = (task.acked_offset, task.stats.replicated)
            if not force and (
                task.acked_offset == NO_OFFSET or self._committed.get(task.lease_id) == progress
            ):
                continue
            try:
                self.commit(task, acked_offset=task.acked_offset, replicated=task.stats.replicated)
            except (FailedPrecondition, NotFound) as refused:
                log.warning("task %s: commit refused: %s; stopping it", task.key.label(), refused.message)
                task.stop.set()
                continue
            self._committed[task.lease_id] = progress

    def commit(
        self,
        task: Task,
        start_offset: int = NO_OFFSET,
        acked_offset: int = NO_OFFSET,
        replicated: int = 0,
        rule_digest: str = "",
    ) -> cpb.ReplicatorCheckpoint:
        assert task.lease is not None
        request = cpb.CommitReplicatorTaskRequest(
            worker_id=self.worker_id,
            task=task_key_pb(task.key),
            epoch=task.lease.epoch,
            start_offset=start_offset,
            acked_offset=acked_offset,
            replicated=replicated,
            rule_digest=rule_digest,
        )
        return self.client.commit_replicator_task(request)

    def leave(self) -> None:
        """A clean stop: the leader gives this worker's tasks to the others at once."""
        request = self._heartbeat_request()
        request.leaving = True
        del request.running[:]
        try:
            self.client.replicator_heartbeat(request)
        except MqmetaError as error:
            log.warning("worker %s: could not leave cleanly: %s", self.worker_id, error.message)

    def close(self) -> None:
        self.client.close()


def task_key_pb(key: Any) -> cpb.ReplicatorTaskKey:
    return cpb.ReplicatorTaskKey(
        rule=key.rule, topic=key.topic, broker_name=key.broker_name, queue_id=key.queue_id
    )
