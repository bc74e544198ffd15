#!/usr/bin/env python
"""Metadata at scale: a real 3-node controller cluster and a nameserver holding P11's load.

    .venv/bin/python bench/metadata_scale.py [--scale 1.0]

At --scale 1.0 (the issue's sizes): 100,000 topics x 8 queues, 10,000 subscription groups,
300 broker sets x 3 replicas registered and heartbeating at the default interval (the 900
brokers are simulated by a few load-generator processes speaking the real RegisterBroker
call and HeartbeatStream, or Heartbeat calls with --heartbeat-transport unary), one watch
stream per broker, and a standalone nameserver. Every count scales with --scale (at least
one broker set); --scale 0.01 runs in seconds.

Prints ONE JSON document on stdout (progress on stderr). Phases, in order:

load        the brokers register (and start heartbeating), a master is elected per set,
            then topics and groups are created through the `Write` RPC (batches of 1024)
            from a few client threads; load rate in writes/s and Raft entries/s;
verify      counts read back through the API (ListTopics, ListGroups, ListBrokerSets),
            sample routes checked, every node's state digest equal after a barrier;
memory      RSS (and peak RSS) of each controller node and of the nameserver;
heartbeat   the fleet heartbeats at the default interval: heartbeats/s, latency p50/p99,
            the leader's CPU (and CPU ms per heartbeat);
route       QueryRoute through the nameserver for random topics under that heartbeat load,
            one sequential client and several concurrent ones (target p99 <= 5 ms), with
            the gRPC floor (Health.Check on the nameserver) and GetTopicRoute straight to
            the leader as baselines; a py-spy profile of the leader meanwhile;
capacity    the fleet's heartbeat interval is shortened step by step (bounded) until the
            leader no longer keeps up: the highest rate sustained, its p99 and CPU, and the
            leader's CPU per heartbeat; first on HeartbeatStream (as the broker agents send
            them), then with unary Heartbeat calls as the same run's baseline;
snapshot    reads are driven until every node has written a Raft snapshot (log
            compaction): its size, how long it took (the temp file's lifetime), the longest
            read stall and any leader change meanwhile; baselines: a plain pickle/unpickle
            (and gzip) of the same state in this process;
raw         a raw pysyncobj cluster (the controller's SyncObjConf) applying entries of the
            same size as the load's entries: the entries/s ceiling of the Raft library;
watch       one watch stream per broker on the leader, twice: as broker agents subscribe
            (each to its own broker set, all at once, as after a leader change) and each
            subscribed to the whole cluster (so that every broker-set change fans out to
            all of them); how many streams are served, the heartbeats and CPU while they
            open, the delay from a committed broker-set change (ElectMaster) to each
            subscribed stream having the event (p50/p99/max), and what a burst of topic
            creations does to the streams;
restart     kill -9 of one follower and restart: time to answering a linearizable read;
            then kill -9 of all three and restart: time until every node answers one
            (target <= 10 s each).

Every loop is bounded in count and time, everything listens on 127.0.0.1, and every child
is stopped on exit (also on exceptions, SIGTERM and Ctrl-C); a watchdog ends the run with
the JSON gathered so far if it overruns its budget.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import math
import multiprocessing as mp
import os
import pickle
import platform
import random
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__:  # imported as bench.X: benchlib sits next to this file (sys.path[0] when run)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (
    CpuMeter,
    _r,
    _ratio,
    latency_summary,
    machine_busy,
    machine_busy_percent,
    make_log,
    percentile,
    profile_start,
    profile_stop,
    run_main,
    stop_clusters,
)
from mqmeta.controller.state_machine import CONFIG_SCHEMA  # noqa: E402 (after benchlib's path)

CLUSTER = "DefaultCluster"
FULL_SIZES = {"topics": 100_000, "queues": 8, "groups": 10_000, "broker_sets": 300, "replicas": 3}
TARGETS = {"restart_one_s_max": 10.0, "restart_all_s_max": 10.0, "route_p99_ms_max": 5.0}
WRITE_BATCH = 1024  # writes per Write RPC (the RPC's own maximum)
SETS_PER_TOPIC = 2  # each topic lives on this many broker sets (8 queues on each)
# The fleet heartbeats as real brokers do by default: at the controllers' default interval
# (P9 made it 300 ms with dead-after 2 s; at 1 s, two late heartbeats made a master dead).
DEFAULT_HEARTBEAT_INTERVAL_MS = CONFIG_SCHEMA["broker_heartbeat_interval_ms"][1]
HEARTBEAT_TIMEOUT_S = 2.0
FLEET_BROKERS_PER_PROCESS = 300
TRANSPORTS = ("stream", "unary")  # how the fleet heartbeats: HeartbeatStream, or Heartbeat calls
WATCH_STREAMS_PER_PROCESS = 300
SAMPLES_MAX = 3_000_000  # per fleet process: ~1 hour of one broker per second each
SNAPSHOT_READERS_PER_NODE = 2  # sequential readers per node driving barrier entries
ELECT_ATTEMPTS_MAX = 20  # a set whose brokers look dead right now is retried (1 s apart)
WATCH_CLUSTER_OPEN_PER_S = 20  # cluster-wide streams subscribing per second (300 events each)

log = make_log("scale")


def sizes_for(scale: float) -> dict[str, int]:
    out = {k: max(1, round(v * scale)) for k, v in FULL_SIZES.items()}
    out["queues"] = FULL_SIZES["queues"]
    out["replicas"] = FULL_SIZES["replicas"]
    out["brokers"] = out["broker_sets"] * out["replicas"]
    return out


def set_name(index: int) -> str:
    return f"bs-{index:04d}"


def topic_name(index: int) -> str:
    return f"topic-{index:07d}"


def group_name(index: int) -> str:
    return f"group-{index:06d}"


def process_memory(pid: int) -> dict[str, float | None]:
    """VmRSS and VmHWM (peak RSS) of a process, in MB."""
    values: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                values["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                values["peak_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return values


def thread_count(pid: int) -> int | None:
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return None


# The broker fleet: processes that register brokers and heartbeat like broker agents ----------


def _fleet_process(
    brokers: list[tuple[str, int]], controllers: list[str], interval_ms: int, transport: str, conn
) -> None:
    """One load generator: registers `brokers` (broker set, replica number), then sends each
    one's heartbeat every interval (spread evenly), following the leader; obeys the parent.
    `transport` "stream": each broker on its own HeartbeatStream, waiting for each answer
    as the broker agent does; "unary": Heartbeat calls sent on schedule."""
    try:
        fleet = _Fleet(brokers, controllers, interval_ms, transport)
        fleet.run(conn)
    except BaseException as exc:  # report, never hang the parent
        try:
            conn.send(("error", repr(exc)))
        except OSError:
            pass


class _Fleet:
    def __init__(
        self, brokers: list[tuple[str, int]], controllers: list[str], interval_ms: int, transport: str
    ) -> None:
        import grpc

        from mqmeta.pb import controller_pb2_grpc

        self.transport = transport
        self.stopping = threading.Event()
        self.brokers = brokers
        self.controllers = controllers
        self.interval_s = interval_ms / 1000
        self.ids: dict[tuple[str, int], int] = {}
        self.requests: dict[tuple[str, int], Any] = {}
        self.channels = {a: grpc.insecure_channel(a) for a in controllers}
        self.stubs = {a: controller_pb2_grpc.ControllerServiceStub(c) for a, c in self.channels.items()}
        self.target = controllers[0]
        self.lock = threading.Lock()
        self.samples: list[tuple[float, float, str]] = []  # (sent wall time, latency s, error code)
        self.outstanding = 0
        self.skipped = 0

    def register(self) -> None:
        from mqmeta.client import ControllerClient
        from mqmeta.pb import controller_pb2 as pb

        def one(broker: tuple[str, int]) -> None:
            name, replica = broker
            with ControllerClient(self.controllers, timeout_s=20.0) as client:
                reply = client.register_broker(
                    pb.RegisterBrokerRequest(
                        cluster=CLUSTER,
                        broker_name=name,
                        broker_id=0,
                        check_code=f"{name}-{replica}",
                        address=f"127.0.0.1:{20000 + replica}",
                        election_priority=replica,
                    ),
                )
            with self.lock:
                self.ids[broker] = reply.broker_id

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, self.brokers))

    def registered(self) -> list[tuple[str, int, int]]:
        return [(name, replica, self.ids[(name, replica)]) for name, replica in self.brokers]

    def run(self, conn) -> None:
        """Registers the brokers in a thread while heartbeating the ones registered so far
        (a broker that registered and then stays silent for 3 s is dead); reports the ids
        once every broker is registered, then obeys the parent."""
        registering = threading.Thread(target=self.register, name="register", daemon=True)
        registering.start()
        streaming = threading.Thread(target=lambda: asyncio.run(self._streams()), name="streams", daemon=True)
        streaming.start()
        try:
            self._run(conn, registering)
        finally:
            self.stopping.set()
            streaming.join(timeout=5.0)

    def _run(self, conn, registering: threading.Thread) -> None:
        reported = False
        position = 0
        next_at = time.monotonic()
        for _ in range(10**9):
            if not reported and not registering.is_alive():
                if len(self.ids) < len(self.brokers):
                    conn.send(("error", "registration failed (see the fleet's stderr)"))
                    return
                conn.send(("ok", self.registered()))
                reported = True
            if reported and conn.poll(0) and not self._command(conn):
                return
            now = time.monotonic()
            step = self.interval_s / len(self.brokers)
            while next_at <= now:  # send every heartbeat that is due (streams send their own)
                request = self._request(self.brokers[position % len(self.brokers)])
                if request is not None and self.transport == "unary":
                    self._send(request)
                position += 1
                next_at += step
            time.sleep(min(0.005, max(0.0, next_at - time.monotonic())))

    def _request(self, broker: tuple[str, int]):
        from mqmeta.pb import controller_pb2 as pb

        broker_id = self.ids.get(broker)
        if broker_id is None:
            return None
        request = self.requests.get(broker)
        if request is None:
            request = self.requests[broker] = pb.HeartbeatRequest(
                cluster=CLUSTER,
                broker_name=broker[0],
                broker_id=broker_id,
                epoch=1,
                max_offset=1000,
                confirm_offset=1000,
                election_priority=broker[1],
            )
        return request

    def _send(self, request) -> None:
        if self.outstanding >= 4 * len(self.brokers):
            self.skipped += 1  # the controller is not answering: do not pile up calls
            return
        sent_wall, sent = time.time(), time.perf_counter()
        target = self.target
        future = self.stubs[target].Heartbeat.future(request, timeout=HEARTBEAT_TIMEOUT_S)
        with self.lock:
            self.outstanding += 1
        future.add_done_callback(lambda f: self._done(f, target, sent_wall, sent))

    def _done(self, future, target: str, sent_wall: float, sent: float) -> None:
        latency = time.perf_counter() - sent
        code = ""
        try:
            future.result()
        except Exception as exc:  # grpc.RpcError; anything else counts as an error too
            code = self._failed(exc, target)
        with self.lock:
            self.outstanding -= 1
        self._sample(sent_wall, latency, code)

    def _failed(self, exc: BaseException, target: str) -> str:
        """The error's code; points the fleet at the leader it names, or the next node."""
        from mqmeta.rpc import from_rpc_error

        error = from_rpc_error(exc) if hasattr(exc, "code") else None  # type: ignore[arg-type]
        if error is not None and error.leader in self.stubs:
            self.target = error.leader
        elif target == self.target:
            index = self.controllers.index(target)
            self.target = self.controllers[(index + 1) % len(self.controllers)]
        return error.code if error is not None else type(exc).__name__

    def _sample(self, sent_wall: float, latency: float, code: str) -> None:
        with self.lock:
            if len(self.samples) < SAMPLES_MAX:
                self.samples.append((sent_wall, latency, code))

    async def _streams(self) -> None:
        """Every broker's HeartbeatStream (grpc.aio: no thread per stream), each started at
        its place in the interval as the unary schedule spreads them."""
        import grpc.aio

        from mqmeta.pb import controller_pb2_grpc

        channels = {a: grpc.aio.insecure_channel(a) for a in self.controllers}
        stubs = {a: controller_pb2_grpc.ControllerServiceStub(c) for a, c in channels.items()}
        count = len(self.brokers)
        start = asyncio.get_running_loop().time()
        try:
            await asyncio.gather(
                *(self._stream(stubs, broker, start, k / count) for k, broker in enumerate(self.brokers))
            )
        finally:
            for channel in channels.values():
                await channel.close()

    async def _stream(
        self, stubs: dict[str, Any], broker: tuple[str, int], start: float, phase: float
    ) -> None:
        """One broker: a heartbeat every interval on its stream, each waiting for its answer
        (HEARTBEAT_TIMEOUT_S at most); a failed stream is dropped and the next heartbeat opens
        one to the node the error points at. Its heartbeats fall at `phase` (a fraction) of
        each interval counted from `start`, so the fleet's stay spread evenly when the
        interval changes. A heartbeat whose time passed while the previous one waited is
        skipped, as the agent's loop skips it."""
        import grpc.aio

        loop = asyncio.get_running_loop()

        def due_after(moment: float) -> float:
            interval = self.interval_s
            return start + (math.floor((moment - start) / interval - phase) + 1 + phase) * interval

        call, target = None, ""
        await asyncio.sleep(max(0.0, due_after(loop.time()) - loop.time()))
        while not self.stopping.is_set():
            request = self._request(broker)
            if self.transport != "stream" or request is None:
                if call is not None:
                    call.cancel()
                    call = None
                await asyncio.sleep(max(0.0, due_after(loop.time()) - loop.time()))
                continue
            if call is None:
                target = self.target
                call = stubs[target].HeartbeatStream()
            sent_wall, sent = time.time(), time.perf_counter()
            code = ""
            try:
                await call.write(request)
                reply = await asyncio.wait_for(call.read(), HEARTBEAT_TIMEOUT_S)
                if reply is grpc.aio.EOF:
                    raise RuntimeError("the controller ended the stream")
            except TimeoutError:
                code = "DEADLINE_EXCEEDED"
                self._failed(RuntimeError(code), target)
            except Exception as exc:  # grpc.aio.AioRpcError; a stream that ended
                code = self._failed(exc, target)
            if code:
                call.cancel()
                call = None
            self._sample(sent_wall, time.perf_counter() - sent, code)
            now = loop.time()
            next_at = due_after(now)
            missed = round((next_at - due_after(now - (time.perf_counter() - sent))) / self.interval_s) - 1
            self.skipped += max(0, missed)
            await asyncio.sleep(next_at - now)

    def _command(self, conn) -> bool:
        message = conn.recv()
        if message[0] == "stop":
            conn.send(("ok", None))
            return False
        if message[0] == "interval":
            self.interval_s = message[1] / 1000
            conn.send(("ok", None))
        elif message[0] == "transport":
            self.transport = message[1]
            conn.send(("ok", None))
        elif message[0] == "window":
            _, start_wall, end_wall = message
            with self.lock:
                window = [(lat, code) for t, lat, code in self.samples if start_wall <= t < end_wall]
                skipped = self.skipped
            conn.send(("ok", {"samples": window, "skipped": skipped}))
        else:
            conn.send(("error", f"unknown command {message[0]}"))
        return True


