#!/usr/bin/env python
"""Benchmark of a real 3-node mqmeta controller cluster, with a raw pysyncobj baseline.

    .venv/bin/python -m bench.controller_bench [--quick]

Prints ONE JSON document on stdout; progress goes to stderr. Phases (--only picks some):

seq         one ControllerClient, N CreateTopic writes (unique names) through the leader,
            then a few through a follower (pysyncobj forwards them); plus the bare gRPC
            round trip (Health.Check) for reference;
concurrent  16 clients writing for a fixed time, as 16 threads of this process and as
            16 processes; the faster one is the headline ("mode_used"); with CPU per
            process, CPU ms per write, Raft entries/s and commands per entry;
ceiling     the same 16 threads calling Health.Check on the leader: what the gRPC
            server and client alone can do on this machine, without any Raft;
raw         pysyncobj baseline, 3 processes with a trivial @replicated counter: the
            controller's SyncObjConf (controller.raft_node._syncobj_conf:
            appendEntriesUseBatch=False, its timings, password and journal) and the
            pysyncobj defaults (appendEntriesUseBatch=True); sync calls one at a time
            and async calls with a window of outstanding calls, from the leader;
failover    K times: kill -9 the leader, time to the first committed write through the
            survivors (per-call timeout 0.25 s), restart the node from its data, wait
            until the cluster is healthy;
handover    the same with SIGTERM: the leader lets its writes in flight commit and hands
            leadership to a caught-up follower before it exits (Raft's TimeoutNow).

Targets are compared, never tuned for: seq p50 <= 3 ms; concurrent >= 5000 writes/s and
>= 30% of the raw pysyncobj rate; failover p99 <= 1.5 s; handover p99 below the
election timeout's minimum (without the hand-over no follower stands sooner). The machine is shared: the
JSON reports the CPU that other processes used during each measured window.

Every loop is bounded in count and time, everything listens on 127.0.0.1, and every
child process is stopped on exit (also on exceptions, SIGTERM and Ctrl-C); a watchdog
ends the run with the JSON gathered so far if it overruns its budget.

Experiments (off by default): --raft-setting KEY=INT (RaftSettings via the controller's
--config TOML), --no-secret, --raw-conf (extra raw confs, see RAW_CONFS), --raw-windows;
and, through a launcher in this file that runs `mqmeta` in-process (`_node ... --`):
--grpc-workers N (controller.server.GRPC_WORKERS_MAX), --switch-interval S,
--patch-next-index (the raw nodes get the controllers' pysyncobj nextIndex fix),
--profile-leader [--profile-tick] (per-thread CPU, on-CPU stack samples, Raft message
counts of the leader during the concurrent phase).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.benchlib import (
    CLK_TCK,
    CpuMeter,
    _r,
    _ratio,
    environment,
    latency_summary,
    machine_busy,
    machine_busy_percent,
    make_log,
    percentile,
    run_main,
    stop_clusters,
)
from bench.raw_raft import RAW_CONFS, RawSpec, raw_node

CLIENTS = 16
TARGETS = {
    "seq_p50_ms_max": 3.0,
    "concurrent_writes_per_s_min": 5000.0,
    "concurrent_vs_raw_min": 0.30,
    "failover_p99_s_max": 1.5,
}


log = make_log("bench")


# Node launcher for experiments (`controller_bench.py _node ... -- <mqmeta args>`) --------


def node_launcher(argv: list[str]) -> int:
    """Runs `mqmeta <args>` in this process after applying the experiment knobs."""
    split = argv.index("--")
    opts, mqmeta_args = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-workers", type=int, default=0)
    parser.add_argument("--profile-out", default="")
    parser.add_argument("--switch-interval", type=float, default=0.0)
    parser.add_argument("--profile-tick", action="store_true")
    parser.add_argument("--gc-log", default="")
    known = parser.parse_args(opts)
    if known.switch_interval:
        sys.setswitchinterval(known.switch_interval)
    if known.gc_log:
        GcPassLog(Path(known.gc_log)).start()
    import mqmeta.controller.server as server_module

    if known.grpc_workers:
        server_module.GRPC_WORKERS_MAX = known.grpc_workers
    if known.profile_out:
        sampler = StackSampler(Path(known.profile_out))
        sampler.start()
        tick = TickProfiler(Path(known.profile_out).with_suffix(".tick.txt")) if known.profile_tick else None

        messages = MessageCounter(Path(known.profile_out).with_suffix(".messages.json"))

        def toggle(*_: object) -> None:
            sampler.toggle()
            messages.toggle()
            if tick is not None:
                tick.toggle()

        signal.signal(signal.SIGUSR1, toggle)
    from mqmeta.cli import main

    return main(mqmeta_args)


class GcPassLog:
    """The garbage collector's passes in this process: how many of each generation, their
    time, and each pass of 10 ms or more (when it ended, as Unix time; generation;
    seconds), written to `out` every second (the node is killed, not asked to exit)."""

    LONG_S = 0.01

    def __init__(self, out: Path) -> None:
        self.out = out
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.long: list[list[float]] = []
        self._pass_started = 0.0

    def start(self) -> None:
        import gc

        gc.callbacks.insert(0, self._on_pass)  # first: its "start" is taken before the others run
        threading.Thread(target=self._write_every_second, name="gc-pass-log", daemon=True).start()

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._pass_started = now
            return
        generation, took_s = info["generation"], now - self._pass_started
        self.counts[generation] += 1
        self.seconds[generation] += took_s
        if took_s >= self.LONG_S:
            self.long.append([round(time.time(), 2), generation, round(took_s, 4)])

    def _write_every_second(self) -> None:
        while True:
            time.sleep(1.0)
            document = {"counts": self.counts, "seconds": self.seconds, "long": self.long}
            self.out.with_suffix(".tmp").write_text(json.dumps(document))
            self.out.with_suffix(".tmp").replace(self.out)


class MessageCounter:
    """Counts the Raft messages this node sends: how many, of which type, how many log
    entries they carry, and how many of those entries were sent before (resends)."""

    def __init__(self, out: Path) -> None:
        from mqmeta.controller import pysyncobj_compat

        self.out = out
        self.active = False
        self.by_type: collections.Counter = collections.Counter()
        self.entries = 0
        self.resent = 0
        self.bytes = 0
        self.sent_max: dict[Any, int] = {}
        self.started = 0.0
        counter = self

        def send(original, transport, node, message):
            if counter.active:
                counter.record(node, message)
            return original(transport, node, message)

        pysyncobj_compat.wrap_transport_send(send)

    def record(self, node, message) -> None:
        kind = message.get("type", "?")
        entries = message.get("entries") or []
        self.by_type[kind] += 1
        self.entries += len(entries)
        self.bytes += sum(len(e[0]) for e in entries)
        top = self.sent_max.get(node.id, 0)
        self.resent += sum(1 for e in entries if e[1] <= top)
        if entries:
            self.sent_max[node.id] = max(top, entries[-1][1])

    def toggle(self) -> None:
        if not self.active:
            self.by_type.clear()
            self.entries = self.resent = self.bytes = 0
            self.started = time.monotonic()
            self.active = True
            return
        self.active = False
        seconds = time.monotonic() - self.started
        self.out.write_text(
            json.dumps(
                {
                    "seconds": round(seconds, 2),
                    "messages_by_type": dict(self.by_type),
                    "entries_sent": self.entries,
                    "entries_resent": self.resent,
                    "entry_bytes_sent": self.bytes,
                },
                indent=1,
            )
        )


class TickProfiler:
    """cProfile of pysyncobj's tick thread (Raft I/O, apply, callbacks) in thread CPU time."""

    def __init__(self, out: Path) -> None:
        import cProfile

        from mqmeta.controller import pysyncobj_compat

        self.out = out
        self.active = False
        self.profile = cProfile.Profile(time.thread_time)
        self.ticks = 0
        profiler = self

        def on_tick(original, obj, time_to_wait):
            if not profiler.active:
                return original(obj, time_to_wait)
            profiler.ticks += 1
            profiler.profile.enable()
            try:
                return original(obj, time_to_wait)
            finally:
                profiler.profile.disable()

        pysyncobj_compat.wrap_tick(on_tick)

    def toggle(self) -> None:
        import cProfile
        import io
        import pstats

        if not self.active:
            self.profile = cProfile.Profile(time.thread_time)
            self.ticks = 0
            self.active = True
            return
        self.active = False
        time.sleep(0.1)
        text = io.StringIO()
        text.write(f"ticks profiled: {self.ticks}\n")
        stats = pstats.Stats(self.profile, stream=text)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(45)
        self.out.write_text(text.getvalue())


