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
"""

from __future__ import annotations

import contextlib
import os
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