class ChildPool:
    """Spawned child processes, each obeying (command, ...) messages over a Pipe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[Any] = []
        self.conns: list[Any] = []

    def start(self, target, args_list: list[tuple]) -> None:
        ctx = mp.get_context("spawn")
        for i, args in enumerate(args_list):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*args, child), daemon=True, name=f"{self.name}-{i}")
            proc.start()
            self.procs.append(proc)
            self.conns.append(parent)

    def receive(self, index: int, timeout_s: float) -> Any:
        if not self.conns[index].poll(timeout_s):
            raise RuntimeError(f"{self.name} {index} did not answer within {timeout_s:.0f}s")
        status, payload = self.conns[index].recv()
        if status != "ok":
            raise RuntimeError(f"{self.name} {index}: {payload}")
        return payload

    def ask_all(self, message: tuple, timeout_s: float) -> list[Any]:
        for conn in self.conns:
            conn.send(message)
        return [self.receive(i, timeout_s) for i in range(len(self.conns))]

    def pids(self) -> dict[str, int]:
        return {f"{self.name}{i}": p.pid for i, p in enumerate(self.procs) if p.pid is not None}

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                try:
                    self.conns[i].send(("stop",))
                    self.receive(i, 5.0)
                except (RuntimeError, OSError, EOFError):
                    pass
        for proc in self.procs:
            proc.join(timeout=3.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self.procs, self.conns = [], []


class BrokerFleet(ChildPool):
    def __init__(self, sizes: dict[str, int], controllers: list[str]) -> None:
        super().__init__("fleet")
        brokers = [
            (set_name(s), r + 1) for s in range(sizes["broker_sets"]) for r in range(sizes["replicas"])
        ]
        self.brokers = brokers
        self.controllers = controllers
        count = max(1, -(-len(brokers) // FLEET_BROKERS_PER_PROCESS))
        self.parts = [brokers[i::count] for i in range(count)]

    def start_fleet(self, interval_ms: int, transport: str, timeout_s: float) -> list[tuple[str, int, int]]:
        self.start(_fleet_process, [(part, self.controllers, interval_ms, transport) for part in self.parts])
        registered: list[tuple[str, int, int]] = []
        for i in range(len(self.parts)):
            registered += self.receive(i, timeout_s)
        return registered

    def set_interval(self, interval_ms: int) -> None:
        self.ask_all(("interval", interval_ms), 10.0)

    def set_transport(self, transport: str) -> None:
        self.ask_all(("transport", transport), 10.0)

    def wait_heartbeating(self, brokers: int, timeout_s: float) -> dict[str, Any]:
        """Until the last second's heartbeats were all answered (every broker alive)."""
        deadline = time.monotonic() + timeout_s
        window: dict[str, Any] = {}
        for _ in range(10_000):
            time.sleep(0.5)
            now = time.time()
            window = self.window(now - 1.5, now - 0.5)
            if window.get("count", 0) >= brokers and not window["errors"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet's heartbeats are not all answered: {window}")
        return window

    def window(self, start_wall: float, end_wall: float) -> dict[str, Any]:
        """Heartbeats sent in [start, end): rate, latency of the answered ones, errors."""
        parts = self.ask_all(("window", start_wall, end_wall), 30.0)
        latencies = [lat for p in parts for lat, code in p["samples"] if not code]
        errors = collections.Counter(code for p in parts for _, code in p["samples"] if code)
        seconds = max(1e-6, end_wall - start_wall)
        out = {
            "heartbeats_per_s": _r(len(latencies) / seconds, 1),
            "sent_per_s": _r(sum(len(p["samples"]) for p in parts) / seconds, 1),
            "errors": dict(errors),
            "skipped_total": sum(p["skipped"] for p in parts),
        }
        out.update(latency_summary(latencies, with_min=False))
        return out


# Watchers: processes holding many Watch streams (grpc.aio: no thread per stream here) -------


def _watch_process(address: str, filters: list[tuple[str, str]], stagger_s: float, conn) -> None:
    try:
        asyncio.run(_Watchers(address, filters, stagger_s).run(conn))
    except BaseException as exc:
        try:
            conn.send(("error", repr(exc)))
        except OSError:
            pass


class _Watchers:
    """Watch streams of one process, one per (cluster, broker name) filter."""

    def __init__(self, address: str, filters: list[tuple[str, str]], stagger_s: float) -> None:
        self.address = address
        self.filters = filters
        self.stagger_s = stagger_s  # stream k subscribes k * stagger_s after the first
        self.first_event: dict[int, float] = {}  # stream -> wall time of its first event
        self.subscribed: dict[int, float] = {}  # stream -> wall time it called Watch
        self.snapshot_events: collections.Counter = collections.Counter()
        self.ended: dict[int, str] = {}
        self.events: dict[str, dict[str, float]] = collections.defaultdict(dict)  # event -> stream -> wall
        self.topic_events: collections.Counter = collections.Counter()

    async def run(self, conn) -> None:
        import grpc

        from mqmeta.pb import controller_pb2 as pb
        from mqmeta.pb import controller_pb2_grpc

        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = controller_pb2_grpc.ControllerServiceStub(channel)
            tasks = [asyncio.create_task(self._stream(stub, pb, k, f)) for k, f in enumerate(self.filters)]
            conn.send(("ok", "started"))
            loop = asyncio.get_running_loop()
            for _ in range(10**7):
                ready = await loop.run_in_executor(None, conn.poll, 0.2)
                if ready and not self._command(conn.recv(), conn):
                    break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream(self, stub, pb, k: int, stream_filter: tuple[str, str]) -> None:
        await asyncio.sleep(k * self.stagger_s)
        self.subscribed[k] = time.time()
        call = stub.Watch(pb.WatchRequest(cluster=stream_filter[0], broker_name=stream_filter[1]))
        try:
            async for event in call:
                now = time.time()
                self.first_event.setdefault(k, now)
                if event.kind == "snapshot":
                    self.snapshot_events[k] += 1
                elif event.kind == "topic":
                    self.topic_events[k] += 1
                else:
                    key = event_key(event.kind, event.broker_name, event.replica_info.master_epoch)
                    self.events[key].setdefault(str(k), now)
            self.ended[k] = "end of stream"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # grpc.aio.AioRpcError: the server ended or refused it
            code = exc.code().name if hasattr(exc, "code") else type(exc).__name__
            self.ended[k] = code

    def _command(self, message: tuple, conn) -> bool:
        kind = message[0]
        if kind == "stop":
            conn.send(("ok", None))
            return False
        if kind == "status":
            conn.send(
                (
                    "ok",
                    {
                        "streams": len(self.filters),
                        "with_first_event": len(self.first_event),
                        "first_event_walls": sorted(self.first_event.values()),
                        "first_event_after_subscribing": [
                            t - self.subscribed[k]
                            for k, t in self.first_event.items()
                            if k in self.subscribed
                        ],
                        "snapshot_events": dict(self.snapshot_events),
                        "topic_events": sum(self.topic_events.values()),
                        "ended": collections.Counter(self.ended.values()),
                        "ended_count": len(self.ended),
                    },
                )
            )
        elif kind == "event":
            conn.send(("ok", dict(self.events.get(message[1], {}))))
        else:
            conn.send(("error", f"unknown command {kind}"))
        return True


class WatchFleet(ChildPool):
    """Watch streams on one controller node, from a few processes (grpc.aio: no thread per
    stream on this side either). style "broker": stream k watches the broker set of
    broker k, as a broker agent does, all subscribing at once (as after a leader change);
    style "cluster": every stream watches the whole cluster (each one's first message is
    every broker set), subscribing at WATCH_CLUSTER_OPEN_PER_S."""

    def __init__(self, address: str, sizes: dict[str, int], style: str, streams: int) -> None:
        super().__init__("watch")
        replicas = sizes["replicas"]
        if style == "broker":
            self.filters = [
                (CLUSTER, set_name((k // replicas) % sizes["broker_sets"])) for k in range(streams)
            ]
        else:
            self.filters = [(CLUSTER, "")] * streams
        count = max(1, -(-streams // WATCH_STREAMS_PER_PROCESS))
        self.parts = [self.filters[i::count] for i in range(count)]
        self.address = address
        self.streams = streams
        self.style = style

    def watching(self, broker_name: str) -> int:
        """How many streams should get an event of this broker set."""
        return sum(1 for _, name in self.filters if name in ("", broker_name))

    def snapshot_events_expected(self, sets: int) -> int:
        return 1 if self.style == "broker" else sets

    def open(self) -> None:
        stagger_s = len(self.parts) / WATCH_CLUSTER_OPEN_PER_S if self.style == "cluster" else 0.0
        self.start(_watch_process, [(self.address, part, stagger_s) for part in self.parts])
        for i in range(len(self.parts)):
            self.receive(i, 60.0)

    def status(self) -> dict[str, Any]:
        parts = self.ask_all(("status",), 30.0)
        ended: collections.Counter = collections.Counter()
        for p in parts:
            ended.update(p["ended"])
        return {
            "streams": sum(p["streams"] for p in parts),
            "with_first_event": sum(p["with_first_event"] for p in parts),
            "first_event_walls": sorted(w for p in parts for w in p["first_event_walls"]),
            "first_event_after_subscribing": [s for p in parts for s in p["first_event_after_subscribing"]],
            "snapshot_counts": [n for p in parts for n in p["snapshot_events"].values()],
            "topic_events": sum(p["topic_events"] for p in parts),
            "ended": dict(ended),
            "ended_count": sum(p["ended_count"] for p in parts),
        }

    def event_times(self, key: str) -> list[float]:
        return [w for part in self.ask_all(("event", key), 30.0) for w in part.values()]


def event_key(kind: str, broker_name: str, master_epoch: int) -> str:
    return f"{kind}/{broker_name}/{master_epoch}"


# Monitors running through the whole bench -------------------------------------------------


class SnapshotMonitor:
    """Polls each node's data directory: a snapshot is being written while raft.snapshot.tmp
    exists (pysyncobj writes there, then renames); records each one's lifetime and size."""

    POLL_S = 0.01

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs
        self.done: list[dict[str, Any]] = []
        self.open: dict[str, float] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="snapshot-monitor", daemon=True)

    def start(self) -> SnapshotMonitor:
        self.thread.start()
        return self

    def _run(self) -> None:
        last = {n: self._stat(d / "raft.snapshot") for n, d in self.dirs.items()}
        for _ in range(10**8):
            if self.stop_event.wait(self.POLL_S):
                return
            for node, directory in self.dirs.items():
                writing = (directory / "raft.snapshot.tmp").exists()
                now = time.monotonic()
                if writing and node not in self.open:
                    self.open[node] = now
                current = self._stat(directory / "raft.snapshot")
                if current != last[node] and current is not None:
                    started = self.open.pop(node, None)
                    self.done.append(
                        {
                            "node": node,
                            "at": now,
                            "write_s": None if started is None else _r(now - started, 3),
                            "bytes": current[1],
                        }
                    )
                    last[node] = current
                elif not writing and node in self.open and now - self.open[node] > 600:
                    self.open.pop(node)

    @staticmethod
    def _stat(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=2.0)


class LeaderMonitor:
    """Polls every node's GetMetadata (leader, term) so that each phase can report leader
    changes (a node stalled by a snapshot loses its leadership)."""

    POLL_S = 0.25

    def __init__(self, addresses: dict[str, str]) -> None:
        self.addresses = addresses
        self.samples: list[tuple[float, str, str, int]] = []  # (monotonic, node, leader, term)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="leader-monitor", daemon=True)

    def start(self) -> LeaderMonitor:
        self.thread.start()
        return self

    def _run(self) -> None:
        from mqmeta.client import ControllerClient
        from mqmeta.errors import MqmetaError
        from mqmeta.pb import controller_pb2 as pb

        clients = {n: ControllerClient([a], timeout_s=0.5) for n, a in self.addresses.items()}
        try:
            for _ in range(10**7):
                if self.stop_event.wait(self.POLL_S):
                    return
                for node, client in clients.items():
                    try:
                        meta = client.get_metadata(pb.GetMetadataRequest())
                    except MqmetaError:
                        continue
                    self.samples.append((time.monotonic(), node, meta.leader_id, meta.term))
        finally:
            for client in clients.values():
                client.close()

    def changes(self, start: float, end: float) -> dict[str, Any]:
        window = [s for s in self.samples if start <= s[0] <= end]
        terms = sorted({s[3] for s in window})
        leaders = sorted({s[2] for s in window if s[2]})
        return {"terms_seen": terms, "leaders_seen": leaders, "leader_changes": max(0, len(terms) - 1)}

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=3.0)


# The cluster under test --------------------------------------------------------------------


class ScaleCluster:
    """3 controllers and a standalone nameserver (cluster.harness), plus the bench's views."""

    def __init__(self, root: Path, raft_settings: dict[str, Any]) -> None:
        from mqmeta.cluster.harness import Cluster

        self.harness = Cluster(root / "cluster", raft_settings=raft_settings)
        self.ids = [n.id for n in self.harness.layout.controllers]

    def start(self) -> None:
        from mqmeta.cluster.ready import wait_ready

        self.harness.start()
        self.harness.start_namesrv()
        wait_ready(self.harness.addresses, self.harness.layout.namesrv, timeout_s=60.0)

    def stop(self) -> None:
        self.harness.stop()

    @property
    def namesrv(self) -> str:
        return self.harness.layout.namesrv[0]

    def grpc(self, node_id: str) -> str:
        return self.harness.node(node_id).grpc

    def addresses(self) -> list[str]:
        return [self.grpc(n) for n in self.ids]

    def data_dirs(self) -> dict[str, Path]:
        return {n: self.harness.root / self.harness.node(n).data_dir for n in self.ids}

    def pid(self, name: str) -> int | None:
        proc = self.harness.supervisor.children.get(name)
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self) -> dict[str, int]:
        return {n: p for n in [*self.ids, "namesrv"] if (p := self.pid(n)) is not None}

    def leader(self, timeout_s: float = 30.0) -> str:
        return self.harness.leader_id(timeout_s=timeout_s)

    def leader_client(self, timeout_s: float = 30.0):
        from mqmeta.client import ControllerClient

        leader = self.leader()
        others = [self.grpc(n) for n in self.ids if n != leader]
        return ControllerClient([self.grpc(leader), *others], timeout_s=timeout_s)


def _metadata(address: str, timeout_s: float = 2.0):
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    with ControllerClient([address], timeout_s=timeout_s) as client:
        return client.get_metadata(pb.GetMetadataRequest())


# Phase: load ---------------------------------------------------------------------------------


def elect_and_sync(cluster: ScaleCluster, registered: list[tuple[str, int, int]]) -> dict[str, Any]:
    """First election per broker set (requester: replica 1), then all replicas in sync."""
    from mqmeta.pb import controller_pb2 as pb

    ids: dict[str, list[int]] = collections.defaultdict(list)
    first: dict[str, int] = {}
    for name, replica, broker_id in registered:
        ids[name].append(broker_id)
        if replica == 1:
            first[name] = broker_id
    t0 = time.monotonic()

    def one(name: str) -> None:
        from mqmeta.errors import FailedPrecondition

        for attempt in range(ELECT_ATTEMPTS_MAX):  # a heartbeat queued behind others may be late
            try:
                return elect_one(name)
            except FailedPrecondition:
                if attempt == ELECT_ATTEMPTS_MAX - 1:
                    raise
                time.sleep(1.0)

    def elect_one(name: str) -> None:
        with cluster.leader_client() as client:
            info = client.elect_master(
                pb.ElectMasterRequest(
                    cluster=CLUSTER,
                    broker_name=name,
                    trigger=pb.ELECT_TRIGGER_BROKER,
                    requester_broker_id=first[name],
                ),
            )
            client.alter_sync_state_set(
                pb.AlterSyncStateSetRequest(
                    cluster=CLUSTER,
                    broker_name=name,
                    master_broker_id=info.master_broker_id,
                    master_epoch=info.master_epoch,
                    sync_state_set_epoch=info.sync_state_set_epoch,
                    new_sync_state_set=sorted(ids[name]),
                ),
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, sorted(ids)))
    return {"broker_sets": len(ids), "elect_and_sync_s": _r(time.monotonic() - t0, 2)}


def _write_batches(cluster: ScaleCluster, ops: list[Any], threads: int, what: str) -> dict[str, Any]:
    """Sends `ops` (WriteOps) as Write batches of WRITE_BATCH from `threads` clients."""
    from mqmeta.pb import controller_pb2 as pb

    batches = [ops[i : i + WRITE_BATCH] for i in range(0, len(ops), WRITE_BATCH)]
    errors: collections.Counter = collections.Counter()
    lock = threading.Lock()
    leader = cluster.leader()
    commit0 = _metadata(cluster.grpc(leader)).commit_index
    t0 = time.monotonic()

    def run(k: int) -> None:
        with cluster.leader_client(timeout_s=60.0) as client:
            for batch in batches[k::threads]:
                results = client.write(pb.WriteBatch(writes=batch), timeout_s=60.0).results
                failed = [r.error_code for r in results if r.error_code]
                if failed:
                    with lock:
                        errors.update(failed)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(threads)))
    seconds = time.monotonic() - t0
    commit1 = _metadata(cluster.grpc(leader)).commit_index
    entries = commit1 - commit0
    log(f"{what}: {len(ops)} writes in {seconds:.1f}s ({len(ops) / seconds:.0f}/s), {entries} entries")
    return {
        "writes": len(ops),
        "seconds": _r(seconds, 2),
        "writes_per_s": _r(len(ops) / seconds, 1),
        "raft_entries": entries,
        "raft_entries_per_s": _r(entries / seconds, 1),
        "writes_per_entry": _r(len(ops) / max(1, entries), 1),
        "errors": dict(errors),
    }