class StackSampler:
    """Poor man's py-spy for a node: SIGUSR1 starts a window, the next SIGUSR1 ends it and
    writes (a) CPU seconds per OS thread from /proc/self/task (gRPC's C threads included)
    and (b) on-CPU samples of Python stacks: a thread's stack is counted only when
    /proc says that thread is running (state R) at the sampling instant."""

    INTERVAL_S = 0.005
    SAMPLES_MAX = 100_000

    def __init__(self, out: Path) -> None:
        self.out = out
        self.active = threading.Event()
        self.leaf: collections.Counter = collections.Counter()
        self.inclusive: collections.Counter = collections.Counter()
        self.running: collections.Counter = collections.Counter()
        self.samples = 0
        self.started = 0.0
        self.cpu0: dict[int, tuple[str, float]] = {}

    def start(self) -> None:
        threading.Thread(target=self._run, name="stack-sampler", daemon=True).start()

    def toggle(self) -> None:
        if self.active.is_set():
            self.active.clear()
            self._dump()
        else:
            self.leaf.clear()
            self.inclusive.clear()
            self.running.clear()
            self.samples = 0
            self.cpu0 = self._task_cpu()
            self.started = time.monotonic()
            self.active.set()

    @staticmethod
    def _task_cpu() -> dict[int, tuple[str, float]]:
        out = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                text = (task / "stat").read_text()
            except OSError:
                continue
            comm = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
        return out

    @staticmethod
    def _task_state(tid: int) -> str:
        try:
            return Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "?"

    def _run(self) -> None:
        me = threading.get_ident()
        for _ in range(10**9):
            if not self.active.wait(1.0):
                continue
            if self.samples >= self.SAMPLES_MAX:
                time.sleep(0.1)
                continue
            threads = {t.ident: t for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                thread = threads.get(ident)
                if ident == me or thread is None or thread.native_id is None:
                    continue
                if self._task_state(thread.native_id) != "R":
                    continue
                name = thread.name.rstrip("0123456789_-")
                stack = []
                f: Any = frame
                depth = 0
                while f is not None and depth < 60:
                    stack.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}")
                    f, depth = f.f_back, depth + 1
                self.leaf[(name, stack[0])] += 1
                for entry in set(stack):
                    self.inclusive[(name, entry)] += 1
                self.running[name] += 1
            self.samples += 1
            time.sleep(self.INTERVAL_S)

    def _dump(self) -> None:
        seconds = time.monotonic() - self.started
        cpu1 = self._task_cpu()
        names = {t.native_id: t.name.rstrip("0123456789_-") for t in threading.enumerate()}
        per_thread: collections.Counter[str] = collections.Counter()  # CPU seconds per thread name
        for tid, (comm, cpu) in cpu1.items():
            delta = cpu - self.cpu0.get(tid, (comm, 0.0))[1]
            per_thread[names.get(tid, "C:" + comm)] += delta  # type: ignore[assignment]  # float counts
        doc = {
            "samples": self.samples,
            "seconds": round(seconds, 2),
            "cpu_percent_by_thread": {
                k: round(100 * v / seconds, 1) for k, v in per_thread.most_common() if v > 0
            },
            "on_cpu_samples_by_thread": dict(self.running.most_common()),
            "leaf": [[t, f, n] for (t, f), n in self.leaf.most_common(50)],
            "inclusive": [[t, f, n] for (t, f), n in self.inclusive.most_common(150)],
        }
        self.out.write_text(json.dumps(doc, indent=1))


# The controller cluster -----------------------------------------------------------------


