"""Child processes with their logs in DIR/logs, stopped all together."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT_S = 10.0
SUSPEND_TIMEOUT_S = 10.0  # a thread in uninterruptible sleep (fdatasync) stops when it returns
SUSPEND_POLL_S = 0.001
# A child that exits is started again after a backoff that doubles while it keeps exiting
# within RESTART_STABLE_S of its start (local up's supervision).
RESTART_BACKOFF_MIN_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
RESTART_STABLE_S = 60.0
EXIT_BAD_INPUT = 2  # the command's own refusal (mqmeta's exit status for bad input)
# Exits that a restart would not undo: 0, a child asked to stop (a signal: Ctrl-C reaches
# every child of a terminal's foreground group, maybe before the launcher heard it), and
# EXIT_BAD_INPUT, its flags or data dir refused.
NOT_RESTARTED = frozenset({0, EXIT_BAD_INPUT})
EXIT_LOG_LINES = 20  # of an exited child's log, in the error that reports it
STOPPED_STATES = frozenset("Tt")  # /proc's "stopped" and "tracing stop"
GONE_STATES = frozenset("ZX")


def runs(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie (ended, not yet reaped by
    its parent). A process that ends while /proc is read does not run either (reading a
    stat file opened just before the process went raises ProcessLookupError)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode() not in GONE_STATES
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def thread_states(pid: int) -> dict[int, str]:
    """Each thread's scheduler state (/proc/PID/task/TID/stat's third field); {} when
    the process is gone. The command name may hold spaces and parentheses: the state is
    the first field after the last ')'."""
    states: dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return states
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                states[int(tid)] = stat.read().rsplit(b")", 1)[1].split()[0].decode()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # a thread that ended meanwhile
    return states


def suspend(proc: subprocess.Popen, timeout_s: float = SUSPEND_TIMEOUT_S) -> None:
    """SIGSTOP, then wait until every thread of the process has stopped. kill(2) returns
    as soon as the signal is queued; each thread stops only when it is next scheduled,
    so on a loaded machine the process can run on for milliseconds, while SIGCONT to
    another process takes effect at once. A test that stops A and then resumes B must
    not let B meet a running A (a fetch answered after "stop": RocketMQ #6662's test)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        states = thread_states(proc.pid)
        if proc.poll() is not None or all(s in STOPPED_STATES or s in GONE_STATES for s in states.values()):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"process {proc.pid} did not stop within {timeout_s} s; thread states {states}"
            )
        time.sleep(SUSPEND_POLL_S)


@dataclass
class _Restarts:
    """A child's restart history: how many times it failed soon after a start, and when
    it may start again."""

    started_at: float
    failures: int = 0
    due_at: float | None = None  # set once its exit was seen


class ChildExited(RuntimeError):
    """A child that was meant to be running has exited (a wait for it to answer ends at once)."""


class Supervisor:
    """Starts child processes with their logs in DIR/logs and stops them all together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self._restarts: dict[str, _Restarts] = {}

    def start(
        self, name: str, command: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log_file = open(self.root / "logs" / f"{name}.log", "ab")
        env = dict(
            os.environ, MQMETA_LOG_LEVEL=os.environ.get("MQMETA_LOG_LEVEL", "INFO"), **(extra_env or {})
        )
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        )
        log_file.close()
        self.children[name] = proc
        self._commands[name] = (command, extra_env)
        history = self._restarts.get(name)
        self._restarts[name] = _Restarts(time.monotonic(), history.failures if history else 0)
        return proc

    def restart_exited(self, now: float | None = None) -> tuple[list[tuple[str, int]], dict[int, int]]:
        """Starts again every child that exited, each after a backoff: RESTART_BACKOFF_MIN_S,
        doubling with each exit that came within RESTART_STABLE_S of its start, up to
        RESTART_BACKOFF_MAX_S. A child that exited with a status of NOT_RESTARTED (asked to
        stop, or its flags or data dir refused) is left down. Returns the
        (name, exit status) of each exit seen for the first time, and each restarted
        child's new pid by its old one; call it periodically."""
        now = time.monotonic() if now is None else now
        seen: list[tuple[str, int]] = []
        restarted: dict[int, int] = {}
        for name, proc in list(self.children.items()):
            code = proc.poll()
            if code is None:
                continue
            history = self._restarts[name]
            if history.due_at is None:
                seen.append((name, code))
                if code in NOT_RESTARTED:
                    history.due_at = float("inf")
                    continue
                quick = now - history.started_at < RESTART_STABLE_S
                history.failures = history.failures + 1 if quick else 0
                backoff_s = min(
                    RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MIN_S * 2 ** max(0, history.failures - 1)
                )
                history.due_at = now + backoff_s
            if now >= history.due_at:
                command, extra_env = self._commands[name]
                restarted[proc.pid] = self.start(name, command, extra_env).pid
        return seen, restarted

    def suspend(self, name: str) -> None:
        """SIGSTOP the child and return once all its threads have stopped (see suspend)."""
        suspend(self.children[name])

    def resume(self, name: str) -> None:
        self.children[name].send_signal(signal.SIGCONT)

    def check_running(self, names: Iterable[str]) -> None:
        """Raises ChildExited for the first of `names` that has exited: its exit code and
        its log's last lines (why it could not start, e.g. a port in use)."""
        for name in names:
            code = self.children[name].poll()
            if code is not None:
                path = self.root / "logs" / f"{name}.log"
                lines = (
                    path.read_text(errors="replace").splitlines()[-EXIT_LOG_LINES:] if path.exists() else []
                )
                tail = "\n".join(lines) or "(its log is empty)"
                raise ChildExited(f"{name} exited with code {code}; the end of {path}:\n{tail}")

    def dead(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is not None]

    def stop_all(self, signum: int = signal.SIGTERM) -> None:
        """Sends `signum` to every running child (SIGTERM: each stops gracefully; SIGINT: at
        once) and waits, bounded, for them all; one still running then is killed."""
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signum)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
