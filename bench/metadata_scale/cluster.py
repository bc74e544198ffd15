"""Metadata at scale: the controller cluster under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
