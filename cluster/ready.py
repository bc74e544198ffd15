"""Waiting until a local cluster answers: a controller leader, SERVING nameservers,
brokers with a role and a writable master per broker set."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.layout import BrokerLayout
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError, Unavailable
from mqmeta.pb import controller_pb2 as pb

READY_TIMEOUT_S = 60.0


def wait_brokers_ready(brokers: list[BrokerLayout], timeout_s: float = READY_TIMEOUT_S) -> dict:
    """Every broker registered with a role, and every broker set with a writable master."""
    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = {}
        for broker in brokers:
            with grpc.insecure_channel(broker.grpc) as channel:
                try:
                    statuses[broker.name] = broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
                        broker_pb2.HaStatusRequest(), timeout=1.0
                    )
                except grpc.RpcError:
                    break
        if len(statuses) == len(brokers) and all(s.role != "FENCED" for s in statuses.values()):
            writable = {s.broker_name for s in statuses.values() if s.writable}
            if writable == {b.broker_name for b in brokers}:
                return statuses
        time.sleep(0.1)
    raise Unavailable(f"the brokers did not become ready within {timeout_s:.0f}s; see the logs")


def wait_ready(controllers: str, namesrv: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Every controller agrees on a leader and every nameserver reports SERVING."""
    deadline = time.monotonic() + timeout_s
    addresses = controllers.split(",")
    while time.monotonic() < deadline:
        if all(_leader_known(a) for a in addresses) and all(_serving(a) for a in namesrv):
            return
        time.sleep(0.1)
    raise Unavailable(f"the cluster did not become ready within {timeout_s:.0f}s; see the logs")


def _leader_known(address: str) -> bool:
    try:
        with ControllerClient([address], timeout_s=1.0) as client:
            return bool(client.call("GetMetadata", pb.GetMetadataRequest()).leader_id)
    except MqmetaError:
        return False


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
