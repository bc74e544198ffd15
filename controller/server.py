"""Runs a controller node and/or a nameserver as gRPC servers in this process."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import grpc
from mqmeta.controller.metrics import controller_metrics, namesrv_metrics
from mqmeta.controller.namesrv import (
    EmbeddedNameServer,
    NameServerServicer,
    RocketMQRoutes,
    add_rocketmq_service,
)
from mqmeta.controller.operations import ControllerOperations
from mqmeta.controller.raft_node import Peer, RaftSettings
from mqmeta.controller.route_cache import RouteCache
from mqmeta.controller.service import ControllerServicer, watch_event_pb

from mqmeta import call_stream, frames
from mqmeta.call_stream import AsyncCallServer
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument
from mqmeta.metrics import Metrics
from mqmeta.pb import (
    call_stream_pb2_grpc,
    controller_pb2,
    controller_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from mqmeta.rpc import (
    STOP_GRACE_S,
    STOP_NOW_GRACE_S,
    AsyncServer,
    add_health_and_reflection_async,
    check_can_listen,
    run_stop_steps,
)
from mqmeta.timing import PROPOSAL_TIMEOUT_MS_MAX
from mqmeta.validate import parse_addresses

log = logging.getLogger(__name__)

# Threads for the plain (sync) handlers; coroutine handlers and Watch streams use none.
# Module-level so that bench/controller_bench.py can change it.
GRPC_WORKERS_MAX = 64
CONTROLLER_DESCRIPTOR = controller_pb2.DESCRIPTOR.services_by_name["ControllerService"]
CONTROLLER_SERVICE = CONTROLLER_DESCRIPTOR.full_name
NAMESRV_SERVICE = namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
PROXY_ROUTES = RocketMQRoutes()
REQUEST_BYTES_MAX = 5 << 20  # a RocketMQ 5 body of 4 MiB passes through the proxy


@dataclass
class ControllerConfig:
    node_id: str
    grpc: str
    raft: str
    data_dir: Path
    peers: list[Peer] = field(default_factory=list)
    raft_settings: RaftSettings = field(default_factory=RaftSettings)
    metrics_listen: str = ""  # HOST:PORT for Prometheus text; empty = none
    call_stream: bool = True  # offer our clients the call stream (mqmeta/call_stream.py)

    def validate(self) -> None:
        parse_addresses(self.grpc, "--grpc address")
        if self.metrics_listen:
            parse_addresses(self.metrics_listen, "--metrics-listen address")
        parse_addresses(self.raft, "--raft address")
        ids = [p.id for p in self.peers]
        if len(ids) != len(set(ids)):
            raise InvalidArgument(f"peer ids must be unique, got {ids}")
        mine = [p for p in self.peers if p.id == self.node_id]
        if not mine:
            self.peers = [Peer(self.node_id, self.raft, self.grpc), *self.peers]
        elif mine[0].raft != self.raft or mine[0].grpc != self.grpc:
            raise InvalidArgument(f"peer {self.node_id} in --peer disagrees with --raft/--grpc")
        self.raft_settings.validate()
        if not self.raft_settings.secret:
            log.warning(
                "no Raft secret configured: the Raft port %s accepts unauthenticated "
                "pickled messages; never expose it to untrusted hosts",
                self.raft,
            )


def parse_peer(text: str) -> Peer:
    """ID=RAFT_HOST:PORT/GRPC_HOST:PORT"""
    node_id, sep, rest = text.partition("=")
    raft, slash, grpc_address = rest.partition("/")
    if not sep or not slash or not node_id:
        raise InvalidArgument(f"peer {text!r} is malformed: use ID=RAFT_HOST:PORT/GRPC_HOST:PORT")
    parse_addresses(raft, "peer Raft address")
    parse_addresses(grpc_address, "peer gRPC address")
    return Peer(node_id, raft, grpc_address)


# The range of each [raft_settings] number: 0 or less would make a busy loop or time out every
# proposal at once, and a huge one an election or a proposal that never times out.
MS_MAX = 600_000
RAFT_SETTINGS_BOUNDS: dict[str, tuple[int, int]] = {
    "heartbeat_ms": (1, 60_000),
    "election_min_ms": (1, MS_MAX),
    "election_max_ms": (1, MS_MAX),
    "leader_fallback_ms": (1, MS_MAX),
    "connection_retry_ms": (1, MS_MAX),
    "compaction_min_entries": (1, 1_000_000_000),
    "compaction_min_time_s": (0, 30 * 24 * 3600),
    "batch_commands_max": (1, 100_000),
    "inflight_batches_max": (1, 1024),
    "queue_commands_max": (1, 10_000_000),
    "proposal_timeout_ms": (1, PROPOSAL_TIMEOUT_MS_MAX),  # mqmeta.timing: brokers' grace
    "scrub_interval_s": (1, 86_400),
    "gc_thaw_interval_s": (0, 86_400),  # 0: no freezing (controller/gc_pauses.py)
}


def raft_settings_from(values: dict[str, Any], secret: str | None) -> RaftSettings:
    """[raft_settings] of a node's TOML file; the secret comes from --secret-file only."""
    defaults = RaftSettings()
    known = sorted(name for name in RaftSettings.__dataclass_fields__ if name != "secret")
    for key, value in values.items():
        if key not in known:
            raise InvalidArgument(f"unknown key {key!r} in [raft_settings]; known keys: {', '.join(known)}")
        expected = type(getattr(defaults, key))  # int or bool
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
            what = "true or false" if expected is bool else "a whole number"
            raise InvalidArgument(f"key {key!r} in [raft_settings] must be {what}")
        low, high = RAFT_SETTINGS_BOUNDS.get(key, (value, value))
        if not low <= value <= high:
            raise InvalidArgument(
                f"key {key!r} in [raft_settings] must be a whole number from {low} to {high}"
            )
    return replace(defaults, secret=secret, **values)


