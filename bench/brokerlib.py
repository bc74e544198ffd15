"""The broker-cluster pieces shared by broker_bench, failover_bench and handoff_bench: the
one way to start (and stop) a bench cluster, the throughput run, the send probe and one
failover round.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.benchlib import (
    CpuMeter,
    _r,
    latency_summary,
    machine_busy,
    machine_busy_percent,
    make_log,
    stop_clusters,
)

TOPIC = "BenchTopic"
QUEUES = 8
BROKER_SET = "broker-a"
BODY_BYTES = 1024
FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]
CONTROLLER_CONFIG = {
    "broker_heartbeat_interval_ms": "200",
    "broker_dead_after_ms": "1000",
    "lease_ms": "500",
    "lease_margin_ms": "200",
}  # Cluster.configure_controller
TARGETS = {
    "throughput_msgs_per_s_min": 20000.0,
    "sigkill_failover_p99_s_max": 1.5,
    "sigstop_failover_p99_s_max": 3.0,
}
CALLS_MAX_PER_THREAD = 1_000_000
REPLICAS = 3  # the throughput cluster's replicas (the ceiling runs one raw append for each)
PROBE_ATTEMPTS_MAX = 100_000


log = make_log("broker-bench")
CLUSTERS: list[Any] = []
SPIES: list[subprocess.Popen] = []


# Cluster helpers ------------------------------------------------------------------------


def wait_in_sync(cluster, members: int, timeout_s: float = 20.0) -> str:
    """Waits until the master's SyncStateSet has `members` brokers; returns the master."""
    from mqmeta.errors import MqmetaError

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            master = cluster.master_of(BROKER_SET, timeout_s=max(0.5, deadline - time.monotonic()))
            status = cluster.broker_status(master)
            if len(status.sync_state_set) == members and status.writable:
                return master
            last = f"{master}: SyncStateSet {list(status.sync_state_set)}"
        except (MqmetaError, Exception) as exc:  # grpc errors while a broker starts
            last = repr(exc)
        time.sleep(0.05)
    raise RuntimeError(f"the SyncStateSet never reached {members} members in {timeout_s}s ({last})")


def broker_pids(cluster) -> dict[str, int]:
    return {
        b.name: cluster.supervisor.children[b.name].pid
        for b in cluster.layout.brokers
        if cluster.is_running(b.name)
    }


def all_pids(cluster, master: str) -> dict[str, int]:
    """master, slave-N, controllers, namesrv and this process."""
    pids: dict[str, int] = {"master": cluster.supervisor.children[master].pid}
    slaves = sorted(n for n in broker_pids(cluster) if n != master)
    for k, name in enumerate(slaves):
        pids[f"slave{k + 1}"] = cluster.supervisor.children[name].pid
    for node in cluster.layout.controllers:
        if cluster.is_running(node.id):
            pids[f"controller-{node.id}"] = cluster.supervisor.children[node.id].pid
    if cluster.is_running("namesrv"):
        pids["namesrv"] = cluster.supervisor.children["namesrv"].pid
    pids["bench"] = os.getpid()
    return pids


class SyncSetMonitor(threading.Thread):
    """Polls the master's SyncStateSet every 0.1 s (bounded) to catch a set that changed
    mid-run: a shrunk set acknowledges with fewer copies and inflates the rate."""

    def __init__(self, cluster, master: str, until: float) -> None:
        super().__init__(daemon=True, name="sss-monitor")
        self.cluster, self.master, self.until = cluster, master, until
        self.samples: list[tuple[float, int, int]] = []  # monotonic, size, sss epoch
        self.errors = 0

    def run(self) -> None:
        import grpc

        from mqmeta.pb import broker_pb2, broker_pb2_grpc

        with grpc.insecure_channel(self.cluster.broker(self.master).grpc) as channel:
            stub = broker_pb2_grpc.BrokerServiceStub(channel)
            for _ in range(2000):
                if time.monotonic() >= self.until:
                    break
                try:
                    st = stub.GetHaStatus(broker_pb2.HaStatusRequest(), timeout=1.0)
                    self.samples.append((time.monotonic(), len(st.sync_state_set), st.sync_state_set_epoch))
                except Exception:
                    self.errors += 1
                time.sleep(0.1)

    @property
    def min_size(self) -> int | None:
        return min(s[1] for s in self.samples) if self.samples else None

    def first_below(self, size: int) -> float | None:
        return next((t for t, n, _ in self.samples if n < size), None)


