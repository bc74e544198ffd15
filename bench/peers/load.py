"""The one load generator every system is driven with, the clients it drives, and the
fsync counter.

A client is an object with `call()` (one operation, returns when acknowledged; raises on
failure) and `close()`, made per thread by a factory. `drive()` runs `threads` such
clients for a bounded time and count, each one call at a time (closed loop), and reports
latencies and operations per second. Every client is plain Python in this process: the
same GIL, the same loop, for every system.

`drive()` also reads the machine's CPU time (/proc/stat, every core) over the measured
seconds: `machine_cpu_ms_per_op`, what the whole machine spent per operation (the system
driven, this load generator, and whatever else runs: the other systems idle), and the
share of those seconds the cores were idle or stolen by the hypervisor
(`machine_idle_percent`, `machine_steal_percent`): a system that leaves cores idle is
bound by a wait, not by CPU, and steal is the machine's neighbours taking it.
"""

from __future__ import annotations

import asyncio
import collections
import http.client
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.benchlib import _r, latency_summary, proc_stat
from bench.peers.servers import NATS_SUBJECT, RABBIT_QUEUE, b64, http_json

CALLS_MAX_PER_THREAD = 200_000
BODY_BYTES = 1024
ETCD_VALUE_BYTES = 64
BATCH = 32


class Client(Protocol):
    def call(self) -> None: ...

    def close(self) -> None: ...


Factory = Callable[[int], Client]  # thread number -> a connected client


def drive(
    factory: Factory, threads: int, warmup_s: float, duration_s: float, per_call: int = 1
) -> dict[str, Any]:
    """`threads` closed-loop clients; latencies of the calls made after the warm-up."""
    clients = [factory(k) for k in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[collections.Counter] = [collections.Counter() for _ in range(threads)]
    start_at = time.monotonic() + 0.1
    warm_until = start_at + warmup_s
    end_at = warm_until + duration_s

    def run(k: int) -> None:
        client = clients[k]
        while time.monotonic() < start_at:
            time.sleep(0.002)
        for _ in range(CALLS_MAX_PER_THREAD):
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            try:
                client.call()
            except Exception as exc:  # any client's error counts the same way
                errors[k][type(exc).__name__] += 1
                time.sleep(0.01)
                continue
            t1 = time.monotonic()
            if t0 >= warm_until and t1 <= end_at:
                latencies[k].append(t1 - t0)

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, warm_until - time.monotonic()))
    cpu_before = proc_stat()
    time.sleep(max(0.0, end_at - time.monotonic()))
    cpu_after = proc_stat()
    for worker in workers:
        worker.join(timeout=duration_s + warmup_s + 30)
    for client in clients:
        try:
            client.close()
        except Exception:
            pass
    every = [x for part in latencies for x in part]
    error_counts: collections.Counter = collections.Counter()
    for counter in errors:
        error_counts.update(counter)
    out = latency_summary(every)
    out["threads"] = threads
    out["per_call"] = per_call
    out["calls_per_s"] = _r(len(every) / duration_s, 1)
    out["ops_per_s"] = _r(len(every) * per_call / duration_s, 1)
    out["errors"] = dict(error_counts)
    out["hung_threads"] = sum(1 for w in workers if w.is_alive())
    out.update(machine_cpu(cpu_before, cpu_after, len(every) * per_call))
    return out


# benchlib.proc_stat()'s fields: user nice system idle iowait irq softirq steal (then the
# guests', already counted in user and nice: not summed here)
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_IDLE_FIELDS = (3, 4)
_STEAL_FIELD = 7


