"""Each node's data dir on its own fault filesystem mount (chaos/faultfs), for the disk faults.

A chaos run with a disk fault (power-loss-node, power-loss-all, slow-disk, fsync-eio)
mounts one fault filesystem per node (controllers and brokers: the nameserver keeps no
data) over `<cluster>/<node data dir>`, backed by `<output>/faultfs/<node>`; one node can
so lose power alone. At the end every mount is unmounted (a clean unmount makes what
the node wrote durable, as umount(8) does) and its backing tree is moved back to the data
dir, where the audit reads it. The tiered store stays on the plain disk.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mqmeta.chaos.failover import DISK_FAULTS
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.cluster.harness import Cluster

log = logging.getLogger(__name__)

__all__ = ["DISK_FAULTS", "NodeDisks"]


class NodeDisks:
    """The mounts of one cluster, by process name (c1, broker-a-1, ...)."""

    def __init__(self, cluster: Cluster, output_dir: Path) -> None:
        self.cluster = cluster
        self.base = output_dir / "faultfs"
        self.mounts: dict[str, FaultFs] = {}

    def data_dirs(self) -> dict[str, Path]:
        layout, root = self.cluster.layout, self.cluster.root
        dirs = {n.id: root / n.data_dir for n in layout.controllers}
        dirs.update({b.name: root / b.data_dir for b in layout.brokers})
        return dirs

    def mount(self) -> None:
        """Mounts every node's data dir (empty: call before the cluster starts)."""
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            for name, data_dir in self.data_dirs().items():
                backing = self.base / name
                backing.mkdir()
                data_dir.mkdir(parents=True, exist_ok=True)
                self.mounts[name] = FaultFs.mount(backing, data_dir, log_path=self.base / f"{name}.log")
        except BaseException:
            self.unmount()
            raise

    def unmount(self) -> None:
        """Unmounts every mount (stop the cluster first), and moves each backing tree back
        to its data dir. Goes on past a mount that fails, and logs it."""
        dirs = self.data_dirs()
        for name, mounted in list(self.mounts.items()):
            try:
                mounted.unmount()
            except Exception:
                log.exception("could not unmount %s", mounted.mountpoint)
                continue
            del self.mounts[name]
            data_dir = dirs[name]
            if os.path.ismount(data_dir):
                log.error("%s is still mounted; its data stays in %s", data_dir, mounted.backing)
                continue
            try:
                data_dir.rmdir()  # the empty mount point
                os.replace(mounted.backing, data_dir)
            except OSError:
                log.exception("could not move %s back to %s", mounted.backing, data_dir)

    def counters(self) -> dict[str, dict[str, int]]:
        found = {}
        for name, mounted in self.mounts.items():
            try:
                found[name] = mounted.status()["counters"]
            except Exception:  # a mount that does not answer: the run's result still gets written
                log.exception("no status from %s's mount", name)
        return found