# Phase 1: throughput ----------------------------------------------------------------------


class _Producers:
    """`threads` producers sending batches of `batch` bodies in a loop; latencies and acks
    are counted inside the measured window only."""

    def __init__(self, cluster, threads: int, batch: int) -> None:
        from mqmeta.broker_client import Producer

        self.batch = batch
        self.producers = [Producer(cluster.namesrv, timeout_s=10.0) for _ in range(threads)]
        for p in self.producers:
            p.routes.route(TOPIC)  # the route query is not part of the measurement
        self.lats: list[list[float]] = [[] for _ in range(threads)]
        self.acked = [0] * threads
        self.errors: list[collections.Counter] = [collections.Counter() for _ in range(threads)]
        self.workers: list[threading.Thread] = []

    def start(self, start_at: float, warm_until: float, end_at: float) -> None:
        self.workers = [
            threading.Thread(
                target=self._run, args=(k, start_at, warm_until, end_at), daemon=True, name=f"producer{k}"
            )
            for k in range(len(self.producers))
        ]
        for w in self.workers:
            w.start()

    def _run(self, k: int, start_at: float, warm_until: float, end_at: float) -> None:
        from mqmeta.errors import MqmetaError

        bodies = [os.urandom(BODY_BYTES)] * self.batch
        producer = self.producers[k]
        while time.monotonic() < start_at:
            time.sleep(0.005)
        for _ in range(CALLS_MAX_PER_THREAD):
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            try:
                producer.send(TOPIC, bodies)
            except MqmetaError as exc:
                self.errors[k][type(exc).__name__] += 1
                time.sleep(0.01)
                continue
            t1 = time.monotonic()
            if t0 >= warm_until and t1 <= end_at:
                self.lats[k].append(t1 - t0)
            if warm_until <= t1 <= end_at:
                self.acked[k] += self.batch

    def stop(self) -> int:
        """Joins the loops and closes the producers; returns how many loops hung."""
        for w in self.workers:
            w.join(timeout=15)
        hung = sum(1 for w in self.workers if w.is_alive())
        for p in self.producers:
            p.close()
        return hung


