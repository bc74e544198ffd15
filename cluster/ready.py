"""Waiting until a local cluster answers: a controller leader, SERVING nameservers,
brokers with a role and a writable master per broker set."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mqmeta.cluster.layout import BrokerLayout
from mqmeta.cluster.wait import wait_for

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb

READY_TIMEOUT_S = 60.0


def _nothing_exited() -> None:
    pass


def wait_brokers_ready(
    brokers: list[BrokerLayout],
    timeout_s: float = READY_TIMEOUT_S,
    check_running: Callable[[], None] = _nothing_exited,
) -> dict:
    """Every broker registered with a role, and every broker set with a writable master;
    returns each broker's HA status by process name. `check_running` raises when a process
    the wait depends on has exited (Supervisor.check_running): no point waiting on."""
    from mqmeta.pb import broker_pb2, broker_pb2_grpc

    def statuses() -> dict:
        check_running()
        found = {}
        for broker in brokers:
            with tls.channel(broker.grpc) as channel:
                found[broker.name] = broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
                    broker_pb2.HaStatusRequest(), timeout=1.0
                )
        return found

    def ready(found: dict) -> bool:
        if any(s.role == "FENCED" for s in found.values()):
            return False
        writable = {s.broker_name for s in found.values() if s.writable}
        return writable == {b.broker_name for b in brokers}

    return wait_for(
        statuses,
        timeout_s,
        "every broker to have a role and every broker set a writable master (see the logs)",
        until=ready,
        retry_on=(grpc.RpcError,),
        interval_s=0.1,
    )


def wait_ready(
    controllers: str,
    namesrv: list[str],
    timeout_s: float = READY_TIMEOUT_S,
    check_running: Callable[[], None] = _nothing_exited,
) -> None:
    """Every controller agrees on a leader and every nameserver reports SERVING
    (`check_running`: as in wait_brokers_ready)."""
    addresses = controllers.split(",")

    def not_ready() -> str:
        """The first thing not ready yet, "" once everything is (no more calls than needed)."""
        check_running()
        for address in addresses:
            if not _leader_known(address):
                return f"controller {address} knows no leader"
        for address in namesrv:
            if not _serving(address):
                return f"nameserver {address} is not serving"
        return ""

    wait_for(
        not_ready,
        timeout_s,
        "every controller to know a leader and every nameserver to serve (see the logs)",
        until=lambda missing: not missing,
        interval_s=0.1,
    )


def _leader_known(address: str) -> bool:
    try:
        with ControllerClient([address], timeout_s=1.0) as client:
            return bool(client.get_metadata(pb.GetMetadataRequest()).leader_id)
    except MqmetaError:
        return False


def _serving(address: str) -> bool:
    with tls.channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