def machine_cpu(before: list[int] | None, after: list[int] | None, ops: int) -> dict[str, Any]:
    """CPU milliseconds the whole machine spent per operation between two
    benchlib.proc_stat() readings, and the percentages of those ticks idle (iowait
    included) and stolen."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return {}
    spent = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    total = sum(spent)
    if total <= 0:
        return {}
    busy_ms = sum(spent[i] for i in _BUSY_FIELDS) * 1000 / os.sysconf("SC_CLK_TCK")
    return {
        "machine_cpu_ms_per_op": _r(busy_ms / ops) if ops else None,
        "machine_idle_percent": _r(100 * sum(spent[i] for i in _IDLE_FIELDS) / total, 1),
        "machine_steal_percent": _r(100 * spent[_STEAL_FIELD] / total, 1),
    }


def sequential(client: Client, count: int) -> float:
    """`count` calls one after another (for the fsync count); their total seconds."""
    t0 = time.monotonic()
    for _ in range(count):
        client.call()
    return time.monotonic() - t0


# mqmeta ------------------------------------------------------------------------------------


class MqmetaWrite:
    """One metadata write: create a topic (a new name each call). `call_stream` False: as
    gRPC calls, not over the controllers' call stream (mqmeta/call_stream.py)."""

    def __init__(self, addresses: list[str], k: int, batch: int = 1, call_stream: bool = True) -> None:
        from mqmeta.client import ControllerClient

        self.client = ControllerClient(addresses, timeout_s=5.0, call_stream=call_stream)
        self.prefix = f"peers-{os.getpid()}-{k}-{time.monotonic_ns()}"
        self.batch = batch
        self.i = 0

    def call(self) -> None:
        from mqmeta.pb import controller_pb2 as pb

        self.i += 1
        if self.batch == 1:
            self.client.create_topic(pb.TopicSpec(name=f"{self.prefix}-{self.i}", queue_count=4))
            return
        writes = [
            pb.WriteOp(create_topic=pb.TopicSpec(name=f"{self.prefix}-{self.i}-{j}", queue_count=4))
            for j in range(self.batch)
        ]
        results = self.client.write(pb.WriteBatch(writes=writes))
        failed = [r.error_code for r in results.results if r.error_code]
        if failed:
            raise RuntimeError(f"{len(failed)} writes of the batch failed: {failed[0]}")

    def close(self) -> None:
        self.client.close()


class MqmetaRead:
    """One linearizable read: the controller's configuration."""

    def __init__(self, addresses: list[str], k: int, call_stream: bool = True) -> None:
        from mqmeta.client import ControllerClient

        self.client = ControllerClient(addresses, timeout_s=5.0, call_stream=call_stream)

    def call(self) -> None:
        from mqmeta.pb import controller_pb2 as pb

        self.client.get_config(pb.GetConfigRequest())

    def close(self) -> None:
        self.client.close()


class MqmetaSend:
    """`batch` 1 KB messages in one synchronous send (acknowledged by the SyncStateSet)."""

    def __init__(self, namesrv: str, topic: str, batch: int = 1, call_stream: bool = True) -> None:
        from mqmeta.broker_client import Producer

        self.producer = Producer(namesrv, timeout_s=10.0, call_stream=call_stream)
        self.producer.routes.route(topic)  # the route query is not measured
        self.topic = topic
        self.bodies = [os.urandom(BODY_BYTES)] * batch

    def call(self) -> None:
        self.producer.send(self.topic, self.bodies)

    def close(self) -> None:
        self.producer.close()


# etcd --------------------------------------------------------------------------------------


class EtcdWrite:
    """One put (or a txn of `batch` puts) over a kept-alive HTTP connection to one member."""

    def __init__(self, endpoint: tuple[str, int], k: int, batch: int = 1) -> None:
        self.endpoint = endpoint
        self.connection = http.client.HTTPConnection(*endpoint, timeout=5.0)
        self.prefix = f"peers-{k}-{time.monotonic_ns()}"
        self.value = b64(os.urandom(ETCD_VALUE_BYTES))
        self.batch = batch
        self.i = 0

    def call(self) -> None:
        self.i += 1
        if self.batch == 1:
            body = {"key": b64(f"{self.prefix}-{self.i}"), "value": self.value}
            http_json(self.endpoint, "/v3/kv/put", body, connection=self.connection)
            return
        puts = [
            {"request_put": {"key": b64(f"{self.prefix}-{self.i}-{j}"), "value": self.value}}
            for j in range(self.batch)
        ]
        http_json(self.endpoint, "/v3/kv/txn", {"success": puts}, connection=self.connection)

    def close(self) -> None:
        self.connection.close()