class Cluster:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        from mqmeta.cluster.layout import ensure_secret, reserve_layout
        from mqmeta.cluster.supervisor import Supervisor

        self.root = root
        self.args = args
        self.layout, self.ports = reserve_layout(3, False)  # held until stop()
        ensure_secret(root)
        self.supervisor = Supervisor(root)
        self.by_id = {n.id: n for n in self.layout.controllers}
        self.config_file = self._write_config()

    def _write_config(self) -> Path | None:
        if not self.args.raft_setting:
            return None
        lines = ["[raft_settings]"]
        for key, value in raft_overrides(self.args.raft_setting).items():
            lines.append(f"{key} = {value}")
        path = self.root / "bench-config.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def command(self, node_id: str) -> list[str]:
        from mqmeta.cluster.layout import controller_command

        cmd = controller_command(self.root, self.layout, self.by_id[node_id])
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        if self.args.no_secret:  # experiment: pysyncobj without password (no Fernet)
            i = cmd.index("--secret-file")
            cmd[i : i + 2] = ["--insecure-raft"]
        wrap = []
        if self.args.grpc_workers:
            wrap += ["--grpc-workers", str(self.args.grpc_workers)]
        if self.args.switch_interval:
            wrap += ["--switch-interval", str(self.args.switch_interval)]
        if self.args.profile_leader:
            wrap += ["--profile-out", str(self.root / f"profile-{node_id}.json")]
        if self.args.profile_tick:
            wrap += ["--profile-tick"]
        if getattr(self.args, "gc_log", False):
            wrap += ["--gc-log", str(self.root / f"gc-{node_id}.json")]
        if wrap:
            assert cmd[1:3] == ["-m", "mqmeta.cli"], cmd
            cmd = [cmd[0], "-m", "bench.controller_bench", "_node", *wrap, "--", *cmd[3:]]
        return cmd

    def start(self) -> None:
        from mqmeta.cluster.ready import wait_ready

        for node in self.layout.controllers:
            self.supervisor.start(node.id, self.command(node.id))
        wait_ready(self.layout.controller_addresses, [], timeout_s=30.0)

    def restart(self, node_id: str) -> None:
        self.supervisor.start(node_id, self.command(node_id))

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.supervisor.children.items() if p.poll() is None}

    def grpc(self, node_id: str) -> str:
        return self.by_id[node_id].grpc

    def all_grpc(self) -> list[str]:
        return [n.grpc for n in self.layout.controllers]

    def metadata(self, node_id: str, timeout_s: float = 1.0):
        from mqmeta.client import ControllerClient
        from mqmeta.pb import controller_pb2 as pb

        with ControllerClient([self.grpc(node_id)], timeout_s=timeout_s) as client:
            return client.get_metadata(pb.GetMetadataRequest())

    def leader_id(self, timeout_s: float = 10.0) -> str:
        from mqmeta.errors import MqmetaError

        deadline = time.monotonic() + timeout_s
        for _ in range(1000):
            for node_id in self.by_id:
                if self.supervisor.children[node_id].poll() is not None:
                    continue
                try:
                    meta = self.metadata(node_id)
                except MqmetaError:
                    continue
                if meta.leader_id:
                    return meta.leader_id
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise RuntimeError(f"no controller leader within {timeout_s}s")

    def wait_healthy(self, timeout_s: float, caught_up: str = "") -> float:
        """Every node answers, agrees on one leader that sees all nodes healthy, and
        `caught_up` (if given) has applied what the leader had committed."""
        from mqmeta.errors import MqmetaError

        t0 = time.monotonic()
        deadline = t0 + timeout_s
        target_commit = None
        for _ in range(10_000):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster was not healthy within {timeout_s}s")
            try:
                metas = {n: self.metadata(n, timeout_s=0.2) for n in self.by_id}
            except MqmetaError:
                time.sleep(0.05)
                continue
            leaders = {m.leader_id for m in metas.values()}
            if len(leaders) == 1 and "" not in leaders:
                leader = metas[leaders.pop()]
                if all(n.healthy for n in leader.nodes):
                    if target_commit is None:
                        target_commit = leader.commit_index
                    if not caught_up or metas[caught_up].last_applied >= target_commit:
                        return time.monotonic() - t0
            time.sleep(0.05)
        raise RuntimeError("wait_healthy: iteration bound reached")

    def stop(self) -> None:
        try:
            self.supervisor.stop_all()
        finally:
            self.ports.release()


# Write helpers ---------------------------------------------------------------------------


def topic_request(prefix: str, i: int):
    from mqmeta.pb import controller_pb2 as pb

    return pb.TopicSpec(name=f"{prefix}-{i}", queue_count=4)


def config_request(i: int):
    from mqmeta.pb import controller_pb2 as pb

    return pb.UpdateConfigRequest(values={"default_queue_count": str(8 + i % 2)})


def sequential_writes(
    addresses: list[str], count: int, prefix: str, warmup: int, time_limit_s: float
) -> dict[str, Any]:
    from mqmeta.client import ControllerClient

    latencies: list[float] = []
    with ControllerClient(addresses, timeout_s=5.0) as client:
        for i in range(warmup):
            client.create_topic(topic_request(prefix + "w", i))
        t_start = time.perf_counter()
        limit = t_start + time_limit_s
        for i in range(count):
            t0 = time.perf_counter()
            client.create_topic(topic_request(prefix, i))
            latencies.append(time.perf_counter() - t0)
            if t0 > limit:
                break
        elapsed = time.perf_counter() - t_start
    out = latency_summary(latencies)
    out["writes_per_s"] = _r(len(latencies) / elapsed, 1)
    out["elapsed_s"] = _r(elapsed)
    return out


