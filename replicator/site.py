"""One cluster as a replicator sees it: routes from its nameservers, calls to the current
master of a broker set (following NOT_MASTER and unreachable masters)."""

from __future__ import annotations

from typing import Any

import grpc

from mqmeta.broker_client import Channels, RouteCache, call_master
from mqmeta.errors import MqmetaError, NotFound, Unavailable
from mqmeta.pb import broker_pb2_grpc as bpb_grpc
from mqmeta.pb import controller_pb2 as cpb
from mqmeta.pb import namesrv_pb2_grpc as npb_grpc
from mqmeta.rpc import from_rpc_error

NAMESRV_TIMEOUT_S = 4.0


class Site:
    def __init__(self, namesrv: tuple[str, ...]) -> None:
        self.namesrv = list(namesrv)
        self.channels = Channels()
        self.routes = RouteCache(self.namesrv, self.channels)

    def call(self, topic: str, broker_name: str, method: str, request: Any, timeout_s: float) -> Any:
        """A blocking call to the broker set's master, re-resolving it until `timeout_s`."""
        return call_master(self.routes, self.channels, topic, broker_name, method, request, timeout_s)

    def master_stub(self, topic: str, broker_name: str, refresh: bool = False) -> bpb_grpc.BrokerServiceStub:
        if refresh:
            self.routes.route(topic, refresh=True)
        return self.channels.broker_stub(self.routes.master(topic, broker_name))

    def cluster_of(self, topic: str, broker_name: str) -> str:
        for broker in self.routes.route(topic).brokers:
            if broker.broker_name == broker_name:
                return str(broker.cluster)
        raise Unavailable(f"broker set {broker_name} of topic {topic} is not in its route")

    def read_queues(self, topic: str) -> list[tuple[str, int]]:
        """(broker set, queue id) of every readable queue of `topic`, sorted."""
        route = self.routes.route(topic, refresh=True)
        return sorted((q.broker_name, i) for q in route.queues for i in range(q.read_queue_count))

    def write_queues(self, topic: str) -> list[tuple[str, int]]:
        route = self.routes.route(topic, refresh=True)
        return sorted((q.broker_name, i) for q in route.queues for i in range(q.write_queue_count))

    def topics(self) -> list[str]:
        """Every topic's name, from the first nameserver that answers."""
        last: MqmetaError | None = None
        for address in self.namesrv:
            try:
                stub = npb_grpc.NameServerStub(self.channels.get(address))
                reply = stub.ListTopics(cpb.ListTopicsRequest(), timeout=NAMESRV_TIMEOUT_S)
                return sorted(t.name for t in reply.topics)
            except grpc.RpcError as rpc_error:
                last = from_rpc_error(rpc_error)
                if isinstance(last, NotFound):
                    raise last from None
        raise Unavailable(f"no nameserver answered ({', '.join(self.namesrv)}): {last}")

    def close(self) -> None:
        self.channels.close()