class StoppableServer(Protocol):
    def stop(self, grace: float | None) -> threading.Event: ...


class RunningNode:
    """What one process serves: a controller core, a nameserver, or both."""

    def __init__(
        self,
        servers: list[StoppableServer],
        core: ControllerOperations | None,
        client: ControllerClient | None,
        metrics: Metrics | None = None,
        closers: list[Callable[[], None]] | None = None,
        route_cache: RouteCache | None = None,
    ) -> None:
        self.servers = servers
        self.core = core
        self.client = client
        self.metrics = metrics
        self.closers = closers or []
        self.route_cache = route_cache  # a standalone nameserver's watched copy of the routes

    def stop(self, graceful: bool = True) -> None:
        """graceful: a leader first hands over (while still serving: calls in flight are
        redirected) and calls in flight get STOP_GRACE_S to finish; else (the whole cluster
        stopping) neither waits."""
        if self.core is not None and graceful:
            self.core.step_down()
        steps: list[Callable[[], object]] = [
            partial(_stop_server, server, STOP_GRACE_S if graceful else STOP_NOW_GRACE_S)
            for server in self.servers
        ]
        steps += [self.core.close] if self.core is not None else []
        steps += [self.client.close] if self.client is not None else []
        steps += [self.metrics.stop] if self.metrics is not None else []
        run_stop_steps([*steps, *self.closers])


def _stop_server(server: StoppableServer, grace: float) -> None:
    server.stop(grace=grace).wait()


