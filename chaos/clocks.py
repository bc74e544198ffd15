"""Each controller's wall clock, steppable one process at a time, for the clock-jump fault.

A clock-jump run starts every controller with MQMETA_CLOCK_OFFSET_FILE (mqmeta/clock.py)
naming its own file under `<cluster>/clock/`; writing an offset in ms there steps that
process's time.time() (not its monotonic clock), as `date -s` would step a machine's.
"""

from __future__ import annotations

import os
from pathlib import Path

from mqmeta.cluster.harness import Cluster

from mqmeta.clock import CLOCK_OFFSET_FILE_ENV


class NodeClocks:
    """The offset files of a cluster's controllers, by node id."""

    def __init__(self, cluster: Cluster) -> None:
        self.directory = cluster.root / "clock"
        self.nodes = [n.id for n in cluster.layout.controllers]

    def install(self, cluster: Cluster) -> None:
        """Creates the files (offset 0) and adds the variable to each controller's
        environment (call after the network has set its own process_env)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            self.step(node, 0)
        base = cluster.process_env

        def env(name: str) -> dict[str, str]:
            extra = dict(base(name))
            if name in self.nodes:
                extra[CLOCK_OFFSET_FILE_ENV] = str(self._path(node=name))
            return extra

        cluster.process_env = env

    def step(self, node: str, offset_ms: int) -> None:
        """From now on `node`'s wall clock reads real time + offset_ms."""
        path = self._path(node)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{offset_ms}\n")
        os.replace(tmp, path)

    def _path(self, node: str) -> Path:
        return self.directory / f"{node}.offset_ms"
