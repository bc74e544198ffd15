"""A real multi-process controller cluster on loopback, with kill/pause/restart hooks.

Used by the tests, the benchmarks and the chaos suite. Each node is a real
`mqmeta controller` (or `mqmeta namesrv --embed-controller`) process. A Cluster holds its
ports (cluster/ports.py) from construction until stop(), so a process killed and
restarted comes back on its address and no other process can take it meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqmeta.cluster.layout import (
    Layout,
    broker_command,
    controller_command,
    ensure_secret,
    load_or_create_layout,
    namesrv_command,
)
from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.ready import wait_brokers_ready, wait_ready
from mqmeta.cluster.supervisor import Supervisor
from mqmeta.cluster.wait import wait_for

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb

FAST_RAFT = {"heartbeat_ms": 50, "election_min_ms": 300, "election_max_ms": 600, "leader_fallback_ms": 1000}


class Cluster:
    def __init__(
        self,
        root: Path,
        count: int = 3,
        embedded: bool = False,
        raft_settings: dict[str, Any] | None = None,
        broker_sets: int = 0,
        replicas: int = 0,
        broker_flags: list[str] | None = None,
        test_liveness: bool = True,
        raft_secret: bool = True,
    ) -> None:
        self.root = root
        self.raft_secret = raft_secret  # False: the controllers run without a Raft secret (benchmarks)
        # False: the brokers run with the controller's default liveness settings (chaos --liveness)
        self.test_liveness = test_liveness
        self.layout: Layout
        self.layout, self._ports = load_or_create_layout(root, count, embedded, broker_sets, replicas)
        self.broker_flags = list(broker_flags or [])
        self.namesrv_flags: list[str] = []  # e.g. --rocketmq-endpoints, set before start()
        ensure_secret(root)
        self.supervisor = Supervisor(root)
        self.raft_settings = dict(FAST_RAFT, **(raft_settings or {}))
        # Extra environment per process name (the chaos suite gives each its dial map).
        self.process_env: Callable[[str], dict[str, str]] = lambda name: {}
        self._config_file = root / "raft.toml"
        lines = ["[raft_settings]"] + [f"{k} = {v}" for k, v in self.raft_settings.items()]
        self._config_file.write_text("\n".join(lines) + "\n")

    # Lifecycle --------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, wait: bool = True, brokers: bool = True) -> Cluster:
        if not self._ports.held:  # started again after stop()
            self._ports = PortReservation.hold(self.layout.addresses())
        started = [node.id for node in self.layout.controllers]
        for node_id in started:
            self.start_node(node_id)

        def check_running() -> None:  # a child that exits ends the wait at once, with its log
            self.supervisor.check_running(started)

        if wait:
            wait_ready(self.addresses, [], check_running=check_running)
        if self.layout.brokers and self.test_liveness:
            self.configure_controller()
        if self.layout.brokers:
            if not self.layout.embedded:
                self.start_namesrv()
                started.append("namesrv")
                if wait:
                    wait_ready(self.addresses, self.layout.namesrv, check_running=check_running)
            if brokers:
                for broker in self.layout.brokers:
                    self.start_broker(broker.name)
                    started.append(broker.name)
                if wait:
                    wait_brokers_ready(self.layout.brokers, check_running=check_running)
        return self

    def configure_controller(self, values: dict[str, str] | None = None) -> None:
        """Fast liveness for tests: heartbeat 200 ms, dead after 1 s, lease 500 ms."""
        from mqmeta.pb import controller_pb2

        values = values or {
            "broker_heartbeat_interval_ms": "200",
            "broker_dead_after_ms": "1000",
            "lease_ms": "500",
            "lease_margin_ms": "200",
        }
        with self.client() as client:
            client.update_config(controller_pb2.UpdateConfigRequest(values=values))

    def start_namesrv(self) -> subprocess.Popen:
        command = namesrv_command(self.layout) + self.namesrv_flags
        return self.supervisor.start("namesrv", command, self.process_env("namesrv"))

    def start_broker(self, name: str, controllers: str = "") -> subprocess.Popen:
        """controllers: other addresses to reach the controllers by (e.g. cuttable proxies)."""
        broker = self.broker(name)
        command = broker_command(self.root, self.layout, broker) + self.broker_flags
        if controllers:
            command[command.index("--controllers") + 1] = controllers
        return self.supervisor.start(name, command, self.process_env(name))

    def restart_broker(self, name: str) -> None:
        if self.is_running(name):
            self.kill(name)
        self.start_broker(name)

    def broker(self, name: str):
        return next(b for b in self.layout.brokers if b.name == name)

    def broker_status(self, name: str, timeout_s: float = 2.0):
        from mqmeta.pb import broker_pb2, broker_pb2_grpc

        with tls.channel(self.broker(name).grpc) as channel:
            return broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
                broker_pb2.HaStatusRequest(), timeout=timeout_s
            )

    def writable_master(self, broker_name: str, exclude: str = "") -> str:
        """The process name of a running writable master of a broker set, or "" (one look)."""
        for broker in self.layout.brokers:
            if broker.broker_name != broker_name or broker.name == exclude:
                continue
            if not self.is_running(broker.name):
                continue
            try:
                if self.broker_status(broker.name, 1.0).writable:
                    return broker.name
            except Exception:  # grpc.RpcError (grpc is imported lazily): starting or stopped
                pass
        return ""

    def master_of(self, broker_name: str, timeout_s: float = 15.0, exclude: str = "") -> str:
        """The process name of the writable master of a broker set, once there is one."""
        return wait_for(
            lambda: self.writable_master(broker_name, exclude),
            timeout_s,
            f"a writable master of {broker_name}" + (f" other than {exclude}" if exclude else ""),
        )

    @property
    def namesrv(self) -> str:
        return ",".join(self.layout.namesrv)

    def start_node(self, node_id: str) -> subprocess.Popen:
        node = self.node(node_id)
        command = controller_command(self.root, self.layout, node, self.raft_secret) + [
            "--config",
            str(self._config_file),
        ]
        return self.supervisor.start(node_id, command, self.process_env(node_id))

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        alive = [n.grpc for n in self.layout.controllers if self.is_running(n.id)]
        wait_ready(",".join(alive), [], timeout_s)

    def stop(self, graceful: bool = False) -> None:
        """Stops every process, then lets the ports go (start() holds them again). At once
        (SIGINT) unless `graceful` (SIGTERM: each master first hands off to a slave that is
        about to stop too, about 3 s per broker set that tests and benches need not pay)."""
        for proc in self.supervisor.children.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        try:
            self.supervisor.stop_all(signal.SIGTERM if graceful else signal.SIGINT)
        finally:
            self._ports.release()

    # Faults -------------------------------------------------------------------------
    def kill(self, node_id: str) -> None:
        """kill -9: no chance to flush or say goodbye."""
        proc = self.supervisor.children[node_id]
        proc.kill()
        proc.wait()

    def pause(self, node_id: str) -> None:
        """Returns once every thread of the node has stopped (Supervisor.suspend)."""
        self.supervisor.suspend(node_id)

    def resume(self, node_id: str) -> None:
        self.supervisor.resume(node_id)

    def restart(self, node_id: str) -> None:
        if self.is_running(node_id):
            self.kill(node_id)
        self.start_node(node_id)

    # Queries ------------------------------------------------------------------------
    def node(self, node_id: str):
        return next(n for n in self.layout.controllers if n.id == node_id)

    def is_running(self, node_id: str) -> bool:
        proc = self.supervisor.children.get(node_id)
        return proc is not None and proc.poll() is None

    @property
    def addresses(self) -> str:
        return self.layout.controller_addresses

    def client(self, node_ids: list[str] | None = None, timeout_s: float = 10.0) -> ControllerClient:
        ids = node_ids or [n.id for n in self.layout.controllers]
        return ControllerClient([self.node(i).grpc for i in ids], timeout_s=timeout_s)

    def metadata(self, node_id: str, timeout_s: float = 2.0) -> pb.ControllerMetadata:
        with self.client([node_id], timeout_s=timeout_s) as client:
            return client.get_metadata(pb.GetMetadataRequest())

    def leader_ids(self, exclude: str = "") -> dict[str, str]:
        """The leader each running node (but `exclude`) names, "" when it names none (one look)."""
        seen = {}
        for node in self.layout.controllers:
            if node.id == exclude or not self.is_running(node.id):
                continue
            try:
                seen[node.id] = self.metadata(node.id, timeout_s=1.0).leader_id
            except MqmetaError:
                seen[node.id] = ""
        return seen

    def leader_id(self, timeout_s: float = 15.0, exclude: str = "") -> str:
        """The leader that every running node agrees on."""

        def agreed(seen: dict[str, str]) -> bool:
            leaders = set(seen.values())
            return len(leaders) == 1 and "" not in leaders and exclude not in leaders

        seen = wait_for(
            lambda: self.leader_ids(exclude),
            timeout_s,
            "every running controller to name the same leader" + (f" (not {exclude})" if exclude else ""),
            until=agreed,
        )
        return next(iter(seen.values()))

    def followers(self) -> list[str]:
        leader = self.leader_id()
        return [n.id for n in self.layout.controllers if n.id != leader]

    def applied_log(self, node_id: str) -> Path:
        return self.root / self.node(node_id).data_dir / "applied.jsonl"
