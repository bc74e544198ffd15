"""Metadata at scale: the simulated broker fleet and the watch-stream processes (load generators)."""

from __future__ import annotations

import asyncio
import collections
import math
import multiprocessing as mp
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.benchlib import (
    _r,
    latency_summary,
)
from bench.metadata_scale.common import (
    CLUSTER,
    FLEET_BROKERS_PER_PROCESS,
    HEARTBEAT_TIMEOUT_S,
    SAMPLES_MAX,
    WATCH_CLUSTER_OPEN_PER_S,
    WATCH_STREAMS_PER_PROCESS,
    set_name,
)

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