def topic_ops(sizes: dict[str, int]) -> list[Any]:
    from mqmeta.pb import controller_pb2 as pb

    sets = sizes["broker_sets"]
    return [
        pb.WriteOp(
            create_topic=pb.TopicSpec(
                name=topic_name(i),
                cluster=CLUSTER,
                queue_count=sizes["queues"],
                broker_names=sorted({set_name((i + k) % sets) for k in range(SETS_PER_TOPIC)}),
            )
        )
        for i in range(sizes["topics"])
    ]


def group_ops(sizes: dict[str, int]) -> list[Any]:
    from mqmeta.pb import controller_pb2 as pb

    topics = sizes["topics"]
    return [
        pb.WriteOp(
            create_group=pb.GroupSpec(
                name=group_name(i),
                subscriptions=[
                    pb.Subscription(topic=topic_name(i % topics), expression="*"),
                    pb.Subscription(topic=topic_name((7 * i + 1) % topics), expression="TagA || TagB"),
                ],
            )
        )
        for i in range(sizes["groups"])
    ]


def journal_bytes(cluster: ScaleCluster, node: str) -> int:
    try:
        return (cluster.data_dirs()[node] / "raft.journal").stat().st_size
    except OSError:
        return 0


def liveness_config(interval_ms: int) -> dict[str, str]:
    """The controllers' liveness settings for a fleet heartbeating every `interval_ms`:
    none to change at the default interval; otherwise dead-after at least 4 intervals (the
    controllers refuse less than 3), never below its default."""
    if interval_ms == DEFAULT_HEARTBEAT_INTERVAL_MS:
        return {}
    dead_after = max(CONFIG_SCHEMA["broker_dead_after_ms"][1], 4 * interval_ms)
    return {"broker_heartbeat_interval_ms": str(interval_ms), "broker_dead_after_ms": str(dead_after)}


