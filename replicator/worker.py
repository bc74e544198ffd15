"""The `mqmeta replicator` process: finds the tasks its rules name and runs each in a thread.

A task is (rule, source broker set, queue) for every source topic a rule matches;
discovery runs again every `discovery_interval_ms`, so new topics and queues are picked
up. This worker runs every task itself: leases that share tasks among several workers
through the controllers are not built yet, so run one worker per config file.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from mqmeta.config_file import accept_config_file
from mqmeta.errors import MqmetaError
from mqmeta.formats.replication_rules import ReplicatorConfig, Rule, load_config
from mqmeta.validate import parse_addresses, validate_name
from replicator.site import Site
from replicator.task import Task, TaskKey

log = logging.getLogger(__name__)

TASKS_MAX = 4096  # threads one worker runs
STOP_JOIN_S = 15.0  # how long a stopping worker waits for a task's in-flight sends


def add_replicator_parser(sub: Any) -> None:
    parser = sub.add_parser("replicator", help="run a cross-cluster replication worker")
    parser.add_argument("--config", type=Path, required=True, help="TOML file: [replicator] and [[rules]]")
    parser.add_argument("--worker-id", default="w1", help="this worker's name in logs")
    parser.add_argument(
        "--metrics-listen", default="", help="HOST:PORT for Prometheus text per task (port 0: any)"
    )
    # worker_id and metrics_listen may also be keys of the file's [replicator] table
    accept_config_file(parser, section="replicator")


class Worker:
    def __init__(self, config: ReplicatorConfig, worker_id: str) -> None:
        self.config = config
        self.worker_id = worker_id
        self.stop = threading.Event()
        self.tasks: dict[TaskKey, Task] = {}
        self._threads: list[threading.Thread] = []

    def discover(self) -> None:
        for rule in self.config.rules:
            try:
                for index, key in enumerate(_task_keys(rule)):
                    self._start(rule, key, index)
            except MqmetaError as error:
                log.warning("rule %s: cannot list its source queues yet: %s", rule.name, error.message)

    def _start(self, rule: Rule, key: TaskKey, source_index: int) -> None:
        if key in self.tasks or len(self.tasks) >= TASKS_MAX:
            return
        task = Task(key, rule, self.config.settings, self.stop, source_index)
        self.tasks[key] = task
        thread = threading.Thread(target=task.run, name=f"task-{key.label()}", daemon=True)
        self._threads.append(thread)
        thread.start()
        log.info("worker %s: started task %s", self.worker_id, key.label())

    def run(self) -> None:
        interval_s = self.config.settings["discovery_interval_ms"] / 1000
        while not self.stop.is_set():
            self.discover()
            self.stop.wait(interval_s)
        for thread in self._threads:
            thread.join(timeout=STOP_JOIN_S)


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


def run_replicator(args: argparse.Namespace) -> int:
    validate_name("--worker-id", args.worker_id)
    config = load_config(args.config)
    worker = Worker(config, args.worker_id)
    if args.metrics_listen:
        from replicator.metrics import serve_metrics

        address = parse_addresses(args.metrics_listen, "--metrics-listen address", allow_port_zero=True)[0]
        bound = serve_metrics(address, lambda: list(worker.tasks.values()))
        log.warning("worker %s: metrics on %s", args.worker_id, bound)  # tests and scripts read the port

    def _stop(signum: int, frame: object) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("worker %s: %d rules", args.worker_id, len(config.rules))
    worker.run()
    return 0