def throughput_run(
    cluster,
    threads: int,
    batch: int,
    warmup_s: float,
    duration_s: float,
    profile: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """profile: {"dir": Path, "targets": ["master" | "slave1" | "bench", ...], "rate": Hz}"""
    master = wait_in_sync(cluster, 3)
    status0 = cluster.broker_status(master)
    producers = _Producers(cluster, threads, batch)
    start_at = time.monotonic() + 0.2
    warm_until = start_at + warmup_s
    end_at = warm_until + duration_s
    producers.start(start_at, warm_until, end_at)
    monitor = SyncSetMonitor(cluster, master, end_at)
    monitor.start()
    pids = all_pids(cluster, master)
    spies: list[tuple[str, subprocess.Popen, Path]] = []
    time.sleep(max(0.0, warm_until - time.monotonic()))
    meter = CpuMeter(pids)
    busy0 = machine_busy()
    if profile is not None:
        spies = start_py_spy(profile, {k: v for k, v in pids.items() if k in profile["targets"]}, duration_s)
    time.sleep(max(0.0, end_at - time.monotonic()))
    cpu = meter.stop()
    busy = machine_busy_percent(busy0)
    hung = producers.stop()
    monitor.join(timeout=3)
    status1 = cluster.broker_status(master)
    all_lats = [x for part in producers.lats for x in part]
    total = sum(producers.acked)
    err: collections.Counter = collections.Counter()
    for c in producers.errors:
        err.update(c)
    out: dict[str, Any] = {
        "threads": threads,
        "batch": batch,
        "duration_s": duration_s,
        "messages_acked": total,
        "msgs_per_s": round(total / duration_s, 1),
        "mb_per_s": round(total * BODY_BYTES / duration_s / 1e6, 2),
        "batches_per_s": round(len(all_lats) / duration_s, 1),
        "batch_ack_latency": latency_summary(all_lats, with_min=False),
        "errors": dict(err),
        "hung_threads": hung,
        "cpu_percent": cpu,
        "cpu_percent_system_part": meter.system_percent,
        "machine_busy_percent": busy,
        "other_processes_cpu_percent": None
        if busy is None
        else round(max(0.0, busy * (os.cpu_count() or 1) - sum(v or 0.0 for v in cpu.values())), 1),
        "master": master,
    }
    out.update(_sync_state_set_during(status0, status1, monitor, start_at))
    out["contended"] = (out["other_processes_cpu_percent"] or 0.0) > 30.0
    if total:
        per = 10.0 * duration_s / total  # cpu% -> CPU ms per message
        out["cpu_us_per_message"] = {k: _r(v * per * 1000, 1) for k, v in cpu.items() if v is not None}
    if spies:
        out["profile"] = finish_py_spy(spies)
    return out


def _sync_state_set_during(status0, status1, monitor: SyncSetMonitor, start_at: float) -> dict[str, Any]:
    """What the SyncStateSet did during a run, and whether every ack came from all 3 replicas."""
    shrunk_at = monitor.first_below(3)
    return {
        "master_epoch": status1.master_epoch,
        "sync_state_set_start": list(status0.sync_state_set),
        "sync_state_set_end": list(status1.sync_state_set),
        "sync_state_set_epochs": [status0.sync_state_set_epoch, status1.sync_state_set_epoch],
        "sync_state_set_min_size_seen": monitor.min_size,
        "commit_log_bytes_written": status1.max_offset - status0.max_offset,
        "sync_state_set_first_shrink_after_load_start_s": (
            None if shrunk_at is None else round(shrunk_at - start_at, 2)
        ),
        # Valid for the target only if every ack came from all 3 replicas: the set never changed.
        "valid_all_3_acked": (
            status0.sync_state_set_epoch == status1.sync_state_set_epoch
            and len(status1.sync_state_set) == 3
            and (monitor.min_size or 3) == 3
        ),
    }


# Phase 3: failover ---------------------------------------------------------------------------


class Probe(threading.Thread):
    """Sends small batches to whoever the nameserver names master, as a producer would,
    with a short per-attempt timeout and a short pause after each failure."""

    def __init__(self, cluster, attempt_timeout_s: float) -> None:
        super().__init__(daemon=True, name="probe")
        from mqmeta.broker_client import RouteCache, _Channels

        self.channels = _Channels()
        self.routes = RouteCache(cluster.namesrv, self.channels)
        self.attempt_timeout_s = attempt_timeout_s
        self.events: list[tuple[float, bool, int, str, str]] = []  # t, ok, epoch, address, error
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.ok_event = threading.Event()
        self.producer_id = uuid.uuid4().hex[:16]

    def run(self) -> None:
        import grpc

        from mqmeta.errors import MqmetaError
        from mqmeta.pb import broker_pb2 as bpb
        from mqmeta.pb import broker_pb2_grpc as bpb_grpc

        refresh = False
        seq = 0
        for n in range(PROBE_ATTEMPTS_MAX):
            if self.stop_event.is_set():
                break
            address, ok, epoch, error = "", False, 0, ""
            try:
                if refresh:
                    self.routes.route(TOPIC, refresh=True)
                address = self.routes.master(TOPIC, BROKER_SET)
                messages = []
                for _ in range(4):
                    seq += 1
                    messages.append(
                        bpb.Message(
                            topic=TOPIC,
                            queue_id=n % QUEUES,
                            body=b"p" * 100,
                            producer_id=self.producer_id,
                            producer_seq=seq,
                        )
                    )
                reply = bpb_grpc.BrokerServiceStub(self.channels.get(address)).Send(
                    bpb.SendRequest(messages=messages), timeout=self.attempt_timeout_s
                )
                ok, epoch = True, reply.master_epoch
            except grpc.RpcError as exc:
                error = str(exc.code())
            except MqmetaError as exc:
                error = type(exc).__name__
            with self.lock:
                self.events.append((time.monotonic(), ok, epoch, address, error))
            if ok:
                self.ok_event.set()
                refresh = False
                self.stop_event.wait(0.005)
            else:
                refresh = True
                self.stop_event.wait(0.02)

    def first_success_after(self, t0: float, min_epoch: int) -> tuple[float, int, str] | None:
        with self.lock:
            for t, ok, epoch, address, _ in self.events:
                if t >= t0 and ok and epoch >= min_epoch:
                    return t, epoch, address
        return None

    def summary_after(self, t0: float, t1: float) -> dict[str, Any]:
        with self.lock:
            window = [e for e in self.events if t0 <= e[0] <= t1]
        errors = collections.Counter(e[4] for e in window if not e[1])
        return {
            "attempts": len(window),
            "failed_attempts": sum(1 for e in window if not e[1]),
            "errors": dict(errors),
        }

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)
        self.channels.close()


