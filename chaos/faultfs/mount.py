"""A mount of the fault filesystem: its process, started and stopped from here.

`FaultFs.mount(backing, mountpoint)` runs `python -m mqmeta.chaos.faultfs` (the FUSE
loop plus the control socket) as a child process and returns once the mount answers;
`unmount()` unmounts it (a clean unmount makes everything durable, as umount(8) does)
and writes the durable state back into `backing` as a plain tree. `serve` is the child's
body. Needs /dev/fuse and fusermount3 (Debian's fuse3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from mqmeta.chaos.faultfs.cache import PageCache
from mqmeta.chaos.faultfs.control import ControlServer, FaultFsControl, default_control_path
from mqmeta.cluster.wait import WaitTimeout, wait_for

from mqmeta.errors import FailedPrecondition, InvalidArgument, Unavailable

MOUNT_TIMEOUT_S = 30.0
UNMOUNT_TIMEOUT_S = 30.0


def check_can_mount() -> None:
    """Raises FailedPrecondition with what is missing for a FUSE mount here."""
    if not os.path.exists("/dev/fuse"):
        raise FailedPrecondition("the fault filesystem needs /dev/fuse (FUSE in the kernel)")
    if shutil.which("fusermount3") is None:
        raise FailedPrecondition("the fault filesystem needs fusermount3 (apt-get install fuse3)")


def serve(backing: Path, mountpoint: Path, control: Path) -> None:
    """The FUSE loop in this process until unmounted (fusermount3 -u, or SIGTERM)."""
    try:  # mfusepy loads libfuse3 when imported
        from mqmeta.chaos.faultfs.fuse_ops import FaultFuse, FaultOperations
    except (ImportError, OSError) as error:
        raise FailedPrecondition(
            "the fault filesystem needs libfuse3 (apt-get install fuse3) and mfusepy "
            f"(pip install 'mqmeta[chaos]'): {error}"
        ) from error
    cache = PageCache(backing)
    operations = FaultOperations(cache)
    server = ControlServer(control, operations)
    server.start()
    try:
        FaultFuse(operations, str(mountpoint), foreground=True, fsname="faultfs", subtype="faultfs")
    finally:
        try:
            cache.close(sync=True)
        finally:
            server.stop()  # last: a gone socket tells `unmount` the tree is written back


class FaultFs(FaultFsControl):
    """A running mount: the control calls of FaultFsControl, plus unmount."""

    def __init__(
        self, backing: Path, mountpoint: Path, control: Path, process: subprocess.Popen[bytes]
    ) -> None:
        super().__init__(control)
        self.backing = backing
        self.mountpoint = mountpoint
        self.process = process

    @classmethod
    def mount(
        cls,
        backing: Path,
        mountpoint: Path,
        control: Path | None = None,
        log_path: Path | None = None,
        timeout_s: float = MOUNT_TIMEOUT_S,
    ) -> FaultFs:
        check_can_mount()
        backing, mountpoint = Path(backing).resolve(), Path(mountpoint).resolve()
        for what, path in (("backing", backing), ("mountpoint", mountpoint)):
            if not path.is_dir():
                raise InvalidArgument(f"the {what} directory {path} does not exist")
        if os.path.ismount(mountpoint):
            raise InvalidArgument(f"{mountpoint} is already a mount point")
        control = Path(control) if control else default_control_path(mountpoint)
        log = open(log_path or os.devnull, "ab")  # noqa: SIM115 (the child holds it)
        command = [sys.executable, "-m", "mqmeta.chaos.faultfs", str(backing), str(mountpoint), str(control)]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        mounted = cls(backing, mountpoint, control, process)
        try:
            wait_for(mounted._answers, timeout_s, f"the fault filesystem on {mountpoint}")
        except (WaitTimeout, Unavailable):
            mounted.unmount()
            raise
        return mounted

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise Unavailable(f"the fault filesystem process exited with {self.process.returncode}")
        if not os.path.ismount(self.mountpoint) or not self.path.exists():
            return False
        self.status()
        return True

    def unmount(self, timeout_s: float = UNMOUNT_TIMEOUT_S) -> None:
        """Unmounts (lazily if still busy after `timeout_s`) and waits for the process;
        kills it if it does not exit. Safe to call twice."""
        if self.process.poll() is None and os.path.ismount(self.mountpoint):
            try:
                wait_for(self._unmounted, timeout_s, f"{self.mountpoint} unmounted")
            except WaitTimeout:
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)

    def _unmounted(self) -> bool:
        subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
        return not os.path.ismount(self.mountpoint)

    def __enter__(self) -> FaultFs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.unmount()

    def describe(self) -> dict[str, Any]:
        return {
            "backing": str(self.backing),
            "mountpoint": str(self.mountpoint),
            "control": str(self.path),
            "pid": self.process.pid,
        }
