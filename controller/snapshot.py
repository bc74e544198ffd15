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
  thread keeps running), compresses each (zlib level 1), and renames the file into place durably
  (pysyncobj_compat.durable_replace: data fsynced, rename, directory fsynced);
- `check()` (serializeChecker) says SERIALIZING until then, SUCCESS once after it:
  pysyncobj compacts its journal only then. pysyncobj itself tries to rename the temp
  file right after `serialize` returns; `guarded_replace` (installed as pysyncobj's
  atomicReplace) refuses that while the writer owns the file, and a snapshot received
  from the leader cancels a writer still running, so an older snapshot never replaces
  a newer one;
- `deserialize(path)` loads this format, the one before it or pysyncobj's stock one
  (files written before). At start the node has read and checked its snapshot once
  already (controller/repair.py checks every file before the node uses it): that read is
  handed over (`LoadedSnapshot`) and installed as it is when the file is still the one
  read, instead of a second read.

File format 2 (written since 2026-12), made so that a restart decodes only what it needs
before it serves: the values stay encoded until read (controller/state_chunks.py).

    MAGIC, then per chunk: zlib(pickle(keys)), zlib(pickle((values, hashes))),
    then pickle(table), its length (8 bytes, little-endian), the CRC-32 of every
    byte before it (4 bytes), END_MAGIC

where table = {"format", "keys", "digest", "tail": (last entry, previous entry, cluster),
"chunks": [(kind, keys, hash sum, keys bytes, values bytes), ...]}. Each chunk holds
keys of one kind (topic, brokerset, ...). Loading one checks the CRC-32 over the whole
file (a flipped byte anywhere is refused before anything in it is used), that the chunks
fill the file and add up to the recorded key count and digest, and decodes the keys
only; a chunk's values are decoded when a key of it is first read, where the hashes
are checked against the chunk's recorded sum again.

Format 1 (read, no longer written): gzip(pickle(header) pickle(chunk) ...), header
being pysyncobj's tuple shape (meta, last entry, previous entry, cluster) with meta =
{"format", "keys", "chunks", "digest"} and each chunk a list of (key, value, hash).
"""

from __future__ import annotations

import gc
import gzip
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.controller import pysyncobj_compat
from mqmeta.controller.state_chunks import EncodedChunk
from mqmeta.controller.state_machine import DIGEST_MODULUS, ControllerState, FrozenState
from pysyncobj import SERIALIZER_STATE

from mqmeta.errors import CorruptData

log = logging.getLogger(__name__)

FORMAT = "mqmeta-controller-state-2"
FORMAT_1 = "mqmeta-controller-state-1"  # gzip(pickles): read, no longer written
MAGIC = b"MQMETA-SNAPSHOT-2\n"
END_MAGIC = b"\nMQMETA-END"
GZIP_MAGIC = b"\x1f\x8b"  # format 1 and pysyncobj's stock format
TABLE_LENGTH = struct.Struct("<Q")
CRC = struct.Struct("<I")  # CRC-32 of every byte before it, the table's length included
CHUNK_KEYS = 1000  # keys per pickle call: each call holds the GIL (~5 ms at 1,000 keys)
ZLIB_LEVEL = 1  # level 9 (pysyncobj's gzip) costs ~12x the CPU for a file ~10% smaller
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
                self.frozen.key_count,
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
        table: list[tuple[str, int, int, int, int]] = []
        with open(self.tmp_path, "wb") as out:
            out.write(MAGIC)
            crc = zlib.crc32(MAGIC)
            for kind, chunk in _chunks(self.frozen.items(), CHUNK_KEYS):
                if self._cancelled.is_set():
                    raise SnapshotCancelled(self.target_path)
                keys, values, hashes = (list(column) for column in zip(*chunk, strict=True))
                keys_blob = zlib.compress(pickle.dumps(keys, protocol=pickle.HIGHEST_PROTOCOL), ZLIB_LEVEL)
                values_blob = zlib.compress(
                    pickle.dumps((values, hashes), protocol=pickle.HIGHEST_PROTOCOL), ZLIB_LEVEL
                )
                for blob in (keys_blob, values_blob):
                    out.write(blob)
                    crc = zlib.crc32(blob, crc)
                table.append((kind, len(keys), sum(hashes), len(keys_blob), len(values_blob)))
                time.sleep(0)  # let the Raft thread have the GIL between chunks
            meta = {
                "format": FORMAT,
                "keys": sum(row[1] for row in table),
                "digest": self.frozen.digest,
                "tail": self.raft_tail,
                "chunks": table,
            }
            table_blob = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
            length = TABLE_LENGTH.pack(len(table_blob))
            out.write(table_blob + length)
            crc = zlib.crc32(length, zlib.crc32(table_blob, crc))
            out.write(CRC.pack(crc) + END_MAGIC)
        self.bytes = os.path.getsize(self.tmp_path)


Item = tuple[str, Any, int]  # (key, value, hash)


def _chunks(items: Iterator[Item], size: int) -> Iterator[tuple[str, list[Item]]]:
    """(kind, up to `size` items of that kind): the items grouped by their key's first
    segment as they come, so that a load adds each chunk's keys to its kind's set at once."""
    pending: dict[str, list[Item]] = {}
    for item in items:
        kind = item[0].partition("/")[0]
        chunk = pending.setdefault(kind, [])
        chunk.append(item)
        if len(chunk) == size:
            del pending[kind]
            yield kind, chunk
    for kind, chunk in pending.items():
        yield kind, chunk


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
    """A snapshot file read whole and checked (CRC-32, key count, digest), kept so that
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
    """The state a snapshot file holds (any format); CorruptData when it is damaged."""
    return read_snapshot(path)[0]


