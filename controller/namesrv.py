"""The nameserver: answers route queries from the replicated metadata.

Embedded (`--embed-controller`) it reads the local controller node's state after a
read barrier; standalone it asks the controller cluster through the client library.
"""

from __future__ import annotations

from controller.core import ControllerCore
from controller.service import broker_route_pb, route_pb, rpc
from mqmeta.client import ControllerClient
from mqmeta.pb import controller_pb2 as pb
from mqmeta.pb import namesrv_pb2 as ns_pb
from mqmeta.pb import namesrv_pb2_grpc as ns_grpc
from mqmeta.validate import validate_name


class NameServerServicer(ns_grpc.NameServerServicer):
    def __init__(self, core: ControllerCore | None = None, client: ControllerClient | None = None) -> None:
        assert (core is None) != (client is None), "embedded or standalone, not both"
        self.core = core
        self.client = client

    @rpc
    def QueryRoute(self, request, context):
        name = validate_name("topic name", request.topic)
        if self.core is not None:
            return route_pb(self.core.topic_route(name))
        return self.client.call("GetTopicRoute", pb.NameRequest(name=name))

    @rpc
    def GetClusterInfo(self, request, context):
        cluster = validate_name("cluster", request.cluster) if request.cluster else ""
        if self.core is not None:
            routes = [broker_route_pb(r) for r in self.core.cluster_routes(cluster)]
            return ns_pb.ClusterInfo(brokers=routes)
        sets = self.client.call("ListBrokerSets", pb.ListBrokerSetsRequest(cluster=cluster))
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
