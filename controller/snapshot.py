"""Raft snapshots of the controller state, written beside the Raft thread, not in it.

pysyncobj's own snapshot pickles the whole state and gzips it (level 9) in its tick
thread. At 100,000 topics that is seconds during which the node sends no Raft heartbeat
and answers no vote: a leader loses its leadership, and since every node compacts at
about the same log length, the whole cluster can stall at once. This module plugs into
pysyncobj's public serializer hooks (SyncObjConf serializer, serializeChecker,
deserializer):

- `serialize(tmp_path, raft_tail)` runs in the tick thread: it freezes the state (two
  shallow dict copies; `apply` never changes a stored value in place), starts a writer
  thread and returns;
- the writer pickles the state in chunks (the GIL is free between chunks, so the tick
  thread keeps running), gzips at level 1, and renames the file into place durably
  (pysyncobj_compat.durable_replace: data fsynced, rename, directory fsynced);
- `check()` (serializeChecker) says SERIALIZING until then, SUCCESS once after it:
  pysyncobj compacts its journal only then. pysyncobj itself tries to rename the temp
  file right after `serialize` returns; `guarded_replace` (installed as pysyncobj's
  atomicReplace) refuses that while the writer owns the file, and a snapshot received
  from the leader cancels a writer still running, so an older snapshot never replaces
  a newer one;
- `deserialize(path)` loads this format or pysyncobj's stock one (files written before).
  At start the node has read and checked its snapshot once already (controller/repair.py
  checks every file before the node uses it): that read is handed over (`LoadedSnapshot`)
  and installed as it is when the file is still the one read, instead of a second read.

File format: gzip(pickle(header) pickle(chunk) ...), where header is pysyncobj's tuple
shape (meta, last entry, previous entry, cluster) with meta = {"format", "keys",
"chunks", "digest"}, and each chunk a list of (key, value, hash). read_snapshot_entries
(the restart check) reads the Raft position from the first pickle alone.
"""

from __future__ import annotations

import gc
import gzip
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.controller import pysyncobj_compat
from mqmeta.controller.state_machine import ControllerState, FrozenState
from pysyncobj import SERIALIZER_STATE

from mqmeta.errors import CorruptData

log = logging.getLogger(__name__)

FORMAT = "mqmeta-controller-state-1"
CHUNK_KEYS = 1000  # keys per pickle call: each call holds the GIL (~5 ms at 1,000 keys)
GZIP_LEVEL = 1  # level 9 (pysyncobj's) costs ~12x the CPU for a file ~10% smaller
WRITER_JOIN_S = 30.0


class SnapshotCancelled(Exception):
    """A newer snapshot (received from the leader) replaced the one being written."""


class SnapshotInProgress(OSError):
    """pysyncobj tried to rename a snapshot file the writer thread is still writing."""


# Writers in progress, by target path (every node of a process shares pysyncobj's rename).
_writers_lock = threading.Lock()
_writers: dict[str, SnapshotWriter] = {}


def guarded_replace(source: str, target: str) -> None:
    """pysyncobj's atomicReplace: durable_replace, except (a) pysyncobj's own rename of
    a file our writer is still writing is refused (pysyncobj counts its attempt as failed
    and asks check() instead), and (b) any other file replacing the target (a snapshot
    received from the leader) first cancels the writer, so it cannot land afterwards."""
    with _writers_lock:
        writer = _writers.get(os.path.abspath(target))
        if writer is not None:
            if os.path.abspath(source) == writer.tmp_path:
                raise SnapshotInProgress(f"{source} is still being written")
            writer.cancel()
        pysyncobj_compat.durable_replace(source, target)


