"""A stand-in for broker agents in controller tests: registers and heartbeats over real gRPC.

It speaks the real ControllerService protocol from a thread; the real broker agent
(P2) replaces it in broker tests.
"""

from __future__ import annotations

import threading

from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb

FAST_LIVENESS = {
    "broker_heartbeat_interval_ms": "200",
    "broker_dead_after_ms": "1000",
    "lease_ms": "500",
    "lease_margin_ms": "200",
}


class FakeBroker:
    def __init__(
        self,
        addresses: str,
        broker_name: str,
        index: int,
        max_offset: int = 0,
        cluster: str = "DefaultCluster",
        interval_s: float = 0.2,
    ) -> None:
        self.client = ControllerClient(addresses, timeout_s=5.0)
        self.cluster = cluster
        self.broker_name = broker_name
        self.check_code = f"{broker_name}-{index}"
        self.address = f"127.0.0.1:{20000 + index}"
        self.max_offset = max_offset
        self.interval_s = interval_s
        self.broker_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> pb.RegisterBrokerResponse:
        reply = self.client.call(
            "RegisterBroker",
            pb.RegisterBrokerRequest(
                cluster=self.cluster,
                broker_name=self.broker_name,
                check_code=self.check_code,
                address=self.address,
            ),
        )
        self.broker_id = reply.broker_id
        return reply

    def elect_self(self) -> pb.ReplicaInfo:
        """Ask for an election naming this broker as the requester (a first election makes it master)."""
        return self.client.call(
            "ElectMaster",
            pb.ElectMasterRequest(
                cluster=self.cluster,
                broker_name=self.broker_name,
                trigger=pb.ELECT_TRIGGER_BROKER,
                requester_broker_id=self.broker_id,
            ),
        )

    def heartbeat_once(self) -> pb.HeartbeatResponse:
        return self.client.heartbeat(
            pb.HeartbeatRequest(
                cluster=self.cluster,
                broker_name=self.broker_name,
                broker_id=self.broker_id,
                epoch=1,
                max_offset=self.max_offset,
            ),
        )

    def start_heartbeats(self) -> FakeBroker:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.heartbeat_once()
            except MqmetaError:
                pass  # the controller may be failing over; keep beating

    def stop_heartbeats(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def close(self) -> None:
        self.stop_heartbeats()
        self.client.close()