def load_phase(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args) -> dict[str, Any]:
    from mqmeta.pb import controller_pb2 as pb

    t0 = time.monotonic()
    config = liveness_config(args.heartbeat_interval_ms)
    if config:  # what a real broker would read from the controllers and follow
        with cluster.leader_client() as client:
            client.update_config(pb.UpdateConfigRequest(values=config))
    registered = fleet.start_fleet(args.heartbeat_interval_ms, args.heartbeat_transport, timeout_s=300.0)
    out: dict[str, Any] = {
        "liveness_config": config or "the defaults",
        "brokers_registered": len(registered),
        "register_s": _r(time.monotonic() - t0, 2),
    }
    out["heartbeating"] = fleet.wait_heartbeating(len(registered), timeout_s=60.0)
    log(f"registered {len(registered)} brokers in {out['register_s']}s; electing masters")
    out.update(elect_and_sync(cluster, registered))
    leader = cluster.leader()
    bytes0 = journal_bytes(cluster, leader)
    loading_from = time.time()
    out["topics"] = _write_batches(cluster, topic_ops(sizes), args.load_threads, "topics")
    # sent below the offered rate: the fleet was late; answered late: the leader was
    out["heartbeats_during_topic_load"] = dict(
        fleet.window(loading_from, time.time()),
        offered_per_s=_r(len(registered) * 1000 / args.heartbeat_interval_ms, 1),
    )
    grown = journal_bytes(cluster, leader) - bytes0
    if grown > 0 and out["topics"]["raft_entries"]:
        out["topics"]["entry_bytes_mean"] = round(grown / out["topics"]["raft_entries"])
    out["groups"] = _write_batches(cluster, group_ops(sizes), args.load_threads, "groups")
    out["registered"] = registered
    return out


# Phase: verify -------------------------------------------------------------------------------

BIG_MESSAGE_BYTES = 512 << 20


def _big_stub(address: str):
    """A stub whose channel accepts replies up to 512 MB (gRPC's default limit is 4 MB)."""
    import grpc

    from mqmeta.pb import controller_pb2_grpc

    options = [("grpc.max_receive_message_length", BIG_MESSAGE_BYTES)]
    channel = grpc.insecure_channel(address, options=options)
    return channel, controller_pb2_grpc.ControllerServiceStub(channel)


def _timed_list(stub, method: str, request, field: str) -> tuple[list[Any], dict[str, Any]]:
    t0 = time.perf_counter()
    reply = getattr(stub, method)(request, timeout=120.0)
    seconds = time.perf_counter() - t0
    items = list(getattr(reply, field))
    return items, {"count": len(items), "seconds": _r(seconds, 3), "reply_bytes": reply.ByteSize()}


def _default_client_lists_topics(address: str) -> dict[str, Any]:
    """What an unmodified client (mqmeta admin topic list) gets: gRPC's 4 MB reply limit."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    try:
        with ControllerClient([address], timeout_s=120.0) as client:
            count = len(client.list_topics(pb.ListTopicsRequest()).topics)
        return {"ok": True, "count": count}
    except MqmetaError as exc:
        return {"ok": False, "error": f"{exc.code}: {exc.message[:200]}"}


def verify_phase(cluster: ScaleCluster, sizes: dict[str, int]) -> dict[str, Any]:
    from mqmeta.pb import controller_pb2 as pb

    leader = cluster.leader()
    channel, stub = _big_stub(cluster.grpc(leader))
    try:
        topics, topics_call = _timed_list(stub, "ListTopics", pb.ListTopicsRequest(), "topics")
        groups, groups_call = _timed_list(stub, "ListGroups", pb.ListGroupsRequest(), "groups")
        sets, sets_call = _timed_list(
            stub, "ListBrokerSets", pb.ListBrokerSetsRequest(cluster=CLUSTER), "broker_sets"
        )
        expected_topics = {topic_name(i) for i in range(sizes["topics"])}
        routes_ok = 0
        picks = random.Random(7).sample(range(sizes["topics"]), min(20, sizes["topics"]))
        for i in picks:
            route = stub.GetTopicRoute(pb.NameRequest(name=topic_name(i)), timeout=10.0)
            full = len(route.queues) == min(SETS_PER_TOPIC, sizes["broker_sets"]) and all(
                q.write_queue_count == sizes["queues"] for q in route.queues
            )
            routes_ok += int(full and all(b.master_address for b in route.brokers))
    finally:
        channel.close()
    out = {
        "topics": {"expected": sizes["topics"], "read_back": len(topics), "list_call": topics_call},
        "topic_names_match": {t.name for t in topics if t.name.startswith("topic-")} == expected_topics,
        "queues_per_topic": sorted({t.queue_count for t in topics}),
        "groups": {"expected": sizes["groups"], "read_back": len(groups), "list_call": groups_call},
        "subscriptions_read_back": sum(len(g.subscriptions) for g in groups),
        "broker_sets": {"expected": sizes["broker_sets"], "read_back": len(sets), "list_call": sets_call},
        "replicas_read_back": sum(len(s.replicas) for s in sets),
        "sets_with_master": sum(1 for s in sets if s.master_broker_id),
        "sets_all_in_sync": sum(1 for s in sets if len(s.sync_state_set) == sizes["replicas"]),
        "sample_routes_complete": f"{routes_ok}/{len(picks)}",
        "default_client_list_topics": _default_client_lists_topics(cluster.grpc(leader)),
    }
    out["state_digests"] = same_digests(cluster)
    return out


def same_digests(cluster: ScaleCluster, timeout_s: float = 60.0) -> dict[str, Any]:
    """Every node answers a linearizable read, then reports the same (applied index, digest)."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    deadline = time.monotonic() + timeout_s
    seen: dict[str, tuple[int, str]] = {}
    for _ in range(1000):
        try:
            for node in cluster.ids:
                with ControllerClient([cluster.grpc(node)], timeout_s=10.0) as client:
                    client.get_config(pb.GetConfigRequest())
            metas = {n: _metadata(cluster.grpc(n)) for n in cluster.ids}
        except MqmetaError:
            metas = {}
        seen = {n: (m.last_applied, m.state_digest) for n, m in metas.items()}
        if len(seen) == len(cluster.ids) and len(set(seen.values())) == 1:
            index, digest = next(iter(seen.values()))
            return {"equal": True, "last_applied": index, "digest": digest[:16]}
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"equal": False, "seen": {n: [i, d[:16]] for n, (i, d) in seen.items()}}


# Phases: heartbeat load, route reads, heartbeat capacity --------------------------------------


def _error_name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError
        return str(code().name)
    return str(code or type(exc).__name__)


def _sequential(call, count: int, time_limit_s: float, stop: threading.Event | None = None) -> dict[str, Any]:
    """call(i) up to `count` times, `time_limit_s` or `stop`; latency summary and errors."""
    latencies: list[float] = []
    errors: collections.Counter = collections.Counter()
    deadline = time.monotonic() + time_limit_s
    for i in range(count):
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            break
        t0 = time.perf_counter()
        try:
            call(i)
        except Exception as exc:  # grpc.RpcError or MqmetaError: counted, not fatal
            errors[_error_name(exc)] += 1
            continue
        latencies.append(time.perf_counter() - t0)
    out = latency_summary(latencies)
    out["errors"] = dict(errors)
    return out


def _route_caller(address: str, topics: int, seed: int):
    import grpc

    from mqmeta.pb import namesrv_pb2 as ns_pb
    from mqmeta.pb import namesrv_pb2_grpc as ns_grpc

    channel = grpc.insecure_channel(address)
    stub = ns_grpc.NameServerStub(channel)
    rng = random.Random(seed)
    stub.QueryRoute(ns_pb.QueryRouteRequest(topic=topic_name(0)), timeout=10.0)  # connect first

    def call(i: int) -> None:
        stub.QueryRoute(ns_pb.QueryRouteRequest(topic=topic_name(rng.randrange(topics))), timeout=5.0)

    return channel, call


def _concurrent_routes(address: str, topics: int, clients: int, seconds: float) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    lat_all: list[float] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        channel, call = _route_caller(address, topics, 100 + k)
        local: list[float] = []
        try:
            deadline = time.monotonic() + seconds
            for i in range(1_000_000):
                if time.monotonic() > deadline:
                    break
                t0 = time.perf_counter()
                call(i)
                local.append(time.perf_counter() - t0)
        finally:
            channel.close()
        with lock:
            lat_all.extend(local)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, range(clients)))
    out = latency_summary(lat_all)
    out["clients"] = clients
    out["reads_per_s"] = _r(len(lat_all) / seconds, 1)
    results.append(out)
    return out


def _baselines_for_routes(cluster: ScaleCluster, topics: int, count: int, limit_s: float) -> dict[str, Any]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from mqmeta.pb import controller_pb2 as pb
    from mqmeta.pb import controller_pb2_grpc

    out: dict[str, Any] = {}
    with grpc.insecure_channel(cluster.namesrv) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        out["nameserver_health_check"] = _sequential(
            lambda i: health.Check(request, timeout=5.0), count, limit_s
        )
    leader = cluster.grpc(cluster.leader())
    rng = random.Random(3)
    with grpc.insecure_channel(leader) as channel:
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        out["leader_get_topic_route"] = _sequential(
            lambda i: stub.GetTopicRoute(pb.NameRequest(name=topic_name(rng.randrange(topics))), timeout=5.0),
            count,
            limit_s,
        )
        out["leader_get_config"] = _sequential(
            lambda i: stub.GetConfig(pb.GetConfigRequest(), timeout=5.0), count, limit_s
        )
    out["what"] = (
        "nameserver_health_check: the gRPC round trip to the nameserver, no work; "
        "leader_get_topic_route: the controller's part of a route read (barrier + route); "
        "leader_get_config: a linearizable read of almost nothing (the barrier alone)"
    )
    return out