class RouteWatcher(threading.Thread):
    """Polls the nameserver route every 20 ms (bounded) and notes when it first names a
    master other than `old_address`: the server side of a failover, without the probe's
    per-attempt timeout granularity."""

    def __init__(self, cluster, old_address: str, until: float) -> None:
        super().__init__(daemon=True, name="route-watcher")
        from mqmeta.broker_client import RouteCache, _Channels

        self.channels = _Channels()
        self.routes = RouteCache(cluster.namesrv, self.channels)
        self.old_address, self.until = old_address, until
        self.switched_at: float | None = None
        self.new_address = ""
        self.stop_event = threading.Event()

    def run(self) -> None:
        for _ in range(2000):
            if self.stop_event.is_set() or time.monotonic() >= self.until:
                break
            try:
                address = (
                    self.routes.master(TOPIC, BROKER_SET) if self.routes.route(TOPIC, refresh=True) else ""
                )
            except Exception:
                address = ""
            if address and address != self.old_address:
                self.switched_at, self.new_address = time.monotonic(), address
                break
            self.stop_event.wait(0.02)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)
        self.channels.close()


def failover_round(cluster, kind: str, k: int, attempt_timeout_s: float, wait_s: float) -> dict[str, Any]:
    old = wait_in_sync(cluster, 3)
    old_status = cluster.broker_status(old)
    old_epoch = old_status.master_epoch
    probe = Probe(cluster, attempt_timeout_s)
    probe.start()
    out: dict[str, Any] = {"round": k + 1, "fault": kind, "old_master": old, "old_epoch": old_epoch}
    try:
        if not probe.ok_event.wait(10.0):
            raise RuntimeError("the probe could not send to the healthy master")
        time.sleep(0.3)  # a steady stream of sends before the fault
        watcher = RouteWatcher(cluster, cluster.broker(old).grpc, time.monotonic() + wait_s)
        t_fault = time.monotonic()
        if kind == "SIGKILL":
            cluster.kill(old)
        else:
            cluster.pause(old)
        watcher.start()
        found = None
        deadline = t_fault + wait_s
        while time.monotonic() < deadline:
            found = probe.first_success_after(t_fault, old_epoch + 1)
            if found:
                break
            time.sleep(0.01)
        t_end = time.monotonic()
        watcher.join(timeout=max(0.1, t_fault + wait_s - time.monotonic()))
        watcher.stop()
        out["route_names_new_master_s"] = (
            None if watcher.switched_at is None else round(watcher.switched_at - t_fault, 4)
        )
        out.update(probe.summary_after(t_fault, found[0] if found else t_end))
        if found:
            out["failover_s"] = round(found[0] - t_fault, 4)
            out["new_epoch"] = found[1]
            out["new_master_address"] = found[2]
            out["new_master"] = next((b.name for b in cluster.layout.brokers if b.grpc == found[2]), found[2])
        else:
            out["failover_s"] = None
            out["error"] = f"no send acknowledged by a new master within {wait_s}s"
    finally:
        probe.stop()
        t_recover = time.monotonic()
        if kind == "SIGKILL":
            cluster.start_broker(old)
        else:
            cluster.resume(old)
    wait_in_sync(cluster, 3, timeout_s=30.0)
    out["back_to_3_in_sync_s"] = round(time.monotonic() - t_recover, 3)
    if kind == "SIGSTOP":
        st = cluster.broker_status(old)
        out["old_master_after_resume"] = {"role": st.role, "master_epoch": st.master_epoch}
    return out