def sequential_health(address: str, count: int) -> dict[str, Any]:
    """One client, Health.Check on the leader: the gRPC round trip with no Raft."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    latencies = []
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        for i in range(count + 20):
            t0 = time.perf_counter()
            stub.Check(request, timeout=2.0)
            if i >= 20:
                latencies.append(time.perf_counter() - t0)
    out = latency_summary(latencies)
    out["what"] = "Health.Check round trips from one client to the leader (no Raft)"
    return out


BATCH_WRITES = 32


def _client_loop(
    addresses: list[str],
    prefix: str,
    start_at: float,
    warm_until: float,
    end_at: float,
    max_calls: int,
    op: str = "write",
) -> tuple[list[float], int, int]:
    """Writes until end_at; returns (latencies counted in the window, errors, total calls).

    start_at/warm_until/end_at are time.time() values so that processes share them."""
    import grpc

    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError

    latencies: list[float] = []
    errors = 0
    calls = 0
    with ControllerClient(addresses, timeout_s=5.0) as client:
        client.get_metadata(_metadata_request())  # connect before the clock starts
        if op == "health":  # the gRPC server's own ceiling: a trivial RPC, no Raft
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            health = health_pb2_grpc.HealthStub(client._channels[client._target])
            check = health_pb2.HealthCheckRequest(service="")

            def call(i: int) -> None:
                health.Check(check, timeout=5.0)
        elif op == "batch":  # WriteBatch: BATCH_WRITES independent writes per RPC
            from mqmeta.pb import controller_pb2 as pb

            def call(i: int) -> None:
                ops = [
                    pb.WriteOp(create_topic=topic_request(f"{prefix}b{i}-", k)) for k in range(BATCH_WRITES)
                ]
                results = client.write(pb.WriteBatch(writes=ops)).results
                failed = [r.error_code for r in results if r.error_code]
                if failed:
                    raise MqmetaError(f"{len(failed)} writes of a batch failed: {failed[:3]}")
        else:

            def call(i: int) -> None:
                client.create_topic(topic_request(prefix, i))

        while time.time() < start_at:
            time.sleep(min(0.01, max(0.0, start_at - time.time())))
        for i in range(max_calls):
            now = time.time()
            if now >= end_at:
                break
            t0 = time.perf_counter()
            try:
                call(i)
            except (MqmetaError, grpc.RpcError):
                errors += 1
                continue
            finally:
                calls += 1
            if now >= warm_until and time.time() <= end_at:
                # every write of a batch waited as long as its batch
                latencies.extend([time.perf_counter() - t0] * (BATCH_WRITES if op == "batch" else 1))
    return latencies, errors, calls


def _commit_index(address: str) -> int | None:
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError

    try:
        with ControllerClient([address], timeout_s=1.0) as client:
            return client.get_metadata(_metadata_request()).commit_index
    except MqmetaError:
        return None


def _metadata_request():
    from mqmeta.pb import controller_pb2 as pb

    return pb.GetMetadataRequest()


def _client_process(addresses, prefix, start_at, warm_until, end_at, max_calls, op, queue) -> None:
    try:
        queue.put(("ok", _client_loop(addresses, prefix, start_at, warm_until, end_at, max_calls, op)))
    except BaseException as exc:  # report, never hang the parent
        queue.put(("error", repr(exc)))


class _ThreadClients:
    """The clients as threads of this process."""

    lead_s = 1.0  # from the start call to the first write

    def __init__(self, addresses: list[str], tag: str, clients: int, op: str) -> None:
        self.addresses, self.tag, self.clients, self.op = addresses, tag, clients, op
        self.results: list[tuple[list[float], int, int]] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, start_at: float, warm_until: float, end_at: float, max_calls: int) -> None:
        def run(k: int) -> None:
            try:
                r = _client_loop(
                    self.addresses, f"{self.tag}-t{k}", start_at, warm_until, end_at, max_calls, self.op
                )
                with self._lock:
                    self.results.append(r)
            except BaseException as exc:
                with self._lock:
                    self.failures.append(repr(exc))

        self._threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(self.clients)]
        for t in self._threads:
            t.start()

    def pids(self) -> dict[str, int]:
        return {"bench": os.getpid()}

    def collect(self, deadline: float) -> None:
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self.failures.append("some client threads did not finish in time")


class _ProcessClients(_ThreadClients):
    """The clients as processes (spawned: each imports grpc first)."""

    lead_s = 6.0

    def start(self, start_at: float, warm_until: float, end_at: float, max_calls: int) -> None:
        ctx = mp.get_context("spawn")
        self._queue = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_client_process,
                daemon=True,
                args=(
                    self.addresses,
                    f"{self.tag}-p{k}",
                    start_at,
                    warm_until,
                    end_at,
                    max_calls,
                    self.op,
                    self._queue,
                ),
            )
            for k in range(self.clients)
        ]
        for p in self._procs:
            p.start()
        BENCH_CHILDREN.extend(self._procs)

    def pids(self) -> dict[str, int]:
        return {f"client{k}": p.pid for k, p in enumerate(self._procs) if p.pid is not None}

    def collect(self, deadline: float) -> None:
        import queue as queue_module

        for _ in self._procs:
            try:
                status, payload = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_module.Empty:
                self.failures.append("a client process did not report in time")
                break
            if status == "ok":
                self.results.append(payload)
            else:
                self.failures.append(payload)
        for p in self._procs:
            p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)


def concurrent_writes(
    cluster: Cluster,
    addresses: list[str],
    mode: str,
    clients: int,
    duration_s: float,
    warmup_s: float,
    tag: str,
    op: str = "write",
) -> dict[str, Any]:
    max_calls = 200_000
    group = (_ThreadClients if mode == "threads" else _ProcessClients)(addresses, tag, clients, op)
    start_at = time.time() + group.lead_s
    warm_until = start_at + warmup_s
    end_at = warm_until + duration_s
    group.start(start_at, warm_until, end_at, max_calls)
    # measure the server side over the counted window only
    while time.time() < warm_until:
        time.sleep(0.01)
    ours = cluster.pids()
    ours.update(group.pids())
    meter = CpuMeter(ours, switches=True)
    busy0 = machine_busy()
    leader = addresses[0]
    commit0 = _commit_index(leader)
    while time.time() < end_at:
        time.sleep(0.01)
    commit1 = _commit_index(leader)
    leader_node = next((n for n in cluster.by_id if cluster.grpc(n) == leader), "")
    leader_detail = meter.detail(leader_node) if leader_node in ours else {}
    cpu = meter.stop()
    busy = machine_busy_percent(busy0)
    clients_cpu = [v for k, v in cpu.items() if k.startswith("client") and v is not None]
    cpu = {k: v for k, v in cpu.items() if not k.startswith("client")}
    if clients_cpu:
        cpu["clients_total"] = round(sum(clients_cpu), 1)
    foreign = None
    if busy is not None:
        foreign = round(max(0.0, busy * (os.cpu_count() or 1) - sum(v or 0 for v in cpu.values())), 1)
    group.collect(time.monotonic() + 15.0)
    latencies = [x for r in group.results for x in r[0]]
    entries = None if commit0 is None or commit1 is None else commit1 - commit0
    out = {
        "mode": mode,
        "op": op,
        "clients": clients,
        "duration_s": duration_s,
        "writes_per_s": _r(len(latencies) / duration_s, 1),
        "raft_entries_per_s": None if entries is None else _r(entries / duration_s, 1),
        "commands_per_raft_entry": _r(len(latencies) / entries, 2) if entries else None,
        "errors": sum(r[1] for r in group.results),
        "calls_total": sum(r[2] for r in group.results),
        "cpu_percent": cpu,
        "machine_busy_percent": busy,
        "other_processes_cpu_percent": foreign,
        "leader": leader_node,
        "leader_process": leader_detail,
    }
    out.update(_write_costs(cluster, latencies, cpu, leader_node, duration_s))
    if group.failures:
        out["failures"] = group.failures[:5]
    return out


def _write_costs(
    cluster: Cluster, latencies: list[float], cpu: dict[str, Any], leader_node: str, duration_s: float
) -> dict[str, Any]:
    """The latency summary, and the CPU cost per write: much less sensitive to other load on
    the machine than writes/s."""
    out: dict[str, Any] = {k: v for k, v in latency_summary(latencies).items() if k != "count"}
    out["writes_counted"] = len(latencies)
    if latencies and cpu.get(leader_node) is not None:
        per = 10.0 * duration_s / len(latencies)  # cpu% -> CPU ms per write
        nodes = [cpu.get(n) or 0.0 for n in cluster.by_id]
        out["cpu_ms_per_write"] = {
            "leader": _r((cpu[leader_node] or 0.0) * per),
            "all_controllers": _r(sum(nodes) * per),
            "clients": _r((cpu.get("bench") or cpu.get("clients_total") or 0.0) * per),
        }
    return out


# Raw pysyncobj baseline --------------------------------------------------------------


class RawCluster:
    def __init__(self, root: Path, kind: str, secret: str, patch_next_index: bool = False) -> None:
        from mqmeta.cluster.ports import PortReservation

        self.kind = kind
        self.ports = PortReservation.pick(3)  # held until stop(): the nodes bind them with SO_REUSEADDR
        self.addresses = self.ports.addresses
        spec = RawSpec(kind=kind, secret=secret, base="next_index" if patch_next_index else "plain")
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for i in range(3):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=raw_node,
                daemon=True,
                name=f"raw-{kind}-{i}",
                args=(i, self.addresses, spec, str(root / f"raw-{kind}-{i}"), child),
            )
            p.start()
            BENCH_CHILDREN.append(p)
            self.procs.append(p)
            self.conns.append(parent)

    def ask(self, i: int, msg: tuple, timeout_s: float) -> Any:
        self.conns[i].send(msg)
        if not self.conns[i].poll(timeout_s):
            raise RuntimeError(f"raw node {i} did not answer {msg[0]} within {timeout_s}s")
        status, payload = self.conns[i].recv()
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def journal(self, i: int) -> str:
        return self.ask(i, ("status",), 30.0)["journal"]

    def wait_leader(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        for _ in range(10_000):
            if time.monotonic() > deadline:
                break
            statuses = [self.ask(i, ("status",), 30.0) for i in range(3)]
            leaders = {s["leader"] for s in statuses}
            if len(leaders) == 1 and "" not in leaders:
                for i, s in enumerate(statuses):
                    if s["is_leader"]:
                        return i
            time.sleep(0.05)
        raise RuntimeError(f"raw cluster {self.kind}: no leader within {timeout_s}s")

    def pids(self) -> dict[str, int]:
        return {f"raw{i}": p.pid for i, p in enumerate(self.procs) if p.pid is not None}

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p.is_alive():
                try:
                    self.ask(i, ("stop",), 3.0)
                except (RuntimeError, OSError, EOFError):
                    pass
        for p in self.procs:
            p.join(timeout=3.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        self.ports.release()


# Outstanding async calls: with appendEntriesUseBatch=True an entry waits for the next
# appendEntriesPeriod (0.1 s by default), so only a big window shows that conf's rate.
RAW_WINDOWS = {
    "controller_conf": [16, 64, 256],
    "controller_conf_no_password": [16, 64, 256],
    "pysyncobj_defaults": [2000, 20000],
}
RAW_WINDOWS_QUICK = {
    "controller_conf": [64],
    "controller_conf_no_password": [64],
    "pysyncobj_defaults": [20000],
}


def raw_baseline(root: Path, kind: str, secret: str, args: argparse.Namespace) -> dict[str, Any]:
    raw = RawCluster(root, kind, secret, args.patch_next_index)
    try:
        leader = raw.wait_leader(30.0)
        seq = raw.ask(leader, ("seq", args.seq_count, 10, args.raw_seq_time_limit), 120.0)
        out: dict[str, Any] = {
            "conf": kind,
            "what": RAW_CONFS.get(kind, ""),
            "leader": leader,
            "journal": raw.journal(leader),
        }
        out["sequential"] = latency_summary(seq["latencies"])
        out["sequential"]["errors"] = seq["errors"]
        best = None
        for window in args.raw_windows or (RAW_WINDOWS_QUICK if args.quick else RAW_WINDOWS)[kind]:
            meter = CpuMeter(raw.pids(), switches=True)
            res = raw.ask(
                leader,
                ("async", args.raw_duration, args.warmup, window),
                args.raw_duration + args.warmup + 60.0,
            )
            res["cpu_percent"] = meter.stop()
            if res["writes_per_s"]:
                res["cpu_ms_per_write"] = {
                    "leader": _r(10.0 * res["cpu_percent"][f"raw{leader}"] / res["writes_per_s"]),
                    "all_nodes": _r(
                        10.0 * sum(v or 0 for v in res["cpu_percent"].values()) / res["writes_per_s"]
                    ),
                }
            out.setdefault("async_by_window", []).append(res)
            if best is None or (res["writes_per_s"] or 0) > (best["writes_per_s"] or 0):
                best = res
        out["async_best"] = best
        statuses = [raw.ask(i, ("status",), 10.0) for i in range(3)]
        out["journal_writes"] = {
            f"raw{i}{' (leader)' if i == leader else ''}": {
                "entries_applied": st["last_applied"],
                "journal_adds": st["journal_ops"].get("add", 0),
                "journal_truncations": st["journal_ops"].get("deleteEntriesFrom", 0),
            }
            for i, st in enumerate(statuses)
        }
        return out
    finally:
        raw.stop()


# Failover ---------------------------------------------------------------------------------


def failover_round(
    cluster: Cluster, round_no: int, per_call_timeout_s: float, stop_signal: int = signal.SIGKILL
) -> dict[str, Any]:
    """SIGKILL: the time from the kill to the first write committed through the survivors.
    SIGTERM (a hand-over): writes go on one after another from before the signal until
    ten have committed after a survivor names the new leader; the sample is the longest
    gap between two commits that spans the signal or follows it (the pause writers see)."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError

    leader = cluster.leader_id()
    survivors = [n for n in cluster.by_id if n != leader]
    client = ControllerClient([cluster.grpc(n) for n in survivors], timeout_s=per_call_timeout_s)
    attempts = errors = 0
    error_codes: collections.Counter = collections.Counter()
    last_error = ""
    commits: list[float] = []
    writes_before = 0 if stop_signal == signal.SIGKILL else 5
    try:
        import grpc

        for n in survivors:  # connect the client's channels before the clock starts
            client._stub(cluster.grpc(n))
            grpc.channel_ready_future(client._channels[cluster.grpc(n)]).result(timeout=5.0)
        proc = cluster.supervisor.children[leader]
        elected: dict[str, Any] = {}
        stop_watch = threading.Event()
        watcher: threading.Thread | None = None
        t0 = time.monotonic()
        for i in range(10_000):
            if i == writes_before:
                t0 = time.monotonic()
                proc.send_signal(stop_signal)
                watcher = threading.Thread(
                    target=_watch_election,
                    daemon=True,
                    args=(cluster, survivors, leader, t0, elected, stop_watch),
                )
                watcher.start()
            if time.monotonic() - t0 > 20.0:
                break
            attempts += 1
            try:
                client.update_config(config_request(round_no + i))
                commits.append(time.monotonic())
            except MqmetaError as exc:
                errors += 1
                last_error = exc.message[:160]
                error_codes[exc.code] += 1
            if i >= writes_before and _round_done(commits, t0, stop_signal, elected):
                break
        if watcher is None:  # the writes before the signal did not finish in time
            raise RuntimeError(f"{leader}: no writes committed before the signal in 20 s")
        proc.wait(timeout=5.0)
        watcher.join(timeout=max(0.1, 12.0 - (time.monotonic() - t0)))
        stop_watch.set()
    finally:
        client.close()
    if stop_signal == signal.SIGKILL:
        after = [c for c in commits if c > t0]
        sample = after[0] - t0 if after else None
    else:
        gaps = [b - a for a, b in zip(commits, commits[1:], strict=False) if b > t0]
        sample = max(gaps) if gaps and elected else None
    new_leader = cluster.leader_id()
    cluster.restart(leader)
    healthy_s = cluster.wait_healthy(30.0, caught_up=leader)
    out = {
        "round": round_no,
        "killed": leader,
        "new_leader": new_leader,
        "failover_s": _r(sample, 4),
        "new_leader_known_s": _r(elected.get("at"), 4),
        "attempts": attempts,
        "failed_attempts": errors,
        "failed_attempt_codes": dict(error_codes),
        "restart_to_healthy_s": _r(healthy_s, 2),
    }
    if sample is None:
        out["last_error"] = last_error
    return out