def heartbeat_and_route_phase(
    cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args, root: Path
) -> dict[str, Any]:
    pids = dict(cluster.pids(), **fleet.pids())
    time.sleep(args.warmup_s)  # the fleet was just (re)started or re-rated
    t0 = time.monotonic()
    heartbeat, cpu = one_leader_window(cluster, fleet, pids, args.phase_s, "heartbeats")
    leader = heartbeat["leader"]
    heartbeat["cpu_percent"] = cpu
    if heartbeat["heartbeats_per_s"] and heartbeat["leader_cpu_percent"] is not None:
        heartbeat["leader_cpu_ms_per_heartbeat"] = _r(
            10.0 * heartbeat["leader_cpu_percent"] / heartbeat["heartbeats_per_s"]
        )
    heartbeat["seconds"] = _r(time.monotonic() - t0, 1)
    rate, p99 = heartbeat["heartbeats_per_s"], heartbeat.get("p99_ms")
    log(f"heartbeats: {rate}/s p99 {p99} ms, leader CPU {heartbeat['leader_cpu_percent']}%")

    route: dict[str, Any] = {}
    profile_out = root / "profile-route.txt"
    profiler = profile_start(pids[leader], profile_out) if args.profile else None
    start_wall = time.time()
    meter = CpuMeter(pids)
    channel, call = _route_caller(cluster.namesrv, sizes["topics"], 1)
    try:
        route["sequential"] = _sequential(call, args.route_reads, args.phase_s)
    finally:
        channel.close()
    route["concurrent"] = _concurrent_routes(
        cluster.namesrv, sizes["topics"], args.route_clients, args.phase_s
    )
    route["cpu_percent"] = meter.stop()
    route["heartbeats_meanwhile"] = fleet.window(start_wall, time.time())
    route["leader_profile"] = profile_stop(profiler, profile_out) if args.profile else {"skipped": True}
    route["baselines"] = _baselines_for_routes(
        cluster, sizes["topics"], args.route_reads // 2, args.phase_s / 2
    )
    route["change_seen_by_nameserver"] = _route_change_delays(cluster, sizes["topics"], ROUTE_CHANGES)
    seq = route["sequential"]
    log(f"route via nameserver: p50 {seq.get('p50_ms')} p99 {seq.get('p99_ms')} ms; errors {seq['errors']}")
    return {"heartbeat": heartbeat, "route": route}


ROUTE_CHANGES = 10
ROUTE_CHANGE_WAIT_S = 10.0


def _route_change_delays(cluster: ScaleCluster, topics: int, count: int) -> dict[str, Any]:
    """The nameserver answers from a watched copy: how long after an UpdateTopic call
    returned its route shows the change (polled every ms through the nameserver). The copy
    does not answer a topic between the event and its reload (the barrier read does), so
    this is the delay a client can see, not only the copy's."""
    import grpc

    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb
    from mqmeta.pb import namesrv_pb2 as ns_pb
    from mqmeta.pb import namesrv_pb2_grpc as ns_grpc

    delays: list[float] = []
    missed = 0
    rng = random.Random(11)
    with ControllerClient(cluster.addresses()) as client, grpc.insecure_channel(cluster.namesrv) as channel:
        stub = ns_grpc.NameServerStub(channel)
        for _ in range(count):
            name = topic_name(rng.randrange(topics))
            before = stub.QueryRoute(ns_pb.QueryRouteRequest(topic=name), timeout=5.0)
            queue_count = before.queues[0].read_queue_count + 1 if before.queues else 9
            client.update_topic(pb.TopicSpec(name=name, queue_count=queue_count))
            changed = time.monotonic()
            seen = None
            while time.monotonic() - changed < ROUTE_CHANGE_WAIT_S:
                route = stub.QueryRoute(ns_pb.QueryRouteRequest(topic=name), timeout=5.0)
                if route.queues and route.queues[0].read_queue_count == queue_count:
                    seen = time.monotonic() - changed
                    break
                time.sleep(0.001)
            if seen is None:
                missed += 1
            else:
                delays.append(seen)
    out = latency_summary(delays)
    out["not_seen_within_s"] = {"count": missed, "wait_s": ROUTE_CHANGE_WAIT_S}
    return out


LEADER_WINDOW_ATTEMPTS = 3