def read_snapshot(path: Path) -> tuple[ControllerState, tuple]:
    """(state, (last entry, previous entry, cluster)) of a snapshot file, any format.

    Format 2: the CRC-32 over the whole file, the chunk table against the file's length,
    key count and digest; the values stay encoded until read. Format 1 and pysyncobj's
    stock format: read to the end of the gzip stream, so its CRC-32 is checked, and (format
    1) the state's digest must equal the digest the writer recorded."""
    with open(path, "rb") as raw:
        return _read_snapshot(raw, path)


def read_position(path: Path) -> tuple:
    """(last entry, previous entry) a snapshot file was taken at, any format, with the same
    checks as read_snapshot (format 2: without decoding any key or value)."""
    with open(path, "rb") as raw:
        if _is_format_2(raw, path):
            return tuple(_check_format_2(raw.read(), path)[0]["tail"][:2])
    return tuple(pysyncobj_compat.read_snapshot_entries(path))


def _is_format_2(raw: Any, path: Path) -> bool:
    """Whether the open file is in format 2 (else gzip: format 1 or pysyncobj's stock
    one); CorruptData when it starts as neither. Leaves the file at its start."""
    head = raw.read(len(MAGIC))
    raw.seek(0)
    if head == MAGIC:
        return True
    if head.startswith(GZIP_MAGIC):
        return False
    raise CorruptData(f"{path} is not a snapshot file: it starts with neither of the formats' marks")


def _read_snapshot(raw: Any, path: Path) -> tuple[ControllerState, tuple]:
    if _is_format_2(raw, path):
        return _read_format_2(raw.read(), path)
    return _read_gzip_snapshot(raw, path)


def _check_format_2(data: bytes, path: Path) -> tuple[dict, int]:
    """(table, where the chunks end) of a format 2 file, after every check that needs no
    decoding: CorruptData when any byte differs from what was written."""
    crc_at = len(data) - CRC.size - len(END_MAGIC)
    trailer_at = crc_at - TABLE_LENGTH.size
    if trailer_at < len(MAGIC) or not data.endswith(END_MAGIC):
        raise CorruptData(f"{path} is cut short: it does not end as a snapshot file does")
    if zlib.crc32(memoryview(data)[:crc_at]) != CRC.unpack_from(data, crc_at)[0]:
        raise CorruptData(f"{path} fails its CRC-32: some of its bytes changed after it was written")
    table_at = trailer_at - TABLE_LENGTH.unpack_from(data, trailer_at)[0]
    meta = pickle.loads(data[table_at:trailer_at])
    if meta.get("format") != FORMAT:
        raise CorruptData(f"{path} is in format {meta.get('format')!r}, which this version cannot read")
    rows = meta["chunks"]
    if (
        sum(row[3] + row[4] for row in rows) != table_at - len(MAGIC)
        or sum(row[1] for row in rows) != meta["keys"]
        or format(sum(row[2] for row in rows) % DIGEST_MODULUS, "064x") != meta["digest"]
    ):
        raise CorruptData(f"{path}'s chunk table does not add up to its length, key count or digest")
    return meta, table_at


def _read_format_2(data: bytes, path: Path) -> tuple[ControllerState, tuple]:
    meta, _ = _check_format_2(data, path)
    chunks: list[tuple[str, EncodedChunk]] = []
    at = len(MAGIC)
    for kind, keys, hash_sum, keys_bytes, values_bytes in meta["chunks"]:
        names = pickle.loads(zlib.decompress(data[at : at + keys_bytes]))
        at += keys_bytes
        if len(names) != keys:
            raise CorruptData(f"{path} holds a chunk of {len(names)} keys where its table says {keys}")
        chunks.append((kind, EncodedChunk(names, hash_sum, data[at : at + values_bytes])))
        at += values_bytes
    state = ControllerState.from_encoded(chunks)
    if state.key_count != meta["keys"]:
        raise CorruptData(f"{path} names a key twice: {state.key_count} keys, not {meta['keys']}")
    return state, tuple(meta["tail"])


def _read_gzip_snapshot(raw: Any, path: Path) -> tuple[ControllerState, tuple]:
    with gzip.GzipFile(fileobj=raw, mode="rb") as source, _gc_paused:
        header = pickle.load(source)
        meta, tail = header[0], tuple(header[1:4])
        if not (isinstance(meta, dict) and meta.get("format") == FORMAT_1):
            state = meta["_state"]  # pysyncobj's stock format: ({"_state": state}, ...)
            source.read()  # to the end: the CRC
            return state, tail
        state = ControllerState.from_chunks(_read_chunks(source, meta["chunks"]))
        if source.read():
            raise CorruptData(f"{path} has data after its last chunk")
    if state.key_count != meta["keys"] or state.digest != meta["digest"]:
        raise CorruptData(
            f"{path} holds {state.key_count} keys with digest {state.digest[:16]}, "
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
            state.key_count,
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
