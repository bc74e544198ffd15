"""The control channel: a unix socket beside the mount, one JSON line each way.

A request is `{"command": NAME, ...arguments}`; the answer `{"ok": true, "status": {...}}`
or `{"ok": false, "error": "one sentence"}`. Commands: `status`, `lose-power`
(`writeback_fraction`, `seed`), `delay` (`fsync_ms`, `read_ms`), `fail-fsync` (`count`, `under`),
`disk-full` (`on`), `sync`. `FaultFsControl` is the client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import socketserver
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqmeta.chaos.faultfs.cache import PageCache

from mqmeta.errors import InvalidArgument, Unavailable

if TYPE_CHECKING:  # fuse_ops loads libfuse3: only the filesystem's own process needs it
    from mqmeta.chaos.faultfs.fuse_ops import FaultOperations

SOCKET_PATH_BYTES_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
REQUEST_BYTES_MAX = 4096
CONTROL_TIMEOUT_S = 30.0
DELAY_MS_MAX = 600_000
FAILURES_MAX = 1_000_000


def default_control_path(mountpoint: Path) -> Path:
    """`<mountpoint>.faultfs.sock` beside the mount, or under /tmp when that path is too
    long for a unix socket; both derived from the mountpoint alone, so the CLI finds it."""
    real = Path(mountpoint).resolve()
    beside = Path(f"{real}.faultfs.sock")
    if len(str(beside).encode()) <= SOCKET_PATH_BYTES_MAX:
        return beside
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:16]
    return Path(f"/tmp/faultfs-{digest}.sock")


class FaultFsControl:
    """A client of one mount's control socket."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def status(self) -> dict[str, Any]:
        return self._call("status")

    def lose_power(self, writeback_fraction: float = 0.0, seed: int = 0) -> dict[str, Any]:
        """Drops every unsynced page and directory entry. Stop the processes that use the
        mount first (kill -9): their open files are closed by the power loss."""
        return self._call("lose-power", writeback_fraction=writeback_fraction, seed=seed)

    def delay(self, fsync_ms: int | None = None, read_ms: int | None = None) -> dict[str, Any]:
        """Every fsync (file or directory) / read from now on waits this long (0: none)."""
        arguments = {"fsync_ms": fsync_ms, "read_ms": read_ms}
        return self._call("delay", **{k: v for k, v in arguments.items() if v is not None})

    def fail_next_fsync(self, count: int = 1, under: str = "/") -> dict[str, Any]:
        """The next `count` fsyncs (file or directory) of paths under `under` (a path
        inside the mount, "/" for any) fail with EIO."""
        return self._call("fail-fsync", count=count, under=under)

    def disk_full(self, on: bool) -> dict[str, Any]:
        """While on, writes, creates and mkdirs fail with ENOSPC."""
        return self._call("disk-full", on=on)

    def sync(self) -> dict[str, Any]:
        """Everything becomes durable (sync(2) of the whole filesystem)."""
        return self._call("sync")

    def _call(self, command: str, **arguments: Any) -> dict[str, Any]:
        request = json.dumps({"command": command, **arguments}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(CONTROL_TIMEOUT_S)
                connection.connect(str(self.path))
                connection.sendall(request)
                answer = connection.makefile("rb").readline()
        except OSError as error:
            raise Unavailable(f"the fault filesystem's control socket {self.path}: {error}") from error
        if not answer:
            raise Unavailable(f"the fault filesystem's control socket {self.path} closed without an answer")
        reply = json.loads(answer)
        if not reply["ok"]:
            raise InvalidArgument(reply["error"])
        status: dict[str, Any] = reply["status"]
        return status


def status_of(cache: PageCache) -> dict[str, Any]:
    return {
        "faults": dataclasses.asdict(cache.faults),
        "counters": dataclasses.asdict(cache.counters),
        "dirty_bytes": cache.dirty_bytes(),
        "inodes": len(cache.inodes),
    }


class ControlServer:
    """Serves one mount's control socket on a thread of its own."""

    def __init__(self, path: Path, operations: FaultOperations) -> None:
        self.path = path
        self.operations = operations
        path.unlink(missing_ok=True)
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(REQUEST_BYTES_MAX)
                try:
                    reply = {"ok": True, "status": owner.carry_out(json.loads(line))}
                except (InvalidArgument, ValueError, TypeError, KeyError) as error:
                    reply = {"ok": False, "error": str(error)}
                self.wfile.write(json.dumps(reply).encode() + b"\n")

        self._server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faultfs-control", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)

    def carry_out(self, request: dict[str, Any]) -> dict[str, Any]:
        operations, cache = self.operations, self.operations.cache
        command = request.get("command")
        if command == "lose-power":
            fraction = float(request.get("writeback_fraction", 0.0))
            if not 0.0 <= fraction <= 1.0:
                raise InvalidArgument(f"writeback_fraction must be between 0 and 1, not {fraction}")
            operations.lose_power(fraction, int(request.get("seed", 0)))
        elif command == "delay":
            fsync_ms = _bounded(request, "fsync_ms", cache.faults.fsync_delay_ms, DELAY_MS_MAX)
            read_ms = _bounded(request, "read_ms", cache.faults.read_delay_ms, DELAY_MS_MAX)
            cache.faults.fsync_delay_ms, cache.faults.read_delay_ms = fsync_ms, read_ms
        elif command == "fail-fsync":
            count = _bounded(request, "count", 1, FAILURES_MAX)
            under = request.get("under", "/")
            if not isinstance(under, str) or not under.startswith("/"):
                raise InvalidArgument(f"under must be a path inside the mount starting with /, not {under!r}")

            def arm() -> None:
                cache.faults.fsync_failures_pending, cache.faults.fsync_failure_under = count, under

            operations.locked(arm)
        elif command == "disk-full":
            cache.faults.disk_full = bool(request["on"])
        elif command == "sync":
            operations.locked(cache.sync_all)
        elif command != "status":
            raise InvalidArgument(f"unknown command {command!r}")
        return operations.locked(lambda: status_of(cache))


def _bounded(request: dict[str, Any], key: str, default: int, maximum: int) -> int:
    value = request.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise InvalidArgument(f"{key} must be an integer between 0 and {maximum}, not {value!r}")
    return value
