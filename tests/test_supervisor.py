"""The harness's suspend: SIGSTOP returns before the target has stopped (each thread
stops when it is next scheduled), so Supervisor.suspend waits until /proc shows every
thread stopped. Restarts (local up's supervision): a child that exits is started again
after a backoff that doubles while it keeps failing soon after its start, up to a bound;
one that exited 0 (asked to stop) or 2 (its input refused) is left down. Real child
processes; no cluster."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.ready import READY_TIMEOUT_S
from mqmeta.cluster.supervisor import (
    RESTART_BACKOFF_MAX_S,
    RESTART_BACKOFF_MIN_S,
    STOPPED_STATES,
    ChildExited,
    Supervisor,
    runs,
    thread_states,
)
from mqmeta.cluster.wait import wait_for

# Four threads spin and one writes a counter to a file every millisecond.
SPINNER = """
import os, sys, threading, time
count = 0
def spin():
    global count
    while True:
        count += 1
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
path = sys.argv[1]
while True:
    with open(path + ".tmp", "w") as f:
        f.write(str(count))
    os.replace(path + ".tmp", path)
    time.sleep(0.001)  # the child's write pace (its workload), not a wait of the test
"""


@pytest.fixture
def supervisor(tmp_path: Path):
    sup = Supervisor(tmp_path)
    yield sup
    for name in sup.children:
        sup.resume(name)
    sup.stop_all()


def _start_spinner(supervisor: Supervisor, tmp_path: Path) -> Path:
    counter = tmp_path / "count"
    supervisor.start("spinner", [sys.executable, "-c", SPINNER, str(counter)])
    pid = supervisor.children["spinner"].pid
    wait_for(
        lambda: counter.exists() and len(thread_states(pid)) >= 5, 10, "the spinner to start its threads"
    )
    return counter


def test_suspend_returns_only_when_every_thread_has_stopped(supervisor: Supervisor, tmp_path: Path) -> None:
    counter = _start_spinner(supervisor, tmp_path)
    pid = supervisor.children["spinner"].pid
    for _ in range(20):  # a bare SIGSTOP would leave a spinning thread running now and then
        supervisor.suspend("spinner")
        states = thread_states(pid)
        assert len(states) >= 5 and all(s in STOPPED_STATES for s in states.values()), states
        frozen = counter.read_text()
        time.sleep(0.02)  # the sleep is the property: no write may come during this interval
        assert counter.read_text() == frozen, "the process wrote after suspend returned"
        supervisor.resume("spinner")
        wait_for(
            lambda frozen=frozen: counter.read_text() != frozen, 5, "the process to run again after resume"
        )


def test_suspend_of_a_process_that_exited_returns(supervisor: Supervisor) -> None:
    proc = supervisor.start("brief", [sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    supervisor.suspend("brief")  # gone: nothing to wait for
    assert thread_states(proc.pid) == {}


def test_runs_is_false_for_a_zombie_and_for_a_process_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert runs(child.pid)
        child.stdin.close()  # type: ignore[union-attr]
        wait_for(lambda: not runs(child.pid), 10, "the child to end (a zombie until reaped)")
        assert child.poll() == 0  # it ended, was a zombie, and is reaped only now
        assert not runs(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_cluster_whose_controller_cannot_bind_fails_at_once_with_its_log(tmp_path: Path) -> None:
    """A child that exits while the harness waits for it ends the wait at once, with its exit
    code and its log, rather than after the readiness timeout (a CI run waited 30 s on a
    controller whose port a proxy had taken)."""
    cluster = Cluster(tmp_path / "c", count=1)
    node = cluster.layout.controllers[0]
    host, _, port = node.grpc.rpartition(":")
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((host, int(port)))  # beside the reservation, which never listens
    squatter.listen()
    started = time.monotonic()
    try:
        with pytest.raises(ChildExited) as raised:
            cluster.start()
    finally:
        squatter.close()
        cluster.stop()
    assert time.monotonic() - started < READY_TIMEOUT_S / 2
    message = str(raised.value)
    assert message.startswith(f"{node.id} exited with code ") and "the port is in use" in message, message


def test_an_exited_child_is_restarted_after_a_bounded_doubling_backoff(supervisor: Supervisor) -> None:
    exits = [sys.executable, "-c", "import sys; sys.exit(int(sys.argv[1]))"]
    for name, code in (("failing", "1"), ("stopped", "0"), ("refused", "2")):
        supervisor.start(name, [*exits, code]).wait(timeout=30)
    left_down = (supervisor.children["stopped"].pid, supervisor.children["refused"].pid)
    now = time.monotonic()  # the clock restart_exited is given (the children's start times are real)
    exited, restarted = supervisor.restart_exited(now)
    assert sorted(exited) == [("failing", 1), ("refused", 2), ("stopped", 0)] and restarted == {}
    backoffs = []
    backoff_s = RESTART_BACKOFF_MIN_S
    for _ in range(7):  # 0.5, 1, 2, 4, 8, 16, then the bound, 30 s
        old = supervisor.children["failing"].pid
        assert supervisor.restart_exited(now + backoff_s * 0.9) == ([], {}), "restarted before its backoff"
        now += backoff_s
        assert list(supervisor.restart_exited(now)[1]) == [old], "not restarted once its backoff was over"
        supervisor.children["failing"].wait(timeout=30)
        assert supervisor.restart_exited(now) == ([("failing", 1)], {})  # reported once
        backoffs.append(backoff_s)
        backoff_s = min(RESTART_BACKOFF_MAX_S, backoff_s * 2)
    assert backoffs[-1] == RESTART_BACKOFF_MAX_S
    assert (supervisor.children["stopped"].pid, supervisor.children["refused"].pid) == left_down
