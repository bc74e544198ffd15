"""One embedded nameserver with a remoting listener, in its own process, for the remoting
ACL and TLS tests: its ports held by a PortReservation until it has stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mqmeta.cluster.ports import PortReservation
from mqmeta.cluster.wait import wait_for


@contextmanager
def remoting_namesrv(root: Path, flags: list[str]) -> Iterator[str]:
    """Starts `mqmeta namesrv --embed-controller --remoting-listen` with `flags` and yields
    the remoting address once it accepts connections; stops the process after."""
    ports = PortReservation.pick(3)
    grpc, raft, remoting = ports.addresses
    command = [sys.executable, "-m", "mqmeta.cli", "namesrv", "--listen", grpc, "--embed-controller"]
    command += ["--id", "c1", "--grpc", grpc, "--raft", raft, "--data-dir", str(root / "data")]
    command += ["--remoting-listen", remoting, "--insecure-raft", *flags]
    with open(root / "err", "wb") as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        wait_for(lambda: reachable(remoting) or process.poll() is not None, 60, "the nameserver")
        assert process.poll() is None, (root / "err").read_text()
        yield remoting
    finally:
        process.terminate()
        process.wait(30)
        ports.release()


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False
