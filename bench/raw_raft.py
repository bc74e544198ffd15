"""The raw pysyncobj baseline shared by the benches: one node process of a 3-node pysyncobj
cluster without gRPC or the controller's state machine, obeying its parent over a Pipe.

controller_bench runs it with pysyncobj's plain SyncObj (or the nextIndex fix) and the
confs in RAW_CONFS; metadata_scale's raw phase runs it with every controller Raft fix and
the controller's conf bound to the node's own address.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from bench.benchlib import _r, latency_summary

RAW_CONFS = {
    "controller_conf": "controller.raft_node._syncobj_conf(RaftSettings(secret=<the cluster "
    "secret>)) with the controller's pysyncobj patches installed "
    "(controller.raft_node.install_pysyncobj_patches: its journal, see 'journal', and "
    "durable snapshots)",
    "pysyncobj_defaults": "SyncObjConf() with no arguments: appendEntriesUseBatch=True, "
    "appendEntriesPeriod=0.1 s, memory journal, no password",
    # experiments (--raw-conf):
    "controller_conf_no_password": "controller_conf without the password (no encryption)",
    "controller_conf_no_fsync": "controller_conf with the controller journal's fsync off",
    "controller_conf_stock_journal": "controller_conf with pysyncobj's own FileJournal",
}

BASES = ("plain", "next_index", "fixes")


@dataclasses.dataclass(frozen=True)
class RawSpec:
    """How a raw node is built: the conf (a RAW_CONFS key), the Raft secret, the SyncObj
    base ("plain": pysyncobj's SyncObj, "next_index": with the nextIndex fix, "fixes":
    every controller Raft fix), whether the Raft port binds the node's own address only,
    and how long the node waits for its parent before it exits."""

    kind: str = "controller_conf"
    secret: str = ""
    base: str = "plain"
    bind_own_address: bool = False
    idle_s: float = 60.0


def raw_conf(kind: str, secret: str, data_dir: str, bind_address: str | None = None):
    from pysyncobj import SyncObjConf

    if kind == "pysyncobj_defaults":
        return SyncObjConf()
    if kind not in RAW_CONFS:
        raise ValueError(f"unknown raw conf {kind}; known: {sorted(RAW_CONFS)}")
    import mqmeta.controller.raft_node as raft_node
    from mqmeta.controller import pysyncobj_compat

    raft_node.install_pysyncobj_patches()
    conf = raft_node._syncobj_conf(
        raft_node.RaftSettings(secret=None if kind == "controller_conf_no_password" else secret),
        Path(data_dir),
        bind_address,
    )
    if kind == "controller_conf_no_fsync" and hasattr(raft_node, "_JOURNAL_FSYNC"):
        raft_node._JOURNAL_FSYNC[str(conf.journalFile)] = False
    if kind == "controller_conf_stock_journal":
        pysyncobj_compat.restore_stock_journal()
    return conf


def _syncobj_base(base: str) -> type:
    from mqmeta.controller import pysyncobj_compat
    from pysyncobj import SyncObj

    if base not in BASES:
        raise ValueError(f"unknown raw base {base}; known: {list(BASES)}")
    return {
        "plain": SyncObj,
        "next_index": pysyncobj_compat.NextIndexFix,
        "fixes": pysyncobj_compat.RaftFixes,
    }[base]


def _build_node(index: int, addresses: list[str], spec: RawSpec, data_dir: str):
    """A node whose replicated methods store nothing but a counter (`inc`) or the size of
    their argument (`put`)."""
    from pysyncobj import replicated

    Path(data_dir).mkdir(parents=True, exist_ok=True)
    bind = addresses[index] if spec.bind_own_address else None
    conf = raw_conf(spec.kind, spec.secret, data_dir, bind)
    base = _syncobj_base(spec.base)

    class RawNode(base):  # type: ignore[valid-type,misc]  # a base chosen at run time
        def __init__(self) -> None:
            others = [a for i, a in enumerate(addresses) if i != index]
            super().__init__(addresses[index], others, conf)
            self.value = 0
            self.bytes_applied = 0

        @replicated
        def inc(self) -> int:
            self.value += 1
            return self.value

        @replicated
        def put(self, payload: str) -> int:
            self.bytes_applied += len(payload)
            return self.bytes_applied

    return RawNode()


def _count_journal_ops(journal) -> collections.Counter:
    """Counts journal writes: with pysyncobj's resends a follower truncates and re-adds
    entries it already holds, and each re-add is a journal write (an fsync if durable)."""
    journal_ops: collections.Counter = collections.Counter()
    for method in ("add", "deleteEntriesFrom"):
        original = getattr(journal, method)

        def counted(*a, _original=original, _name=method):
            journal_ops[_name] += 1
            return _original(*a)

        setattr(journal, method, counted)
    return journal_ops


def raw_node(index: int, addresses: list[str], spec: RawSpec, data_dir: str, conn) -> None:
    """One node of the raw cluster; obeys commands from the parent over a Pipe:
    ("stop",), ("status",), ("is_leader",), ("seq", count, warmup, time_limit),
    ("async", duration, warmup, window), ("sequential", count, seconds),
    ("put", entry_bytes, window, seconds)."""
    from mqmeta.controller import pysyncobj_compat

    node = _build_node(index, addresses, spec, data_dir)
    journal = pysyncobj_compat.raft_journal(node)
    journal_ops = _count_journal_ops(journal)
    try:
        for _ in range(100_000):
            if not conn.poll(spec.idle_s):
                return  # the parent is gone
            msg = conn.recv()
            if msg[0] == "stop":
                conn.send(("ok", None))
                return
            conn.send(_answer(node, journal, journal_ops, msg))
    finally:
        node.destroy()


def _answer(node, journal, journal_ops: collections.Counter, msg: tuple) -> tuple[str, Any]:
    from mqmeta.controller import pysyncobj_compat

    op = msg[0]
    if op == "status":
        return (
            "ok",
            {
                "leader": pysyncobj_compat.leader_address(node),
                "is_leader": pysyncobj_compat.is_leader(node),
                "journal": type(journal).__module__ + "." + type(journal).__name__,
                "journal_ops": dict(journal_ops),
                "last_applied": node.raftLastApplied,
            },
        )
    if op == "is_leader":
        return ("ok", pysyncobj_compat.is_leader(node))
    if op == "seq":
        return ("ok", raw_seq(node, *msg[1:]))
    if op == "async":
        return ("ok", raw_async(node, *msg[1:]))
    if op == "sequential":
        return ("ok", raw_sequential(node, *msg[1:]))
    if op == "put":
        _, entry_bytes, window, seconds = msg
        return ("ok", raw_window(node, "x" * entry_bytes, window, seconds))
    return ("error", f"unknown op {op}")


def raw_seq(node, count: int, warmup: int, time_limit: float) -> dict[str, Any]:
    """`inc` one at a time, each waited for; the raw latencies after `warmup` calls."""
    from pysyncobj import SyncObjException

    lat: list[float] = []
    errors = 0
    limit = time.perf_counter() + time_limit
    for i in range(warmup + count):
        t0 = time.perf_counter()
        try:
            node.inc(sync=True, timeout=2.0)
        except SyncObjException:
            errors += 1
            continue
        if i >= warmup:
            lat.append(time.perf_counter() - t0)
        if t0 > limit:
            break
    return {"latencies": lat, "errors": errors}


def raw_async(node, duration: float, warmup: float, window: int) -> dict[str, Any]:
    """Keeps `window` async calls outstanding; counts completions in the window."""
    from pysyncobj import FAIL_REASON

    slots = threading.BoundedSemaphore(window)
    done: list[tuple[float, float]] = []
    errors: collections.Counter[int] = collections.Counter()

    def callback(result, error, t0):
        if error == FAIL_REASON.SUCCESS:
            done.append((time.perf_counter(), time.perf_counter() - t0))
        else:
            errors[int(error)] += 1
        slots.release()

    start = time.perf_counter()
    warm_until = start + warmup
    end = warm_until + duration
    issued = 0
    for _ in range(5_000_000):
        if time.perf_counter() >= end:
            break
        if not slots.acquire(timeout=1.0):
            continue
        t0 = time.perf_counter()
        node.inc(callback=lambda r, e, t0=t0: callback(r, e, t0))
        issued += 1
    counted = [lat for t, lat in list(done) if warm_until <= t <= end]
    out = {
        "window": window,
        "issued": issued,
        "writes_per_s": _r(len(counted) / duration, 1),
        "errors": dict(errors),
    }
    out.update({k: v for k, v in latency_summary(counted).items() if k != "count"})
    return out


def raw_sequential(node, count: int, seconds: float) -> dict[str, Any]:
    """One tiny entry at a time, each waited for: what a barrier costs this Raft library on
    this disk, without gRPC or the controller (the floor of a linearizable read)."""
    from pysyncobj import SyncObjException

    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        try:
            node.put("b", sync=True, timeout=2.0)
        except SyncObjException:
            errors += 1
            continue
        latencies.append(time.perf_counter() - t0)
    out = latency_summary(latencies)
    out["errors"] = errors
    return out


def raw_window(node, payload: str, window: int, seconds: float) -> dict[str, Any]:
    """Keeps `window` `put(payload)` calls outstanding for `seconds`; entries/s."""
    from pysyncobj import FAIL_REASON

    slots = threading.BoundedSemaphore(window)
    done: list[float] = []
    errors = [0]

    def callback(result, error) -> None:
        if error == FAIL_REASON.SUCCESS:
            done.append(time.monotonic())
        else:
            errors[0] += 1
        slots.release()

    start = time.monotonic()
    end = start + seconds
    for _ in range(10_000_000):
        if time.monotonic() >= end:
            break
        if slots.acquire(timeout=1.0):
            node.put(payload, callback=callback)
    counted = [t for t in done if t <= end]
    return {"entries_per_s": _r(len(counted) / seconds, 1), "errors": errors[0], "window": window}
