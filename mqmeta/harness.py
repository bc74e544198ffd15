"""A real multi-process controller cluster on loopback, with kill/pause/restart hooks.

Used by the tests, the benchmarks and (later) the chaos suite. Each node is a real
`mqmeta controller` (or `mqmeta namesrv --embed-controller`) process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from controller.local import (
    Layout,
    Supervisor,
    controller_command,
    ensure_secret,
    load_or_create_layout,
    wait_ready,
)
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError, Unavailable
from mqmeta.pb import controller_pb2 as pb

FAST_RAFT = {"heartbeat_ms": 50, "election_min_ms": 300, "election_max_ms": 600,
             "leader_fallback_ms": 1000}


class Cluster:
    def __init__(self, root: Path, count: int = 3, embedded: bool = False,
                 raft_settings: dict[str, Any] | None = None) -> None:
        self.root = root
        self.layout: Layout = load_or_create_layout(root, count, embedded)
        ensure_secret(root)
        self.supervisor = Supervisor(root)
        self.raft_settings = dict(FAST_RAFT, **(raft_settings or {}))
        self._config_file = root / "raft.toml"
        lines = ["[raft_settings]"] + [f"{k} = {v}" for k, v in self.raft_settings.items()]
        self._config_file.write_text("\n".join(lines) + "\n")

    # Lifecycle --------------------------------------------------------------------
    def start(self, wait: bool = True) -> Cluster:
        for node in self.layout.controllers:
            self.start_node(node.id)
        if wait:
            self.wait_ready()
        return self

    def start_node(self, node_id: str) -> subprocess.Popen:
        node = self.node(node_id)
        command = controller_command(self.root, self.layout, node) + ["--config",
                                                                      str(self._config_file)]
        return self.supervisor.start(node_id, command)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        alive = [n.grpc for n in self.layout.controllers if self.is_running(n.id)]
        wait_ready(",".join(alive), [], timeout_s)

    def stop(self) -> None:
        for proc in self.supervisor.children.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.supervisor.stop_all()

    # Faults -------------------------------------------------------------------------
    def kill(self, node_id: str) -> None:
        """kill -9: no chance to flush or say goodbye."""
        proc = self.supervisor.children[node_id]
        proc.kill()
        proc.wait()

    def pause(self, node_id: str) -> None:
        os.kill(self.supervisor.children[node_id].pid, signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        os.kill(self.supervisor.children[node_id].pid, signal.SIGCONT)

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
            return client.call("GetMetadata", pb.GetMetadataRequest())

    def leader_id(self, timeout_s: float = 15.0, exclude: str = "") -> str:
        """The leader that every running node agrees on."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = set()
            for node in self.layout.controllers:
                if node.id == exclude or not self.is_running(node.id):
                    continue
                try:
                    seen.add(self.metadata(node.id, timeout_s=1.0).leader_id)
                except MqmetaError:
                    seen.add("")
            if len(seen) == 1 and "" not in seen and exclude not in seen:
                return seen.pop()
            time.sleep(0.05)
        raise Unavailable(f"no agreed leader within {timeout_s}s")

    def followers(self) -> list[str]:
        leader = self.leader_id()
        return [n.id for n in self.layout.controllers if n.id != leader]

    def applied_log(self, node_id: str) -> Path:
        return self.root / self.node(node_id).data_dir / "applied.jsonl"
