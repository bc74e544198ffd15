"""Every system's nodes placed alike on the CPUs, for one phase of bench.peers.

On this machine kind (a VM with two vCPUs) a woken process mostly starts only once the
one that woke it blocks, or once a halted vCPU comes back (docs/benchmarks.md,
2026-12-05): a send's processes then run largely one after another, and how much that
costs a system depends on how many processes and hand-offs its send takes. `placed`
pins each system the same way for the length of a phase: the node that leads (mqmeta's
master, the RabbitMQ node leading the quorum queue) on the first CPU, the other two on
the next ones in turn, the load generator on the fourth (with two CPUs: 0, 1, 0 and 1),
every thread of each process, and afterwards puts every CPU back for every thread of
the nodes and of this process, those started meanwhile included (a thread inherits its
creator's CPUs). Not how any system is deployed: a figure beside the kernel's own
placement, which stays the headline. With more than two CPUs each node gets one of its
own: another experiment.

`awake` changes the kernel's placement another way, without pinning any system: one
spinning process per CPU at SCHED_IDLE, the lowest policy, which runs only when nothing
else wants that CPU. No vCPU halts while it runs, and a CPU that runs only a spinner
counts as idle when the kernel places a woken process: in a variant of the pipe test of
docs/benchmarks.md the woken process then started on the other vCPU in all 300 rounds (on
its waker's in all 300 without), any real work taking the CPU from the spinner. Not how any
system is deployed either (it burns every idle cycle); RabbitMQ's nodes run without
Erlang's own scheduler busy-waiting here (servers.py), so neither system spins by itself.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

LAYOUT = (
    "the leading node (mqmeta's master, the node leading RabbitMQ's quorum queue) on CPU 0, "
    "the other two on CPUs 1 and 2, the load generator on CPU 3, each modulo the CPUs "
    "(two here: 0, 1, 0 and 1); every thread, for that phase only"
)


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def layout(cpus: Sequence[int], nodes: int = 3) -> tuple[list[set[int]], set[int]]:
    """(each node's CPUs, the load generator's): node i on cpus[i % n], the generator on
    cpus[nodes % n]."""
    if len(cpus) < 2:
        raise ValueError(f"placing nodes needs at least 2 CPUs, not {len(cpus)}")
    return [{cpus[i % len(cpus)]} for i in range(nodes)], {cpus[nodes % len(cpus)]}


def threads_of(pid: int) -> list[int]:
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


PIN_ROUNDS_MAX = 20  # listings of a process's threads until no new one appears


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus`, listed again until a listing finds no thread it
    has not pinned (one may start another meanwhile); a thread or process gone meanwhile
    is skipped."""
    done: set[int] = set()
    for _ in range(PIN_ROUNDS_MAX):
        try:
            tids = set(threads_of(pid)) - done
        except FileNotFoundError:  # the process ended
            return
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
        done |= tids


@contextlib.contextmanager
def placed(node_pids: Sequence[int]) -> Iterator[None]:
    """The nodes (leader first) and the calling thread (the load generator's threads start
    from it) pinned per `layout`; afterwards, also after an error, every thread of the
    nodes and of this process back on all the CPUs this thread could use before."""
    everywhere = set(usable_cpus())
    nodes, generator = layout(sorted(everywhere), len(node_pids))
    try:
        for pid, cpus in zip(node_pids, nodes, strict=True):
            pin(pid, cpus)
        os.sched_setaffinity(0, generator)
        yield
    finally:
        pin(os.getpid(), everywhere)  # this thread and any the phase started (a hung worker)
        for pid in node_pids:
            pin(pid, everywhere)


AWAKE = (
    "one process per CPU, pinned to it, SCHED_IDLE (it runs only when nothing else wants the CPU), "
    "spinning for that phase only: no vCPU halts"
)
AWAKE_S_MAX = 120.0  # a spinner ends on its own by then, whatever happens to this process
_SPIN = """
import os, sys, time
cpu, seconds = int(sys.argv[1]), float(sys.argv[2])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print("spinning", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    pass
"""


class SpinnerError(RuntimeError):
    """A spinner did not start spinning, or ended before the phase did: that phase did not
    run with every vCPU awake."""


RUNNING: set[int] = set()  # the spinners' pids until stopped (stop_spinners: a watchdog's cleanup)
SPIN_START_S = 10.0  # for every spinner to say it spins


@contextlib.contextmanager
def awake(max_s: float = AWAKE_S_MAX) -> Iterator[list[int]]:
    """One spinner per usable CPU (see AWAKE) for the length of the block, each ending on
    its own after `max_s`; yields their pids once every one is spinning at SCHED_IDLE.
    SpinnerError when one did not start within SPIN_START_S, or ended before the block
    did. Afterwards, also after an error, each is stopped by its pid."""
    spinners: list[subprocess.Popen[str]] = []
    try:
        for cpu in usable_cpus():
            spinner = subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(cpu), str(max_s)], stdout=subprocess.PIPE, text=True
            )
            spinners.append(spinner)
            RUNNING.add(spinner.pid)
        deadline = time.monotonic() + SPIN_START_S
        for spinner in spinners:
            _await_spinning(spinner, deadline)
        yield [spinner.pid for spinner in spinners]
        ended = [spinner.pid for spinner in spinners if spinner.poll() is not None]
        if ended:
            raise SpinnerError(f"spinners {ended} ended before the phase did (each spins at most {max_s} s)")
    finally:
        _stop(spinners)


def _await_spinning(spinner: subprocess.Popen[str], deadline: float) -> None:
    assert spinner.stdout is not None
    ready, _, _ = select.select([spinner.stdout], [], [], max(0.0, deadline - time.monotonic()))
    line = spinner.stdout.readline() if ready else None
    if line is not None and line.strip() == "spinning":
        return
    if line == "":  # its end of output: it exited (it could not pin or lower itself)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spinner.wait(2)
    raise SpinnerError(
        f"spinner {spinner.pid} did not start spinning within {SPIN_START_S:.0f} s "
        f"(exit code {spinner.poll()})"
    )


def _stop(spinners: list[subprocess.Popen[str]]) -> None:
    for spinner in spinners:
        spinner.kill()
    for spinner in spinners:
        try:
            spinner.wait(10)
        except subprocess.TimeoutExpired:  # killed, not yet gone: it ends without a CPU to spin on
            pass
        finally:
            RUNNING.discard(spinner.pid)
            if spinner.stdout is not None:
                spinner.stdout.close()


def stop_spinners() -> None:
    """Kills every spinner still running (a watchdog's exit skips awake's own cleanup)."""
    for pid in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    RUNNING.clear()