def _round_done(commits: list[float], t0: float, stop_signal: int, elected: dict[str, Any]) -> bool:
    """A kill's round ends at the first commit after it; a hand-over's once ten writes
    have committed after a survivor named the new leader."""
    if stop_signal == signal.SIGKILL:
        return bool(commits) and commits[-1] > t0
    known = elected.get("at")
    return known is not None and sum(1 for c in commits if c - t0 > known) >= 10


def _watch_election(
    cluster: Cluster,
    survivors: list[str],
    killed: str,
    t0: float,
    elected: dict[str, Any],
    stop: threading.Event,
) -> None:
    """Records when a survivor first names a new leader (polls every 20 ms, <= 10 s)."""
    from mqmeta.errors import MqmetaError

    for _ in range(500):
        if stop.is_set() or time.monotonic() - t0 > 10.0:
            return
        for node in survivors:
            try:
                meta = cluster.metadata(node, timeout_s=0.2)
            except MqmetaError:
                continue
            if meta.leader_id and meta.leader_id != killed:
                elected["at"] = time.monotonic() - t0
                elected["leader"] = meta.leader_id
                return
        time.sleep(0.02)


# Orchestration ------------------------------------------------------------------------------

BENCH_CHILDREN: list[Any] = []


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--only",
        default="",
        help="comma list of phases: seq,concurrent,batched,ceiling,raw,failover,handover",
    )
    p.add_argument("--modes", default="threads,processes", help="concurrent client modes")
    p.add_argument(
        "--raft-setting",
        action="append",
        default=[],
        help="KEY=INT RaftSettings override passed via the controller's --config",
    )
    p.add_argument(
        "--no-secret", action="store_true", help="experiment: start the controllers without --secret-file"
    )
    p.add_argument("--grpc-workers", type=int, default=0, help="override GRPC_WORKERS_MAX")
    p.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="sys.setswitchinterval() in the controller processes (seconds)",
    )
    p.add_argument(
        "--profile-leader",
        action="store_true",
        help="sample the leader's thread stacks during the concurrent phase",
    )
    p.add_argument(
        "--profile-tick",
        action="store_true",
        help="with --profile-leader: also cProfile pysyncobj's tick thread (slows it down a lot)",
    )
    p.add_argument(
        "--patch-next-index",
        action="store_true",
        help="experiment: the raw nodes run with the controllers' fix of pysyncobj's nextIndex "
        "regression (controller.pysyncobj_compat.NextIndexFix; the controllers always do)",
    )
    p.add_argument("--raw-conf", default="", help="comma list of raw baseline confs")
    p.add_argument("--clients", type=int, default=CLIENTS)
    p.add_argument("--duration", type=float, default=0.0, help="concurrent phase seconds")
    p.add_argument("--raw-windows", default="", help="comma list of async windows (all confs)")
    args = p.parse_args(argv)
    q = args.quick
    args.seq_count = 300 if q else 1500
    args.seq_time_limit = 8.0 if q else 20.0
    args.raw_seq_time_limit = 2.0 if q else 3.0  # pysyncobj defaults: ~100 ms per call
    args.duration = args.duration or (2.0 if q else 5.0)
    args.warmup = 0.3 if q else 0.5
    args.raw_duration = 2.0 if q else 4.0
    args.raw_windows = [int(w) for w in args.raw_windows.split(",")] if args.raw_windows else []
    args.failover_rounds = 3 if q else 10
    args.failover_call_timeout_s = 0.25
    args.budget_s = 58.0 if q else 178.0
    args.raw_confs = args.raw_conf.split(",") if args.raw_conf else ["controller_conf", "pysyncobj_defaults"]
    phases = {"seq", "concurrent", "batched", "ceiling", "raw", "failover", "handover"}
    args.phases = set(args.only.split(",")) if args.only else phases
    return args