def cleanup() -> None:
    """Stop every py-spy and cluster this process started (also on exceptions and signals)."""
    for proc in SPIES:
        try:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        except Exception:
            pass
    stop_clusters(CLUSTERS, log)


def start_cluster(root: Path, name: str, flags: list[str], no_tiered: bool = False):
    from mqmeta.cluster.harness import Cluster

    from mqmeta.pb import controller_pb2 as pb

    t0 = time.monotonic()
    if no_tiered:
        flags = [*flags, "--tiered-store", ""]  # the last occurrence wins: no tiered store
    cluster = Cluster(root / name, broker_sets=1, replicas=3, broker_flags=flags)
    CLUSTERS.append(cluster)
    cluster.start()  # also Cluster.configure_controller(): the test liveness settings
    with cluster.client() as client:
        client.create_topic(pb.TopicSpec(name=TOPIC, queue_count=QUEUES))
    master = wait_in_sync(cluster, 3, timeout_s=30.0)
    try:  # what the harness really started (it may add flags of its own, e.g. a tiered store)
        argv = Path(f"/proc/{cluster.supervisor.children[master].pid}/cmdline").read_bytes()
        command = [a.decode() for a in argv.split(b"\0") if a]
        command = [a.replace(str(root), "<root>") for a in command]
    except OSError:
        command = []
    info = {
        "startup_s": round(time.monotonic() - t0, 2),
        "first_master": master,
        "broker_command": " ".join(command[command.index("broker") :] if "broker" in command else command),
        "controllers": len(cluster.layout.controllers),
        "brokers": len(cluster.layout.brokers),
        "controller_config": CONTROLLER_CONFIG,
        "broker_flags": " ".join(flags),
        "ack_policy": ack_policy(flags),
        "topic": {"name": TOPIC, "queues": QUEUES},
        "message_body_bytes": BODY_BYTES,
        "broker_fsync": True,
    }
    log(f"cluster {name} up in {info['startup_s']} s, master {master}, flags {' '.join(flags)}")
    return cluster, info


def ack_policy(flags: list[str]) -> str:
    """What acknowledges a send on brokers started with `flags`, as the broker's own
    command line reads them."""
    from mqmeta.broker_agent.cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    required = [
        "--broker-name",
        "b",
        "--listen",
        "127.0.0.1:1",
        "--controllers",
        "127.0.0.1:1",
        "--data-dir",
        "d",
    ]
    args = parser.parse_args(["broker", *required, *flags])
    if not args.no_all_ack:
        return "all SyncStateSet members (default, no --no-all-ack)"
    copies = args.in_sync_replicas
    return f"{copies} copies, the master's included (--no-all-ack --in-sync-replicas {copies})"


def stop_cluster(cluster) -> None:
    cluster.stop()
    CLUSTERS.remove(cluster)


# py-spy -----------------------------------------------------------------------------------------