def start_controller(
    config: ControllerConfig,
    namesrv_address: str = "",
    remoting_address: str = "",
    routes: RocketMQRoutes = PROXY_ROUTES,
    remoting_proxies: dict[str, str] | None = None,
) -> RunningNode:
    """A controller node on an AsyncServer (its Watch streams hold no thread); with
    `namesrv_address`, its embedded nameserver on the same port or on one of its own, and
    with `remoting_address` that nameserver's RocketMQ remoting listener."""
    config.validate()
    routes.validate()
    for address in dict.fromkeys([config.grpc, config.raft, namesrv_address]):
        if address:  # before the journal opens; pysyncobj would retry a taken Raft port forever
            check_can_listen(address)
    core = ControllerOperations(config.node_id, config.peers, config.data_dir, config.raft_settings)
    embedded_here = namesrv_address == config.grpc
    metrics, call_stream_calls = controller_metrics(core, serving=bool(config.metrics_listen))
    call_server: list[AsyncServer] = []  # set before setup runs on its loop

    async def setup(server: grpc.aio.Server) -> None:
        core.watch_hub.attach(asyncio.get_running_loop(), watch_event_pb, core.reaches_leader)
        servicer = ControllerServicer(core)
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        await _serve_call_stream(call_server[0], config, servicer, call_stream_calls.inc, server)
        services = [CONTROLLER_SERVICE, call_stream.SERVICE]
        if embedded_here:
            namesrv_pb2_grpc.add_NameServerServicer_to_server(EmbeddedNameServer(core), server)
            services.append(NAMESRV_SERVICE)
            services.append(_embedded_rocketmq(server, core, routes, namesrv_address))
        await add_health_and_reflection_async(server, services)

    servers: list[StoppableServer] = []
    try:
        call_server.append(AsyncServer(config.grpc, setup, GRPC_WORKERS_MAX, REQUEST_BYTES_MAX))
        servers.append(_started(call_server[0]))
        if namesrv_address and not embedded_here:
            setup_namesrv = _namesrv_setup(core, routes, namesrv_address)
            servers.append(
                _started(AsyncServer(namesrv_address, setup_namesrv, GRPC_WORKERS_MAX, REQUEST_BYTES_MAX))
            )
    except BaseException:
        for server in servers:
            server.stop(grace=0)
        core.close()
        raise
    closers = []
    if namesrv_address and remoting_address:
        try:
            remoting = _remoting(
                remoting_address, _embedded_route(core), remoting_proxies, _embedded_master(core)
            )
            closers.append(remoting.stop)
        except BaseException:
            for server in servers:
                server.stop(grace=0)
            core.close()
            raise
    metrics.serve(config.metrics_listen)
    return RunningNode(servers, core, None, metrics, closers)


async def _serve_call_stream(
    owner: AsyncServer,
    config: ControllerConfig,
    servicer: ControllerServicer,
    on_call: Callable[[], object],
    server: grpc.aio.Server,
) -> None:
    """The call stream (mqmeta/call_stream.py) on `owner`'s loop, bound before gRPC serves,
    stopped with gRPC (with its grace for the calls being served); CallStream.Offer tells
    clients its port (0: none)."""
    stream: AsyncCallServer | None = None
    if config.call_stream and frames.offered():
        table = call_stream.handlers(servicer, CONTROLLER_DESCRIPTOR)
        stream = AsyncCallServer(config.grpc, table, owner.pool, on_call)
        await stream.start(frames.host_of(config.grpc))
        owner.stop_hooks.append(stream.stop)
    port = stream.port if stream is not None else 0
    offer = call_stream.OfferServicer(lambda: port, [CONTROLLER_SERVICE] if port else [], config.grpc)
    call_stream_pb2_grpc.add_CallStreamServicer_to_server(offer, server)


def _remoting(
    address: str,
    route_of: Callable[[str], Any],
    proxies: dict[str, str] | None = None,
    master_of: Callable[[str], tuple[str, tuple[str, ...]]] | None = None,
):
    from mqmeta.controller.namesrv_remoting import start_namesrv_remoting

    return start_namesrv_remoting(address, route_of, proxies, master_of)


def _embedded_master(core: ControllerOperations) -> Callable[[str], tuple[str, tuple[str, ...]]]:
    """A broker set's master and replicas (gRPC addresses) from this node's applied state
    (no barrier: the proxy only needs a hint; a stale one is refused by the fenced old
    master and asked again)."""
    from mqmeta.controller.state_machine import broker_route

    def master_of(broker_name: str) -> tuple[str, tuple[str, ...]]:
        found = [bs for bs in core.state.broker_sets() if bs["broker_name"] == broker_name]
        if not found:
            return "", ()
        route = broker_route(found[0])
        return str(route["master_address"]), tuple(str(a) for a in route["addresses"].values())

    return master_of