def one_leader_window(
    cluster: ScaleCluster, fleet: BrokerFleet, pids: dict[str, int], seconds: float, what: str
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """The fleet's heartbeat window of `seconds` and every process's CPU% in it, from a
    window with one leader throughout. A window in which the leader changed says nothing
    of one leader's CPU (a loaded 2-core machine may see an election): it is measured
    again, at most LEADER_WINDOW_ATTEMPTS times; the windows discarded are counted."""
    discarded = 0
    while True:
        leader = cluster.leader()
        start_wall = time.time()
        meter = CpuMeter(pids)
        busy0 = machine_busy()
        time.sleep(seconds)
        cpu = meter.stop()
        window = fleet.window(start_wall, time.time())
        window["leader"] = leader
        window["leader_cpu_percent"] = leader_cpu_of(cluster, leader, cpu)
        window["machine_busy_percent"] = machine_busy_percent(busy0)
        if window["leader_cpu_percent"] is not None or discarded + 1 == LEADER_WINDOW_ATTEMPTS:
            window["windows_discarded_leader_changed"] = discarded
            return window, cpu
        discarded += 1
        log(f"{what}: the leader changed in the window; measuring again")


def leader_cpu_of(cluster: ScaleCluster, leader: str, cpu: dict[str, float | None]) -> float | None:
    """The CPU% of the node that led for the whole window (`leader` at its start); None
    when the leader changed meanwhile, whose CPU would be some other node's."""
    try:
        still = cluster.leader(timeout_s=5.0) == leader
    except Exception:  # no leader within 5 s: the window had no single leader either
        still = False
    return cpu.get(leader) if still else None


def capacity_phase(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args) -> dict[str, Any]:
    """For each transport (the stream first, then the unary call as the same run's
    baseline): the heartbeat capacity steps below, and the leader's CPU per heartbeat."""
    out: dict[str, Any] = {}
    for transport in args.capacity_transports:
        fleet.set_transport(transport)
        out[transport] = _capacity_steps(cluster, fleet, sizes, args, transport)
    fleet.set_transport(args.heartbeat_transport)
    if {"stream", "unary"} <= out.keys():
        stream, unary = out["stream"], out["unary"]
        out["stream_to_unary"] = {
            "sustained_heartbeats_per_s": _ratio(
                stream["sustained_heartbeats_per_s"], unary["sustained_heartbeats_per_s"]
            ),
            "leader_cpu_us_per_heartbeat_first_step": _ratio(
                stream["steps"][0].get("leader_cpu_us_per_heartbeat"),
                unary["steps"][0].get("leader_cpu_us_per_heartbeat"),
            ),
        }
    out["note"] = "the fleet runs on the same 2 cores: its CPU is listed per step"
    return out


def _capacity_steps(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args, transport: str):
    """Shortens the fleet's heartbeat interval step by step; stops at the first step the
    leader does not keep up with (< 90% of the offered rate answered, or p99 > 100 ms)."""
    steps = []
    pids = dict(cluster.pids(), **fleet.pids())
    best = None
    for interval_ms in args.capacity_intervals:
        fleet.set_interval(interval_ms)
        time.sleep(args.warmup_s)
        window, cpu = one_leader_window(
            cluster, fleet, pids, args.capacity_s, f"capacity ({transport}) at {interval_ms} ms"
        )
        leader_cpu = window["leader_cpu_percent"]
        offered = sizes["brokers"] * 1000 / interval_ms
        answered = window["heartbeats_per_s"] or 0
        window.update(
            {
                "interval_ms": interval_ms,
                "offered_per_s": _r(offered, 1),
                # CPU percent of one core = 10,000 us per second
                "leader_cpu_us_per_heartbeat": _r(leader_cpu * 10_000 / answered, 1)
                if leader_cpu is not None and answered
                else None,
                "fleet_cpu_percent": _r(sum(v or 0 for k, v in cpu.items() if k.startswith("fleet")), 1),
            }
        )
        kept_up = answered >= 0.9 * offered and (window.get("p99_ms") or 1e9) <= 100
        window["kept_up"] = kept_up
        steps.append(window)
        log(
            f"capacity ({transport}): {interval_ms} ms -> {window['heartbeats_per_s']}/s "
            f"p99 {window.get('p99_ms')} ms, leader {window['leader_cpu_us_per_heartbeat']} us each"
        )
        if not kept_up:
            break
        best = window
    fleet.set_interval(args.heartbeat_interval_ms)
    time.sleep(args.warmup_s)
    return {
        "steps": steps,
        "sustained_heartbeats_per_s": best["heartbeats_per_s"] if best else None,
        "sustained_p99_ms": best.get("p99_ms") if best else None,
        "sustained_leader_cpu_percent": best["leader_cpu_percent"] if best else None,
    }


# Phase: snapshot -----------------------------------------------------------------------------


def snapshot_phase(
    cluster: ScaleCluster, monitor: SnapshotMonitor, leaders: LeaderMonitor, args, root: Path
) -> dict[str, Any]:
    """Linearizable reads on every node (each one a barrier entry) until every node has
    written a new snapshot; the longest read meanwhile is the stall a snapshot causes."""
    from mqmeta.client import ControllerClient
    from mqmeta.pb import controller_pb2 as pb

    before = len(monitor.done)
    logged_before = {node: len(lines) for node, lines in _snapshot_log_lines(cluster).items()}
    leader = cluster.leader()
    leader_pid = cluster.pid(leader)
    profile_out = root / "profile-snapshot.txt"
    profiler = profile_start(leader_pid, profile_out) if args.profile and leader_pid else None
    t0 = time.monotonic()
    stop = threading.Event()
    results: dict[str, dict[str, Any]] = {}

    def drive(node: str, k: int) -> None:
        with ControllerClient([cluster.grpc(node)], timeout_s=10.0) as client:
            results[f"{node}.{k}"] = _sequential(
                lambda i: client.get_config(pb.GetConfigRequest()),
                args.snapshot_reads_max,
                args.snapshot_s_max,
                stop,
            )

    def all_written() -> bool:
        return {d["node"] for d in monitor.done[before:]} >= set(cluster.ids)

    threads = [
        threading.Thread(target=drive, args=(n, k), daemon=True)
        for n in cluster.ids
        for k in range(SNAPSHOT_READERS_PER_NODE)
    ]
    for thread in threads:
        thread.start()
    for _ in range(100_000):
        if all_written() or time.monotonic() - t0 > args.snapshot_s_max:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # reads just after the snapshots finish show the tail of the stall
    stop.set()
    for thread in threads:
        thread.join(timeout=30.0)
    t1 = time.monotonic()
    written = monitor.done[before:]
    out: dict[str, Any] = {
        "snapshots": [dict(d, at_s=_r(d["at"] - t0, 2), at=None) for d in written],
        "all_nodes_wrote_one": all_written(),
        "seconds": _r(t1 - t0, 1),
        "reads_by_node": results,
        "longest_read_ms": max((r.get("max_ms") or 0 for r in results.values()), default=None),
        "leader_changes": leaders.changes(t0, t1),
    }
    for item in out["snapshots"]:
        item.pop("at")
    sizes = [d["bytes"] for d in written]
    times = [d["write_s"] for d in written if d["write_s"] is not None]
    # A snapshot written between two polls of the monitor (a small one, or a starved
    # monitor thread on a loaded machine) has no time from it: the controllers' own log
    # lines give each snapshot's write time then.
    logged = {
        node: lines[logged_before.get(node, 0) :] for node, lines in _snapshot_log_lines(cluster).items()
    }
    out["written_by_node_log"] = logged
    out["write_s_source"] = "monitor"
    if not times:
        times = [line["write_s"] for lines in logged.values() for line in lines]
        out["write_s_source"] = "node logs"
    out["snapshot_bytes"] = max(sizes) if sizes else None
    out["write_s_max"] = max(times) if times else None
    out["write_s_mean"] = _r(sum(times) / len(times), 3) if times else None
    if args.profile:
        out["leader_profile"] = profile_stop(profiler, profile_out)
    log(
        f"snapshot: {len(written)} written, {out['snapshot_bytes']} bytes, write {out['write_s_max']} s, "
        f"longest read {out['longest_read_ms']} ms, leader changes {out['leader_changes']['leader_changes']}"
    )
    return out


SNAPSHOT_LOG_LINE = re.compile(r"snapshot at index (\d+) written: (\d+) keys, (\d+) bytes in ([0-9.]+) s")


def _snapshot_log_lines(cluster: ScaleCluster) -> dict[str, list[dict[str, Any]]]:
    """Each node's snapshots as its log reports them (controller/snapshot.py), oldest first."""
    out: dict[str, list[dict[str, Any]]] = {}
    for node in cluster.ids:
        try:
            text = (cluster.harness.root / "logs" / f"{node}.log").read_text(errors="replace")
        except OSError:
            text = ""
        out[node] = [
            {"index": int(m[1]), "keys": int(m[2]), "bytes": int(m[3]), "write_s": float(m[4])}
            for m in SNAPSHOT_LOG_LINE.finditer(text)
        ]
    return out


def load_snapshot_state(path: Path) -> Any:
    """The ControllerState in a node's snapshot file, whichever format wrote it."""
    try:
        from mqmeta.controller.snapshot import read_state  # the controller's own reader, when it has one
    except ImportError:
        read_state = None
    if read_state is not None:
        return read_state(path)
    import pysyncobj.pickle as syncobj_pickle

    with gzip.open(path, "rb") as f:
        data = syncobj_pickle.loads(f.read())
    return data[0]["_state"]


def pickle_baseline(path: Path) -> dict[str, Any]:
    """Plain pickle/unpickle and gzip of the same state, in this process: what a snapshot
    costs at the least, and what pysyncobj's stock snapshot (gzip level 9) costs."""
    t0 = time.perf_counter()
    state = load_snapshot_state(path)
    out: dict[str, Any] = {"read_snapshot_file_s": _r(time.perf_counter() - t0, 3)}
    out["keys"] = len(state.entries)
    t0 = time.perf_counter()
    raw = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    out["pickle_s"] = _r(time.perf_counter() - t0, 3)
    out["pickle_bytes"] = len(raw)
    t0 = time.perf_counter()
    pickle.loads(raw)
    out["unpickle_s"] = _r(time.perf_counter() - t0, 3)
    for level in (9, 1):
        t0 = time.perf_counter()
        packed = gzip.compress(raw, compresslevel=level)
        out[f"gzip{level}_s"] = _r(time.perf_counter() - t0, 3)
        out[f"gzip{level}_bytes"] = len(packed)
    t0 = time.perf_counter()
    gzip.decompress(packed)
    out["gunzip_s"] = _r(time.perf_counter() - t0, 3)
    out["stock_pysyncobj_snapshot_s"] = _r(out["pickle_s"] + out["gzip9_s"], 3)
    out["what"] = (
        "stock_pysyncobj_snapshot_s: pickle + gzip level 9 (pysyncobj's Serializer), the time its "
        "tick thread is blocked when it writes a snapshot in-thread"
    )
    del state
    return out


# Phase: raw pysyncobj --------------------------------------------------------------------------


def _raw_node(index: int, addresses: list[str], secret: str, data_dir: str, conn) -> None:
    """A pysyncobj node with the controller's SyncObjConf whose replicated method stores
    nothing but the size of its argument; obeys the parent over a Pipe."""
    import mqmeta.controller.raft_node as raft_node
    from mqmeta.controller import pysyncobj_compat
    from pysyncobj import FAIL_REASON, replicated

    raft_node.install_pysyncobj_patches()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    conf = raft_node._syncobj_conf(raft_node.RaftSettings(secret=secret), Path(data_dir), addresses[index])

    class Sink(pysyncobj_compat.RaftFixes):  # the controller's two Raft fixes, nothing else
        def __init__(self) -> None:
            super().__init__(addresses[index], [a for a in addresses if a != addresses[index]], conf)
            self.bytes_applied = 0

        @replicated
        def put(self, payload: str) -> int:
            self.bytes_applied += len(payload)
            return self.bytes_applied

    node = Sink()
    try:
        for _ in range(10_000):
            if not conn.poll(120.0):
                return
            message = conn.recv()
            if message[0] == "stop":
                conn.send(("ok", None))
                return
            if message[0] == "is_leader":
                conn.send(("ok", pysyncobj_compat.is_leader(node)))
                continue
            if message[0] == "sequential":
                conn.send(("ok", _raw_sequential(node, message[1], message[2])))
                continue
            _, entry_bytes, window, seconds = message
            conn.send(("ok", _raw_window(node, "x" * entry_bytes, window, seconds, FAIL_REASON.SUCCESS)))
    finally:
        node.destroy()


def _raw_sequential(node, count: int, seconds: float) -> dict[str, Any]:
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


def _raw_window(node, payload: str, window: int, seconds: float, success: int) -> dict[str, Any]:
    slots = threading.BoundedSemaphore(window)
    done: list[float] = []
    errors = [0]

    def callback(result, error) -> None:
        if error == success:
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


def raw_phase(root: Path, entry_bytes: int, seconds: float) -> dict[str, Any]:
    from mqmeta.cluster.ports import PortReservation

    secret = (root / "cluster" / "secret").read_text().strip()
    with PortReservation.pick(3) as reserved:  # released before the raw nodes bind them
        addresses = reserved.addresses
    pool = ChildPool("raw")
    try:
        pool.start(_raw_node, [(i, addresses, secret, str(root / f"raw{i}")) for i in range(3)])
        leader = None
        deadline = time.monotonic() + 30.0
        while leader is None and time.monotonic() < deadline:
            for i in range(3):
                pool.conns[i].send(("is_leader",))
                if pool.receive(i, 10.0):
                    leader = i
            time.sleep(0.1)
        if leader is None:
            return {"error": "the raw pysyncobj cluster elected no leader in 30 s"}
        pool.conns[leader].send(("sequential", 100_000, seconds))
        out: dict[str, Any] = {"sequential_tiny_entries": pool.receive(leader, seconds + 60.0)}
        out.update({"entry_bytes": entry_bytes, "windows": []})
        for window in (1, 4):
            pool.conns[leader].send(("put", entry_bytes, window, seconds))
            result = pool.receive(leader, seconds + 60.0)
            result["mb_per_s"] = _r(result["entries_per_s"] * entry_bytes / 1e6, 2)
            out["windows"].append(result)
        out["what"] = (
            "3 pysyncobj processes with the controller's SyncObjConf and Raft fixes (journal with fsync, "
            "password), "
            "a replicated method that does nothing with entries of the load's mean entry size; "
            "window 1 is what the controller's proposer does (one entry in flight)"
        )
        return out
    finally:
        pool.stop()


# Phase: watch fan-out ----------------------------------------------------------------------------


def _open_streams(watchers: WatchFleet, sets: int, limit_s: float) -> dict[str, Any]:
    """Waits until every stream has its initial snapshot (one event per broker set it watches)."""
    t0_wall, t0 = time.time(), time.monotonic()
    watchers.open()
    expected = watchers.snapshot_events_expected(sets)
    status: dict[str, Any] = {}
    full = 0
    for _ in range(100_000):
        status = watchers.status()
        full = sum(1 for n in status["snapshot_counts"] if n >= expected)
        if full >= watchers.streams or time.monotonic() - t0 > limit_s:
            break
        time.sleep(0.5)
    return {
        "streams": watchers.streams,
        "streams_served": status["with_first_event"],
        "streams_with_full_snapshot": full,
        "open_s": _r(time.monotonic() - t0, 2),
        "first_event_after_s": seconds_stats([w - t0_wall for w in status["first_event_walls"]]),
        "first_event_after_subscribing_s": seconds_stats(status["first_event_after_subscribing"]),
        "ended": status["ended"],
    }


def seconds_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50_s": _r(percentile(values, 50)),
        "p99_s": _r(percentile(values, 99)),
        "max_s": _r(max(values)),
    }


def _fan_out_round(
    cluster: ScaleCluster, watchers: WatchFleet, set_index: int, wait_s: float
) -> dict[str, Any]:
    """One committed broker-set change (a new master chosen by the admin), and when each
    stream watching that set had the event: measured from the ElectMaster call (so it
    includes the commit) and from its reply (negative: the stream had it first)."""
    from mqmeta.pb import controller_pb2 as pb

    name = set_name(set_index)
    with cluster.leader_client(timeout_s=10.0) as client:
        info = client.get_replica_info(pb.BrokerSetRef(cluster=CLUSTER, broker_name=name))
        if not info.master_broker_id:  # no alive in-sync replica at an election: elect one first
            info = client.elect_master(
                pb.ElectMasterRequest(cluster=CLUSTER, broker_name=name, trigger=pb.ELECT_TRIGGER_ADMIN),
            )
        if len(info.sync_state_set) < 2:  # an election since the load reset it: widen it first
            info = _all_in_sync(client, info)
        preferred = next(i for i in info.sync_state_set if i != info.master_broker_id)
        called = time.time()
        reply = client.elect_master(
            pb.ElectMasterRequest(
                cluster=CLUSTER,
                broker_name=name,
                trigger=pb.ELECT_TRIGGER_ADMIN,
                preferred_broker_id=preferred,
            ),
        )
        acknowledged = time.time()
        _all_in_sync(client, reply)  # elections reset the SyncStateSet to the new master
    key = event_key("role", name, reply.master_epoch)
    expected = watchers.watching(name)
    times: list[float] = []
    deadline = time.monotonic() + wait_s
    for _ in range(10_000):
        times = watchers.event_times(key)
        if len(times) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {
        "broker_set": name,
        "acknowledged_ms": _r(1000 * (acknowledged - called), 2),
        "streams_expected": expected,
        "streams_with_event": len(times),
        "from_call_ms": latency_summary([t - called for t in times]),
        "from_reply_ms": latency_summary([t - acknowledged for t in times]),
    }