def start_py_spy(
    profile: dict[str, Any], pids: dict[str, int], duration_s: float
) -> list[tuple[str, subprocess.Popen, Path]]:
    # the venv running this bench (a worktree has no .venv of its own)
    spy = Path(shutil.which("py-spy") or Path(sys.executable).with_name("py-spy"))
    out_dir: Path = profile["dir"]
    spies = []
    for name, pid in pids.items():
        path = out_dir / f"pyspy-{name}.txt"
        cmd = [
            str(spy),
            "record",
            "-p",
            str(pid),
            "-d",
            str(max(1, int(duration_s))),
            "-r",
            str(profile.get("rate", 100)),
            "--format",
            "raw",
            "-o",
            str(path),
            "--nonblocking",
            "--threads",
        ]
        if profile.get("native"):
            cmd.append("--native")
        if profile.get("gil", True):
            cmd.append("--gil")  # only the thread holding the GIL: where Python CPU goes
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        SPIES.append(proc)
        spies.append((name, proc, path))
    return spies


WRITE_PATH_FUNCS = [
    # function names as py-spy reports them (Class.method), file as _frame_key shortens it
    # broker side
    "BrokerServicer.Send (broker_agent/service.py)",
    "_message (broker_agent/service.py)",
    "BrokerAgent.send (broker_agent/agent.py)",
    "BrokerAgent.wait_acknowledged (broker_agent/agent.py)",
    "MessageStore.put_messages (broker_agent/store.py)",
    "MessageStore._put_locked (broker_agent/store.py)",
    "encode_record (formats/records.py)",
    "make_msg_id (formats/records.py)",
    "CommitLog.append_verified (broker_agent/commitlog.py)",
    "CommitLog._write (broker_agent/commitlog.py)",
    "MessageStore._index_batch (broker_agent/store.py)",
    "serve_fetch (broker_agent/ha_fetch.py)",
    "CommitLog.read (broker_agent/commitlog.py)",
    "_fetch_once (broker_agent/ha_fetch.py)",
    "MessageStore.append_replicated (broker_agent/store.py)",
    "MessageStore.sync_replicated (broker_agent/store.py)",
    "scan_records (formats/records.py)",
    "valid_run (formats/records.py)",
    "MessageStore._plan_replicated (broker_agent/store.py)",
    "Condition.notify_all (threading.py)",
    "Condition.wait (threading.py)",
    "TieredUploader.step (broker_agent/tiered.py)",
    "BrokerAgent._heartbeat (broker_agent/agent.py)",
    # client side
    "Producer.send (mqmeta/broker_client.py)",
    "_call_master (mqmeta/broker_client.py)",
]


def _frame_key(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (pkg/file.py)' (line numbers dropped)."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


def finish_py_spy(spies: list[tuple[str, subprocess.Popen, Path]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, proc, path in spies:
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not path.exists():
            out[name] = {"error": (err or b"").decode(errors="replace")[-500:]}
            continue
        leaf: collections.Counter = collections.Counter()
        inclusive: collections.Counter = collections.Counter()
        threads: collections.Counter = collections.Counter()
        total = 0
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            try:
                count = int(count_text)
            except ValueError:
                continue
            frames = stack.split(";")
            if frames and frames[0].startswith(("thread (", "process ")):
                thread = frames[0]
                frames = [f for f in frames[1:] if not f.startswith(("thread (", "process "))]
            else:
                thread = "?"
            total += count
            threads[thread] += count
            if frames:
                leaf[_frame_key(frames[-1])] += count
            for key in {_frame_key(f) for f in frames}:
                inclusive[key] += count
        if not total:
            out[name] = {"samples": 0}
            continue
        out[name] = {
            "samples": total,
            "top_leaf_frames_percent": {k: round(100 * v / total, 1) for k, v in leaf.most_common(15)},
            "write_path_inclusive_percent": {
                k: round(100 * inclusive[k] / total, 1) for k in WRITE_PATH_FUNCS if inclusive.get(k)
            },
            "top_inclusive_percent": {k: round(100 * v / total, 1) for k, v in inclusive.most_common(25)},
            "threads_percent": {k: round(100 * v / total, 1) for k, v in threads.most_common(8)},
            "raw_file": str(path),
        }
    return out