def _cached_master(
    client: ControllerClient, cache: RouteCache
) -> Callable[[str], tuple[str, tuple[str, ...]]]:
    """A broker set's master and replicas from the watched route copy; the controller when
    the copy cannot answer."""

    def master_of(broker_name: str) -> tuple[str, tuple[str, ...]]:
        cached = cache.broker(broker_name)
        if cached is not None:
            return cached.master_address, tuple(cached.addresses.values())
        listed = client.list_broker_sets(controller_pb2.ListBrokerSetsRequest())
        for found in listed.broker_sets:
            if found.broker_name == broker_name:
                return found.master_address, tuple(r.address for r in found.replicas)
        return "", ()

    return master_of


def _started(server: AsyncServer) -> AsyncServer:
    server.start()
    return server


def _namesrv_setup(core: ControllerOperations, routes: RocketMQRoutes, listen: str):
    async def setup(server: grpc.aio.Server) -> None:
        namesrv_pb2_grpc.add_NameServerServicer_to_server(EmbeddedNameServer(core), server)
        messaging = _embedded_rocketmq(server, core, routes, listen)
        await add_health_and_reflection_async(server, [NAMESRV_SERVICE, messaging])

    return setup


def _embedded_route(core: ControllerOperations):
    from mqmeta.controller.service import route_pb

    return lambda topic: route_pb(core.topic_route(topic))


def _embedded_rocketmq(server, core: ControllerOperations, routes: RocketMQRoutes, listen: str) -> str:
    """The RocketMQ 5 service of an embedded nameserver: the proxy reads the node's own
    applied state (no barrier: a route only says where to go; masters are fenced by epoch)."""
    from mqmeta.controller.service import route_pb
    from mqmeta.controller.state_machine import broker_route, topic_route

    def route_now(topic: str):
        try:
            return route_pb(topic_route(core.state, topic))
        except Exception:  # not found, or the state moved under the read: the barrier read answers
            return None

    def masters_now() -> dict[str, str] | None:
        try:
            found = [broker_route(bs) for bs in core.state.broker_sets()]
        except Exception:  # the state moved under the read: none this time
            return None
        return {r["broker_name"]: r["master_address"] for r in found if r["master_broker_id"]}

    return add_rocketmq_service(server, routes, listen, _embedded_route(core), route_now, masters_now)


def start_namesrv(
    address: str,
    controllers: list[str],
    metrics_listen: str = "",
    remoting_address: str = "",
    rocketmq_routes: RocketMQRoutes = PROXY_ROUTES,
    remoting_proxies: dict[str, str] | None = None,
) -> RunningNode:
    """A standalone nameserver: routes from a watched copy of the metadata (RouteCache),
    the controller's barrier read when the copy cannot answer. On an AsyncServer: the
    RocketMQ 5 proxy's forwarded calls and long polls hold no thread."""
    rocketmq_routes.validate()
    client = ControllerClient(controllers)
    cache = RouteCache(ControllerClient(controllers))
    metrics, routes = namesrv_metrics(serving=bool(metrics_listen))
    servicer = NameServerServicer(client, cache, routes.inc)

    def route(topic: str):
        routes.inc()
        return servicer.route(topic)

    async def setup(server: grpc.aio.Server) -> None:
        namesrv_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
        messaging = add_rocketmq_service(
            server, rocketmq_routes, address, servicer.route, cache.route, cache.masters, routes.inc
        )
        await add_health_and_reflection_async(server, [NAMESRV_SERVICE, messaging])

    server = _started(AsyncServer(address, setup, GRPC_WORKERS_MAX, REQUEST_BYTES_MAX))
    cache.start()
    closers = [cache.stop]  # closes its client
    if remoting_address:
        try:
            master_of = _cached_master(client, cache)
            closers.insert(0, _remoting(remoting_address, route, remoting_proxies, master_of).stop)
        except BaseException:
            server.stop(grace=0)
            cache.stop()
            raise
    metrics.serve(metrics_listen)
    return RunningNode([server], None, client, metrics, closers=closers, route_cache=cache)
