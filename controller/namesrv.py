"""The nameserver: answers route queries from the replicated metadata.

Embedded (`--embed-controller`) it reads the local controller node's state after a
read barrier (EmbeddedNameServer: coroutines on the controller's event loop, so a
route read waits for its barrier without holding a thread); standalone it answers
routes from a copy of the metadata that a watch stream keeps current (RouteCache: why
that is safe is written there), and asks the controller cluster through the client
library whenever the copy cannot answer (NameServerServicer, on a thread pool).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqmeta.controller.operations import ControllerOperations
from mqmeta.controller.route_cache import RouteCache
from mqmeta.controller.service import broker_route_pb, list_topics_names, list_topics_pb, route_pb

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import InvalidArgument
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import namesrv_pb2 as ns_pb
from mqmeta.pb import namesrv_pb2_grpc as ns_grpc
from mqmeta.rpc import rpc, rpc_async
from mqmeta.validate import parse_addresses, validate_name


class NameServerServicer(ns_grpc.NameServerServicer):
    """A standalone nameserver: routes from `cache` when it can answer, else (and every
    other answer) from the controller cluster."""

    def __init__(
        self,
        client: ControllerClient,
        cache: RouteCache | None = None,
        on_route: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.cache = cache
        self._on_route = on_route  # metrics: a route query answered

    def route(self, name: str) -> pb.TopicRoute:
        cached = self.cache.route(name) if self.cache is not None else None
        if cached is not None:
            return cached
        return self.client.get_topic_route(pb.NameRequest(name=name))

    @rpc
    def QueryRoute(self, request, context):
        name = validate_name("topic name", request.topic)
        self._on_route()
        return self.route(name)

    @rpc
    def GetClusterInfo(self, request, context):
        cluster = validate_name("cluster", request.cluster) if request.cluster else ""
        sets = self.client.list_broker_sets(pb.ListBrokerSetsRequest(cluster=cluster))
        return ns_pb.ClusterInfo(
            brokers=[
                pb.BrokerRoute(
                    cluster=s.cluster,
                    broker_name=s.broker_name,
                    master_broker_id=s.master_broker_id,
                    master_address=s.master_address,
                    master_epoch=s.master_epoch,
                    addresses={r.broker_id: r.address for r in s.replicas},
                )
                for s in sets.broker_sets
            ]
        )

    @rpc
    def ListTopics(self, request, context):
        list_topics_names(request)  # refused here, before the controller is asked
        return self.client.list_topics(request)


class EmbeddedNameServer(ns_grpc.NameServerServicer):
    """The nameserver of a controller node (`--embed-controller`), on its AsyncServer."""

    def __init__(self, core: ControllerOperations) -> None:
        self.core = core

    @rpc_async
    async def QueryRoute(self, request, context):
        name = validate_name("topic name", request.topic)
        return route_pb(await self.core.topic_route_async(name))

    @rpc_async
    async def GetClusterInfo(self, request, context):
        cluster = validate_name("cluster", request.cluster) if request.cluster else ""
        routes = await self.core.cluster_routes_async(cluster)
        return ns_pb.ClusterInfo(brokers=[broker_route_pb(r) for r in routes])

    @rpc_async
    async def ListTopics(self, request, context):
        names = list_topics_names(request)
        return list_topics_pb(await self.core.read_barrier_async(), names)


# The RocketMQ 5 client protocol -------------------------------------------------------------
NAMESRV_TELEMETRY_STREAMS_MAX = 16  # the official clients open Telemetry to brokers, not here
FORWARD_TIMEOUT_S = 3.0
ROCKETMQ_ROUTES = ("proxy", "direct")


@dataclass(frozen=True)
class RocketMQRoutes:
    """What QueryRoute gives RocketMQ 5 clients. `proxy` (the default): the nameservers'
    own endpoints (`endpoints`; this nameserver's address when empty), and this
    nameserver forwards the data path to the masters (controller/rmq_proxy.py).
    `direct`: each broker set's master address, as a route read at that instant."""

    mode: str = "proxy"
    endpoints: tuple[str, ...] = ()
    merge_calls: bool = True  # the proxy merges calls that wait together (rmq_proxy.upstream)

    def validate(self) -> None:
        if self.mode not in ROCKETMQ_ROUTES:
            raise InvalidArgument(f"--rocketmq-routes must be proxy or direct, not {self.mode!r}")
        for address in self.endpoints:
            parse_addresses(address, "--rocketmq-endpoints address")


def add_rocketmq_service(
    server,
    routes: RocketMQRoutes,
    listen: str,
    route_of: Callable[[str], pb.TopicRoute],
    route_now: Callable[[str], pb.TopicRoute | None],
    masters_now: Callable[[], dict[str, str] | None],
    on_route: Callable[[], None] = lambda: None,
) -> str:
    """apache.rocketmq.v2.MessagingService on an AsyncServer, in the mode `routes` names."""
    if routes.mode == "direct":

        def counted(topic: str) -> pb.TopicRoute:
            on_route()
            return route_of(topic)

        return add_messaging_service(server, counted)
    from mqmeta.controller.rmq_proxy import RocketMQProxy, RouteSource

    from mqmeta.rocketmq import MESSAGING_SERVICE

    proxy = RocketMQProxy(
        RouteSource(route_now, route_of, masters_now),
        list(routes.endpoints or (listen,)),
        on_route,
        merge_calls=routes.merge_calls,
    )
    server.add_generic_rpc_handlers((proxy.handler(),))
    return MESSAGING_SERVICE


def add_messaging_service(server, route_of) -> str:
    """Serves apache.rocketmq.v2.MessagingService on the nameserver's port: QueryRoute (the
    clients' entry point: the current masters of every broker set), Heartbeat,
    NotifyClientTermination, Telemetry (Settings answered, the stream kept open) and
    QueryAssignment (asked of a master of the topic). Everything else belongs to the
    brokers the route names. `route_of(topic)` returns the controller's TopicRoute.
    Imported here only: the stubs are the server side's (see mqmeta/rocketmq.py)."""
    from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
    from mqmeta.rocketmq import MESSAGING_SERVICE

    rsvc_grpc.add_MessagingServiceServicer_to_server(_namesrv_messaging(route_of), server)
    return MESSAGING_SERVICE


def _namesrv_messaging(route_of):
    from mqmeta.errors import NotFound
    from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
    from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
    from mqmeta.pb.apache.rocketmq.v2 import service_pb2_grpc as rsvc_grpc
    from mqmeta.rocketmq import (
        RmqError,
        TelemetryHub,
        address_of,
        answer_settings,
        check_name,
        message_queues,
        rmq_call,
        status,
    )

    def queues(topic: str):
        try:
            return message_queues(route_of(topic))
        except NotFound:
            raise RmqError(
                rdef.TOPIC_NOT_FOUND, f"topic {topic} does not exist: create it with mqmeta admin"
            ) from None

    class NameServerMessaging(rsvc_grpc.MessagingServiceServicer):
        def __init__(self) -> None:
            self.hub = TelemetryHub(
                NAMESRV_TELEMETRY_STREAMS_MAX, lambda client, settings: answer_settings(settings, None)
            )

        @rmq_call(rsvc.QueryRouteResponse)
        def QueryRoute(self, request, context):
            topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
            return rsvc.QueryRouteResponse(status=status(), message_queues=queues(topic))

        @rmq_call(rsvc.HeartbeatResponse)
        def Heartbeat(self, request, context):
            return rsvc.HeartbeatResponse(status=status())

        @rmq_call(rsvc.NotifyClientTerminationResponse)
        def NotifyClientTermination(self, request, context):
            return rsvc.NotifyClientTerminationResponse(status=status())

        def Telemetry(self, request_iterator, context):
            return self.hub.serve(request_iterator, context)

        @rmq_call(rsvc.QueryAssignmentResponse)
        def QueryAssignment(self, request, context):
            topic = check_name("topic", request.topic, rdef.ILLEGAL_TOPIC)
            found = queues(topic)
            if not found:
                raise RmqError(rdef.TOPIC_NOT_FOUND, f"topic {topic} has no broker set with a master")
            metadata = [(k, v) for k, v in context.invocation_metadata() if k.startswith("x-mq-")]
            with tls.channel(address_of(found[0].broker.endpoints)) as channel:
                stub = rsvc_grpc.MessagingServiceStub(channel)
                return stub.QueryAssignment(request, metadata=metadata, timeout=FORWARD_TIMEOUT_S)

    _refuse_broker_calls(NameServerMessaging)
    return NameServerMessaging()


def _refuse_broker_calls(servicer_class: type) -> None:
    """The calls a broker serves answer ILLEGAL_ACCESS_POINT at the nameserver."""
    from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
    from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
    from mqmeta.rocketmq import status

    def refusal(response_type, method: str):
        return response_type(
            status=status(
                rdef.ILLEGAL_ACCESS_POINT, f"{method} goes to a broker the route names, not the nameserver"
            )
        )

    def unary(response_type, method: str):
        def handler(self, request, context):
            return refusal(response_type, method)

        return handler

    def stream(response_type, method: str):
        def handler(self, request, context):
            yield refusal(response_type, method)

        return handler

    for method, response in (
        ("SendMessage", rsvc.SendMessageResponse),
        ("AckMessage", rsvc.AckMessageResponse),
        ("ChangeInvisibleDuration", rsvc.ChangeInvisibleDurationResponse),
        ("EndTransaction", rsvc.EndTransactionResponse),
        ("ForwardMessageToDeadLetterQueue", rsvc.ForwardMessageToDeadLetterQueueResponse),
        ("RecallMessage", rsvc.RecallMessageResponse),
        ("UpdateOffset", rsvc.UpdateOffsetResponse),
        ("GetOffset", rsvc.GetOffsetResponse),
        ("QueryOffset", rsvc.QueryOffsetResponse),
        ("SyncLiteSubscription", rsvc.SyncLiteSubscriptionResponse),
    ):
        setattr(servicer_class, method, unary(response, method))
    for method, response in (
        ("ReceiveMessage", rsvc.ReceiveMessageResponse),
        ("PullMessage", rsvc.PullMessageResponse),
    ):
        setattr(servicer_class, method, stream(response, method))
