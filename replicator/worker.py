"""The `mqmeta replicator` process: finds the tasks its rules name and runs each in a thread.

A task is (rule, source broker set, queue) for every source topic a rule matches;
discovery runs again every `discovery_interval_ms`, so new topics and queues are picked
up. Without `[replicator] controllers` this worker runs every task itself. With them, it
reports what it found to the controllers' leader and runs only the tasks leased to it
(replicator.leases), so several workers on one config share the tasks, each task run by
one of them, and a dead worker's tasks move to the others.
"""

from __future__ import annotations

import logging
import threading
import time

from mqmeta.replicator.leases import LeaseKeeper, TaskLease
from mqmeta.replicator.site import Site
from mqmeta.replicator.task import Task, TaskKey

from mqmeta.errors import MqmetaError
from mqmeta.formats.replication_rules import ReplicatorConfig, Rule
from mqmeta.rpc import SIGNAL_POLL_S

log = logging.getLogger(__name__)

TASKS_MAX = 4096  # threads one worker runs
STOP_JOIN_S = 15.0  # how long a stopping worker waits for a task's in-flight sends
STOP_NOW_JOIN_S = 0.5  # the same, stopped at once (SIGINT)


class Worker:
    def __init__(self, config: ReplicatorConfig, worker_id: str) -> None:
        self.config = config
        self.worker_id = worker_id
        self.stop = threading.Event()
        # False once stopped at once (SIGINT): no clean leave, the controllers may be
        # stopping too (Ctrl-C of `local up`); the others take the tasks after dead-after.
        self.graceful = True
        self.tasks: dict[TaskKey, Task] = {}  # started, until their thread ends
        self.discovered: set[TaskKey] = set()
        self._threads: dict[TaskKey, threading.Thread] = {}
        self._lock = threading.Lock()
        self.keeper = LeaseKeeper(self, config.controllers, worker_id) if config.controllers else None

    def discover(self) -> None:
        for rule in self.config.rules:
            try:
                for index, key in enumerate(_task_keys(rule)):
                    if self.keeper is not None:
                        if len(self.discovered) < TASKS_MAX:
                            self.discovered.add(key)  # run once leased
                    else:
                        self._start(rule, key, index, None)
            except MqmetaError as error:
                log.warning("rule %s: cannot list its source queues yet: %s", rule.name, error.message)

    def _start(self, rule: Rule, key: TaskKey, source_index: int | None, lease: TaskLease | None) -> None:
        with self._lock:
            if key in self.tasks or len(self.tasks) >= TASKS_MAX or self.stop.is_set():
                return
            task = Task(key, rule, self.config.settings, threading.Event(), source_index, lease)
            self.tasks[key] = task
            thread = threading.Thread(
                target=self._run_task, args=(task,), name=f"task-{key.label()}", daemon=True
            )
            self._threads[key] = thread
        thread.start()
        epoch = f" under lease epoch {lease.epoch}" if lease else ""
        log.info("worker %s: started task %s%s", self.worker_id, key.label(), epoch)

    def _run_task(self, task: Task) -> None:
        try:
            task.run()
        finally:
            with self._lock:
                if self.tasks.get(task.key) is task:
                    del self.tasks[task.key]
                    del self._threads[task.key]
            log.info("worker %s: task %s ended", self.worker_id, task.key.label())

    def running(self) -> list[Task]:
        """Every task whose thread has not ended (a stopping one still sends what it has)."""
        with self._lock:
            return list(self.tasks.values())

    def reconcile(self, leases: list, keeper: LeaseKeeper) -> None:
        """Runs exactly the tasks leased to this worker: stops the others (and any run under
        an older epoch), starts those granted and not running."""
        granted = {}
        for lease in leases:
            key = TaskKey(lease.task.rule, lease.task.topic, lease.task.broker_name, lease.task.queue_id)
            granted[key] = lease
        for task in self.running():
            lease = granted.get(task.key)
            if not task.stop.is_set() and (
                lease is None or task.lease is None or lease.epoch != task.lease.epoch
            ):
                log.warning(
                    "worker %s: task %s is no longer leased to it; stopping it",
                    self.worker_id,
                    task.key.label(),
                )
                task.stop.set()
        names = {rule.name for rule in self.config.rules}
        for key, lease in sorted(granted.items(), key=lambda item: str(item[0])):
            if key.rule not in names:
                continue
            task_lease = TaskLease(
                lease.epoch, lease.start_offset, lease.acked_offset, lease.rule_digest, keeper
            )
            self._start(self.config.rule(key.rule), key, None, task_lease)

    def run(self) -> None:
        interval_s = self.config.settings["discovery_interval_ms"] / 1000
        keeper_thread = None
        if self.keeper is not None:
            keeper_thread = threading.Thread(
                target=self.keeper.run, args=(self.stop,), name="leases", daemon=True
            )
            keeper_thread.start()
        while not self.stop.is_set():
            self.discover()
            self._pause(interval_s)
        for task in self.running():
            task.stop.set()
        with self._lock:
            threads = list(self._threads.values())
        # At once (SIGINT): a task blocked in a call (retried for up to its deadline while the
        # sites stop too) is not waited for; a worker killed at any instant resumes exactly
        # once from the target's head, so nothing is lost by leaving it.
        join_s = STOP_JOIN_S if self.graceful else STOP_NOW_JOIN_S
        deadline = time.monotonic() + join_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.keeper is not None:
            if keeper_thread is not None:
                keeper_thread.join(timeout=STOP_JOIN_S)
            if self.graceful:
                self.keeper.leave()
            self.keeper.close()

    def _pause(self, duration_s: float) -> None:
        """Waits `duration_s` or until stopped, in short slices: a signal delivered to another
        thread runs its handler only when the main thread wakes."""
        deadline = time.monotonic() + duration_s
        while not self.stop.is_set() and (left_s := deadline - time.monotonic()) > 0:
            self.stop.wait(min(SIGNAL_POLL_S, left_s))


def _task_keys(rule: Rule) -> list[TaskKey]:
    site = Site(rule.source_namesrv)
    try:
        topics = [rule.topic] if not rule.topic.startswith("re:") else site.topics()
        keys: list[TaskKey] = []
        for topic in topics:
            if rule.matches_topic(topic):
                keys.extend(TaskKey(rule.name, topic, b, q) for b, q in site.read_queues(topic))
        return keys
    finally:
        site.close()
