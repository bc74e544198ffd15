"""Metadata at scale, phases heartbeat, route and capacity."""

from __future__ import annotations

import collections
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.benchlib import (
    CpuMeter,
    _r,
    _ratio,
    latency_summary,
    machine_busy,
    machine_busy_percent,
    profile_start,
    profile_stop,
)
from bench.metadata_scale.cluster import ScaleCluster
from bench.metadata_scale.common import log, topic_name
from bench.metadata_scale.fleet import BrokerFleet

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


LEADER_WINDOW_ATTEMPTS = 6  # CI (a 1 s window on a loaded 2-core machine) once saw three changes


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
        step = _first_measured_step(stream["steps"], unary["steps"])
        out["stream_to_unary"] = {
            "sustained_heartbeats_per_s": _ratio(
                stream["sustained_heartbeats_per_s"], unary["sustained_heartbeats_per_s"]
            ),
            "leader_cpu_us_per_heartbeat_first_measured_step": None
            if step is None
            else _ratio(
                stream["steps"][step].get("leader_cpu_us_per_heartbeat"),
                unary["steps"][step].get("leader_cpu_us_per_heartbeat"),
            ),
            "first_measured_step_interval_ms": None
            if step is None
            else stream["steps"][step].get("interval_ms"),
        }
    out["note"] = "the fleet runs on the same 2 cores: its CPU is listed per step"
    return out


def _first_measured_step(stream: list[dict[str, Any]], unary: list[dict[str, Any]]) -> int | None:
    """The first step (same interval in both) at which both leaders' CPU was measured above
    zero: the kernel counts a process's CPU in 10 ms ticks, so a one-second window of a
    few heartbeats a second may read 0 and say nothing of the cost per heartbeat."""
    for i, (a, b) in enumerate(zip(stream, unary, strict=False)):
        if a.get("interval_ms") == b.get("interval_ms") and all(
            (step.get("leader_cpu_us_per_heartbeat") or 0) > 0 for step in (a, b)
        ):
            return i
    return None


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