def _all_in_sync(client, info):
    """Puts every replica of a broker set in its SyncStateSet; the new ReplicaInfo."""
    from mqmeta.pb import controller_pb2 as pb

    return client.alter_sync_state_set(
        pb.AlterSyncStateSetRequest(
            cluster=info.cluster,
            broker_name=info.broker_name,
            master_broker_id=info.master_broker_id,
            master_epoch=info.master_epoch,
            sync_state_set_epoch=info.sync_state_set_epoch,
            new_sync_state_set=sorted(r.broker_id for r in info.replicas),
        ),
    )


def watch_phase(cluster: ScaleCluster, fleet: BrokerFleet, sizes: dict[str, int], args) -> dict[str, Any]:
    streams = args.watch_streams or sizes["brokers"]
    out: dict[str, Any] = {}
    for style in args.watch_styles:
        out[f"{style}_streams"] = _watch_style(cluster, fleet, sizes, args, style, streams)
    return out


def _watch_style(cluster: ScaleCluster, fleet: BrokerFleet, sizes, args, style: str, streams: int) -> dict:
    leader = cluster.leader()
    leader_pid = cluster.pid(leader)
    watchers = WatchFleet(cluster.grpc(leader), sizes, style, streams)
    out: dict[str, Any] = {
        "leader": leader,
        "filter": "each stream its broker's set" if style == "broker" else f"cluster={CLUSTER}, every set",
    }
    threads_before = thread_count(leader_pid) if leader_pid else None
    start_wall = time.time()
    meter = CpuMeter(dict(cluster.pids(), **fleet.pids()))
    try:
        out["open"] = _open_streams(watchers, sizes["broker_sets"], args.watch_open_s)
        out["cpu_percent_while_opening"] = meter.stop()
        out["heartbeats_while_opening"] = fleet.window(start_wall, time.time())
        out["leader_threads"] = {"before": threads_before, "with_streams": thread_count(leader_pid)}
        opened = out["open"]
        log(f"watch ({style}): {opened['streams_served']}/{streams} streams served in {opened['open_s']} s")
        settle_t0 = time.monotonic()
        try:  # the fan-out is measured once the opening storm is over and heartbeats answer again
            fleet.wait_heartbeating(sizes["brokers"], timeout_s=args.watch_open_s)
            out["settled_after_open_s"] = _r(time.monotonic() - settle_t0, 1)
        except RuntimeError as exc:
            out["settled_after_open_s"] = None
            out["not_settled"] = str(exc)[:300]
        out["rounds"] = _fan_out_rounds(cluster, watchers, sizes, args)
        out["fan_out"] = _fan_out_summary(out["rounds"])
        burst_wall = time.time()
        burst = min(WRITE_BATCH, max(10, sizes["topics"] // 10))
        out["topic_burst"] = _topic_burst(cluster, watchers, burst, args.watch_wait_s)
        out["heartbeats_during_burst"] = fleet.window(burst_wall, time.time())
        out["heartbeats_with_streams_open"] = fleet.window(start_wall, time.time())
    finally:
        watchers.stop()
    return out


def _fan_out_rounds(cluster: ScaleCluster, watchers: WatchFleet, sizes, args) -> list[dict[str, Any]]:
    """args.watch_rounds changes, each on the next broker set; a change refused because an
    election moved the set on meanwhile (fenced) is tried again on the next set."""
    rounds: list[dict[str, Any]] = []
    for k in range(args.watch_rounds * 3):
        if len([r for r in rounds if "error" not in r]) >= args.watch_rounds:
            break
        try:
            rounds.append(_fan_out_round(cluster, watchers, k % sizes["broker_sets"], args.watch_wait_s))
        except Exception as exc:  # the server may not answer (before: its workers are held)
            rounds.append({"error": f"{_error_name(exc)}: {str(exc)[:200]}"})
            if "FENCED" not in str(exc) and "MASTER_NOT_AVAILABLE" not in str(exc):
                break
    return rounds


def _fan_out_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rounds if "from_call_ms" in r and r["streams_with_event"]]
    if not good:
        return {"rounds": 0}

    def worst(which: str, stat: str) -> float:
        return max(r[which].get(stat) or 0 for r in good)

    return {
        "rounds": len(good),
        "streams_per_change": good[0]["streams_expected"],
        "streams_with_event_min": min(r["streams_with_event"] for r in good),
        "all_streams_had_every_event": all(r["streams_with_event"] >= r["streams_expected"] for r in good),
        "from_call_p50_ms": worst("from_call_ms", "p50_ms"),
        "from_call_p99_ms": worst("from_call_ms", "p99_ms"),
        "from_call_max_ms": worst("from_call_ms", "max_ms"),
        "from_reply_p99_ms": worst("from_reply_ms", "p99_ms"),
        "from_reply_max_ms": worst("from_reply_ms", "max_ms"),
        "note": "worst round of each figure; from_call includes the commit (acknowledged_ms per round)",
    }


def _topic_burst(cluster: ScaleCluster, watchers: WatchFleet, burst: int, wait_s: float) -> dict[str, Any]:
    """`burst` topic creations in one Write call while every stream is open: streams that
    want topic events should get them all (or be cut off if they fall behind)."""
    from mqmeta.pb import controller_pb2 as pb

    before = watchers.status()
    ops = [
        pb.WriteOp(create_topic=pb.TopicSpec(name=f"burst-{watchers.style}-{i}", queue_count=8))
        for i in range(burst)
    ]
    t0 = time.monotonic()
    try:
        with cluster.leader_client(timeout_s=30.0) as client:
            client.write(pb.WriteBatch(writes=ops), timeout_s=30.0)
    except Exception as exc:
        return {"error": f"{_error_name(exc)}: {str(exc)[:200]}"}
    wanting = watchers.watching("") if watchers.style == "cluster" else 0
    status = before
    for _ in range(10_000):
        status = watchers.status()
        got = status["topic_events"] - before["topic_events"]
        settled = got >= burst * wanting and time.monotonic() - t0 > 1.0
        if settled or time.monotonic() - t0 > wait_s:
            break
        time.sleep(0.2)
    return {
        "topics": burst,
        "streams_wanting_topic_events": wanting,
        "events_delivered": status["topic_events"] - before["topic_events"],
        "seconds": _r(time.monotonic() - t0, 2),
        "streams_ended": status["ended_count"] - before["ended_count"],
        "ended_reasons": status["ended"],
    }


# Phase: restart ---------------------------------------------------------------------------------


def _until_serving(address: str, started: float, limit_s: float) -> dict[str, Any]:
    """Seconds from `started` until `address` answers GetMetadata (process up) and then a
    linearizable read (GetConfig: a barrier committed and applied on that node)."""
    from mqmeta.client import ControllerClient
    from mqmeta.errors import MqmetaError
    from mqmeta.pb import controller_pb2 as pb

    out: dict[str, Any] = {"answering_s": None, "serving_s": None}
    with ControllerClient([address], timeout_s=1.0) as client:
        for _ in range(100_000):
            if time.monotonic() - started > limit_s:
                break
            try:
                if out["answering_s"] is None:
                    client.get_metadata(pb.GetMetadataRequest())
                    out["answering_s"] = _r(time.monotonic() - started, 3)
                client.get_config(pb.GetConfigRequest())
                out["serving_s"] = _r(time.monotonic() - started, 3)
                return out
            except MqmetaError:
                time.sleep(0.02)
    return out


def restart_phase(cluster: ScaleCluster, args) -> dict[str, Any]:
    harness = cluster.harness
    out: dict[str, Any] = {"how": "kill -9, then start the same command on the same data"}
    follower = next(n for n in cluster.ids if n != cluster.leader())
    harness.kill(follower)
    t0 = time.monotonic()
    harness.start_node(follower)
    one = _until_serving(cluster.grpc(follower), t0, args.restart_s_max)
    out["one_node"] = dict(one, node=follower, role_before="follower")
    log(f"restart of {follower}: serving after {one['serving_s']} s")
    same_digests(cluster, timeout_s=60.0)
    for node in cluster.ids:
        harness.kill(node)
    t0 = time.monotonic()
    for node in cluster.ids:
        harness.start_node(node)
    results: dict[str, dict[str, Any]] = {}

    def wait(node: str) -> None:
        results[node] = _until_serving(cluster.grpc(node), t0, args.restart_s_max)

    threads = [threading.Thread(target=wait, args=(n,), daemon=True) for n in cluster.ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.restart_s_max + 30.0)
    serving = [r["serving_s"] for r in results.values()]
    out["all_nodes"] = {
        "by_node": results,
        "first_serving_s": min((s for s in serving if s is not None), default=None),
        "all_serving_s": None if None in serving or not serving else max(serving),
    }
    out["digests_after"] = same_digests(cluster, timeout_s=60.0)
    log(f"restart of all three: every node serving after {out['all_nodes']['all_serving_s']} s")
    out["node_log_lines"] = _startup_log_lines(cluster)
    return out


def _startup_log_lines(cluster: ScaleCluster) -> dict[str, list[str]]:
    """The controller's own account of its start (snapshot load, replay), if it logs one."""
    lines: dict[str, list[str]] = {}
    for node in cluster.ids:
        path = cluster.harness.root / "logs" / f"{node}.log"
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        lines[node] = [ln[-200:] for ln in text if "snapshot" in ln.lower() or "replay" in ln.lower()][-6:]
    return lines


# Orchestration ------------------------------------------------------------------------------------

CLUSTERS: list[ScaleCluster] = []
LEADERS: list[LeaderMonitor] = []
POOLS: list[ChildPool] = []
PHASES = ("load", "verify", "heartbeat", "capacity", "snapshot", "raw", "watch", "restart")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="size factor (1.0 = the issue's sizes)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--skip", default="", help=f"comma list of phases to skip: {','.join(PHASES[2:])}")
    p.add_argument("--phase-s", type=float, default=0.0, help="seconds per measuring window")
    p.add_argument("--route-clients", type=int, default=4)
    p.add_argument("--load-threads", type=int, default=4)
    p.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        default=DEFAULT_HEARTBEAT_INTERVAL_MS,
        help=f"the fleet's heartbeat interval (default: the controllers', {DEFAULT_HEARTBEAT_INTERVAL_MS})",
    )
    p.add_argument(
        "--heartbeat-transport",
        choices=TRANSPORTS,
        default="stream",
        help="how the fleet heartbeats (stream: one HeartbeatStream per broker, as the broker agent does)",
    )
    p.add_argument(
        "--capacity-transports",
        default=",".join(TRANSPORTS),
        help="the capacity phase's steps for each of these (the unary call is the baseline)",
    )
    p.add_argument(
        "--capacity-intervals",
        default="",
        help="heartbeat intervals (ms) to try (default: the fleet's interval, then 1/2, 1/4, 1/8 of it)",
    )
    p.add_argument("--compaction-min-entries", type=int, default=0, help="raft setting (0: the node default)")
    p.add_argument("--watch-streams", type=int, default=0, help="0: one per broker")
    p.add_argument("--watch-rounds", type=int, default=5)
    p.add_argument("--watch-styles", default="broker,cluster", help="watch phase: broker,cluster or one")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    p.add_argument("--budget-s", type=float, default=0.0, help="watchdog (default from the scale)")
    args = p.parse_args(argv)
    if args.scale <= 0 or args.scale > 10:
        p.error("--scale must be in (0, 10]")
    small = args.scale < 0.2
    args.phase_s = args.phase_s or (2.0 if small else 10.0)
    args.warmup_s = 0.5 if small else 2.0
    args.capacity_s = args.phase_s / 2 if small else 6.0
    if not 50 <= args.heartbeat_interval_ms <= 60_000:
        p.error("--heartbeat-interval-ms must be in [50, 60000] (the controllers' bounds)")
    args.capacity_intervals = [int(x) for x in args.capacity_intervals.split(",") if x] or [
        max(1, args.heartbeat_interval_ms // k) for k in (1, 2, 4, 8)
    ]
    args.capacity_transports = [x for x in args.capacity_transports.split(",") if x]
    if not args.capacity_transports or not set(args.capacity_transports) <= set(TRANSPORTS):
        p.error(f"--capacity-transports takes one or more of {', '.join(TRANSPORTS)}")
    args.watch_styles = [x for x in args.watch_styles.split(",") if x]
    if not set(args.watch_styles) <= {"broker", "cluster"}:
        p.error("--watch-styles takes broker, cluster or both")
    args.route_reads = 100_000
    args.snapshot_reads_max = 200_000
    args.snapshot_s_max = 120.0 if args.scale >= 0.05 else 30.0
    args.watch_open_s = 20.0 if small else 120.0
    args.watch_wait_s = 5.0 if small else 15.0
    args.restart_s_max = 60.0 if small else 120.0
    args.budget_s = args.budget_s or (240.0 if small else 900.0 + 1500.0 * args.scale)
    args.profile = not args.no_profile
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = args.skip - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    return args


def _phase(result: dict[str, Any], name: str, args, fn) -> Any:
    if name in args.skip:
        result[name] = {"skipped": True}
        return None
    t0 = time.monotonic()
    log(f"phase {name}")
    value = fn()
    result.setdefault("phase_seconds", {})[name] = _r(time.monotonic() - t0, 1)
    if LEADERS:
        result.setdefault("leader_changes_by_phase", {})[name] = LEADERS[0].changes(t0, time.monotonic())
    result[name] = value
    return value


def memory_snapshot(cluster: ScaleCluster) -> dict[str, Any]:
    return {
        name: dict(process_memory(pid), threads=thread_count(pid)) for name, pid in cluster.pids().items()
    }


def run(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    sizes = sizes_for(args.scale)
    result["sizes"] = sizes
    raft_settings = (
        {"compaction_min_entries": args.compaction_min_entries} if args.compaction_min_entries else {}
    )
    result["raft_settings_overrides"] = raft_settings
    cluster = ScaleCluster(root, raft_settings)
    CLUSTERS.append(cluster)
    t0 = time.monotonic()
    cluster.start()
    result["cluster"] = {
        "start_to_ready_s": _r(time.monotonic() - t0, 2),
        "controllers": {n: cluster.grpc(n) for n in cluster.ids},
        "nameserver": cluster.namesrv,
    }
    result["memory_empty"] = memory_snapshot(cluster)
    snapshots = SnapshotMonitor(cluster.data_dirs()).start()
    leaders = LeaderMonitor({n: cluster.grpc(n) for n in cluster.ids}).start()
    LEADERS.append(leaders)
    fleet = BrokerFleet(sizes, cluster.addresses())
    POOLS.append(fleet)
    try:
        _run_phases(args, root, result, sizes, cluster, fleet, snapshots, leaders)
    finally:
        snapshots.stop()
        leaders.stop()
        result["leader_changes_whole_run"] = leaders.changes(0.0, time.monotonic())


def _run_phases(args, root, result, sizes, cluster, fleet, snapshots, leaders) -> None:
    load = _phase(result, "load", args, lambda: load_phase(cluster, fleet, sizes, args))
    load.pop("registered", None)
    _phase(result, "verify", args, lambda: verify_phase(cluster, sizes))
    result["memory"] = memory_snapshot(cluster)
    log(f"memory: {result['memory']}")
    both = _phase(
        result, "heartbeat", args, lambda: heartbeat_and_route_phase(cluster, fleet, sizes, args, root)
    )
    if both is not None:
        result["heartbeat"], result["route"] = both["heartbeat"], both["route"]
    _phase(result, "capacity", args, lambda: capacity_phase(cluster, fleet, sizes, args))
    snap = _phase(result, "snapshot", args, lambda: snapshot_phase(cluster, snapshots, leaders, args, root))
    snapshot_file = cluster.data_dirs()[cluster.ids[0]] / "raft.snapshot"
    if snap is not None and snapshot_file.exists():
        result["snapshot"]["baseline"] = pickle_baseline(snapshot_file)
    entry_bytes = (load or {}).get("topics", {}).get("entry_bytes_mean") or 50_000
    _phase(result, "raw", args, lambda: raw_phase(root, entry_bytes, args.phase_s))
    _phase(result, "watch", args, lambda: watch_phase(cluster, fleet, sizes, args))
    result["memory_after_watch"] = memory_snapshot(cluster)
    _phase(result, "restart", args, lambda: restart_phase(cluster, args))
    result["memory_after_restart"] = memory_snapshot(cluster)


def summarize(result: dict[str, Any]) -> None:
    """Headline figures, targets and same-run ratios (None where a phase did not run)."""

    def get(*path: str) -> Any:
        node: Any = result
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    memory = result.get("memory") or {}
    restart_one = get("restart", "one_node", "serving_s")
    restart_all = get("restart", "all_nodes", "all_serving_s")
    route_p99 = get("route", "sequential", "p99_ms")
    figures = {
        "controller_rss_mb": {n: m.get("rss_mb") for n, m in memory.items() if n != "namesrv"},
        "nameserver_rss_mb": (memory.get("namesrv") or {}).get("rss_mb"),
        "snapshot_bytes": get("snapshot", "snapshot_bytes"),
        "snapshot_write_s": get("snapshot", "write_s_max"),
        "snapshot_longest_read_ms": get("snapshot", "longest_read_ms"),
        "snapshot_leader_changes": get("snapshot", "leader_changes", "leader_changes"),
        "restart_one_node_s": restart_one,
        "restart_all_nodes_s": restart_all,
        "route_p50_ms": get("route", "sequential", "p50_ms"),
        "route_p99_ms": route_p99,
        "route_concurrent_reads_per_s": get("route", "concurrent", "reads_per_s"),
        "route_concurrent_p99_ms": get("route", "concurrent", "p99_ms"),
        "route_change_seen_by_nameserver_p99_ms": get("route", "change_seen_by_nameserver", "p99_ms"),
        "heartbeats_per_s": get("heartbeat", "heartbeats_per_s"),
        "heartbeat_p99_ms": get("heartbeat", "p99_ms"),
        "heartbeat_leader_cpu_percent": get("heartbeat", "leader_cpu_percent"),
        "heartbeat_leader_cpu_ms_each": get("heartbeat", "leader_cpu_ms_per_heartbeat"),
        "heartbeats_sustained_per_s": get("capacity", "stream", "sustained_heartbeats_per_s"),
        "heartbeats_sustained_unary_per_s": get("capacity", "unary", "sustained_heartbeats_per_s"),
        "watch_broker_streams_served": get("watch", "broker_streams", "open", "streams_served"),
        "watch_cluster_streams_served": get("watch", "cluster_streams", "open", "streams_served"),
        "watch_fan_out_streams": get("watch", "cluster_streams", "fan_out", "streams_per_change"),
        "watch_fan_out_p50_ms": get("watch", "cluster_streams", "fan_out", "from_call_p50_ms"),
        "watch_fan_out_p99_ms": get("watch", "cluster_streams", "fan_out", "from_call_p99_ms"),
        "watch_fan_out_max_ms": get("watch", "cluster_streams", "fan_out", "from_call_max_ms"),
        "watch_broker_style_p99_ms": get("watch", "broker_streams", "fan_out", "from_call_p99_ms"),
        "watch_topic_burst_to_broker_streams": get(
            "watch", "broker_streams", "topic_burst", "events_delivered"
        ),
        "load_writes_per_s": get("load", "topics", "writes_per_s"),
        "load_raft_entries_per_s": get("load", "topics", "raft_entries_per_s"),
    }
    result["figures"] = figures
    result["ratios"] = {
        "snapshot_write_vs_plain_pickle_gzip9": _ratio(
            figures["snapshot_write_s"], get("snapshot", "baseline", "stock_pysyncobj_snapshot_s")
        ),
        "heartbeat_leader_cpu_stream_vs_unary": get(
            "capacity", "stream_to_unary", "leader_cpu_us_per_heartbeat_first_step"
        ),
        "route_p99_vs_grpc_floor_p99": _ratio(
            route_p99, get("route", "baselines", "nameserver_health_check", "p99_ms")
        ),
        "route_p99_vs_raw_pysyncobj_commit_p99": _ratio(
            route_p99, get("raw", "sequential_tiny_entries", "p99_ms")
        ),
        "load_entries_per_s_vs_raw_pysyncobj_window1": _ratio(
            figures["load_raft_entries_per_s"], (get("raw", "windows") or [{}])[0].get("entries_per_s")
        ),
    }
    result["targets"] = TARGETS
    result["targets_met"] = {
        "restart_one_node_le_10s": restart_one is not None and restart_one <= TARGETS["restart_one_s_max"],
        "restart_all_nodes_le_10s": restart_all is not None and restart_all <= TARGETS["restart_all_s_max"],
        "route_p99_le_5ms": route_p99 is not None and route_p99 <= TARGETS["route_p99_ms_max"],
    }


def cleanup() -> None:
    for pool in POOLS:
        try:
            pool.stop()
        except Exception as exc:  # keep cleaning the rest
            log(f"cleanup: {exc!r}")
    stop_clusters(CLUSTERS, log)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import grpc
    from pysyncobj.version import VERSION

    root = Path(tempfile.mkdtemp(prefix="mqmeta-scale-"))
    result: dict[str, Any] = {
        "bench": "mqmeta metadata at scale",
        "scale": args.scale,
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "grpcio": grpc.__version__,
            "pysyncobj": VERSION,
            "host": "127.0.0.1",
            "loadavg_before_start": os.getloadavg(),
        },
    }
    busy0 = machine_busy()
    time.sleep(1.0)
    result["env"]["machine_busy_percent_before_start"] = machine_busy_percent(busy0)
    return run_main(
        args, root, result, lambda t0: run(args, root, result), summarize, cleanup, log, watchdog_grace_s=30.0
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