@dataclasses.dataclass
class _Run:
    """What every phase of one run shares."""

    args: argparse.Namespace
    root: Path
    result: dict[str, Any]
    cluster: Cluster
    tag: str  # a prefix of this run's topic names
    t_begin: float
    order: list[str] = dataclasses.field(default_factory=list)  # gRPC addresses, leader first

    def leader_first(self) -> tuple[str, list[str]]:
        leader = self.cluster.leader_id()
        self.order = [self.cluster.grpc(leader)] + [
            self.cluster.grpc(n) for n in self.cluster.by_id if n != leader
        ]
        return leader, self.order


def _phase_seq(ctx: _Run) -> None:
    args, result, tag = ctx.args, ctx.result, ctx.tag
    leader, order = ctx.leader_first()
    result["grpc_floor_sequential"] = sequential_health(order[0], 300 if args.quick else 1000)
    log(f"sequential: {args.seq_count} CreateTopic writes through the leader {leader}")
    result["sequential"] = sequential_writes(order, args.seq_count, f"{tag}-seq", 30, args.seq_time_limit)
    result["sequential"]["target"] = "leader"
    follower_first = order[1:] + order[:1]
    count = max(100, args.seq_count // 5)
    log(f"sequential: {count} writes through a follower (pysyncobj forwards them)")
    result["sequential_via_follower"] = sequential_writes(
        follower_first, count, f"{tag}-seqf", 10, args.seq_time_limit / 2
    )
    log(
        f"sequential p50 {result['sequential']['p50_ms']} ms, {result['sequential']['writes_per_s']} writes/s"
    )


def _phase_concurrent(ctx: _Run) -> None:
    args, root, result, cluster, tag = ctx.args, ctx.root, ctx.result, ctx.cluster, ctx.tag
    leader, order = ctx.leader_first()
    runs = []
    for mode in args.modes.split(","):
        log(f"concurrent: {args.clients} clients as {mode} for {args.duration}s")
        if args.profile_leader:
            _signal_profile(cluster, leader)
        r = concurrent_writes(
            cluster, order, mode, args.clients, args.duration, args.warmup, f"{tag}-c{mode[0]}"
        )
        if args.profile_leader:
            _signal_profile(cluster, leader)
            time.sleep(0.5)
            r["profile_file"] = str(root / f"profile-{leader}.json")
            if args.keep:
                pass
            for key, suffix in (("profile", ".json"), ("raft_messages", ".messages.json")):
                try:
                    r[key] = json.loads(Path(r["profile_file"]).with_suffix(suffix).read_text())
                except (OSError, ValueError):
                    pass
        log(
            f"concurrent {mode}: {r['writes_per_s']} writes/s p50 {r.get('p50_ms')} ms cpu {r['cpu_percent']}"
        )
        runs.append(r)
    best = max(runs, key=lambda r: r["writes_per_s"] or 0)
    why = ["the mode with the higher rate shows more of the server's capacity"]
    for r in runs:
        client_cpu = r["cpu_percent"].get("bench", r["cpu_percent"].get("clients_total"))
        why.append(
            f"{r['mode']}: {r['writes_per_s']} writes/s, client CPU {client_cpu}% "
            f"(100 = one core), leader CPU "
            f"{r['cpu_percent'].get(r['leader'])}%"
        )
    result["concurrent"] = {"mode_used": best["mode"], "best": best, "runs": runs, "why": "; ".join(why)}


def _phase_batched(ctx: _Run) -> None:
    args, result, cluster, tag = ctx.args, ctx.result, ctx.cluster, ctx.tag
    order = ctx.order
    log(f"batched: {args.clients} threads, WriteBatch of {BATCH_WRITES} writes per call")
    r = concurrent_writes(
        cluster,
        order,
        "threads",
        args.clients,
        args.duration,
        1.0 if args.quick else 2.0,
        f"{tag}-batch",
        op="batch",
    )
    r["writes_per_call"] = BATCH_WRITES
    result["concurrent_batched"] = r
    log(f"batched: {r['writes_per_s']} writes/s p50 {r.get('p50_ms')} ms")


def _phase_ceiling(ctx: _Run) -> None:
    args, result, cluster, tag = ctx.args, ctx.result, ctx.cluster, ctx.tag
    leader, order = ctx.leader_first()
    log(f"gRPC ceiling: {args.clients} threads calling Health.Check (no Raft) on the leader")
    r = concurrent_writes(
        cluster, order, "threads", args.clients, args.duration, args.warmup, f"{tag}-h", op="health"
    )
    for key in ("raft_entries_per_s", "commands_per_raft_entry"):
        r.pop(key, None)
    r["calls_per_s"] = r.pop("writes_per_s")
    r["what"] = (
        "the same client threads against a trivial RPC of the leader's gRPC server: "
        "an upper bound for any write path through this server and client"
    )
    result["grpc_ceiling"] = r
    log(f"gRPC ceiling: {r['calls_per_s']} calls/s p50 {r.get('p50_ms')} ms cpu {r['cpu_percent']}")


def _phase_raw(ctx: _Run) -> None:
    args, root, result = ctx.args, ctx.root, ctx.result
    secret = (root / "secret").read_text().strip()
    result["raw_pysyncobj"] = {}
    for kind in args.raw_confs:
        log(f"raw pysyncobj baseline: {kind}")
        r = raw_baseline(root, kind, secret, args)
        result["raw_pysyncobj"][kind] = r
        log(
            f"raw {kind}: seq p50 {r['sequential'].get('p50_ms')} ms, async "
            f"{r['async_best']['writes_per_s']} writes/s (window {r['async_best']['window']})"
        )


def _phase_failover(ctx: _Run, name: str = "failover", stop_signal: int = signal.SIGKILL) -> None:
    args, result, cluster = ctx.args, ctx.result, ctx.cluster
    rounds = []
    samples = []
    measured = "first commit after" if stop_signal == signal.SIGKILL else "writes paused for"
    for k in range(args.failover_rounds):
        remaining = args.budget_s - (time.monotonic() - ctx.t_begin)
        if remaining < 12.0:
            log(f"{name}: stopping after {k} rounds to stay within the time budget")
            result[f"{name}_truncated"] = True
            break
        try:
            r = failover_round(cluster, k, args.failover_call_timeout_s, stop_signal)
        except RuntimeError as exc:  # the cluster did not recover: report, stop here
            result[f"{name}_error"] = str(exc)
            log(f"{name} round {k + 1}: {exc}")
            break
        rounds.append(r)
        if r["failover_s"] is not None:
            samples.append(r["failover_s"])
        log(
            f"{name} {k + 1}/{args.failover_rounds}: stopped {r['killed']}, {measured} "
            f"{r['failover_s']} s (leader known after {r['new_leader_known_s']} s), "
            f"new leader {r['new_leader']}, healthy again in "
            f"{r['restart_to_healthy_s']} s"
        )
    result[name] = {
        "signal": signal.Signals(stop_signal).name,
        "rounds": len(rounds),
        "samples_s": samples,
        "failed_rounds": sum(1 for r in rounds if r["failover_s"] is None),
        "p50_s": _r(percentile(samples, 50), 4),
        "p99_s": _r(percentile(samples, 99), 4),
        "max_s": _r(max(samples), 4) if samples else None,
        "detail": rounds,
        "per_call_timeout_s": args.failover_call_timeout_s,
    }


PHASE_RUNS: dict[str, Callable[[_Run], None]] = {
    "seq": _phase_seq,
    "concurrent": _phase_concurrent,
    "batched": _phase_batched,
    "ceiling": _phase_ceiling,
    "raw": _phase_raw,
    "failover": _phase_failover,
    "handover": partial(_phase_failover, name="handover", stop_signal=signal.SIGTERM),
}


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    t_begin = time.monotonic()
    cluster = Cluster(root, args)
    CLUSTERS.append(cluster)
    log(f"starting 3 controllers in {root}")
    t0 = time.monotonic()
    cluster.start()
    result["cluster"] = {
        "start_to_ready_s": _r(time.monotonic() - t0, 2),
        "nodes": {n.id: n.grpc for n in cluster.layout.controllers},
        "raft_settings_overrides": args.raft_setting,
        "grpc_workers": args.grpc_workers or "default (64)",
        "raft_secret": not args.no_secret,
        "experiments": {
            k: getattr(args, k)
            for k in ("switch_interval", "patch_next_index", "profile_leader")
            if getattr(args, k)
        },
    }

    ctx = _Run(args, root, result, cluster, f"b{int(time.time())}", t_begin)
    result["cluster"]["leader"], _ = ctx.leader_first()
    for name, phase in PHASE_RUNS.items():
        if name in args.phases:
            phase(ctx)


def _signal_profile(cluster: Cluster, node_id: str) -> None:
    proc = cluster.supervisor.children[node_id]
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGUSR1)


