"""One replication task's loop, in process (its sites replaced by stand-ins).

Property checked: a refusal of the sites that passes (NOT_MASTER: a target master without a
valid lease, or handing off) is an expected condition: the task counts it in its error
counter, logs one line without a traceback and goes on in the same thread; only
FENCED_LEASE_EPOCH (another worker holds the task) stops it. A task thread that died on
it was restarted with its counters at zero (the errors and the copies it had counted).
"""

from __future__ import annotations

import logging
import threading

import pytest
from mqmeta.replicator import task as task_module
from mqmeta.replicator.task import Task, TaskKey

from mqmeta.backoff import Backoff
from mqmeta.errors import FailedPrecondition, NotMaster
from mqmeta.formats.replication_rules import parse_config

pytestmark = pytest.mark.timeout(30)

CONFIG = """
[[rules]]
name = "a-to-b"
source_namesrv = "127.0.0.1:1"
target_namesrv = "127.0.0.1:2"
topic = "T"
"""
NOT_MASTER = "master 1 of broker-a has no valid lease from the controller; it refuses writes until it renews"


class _NoSite:
    def __init__(self, namesrv: object) -> None:
        pass

    def close(self) -> None:
        pass


def _task(monkeypatch: pytest.MonkeyPatch, refusals: list[Exception]) -> Task:
    """A task whose every attempt to find its position raises the next of `refusals`; once
    they are used up it stops."""
    monkeypatch.setattr(task_module, "Site", _NoSite)
    monkeypatch.setattr(
        task_module.backoff, "REPLICATOR_TASK", Backoff(first_pause_s=0.001, pause_max_s=0.002)
    )
    config = parse_config(CONFIG)
    task = Task(TaskKey("a-to-b", "T", "broker-a", 0), config.rules[0], config.settings, threading.Event())

    def position(source: object, target: object) -> None:
        if len(refusals) == 1:
            task.stop.set()
        raise refusals.pop(0)

    monkeypatch.setattr(task, "_position", position)
    return task


def test_not_master_is_retried_counted_and_logged_in_one_line(monkeypatch, caplog):
    task = _task(monkeypatch, [NotMaster(NOT_MASTER), NotMaster(NOT_MASTER), NotMaster(NOT_MASTER)])
    with caplog.at_level(logging.WARNING, logger=task_module.__name__):
        task.run()  # returns: the refusals did not end the task's thread
    assert task.stats.errors == 3 and "no valid lease" in task.stats.last_error
    lines = [r for r in caplog.records if r.name == task_module.__name__]
    assert len(lines) == 3 and all(r.exc_info is None for r in lines), "a traceback was logged"
    assert all("resuming" in r.getMessage() for r in lines)


def test_a_fenced_lease_stops_the_task_without_counting_an_error(monkeypatch):
    fenced = FailedPrecondition("worker w1 does not hold the task", code="FENCED_LEASE_EPOCH")
    refusals: list[Exception] = [fenced, NotMaster(NOT_MASTER)]
    task = _task(monkeypatch, refusals)
    task.run()
    assert task.stop.is_set() and task.stats.errors == 0 and len(refusals) == 1, "it went on"