class SnapshotWriter:
    """Writes one frozen state to tmp_path, then renames it over target_path."""

    def __init__(self, frozen: FrozenState, raft_tail: tuple, tmp_path: str, target_path: str) -> None:
        self.frozen = frozen
        self.raft_tail = raft_tail  # (last applied entry, previous entry, cluster)
        self.tmp_path = os.path.abspath(tmp_path)
        self.target_path = os.path.abspath(target_path)
        self.state = SERIALIZER_STATE.SERIALIZING
        self.started = time.monotonic()
        self.seconds = 0.0
        self.bytes = 0
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)

    def start(self) -> None:
        with _writers_lock:
            previous = _writers.get(self.target_path)
            assert previous is None, f"two snapshot writers for {self.target_path}"
            _writers[self.target_path] = self
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        outcome = SERIALIZER_STATE.FAILED
        try:
            self._write()
            with _writers_lock:  # a received snapshot replaces the target under this lock too
                if self._cancelled.is_set():
                    raise SnapshotCancelled(self.target_path)
                pysyncobj_compat.durable_replace(self.tmp_path, self.target_path)
            self.seconds = time.monotonic() - self.started
            log.info(
                "snapshot at index %d written: %d keys, %d bytes in %.3f s (beside the Raft thread)",
                self.raft_tail[0][1],
                len(self.frozen.entries),
                self.bytes,
                self.seconds,
            )
            outcome = SERIALIZER_STATE.SUCCESS
        except SnapshotCancelled:
            log.info("snapshot of %s cancelled: a newer one was installed", self.target_path)
        except Exception:  # any failure: pysyncobj keeps its journal and tries again later
            log.exception("writing the snapshot %s failed", self.tmp_path)
        finally:
            if outcome != SERIALIZER_STATE.SUCCESS:
                _unlink(self.tmp_path)
            with _writers_lock:
                if _writers.get(self.target_path) is self:
                    del _writers[self.target_path]
            self.state = outcome  # last: check() starts no new writer before this one is gone

    def _write(self) -> None:
        entries = self.frozen.entries
        chunks = -(-len(entries) // CHUNK_KEYS)
        meta = {"format": FORMAT, "keys": len(entries), "chunks": chunks, "digest": self.frozen.digest}
        with (
            open(self.tmp_path, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL) as out,
        ):
            out.write(pickle.dumps((meta, *self.raft_tail), protocol=pickle.HIGHEST_PROTOCOL))
            for chunk in _chunks(self.frozen.items(), CHUNK_KEYS):
                if self._cancelled.is_set():
                    raise SnapshotCancelled(self.target_path)
                out.write(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
                time.sleep(0)  # let the Raft thread have the GIL between chunks
        self.bytes = os.path.getsize(self.tmp_path)


def _chunks(items: Iterator[tuple[str, Any, int]], size: int) -> Iterator[list[tuple[str, Any, int]]]:
    chunk: list[tuple[str, Any, int]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _GcPause:
    """Holds the cyclic garbage collector off while a snapshot is decoded, across threads.

    Unpickling 100,000 values allocates hundreds of thousands of containers, and the
    collector runs on allocation counts: it walked the growing state over and over,
    about two thirds of the decode's CPU (0.56 s against 0.18 s at 120,000 keys). The
    values are JSON trees, which hold no cycles; reference counting frees them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._resume:
                gc.enable()


_gc_paused = _GcPause()

FileIdentity = tuple[int, int, int]  # (inode, size, mtime_ns) of the file that was read


@dataclass(frozen=True)
class LoadedSnapshot:
    """A snapshot file read whole and checked (gzip CRC, key count, digest), kept so that
    the node's first load of that same file installs it instead of reading it again."""

    path: str
    identity: FileIdentity
    state: ControllerState
    tail: tuple  # (last entry, previous entry, cluster)

    def is_file(self, path: str) -> bool:
        """True while `path` is still the very file that was read (not renamed over)."""
        try:
            return os.path.abspath(path) == self.path and _identity(os.stat(path)) == self.identity
        except OSError:
            return False


def _identity(stat: os.stat_result) -> FileIdentity:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def load_snapshot(path: Path) -> LoadedSnapshot:
    """Reads and checks a snapshot file (see read_snapshot), remembering which file it was."""
    with open(path, "rb") as raw:
        identity = _identity(os.fstat(raw.fileno()))
        state, tail = _read_snapshot(raw, path)
    return LoadedSnapshot(os.path.abspath(path), identity, state, tail)


def read_state(path: Path) -> ControllerState:
    """The state a snapshot file holds (either format); CorruptData when it is damaged."""
    return read_snapshot(path)[0]


def read_snapshot(path: Path) -> tuple[ControllerState, tuple]:
    """(state, (last entry, previous entry, cluster)) of a snapshot file.

    Reads to the end of the gzip stream, so its CRC-32 is checked; the state's digest
    must equal the digest the writer recorded."""
    with open(path, "rb") as raw:
        return _read_snapshot(raw, path)


def _read_snapshot(raw: Any, path: Path) -> tuple[ControllerState, tuple]:
    with gzip.GzipFile(fileobj=raw, mode="rb") as source, _gc_paused:
        header = pickle.load(source)
        meta, tail = header[0], tuple(header[1:4])
        if not (isinstance(meta, dict) and meta.get("format") == FORMAT):
            state = meta["_state"]  # pysyncobj's stock format: ({"_state": state}, ...)
            source.read()  # to the end: the CRC
            return state, tail
        state = ControllerState.from_chunks(_read_chunks(source, meta["chunks"]))
        if source.read():
            raise CorruptData(f"{path} has data after its last chunk")
    if len(state.entries) != meta["keys"] or state.digest != meta["digest"]:
        raise CorruptData(
            f"{path} holds {len(state.entries)} keys with digest {state.digest[:16]}, "
            f"not the {meta['keys']} keys with digest {meta['digest'][:16]} it was written with"
        )
    return state, tail


def _read_chunks(source: Any, chunks: int) -> Iterator[list[tuple[str, Any, int]]]:
    for _ in range(chunks):
        yield pickle.load(source)


class StateSnapshots:
    """The serializer, checker and deserializer one ControllerRaft gives pysyncobj."""

    def __init__(
        self,
        state_of: Callable[[], ControllerState],
        install: Callable[[ControllerState], None],
        loaded: LoadedSnapshot | None = None,
    ):
        self._state_of = state_of
        self._install = install
        self._loaded = loaded  # the start-up check's read of the snapshot: used once
        self._writer: SnapshotWriter | None = None
        self._closed = False

    def serialize(self, tmp_path: str, raft_tail: tuple) -> None:
        """pysyncobj's serializer(fileName, data): called in the tick thread."""
        if self._closed:
            return  # the node is stopping: check() says NOT_SERIALIZING, nothing is compacted
        target = tmp_path[: -len(".tmp")] if tmp_path.endswith(".tmp") else tmp_path + ".final"
        _unlink(tmp_path)  # a temp file left by a crash is never renamed into place
        writer = SnapshotWriter(self._state_of().freeze(), tuple(raft_tail), tmp_path, target)
        self._writer = writer
        writer.start()

    def check(self) -> int:
        """pysyncobj's serializeChecker: SUCCESS or FAILED exactly once per snapshot."""
        writer = self._writer
        if writer is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if writer.state == SERIALIZER_STATE.SERIALIZING:
            return SERIALIZER_STATE.SERIALIZING
        self._writer = None
        return writer.state

    def deserialize(self, path: str) -> tuple:
        """pysyncobj's deserializer(fileName): installs the state, returns the Raft tail.

        A snapshot that cannot be read here passed its checks before (at start, or the
        transfer's own), so failing is a bug or a disk going bad: the node stops rather
        than serve (pysyncobj would log it and carry on with the state it had)."""
        t0 = time.monotonic()
        loaded, self._loaded = self._loaded, None
        try:
            if loaded is not None and loaded.is_file(path):
                state, tail = loaded.state, loaded.tail  # read and checked at start
            else:
                state, tail = read_snapshot(Path(path))
        except Exception:
            log.critical("cannot load the Raft snapshot %s; stopping this node", path, exc_info=True)
            os._exit(70)
        self._install(state)
        log.info(
            "snapshot %s loaded: %d keys at index %d in %.2f s",
            path,
            len(state.entries),
            tail[0][1],
            time.monotonic() - t0,
        )
        return tail

    def close(self) -> None:
        """Cancels a writer still running and waits for it (a writer that outlived its node
        could rename an old snapshot over the one a restarted node wrote)."""
        self._closed = True
        writer = self._writer
        if writer is not None:
            writer.cancel()
            writer.join(WRITER_JOIN_S)