class EtcdRead:
    """One linearizable range read of one key (etcd's default consistency)."""

    def __init__(self, endpoint: tuple[str, int], k: int) -> None:
        self.endpoint = endpoint
        self.connection = http.client.HTTPConnection(*endpoint, timeout=5.0)

    def call(self) -> None:
        http_json(self.endpoint, "/v3/kv/range", {"key": b64("peers-read")}, connection=self.connection)

    def close(self) -> None:
        self.connection.close()


# RabbitMQ ----------------------------------------------------------------------------------


class RabbitSend:
    """One persistent 1 KB publish to the quorum queue, returning on its confirm."""

    def __init__(self, port: int, k: int) -> None:
        import pika

        self.connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.body = os.urandom(BODY_BYTES)
        self.properties = pika.BasicProperties(delivery_mode=2)

    def call(self) -> None:
        self.channel.basic_publish("", RABBIT_QUEUE, self.body, self.properties, mandatory=True)

    def close(self) -> None:
        self.connection.close()


def rabbit_purge(port: int) -> None:
    """Empties the queue between runs (a quorum queue's length changes its costs)."""
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    connection.channel().queue_purge(RABBIT_QUEUE)
    connection.close()


# NATS --------------------------------------------------------------------------------------


class NatsSend:
    """`batch` 1 KB JetStream publishes, awaited together (1: one synchronous publish).
    Each client has its own event loop and connection, driven from its thread."""

    def __init__(self, url: str, k: int, batch: int = 1) -> None:
        import nats

        self.loop = asyncio.new_event_loop()
        self.connection = self.loop.run_until_complete(nats.connect(url, connect_timeout=5))
        self.js = self.connection.jetstream(timeout=5)
        self.body = os.urandom(BODY_BYTES)
        self.batch = batch

    def call(self) -> None:
        if self.batch == 1:
            self.loop.run_until_complete(self.js.publish(NATS_SUBJECT, self.body))
            return

        async def many() -> None:
            await asyncio.gather(*(self.js.publish(NATS_SUBJECT, self.body) for _ in range(self.batch)))

        self.loop.run_until_complete(many())

    def close(self) -> None:
        self.loop.run_until_complete(self.connection.close())
        self.loop.close()


# fsyncs -------------------------------------------------------------------------------------

FSYNC_CALLS = ("fsync", "fdatasync", "sync_file_range")
STRACE_ATTACH_S = 1.0


def count_fsyncs(pids: list[int], client: Client, writes: int, out: Path) -> dict[str, Any]:
    """fsync-family calls made by `pids` (all their threads) while `client` makes `writes`
    acknowledged writes one after another, per write; None figures when strace is absent.
    strace slows the traced processes: these writes are not timed."""
    if shutil.which("strace") is None:
        return {"fsyncs_per_write": None, "why": "strace is not installed (apt-get install -y strace)"}
    argv = ["strace", "-f", "-c", "-e", "trace=" + ",".join(FSYNC_CALLS), "-o", str(out)]
    for pid in pids:
        argv += ["-p", str(pid)]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(STRACE_ATTACH_S)  # attaching to every thread takes a moment
        seconds = sequential(client, writes)
    finally:
        tracer.send_signal(signal.SIGINT)  # strace detaches and writes its summary
        try:
            tracer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    calls = _strace_calls(out.read_text() if out.exists() else "")
    total = sum(calls.values())
    return {
        "writes": writes,
        "seconds_traced": _r(seconds),
        "calls": calls,
        "fsyncs_per_write": _r(total / writes, 2),
        "note": "whole cluster (every node), including background fsyncs during the window",
    }


def _strace_calls(summary: str) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in summary.splitlines():
        fields = line.split()
        if fields and fields[-1] in FSYNC_CALLS and len(fields) >= 5:
            numbers = [f for f in fields[:-1] if re.fullmatch(r"[0-9.]+", f)]
            if len(numbers) >= 4:
                calls[fields[-1]] = int(numbers[3])  # % time, seconds, usecs/call, calls
    return calls


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