def summarize(result: dict[str, Any]) -> None:
    seq = result.get("sequential", {})
    conc = result.get("concurrent", {}).get("best", {})
    raw = result.get("raw_pysyncobj", {})
    fo = result.get("failover", {})
    ratios: dict[str, Any] = {}
    for kind, r in raw.items():
        ratios[f"concurrent_vs_raw_async_{kind}"] = _ratio(
            conc.get("writes_per_s"), r["async_best"]["writes_per_s"]
        )
        ratios[f"seq_p50_vs_raw_sync_p50_{kind}"] = _ratio(seq.get("p50_ms"), r["sequential"].get("p50_ms"))
    batched = result.get("concurrent_batched", {})
    for kind, r in raw.items():
        ratios[f"batched_vs_raw_async_{kind}"] = _ratio(
            batched.get("writes_per_s"), r["async_best"]["writes_per_s"]
        )
    result["ratios"] = ratios
    met: dict[str, Any] = {}
    if batched:
        met["batched_ge_5000_writes_per_s"] = (batched["writes_per_s"] or 0) >= 5000
        for kind in raw:
            ratio = ratios.get(f"batched_vs_raw_async_{kind}")
            met[f"batched_ge_30pct_of_raw_{kind}"] = ratio is not None and ratio >= 0.30
    if seq:
        met["seq_p50_le_3ms"] = seq["p50_ms"] is not None and seq["p50_ms"] <= 3.0
    if conc:
        met["concurrent_ge_5000_writes_per_s"] = (conc["writes_per_s"] or 0) >= 5000
        for kind in raw:
            ratio = ratios.get(f"concurrent_vs_raw_async_{kind}")
            met[f"concurrent_ge_30pct_of_raw_{kind}"] = ratio is not None and ratio >= 0.30
    if fo:
        met["failover_p99_le_1_5s"] = (
            fo["p99_s"] is not None and fo["p99_s"] <= 1.5 and fo["failed_rounds"] == 0
        )
    ho = result.get("handover", {})
    if ho:
        election_min_s = _election_min_ms(result.get("cluster", {}).get("raft_settings_overrides", [])) / 1000
        ho["election_min_s"] = election_min_s
        met["handover_p99_below_election_min"] = (
            ho["p99_s"] is not None and ho["p99_s"] < election_min_s and ho["failed_rounds"] == 0
        )
    result["targets"] = TARGETS
    result["targets_met"] = met


def raft_overrides(items: list[str]) -> dict[str, int]:
    """--raft-setting KEY=INT items as RaftSettings overrides."""
    pairs = (item.partition("=") for item in items)
    return {key.strip(): int(value) for key, _, value in pairs}


def _election_min_ms(overrides: list[str]) -> int:
    """The cluster's election_min_ms: an override of this run's, else the default."""
    from mqmeta.controller.raft_node import RaftSettings

    return raft_overrides(overrides).get("election_min_ms", RaftSettings().election_min_ms)


CLUSTERS: list[Cluster] = []


def cleanup() -> None:
    stop_clusters(CLUSTERS, log)
    for p in BENCH_CHILDREN:
        try:
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        except Exception:
            pass


def main(argv: list[str]) -> int:
    if argv[:1] == ["_node"]:
        return node_launcher(argv[1:])
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqmeta-bench-"))
    result: dict[str, Any] = {"bench": "mqmeta controller", "quick": args.quick, "env": environment()}
    busy0 = machine_busy()
    time.sleep(0.5 if args.quick else 1.0)
    result["env"]["machine_busy_percent_before_start"] = machine_busy_percent(busy0)
    result["env"]["loadavg_before_start"] = os.getloadavg()
    result["env"]["note"] = (
        "cpu_percent: 100 = one core; machine_busy_percent: all cores; "
        "other_processes_cpu_percent: load this benchmark did not create"
    )
    return run_main(
        args, root, result, lambda t0: run(args, root, result), summarize, cleanup, log, watchdog_grace_s=15.0
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
