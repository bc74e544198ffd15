"""The queue index: for every (topic, queue id), the commit offset and size of each of
its records in queue-offset order (RocketMQ's ConsumeQueue), so a read by queue offset
finds its record without scanning the log.

Files under the store's `index/`: `{topic}/{queue_id}`, a header (magic, version, queue
offset of the first entry) then 12-byte entries (commit offset u64, size u32). Entries
are kept in memory and mirrored to their files lazily, when the store checkpoints.

The index is derived from the commit log, and the store (store.py) sequences it: it
`add`s each record after the log append, `cut`s at a truncation, `flush`es before it
writes the checkpoint, which lists `rows()`; at open it `load`s what the checkpoint
lists and re-adds what the log holds past it. A missing or doubtful file means a rebuild.

This is the seam for indexes derived from the log: a per-topic key index (message query
by key) is a second class of this shape in its own module beside this one (key_index.py),
called by the store at the same five points (load, add, cut, flush, rows).
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from mqmeta.errors import CorruptData
from mqmeta.formats.atomic import fsync_dir, make_directories
from mqmeta.formats.records import TOPIC_PATTERN

log = logging.getLogger(__name__)

_INDEX_MAGIC = b"MQIX"
_INDEX_HEADER = struct.Struct("<4sIQ")  # magic, version, queue offset of the first entry
INDEX_ENTRY = struct.Struct("<QI")  # commit offset, size (also the tiered index object's entry)

QueueKey = tuple[str, int]


class Placed(Protocol):
    """Where a record was written: a PutResult, or a RecordHead scanned from the log."""

    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def queue_offset(self) -> int: ...
    @property
    def commit_offset(self) -> int: ...


class QueueFile:
    """One queue's entries in memory (12 bytes each), mirrored lazily to its file."""

    def __init__(self, topic: str, queue_id: int, base: int, path: Path) -> None:
        self.topic, self.queue_id, self.base, self.path = topic, queue_id, base, path
        self.entries = bytearray()
        self.flushed = 0  # entries durable in the file
        self.dirty = True  # the file needs writing (or cutting) and an fsync

    @property
    def count(self) -> int:
        return len(self.entries) // INDEX_ENTRY.size

    @property
    def max_offset(self) -> int:
        return self.base + self.count

    def entry(self, i: int) -> tuple[int, int]:
        commit_offset, size = INDEX_ENTRY.unpack_from(self.entries, i * INDEX_ENTRY.size)
        return commit_offset, size

    def append(self, commit_offset: int, size: int) -> None:
        self.entries += INDEX_ENTRY.pack(commit_offset, size)
        self.dirty = True

    def first_at_or_after(self, commit_offset: int) -> int:
        return bisect.bisect_left(range(self.count), commit_offset, key=lambda i: self.entry(i)[0])

    def count_ending_by(self, end_offset: int) -> int:
        return bisect.bisect_right(range(self.count), end_offset, key=lambda i: sum(self.entry(i)))

    def min_offset(self, log_min_offset: int) -> int:
        """The first queue offset whose record the log still holds."""
        return self.base + self.first_at_or_after(log_min_offset)

    def cut(self, commit_offset: int) -> None:
        """Drops the entries at or after `commit_offset`."""
        keep = self.first_at_or_after(commit_offset)
        if keep < self.count:
            del self.entries[keep * INDEX_ENTRY.size :]
            self.flushed = min(self.flushed, keep)
            self.dirty = True

    def flush(self, fsync: bool) -> bool:
        """Writes the unflushed entries (and cuts stale ones); True when it made the file."""
        if not self.dirty:
            return False
        created = not self.path.exists()
        make_directories(self.path.parent, fsync)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = INDEX_ENTRY.size
            if created:
                os.pwrite(fd, _INDEX_HEADER.pack(_INDEX_MAGIC, 1, self.base), 0)
            os.pwrite(
                fd, bytes(self.entries[self.flushed * size :]), _INDEX_HEADER.size + self.flushed * size
            )
            os.ftruncate(fd, _INDEX_HEADER.size + len(self.entries))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.flushed = self.count
        self.dirty = False
        return created


class QueueIndex:
    """Every queue's entries, under `directory` (the store's index/). Not thread-safe: the
    store calls it under its lock. `label` names the store in errors."""

    def __init__(self, directory: Path, label: str) -> None:
        self.directory = directory
        self.label = label
        self.queues: dict[QueueKey, QueueFile] = {}

    def __len__(self) -> int:
        return len(self.queues)

    def get(self, key: QueueKey) -> QueueFile | None:
        return self.queues.get(key)

    def next_offset(self, key: QueueKey) -> int:
        """The queue offset the next record of `key` gets (0 for a new queue)."""
        queue = self.queues.get(key)
        return queue.max_offset if queue is not None else 0

    def keys(self) -> list[QueueKey]:
        return sorted(self.queues)

    # Load and rows (the checkpoint's "queues") -------------------------------------------
    def rows(self) -> list[list[Any]]:
        return [[q.topic, q.queue_id, q.base, q.count] for q in self.queues.values()]

    def load(self, listed: list[Any], trusted: int) -> bool:
        """Loads the files the checkpoint lists (rows()) and cuts their entries at `trusted`;
        False (and nothing loaded) when one is missing or does not match. Files it does not
        list were written after it and are deleted (rebuilt from the log)."""
        queues: dict[QueueKey, QueueFile] = {}
        try:
            for topic, queue_id, base, count in listed:
                if (
                    not TOPIC_PATTERN.fullmatch(topic)
                    or type(queue_id) is not int
                    or type(base) is not int
                    or type(count) is not int
                ):
                    raise ValueError(f"bad queue {topic!r}/{queue_id!r}")
                queue = self._load_file(topic, queue_id, base, count)
                if queue is None:
                    return False
                queues[(topic, queue_id)] = queue
        except (TypeError, ValueError) as exc:
            log.warning("%s: unusable queue list (%s)", self.directory, exc)
            return False
        names = {(topic, str(queue_id)) for topic, queue_id in queues}
        for path in self.directory.glob("*/*"):
            if (path.parent.name, path.name) not in names:
                path.unlink()  # written after the checkpoint: rebuilt from the log
        self.queues = queues
        self.cut(trusted)
        return True

    def _load_file(self, topic: str, queue_id: int, base: int, count: int) -> QueueFile | None:
        path = self.directory / topic / str(queue_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            log.warning("%s: missing although the checkpoint lists it", path)
            return None
        size = INDEX_ENTRY.size
        if (
            len(data) < _INDEX_HEADER.size
            or _INDEX_HEADER.unpack_from(data) != (_INDEX_MAGIC, 1, base)
            or len(data) < _INDEX_HEADER.size + count * size
        ):
            log.warning("%s: header or length does not match the checkpoint", path)
            return None
        queue = QueueFile(topic, queue_id, base, path)
        queue.entries = bytearray(data[_INDEX_HEADER.size : _INDEX_HEADER.size + count * size])
        queue.flushed = count
        queue.dirty = len(data) != _INDEX_HEADER.size + count * size
        return queue

    def reset(self) -> None:
        """Empty, for a rebuild from the whole log."""
        self.queues = {}

    # Add, cut, flush -----------------------------------------------------------------------
    def add(self, topic: str, queue_id: int, queue_offset: int, commit_offset: int, size: int) -> None:
        self._queue_at(topic, queue_id, queue_offset, commit_offset).append(commit_offset, size)

    def add_batch(self, placed: Sequence[Placed], sizes: list[int]) -> None:
        """add() of each record just appended, with one entry write per queue."""
        entries: dict[QueueKey, list[bytes]] = {}
        first: dict[QueueKey, Placed] = {}
        pack = INDEX_ENTRY.pack
        for record, size in zip(placed, sizes, strict=True):
            key = (record.topic, record.queue_id)
            found = entries.get(key)
            if found is None:
                entries[key] = found = []
                first[key] = record
            found.append(pack(record.commit_offset, size))
        for key, packed in entries.items():
            head = first[key]
            queue = self._queue_at(head.topic, head.queue_id, head.queue_offset, head.commit_offset)
            queue.entries += b"".join(packed)
            queue.dirty = True

    def _queue_at(self, topic: str, queue_id: int, queue_offset: int, commit_offset: int) -> QueueFile:
        """The index of topic/queue_id, whose next entry must be `queue_offset` (made at it
        when new); CorruptData otherwise, naming the record at `commit_offset`."""
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = QueueFile(topic, queue_id, queue_offset, self.directory / topic / str(queue_id))
            self.queues[(topic, queue_id)] = queue
        elif queue_offset != queue.max_offset:
            raise CorruptData(
                f"{self.label}: the record at {commit_offset} has queue offset "
                f"{queue_offset} in {topic}/{queue_id}, which expects {queue.max_offset}"
            )
        return queue

    def cut(self, commit_offset: int) -> None:
        """Drops every entry at or after `commit_offset` (a truncation)."""
        for queue in self.queues.values():
            queue.cut(commit_offset)

    def flush(self, fsync: bool) -> None:
        """Makes every queue file durable (the checkpoint that lists them comes after)."""
        make_directories(self.directory, fsync)
        made_dirs: set[Path] = set()
        for queue in self.queues.values():
            if queue.flush(fsync):
                made_dirs.add(queue.path.parent)
        if fsync:
            for directory in made_dirs:
                fsync_dir(directory)
            fsync_dir(self.directory)

    # Reads ---------------------------------------------------------------------------------
    def runs_between(self, start: int, end: int) -> dict[QueueKey, tuple[int, bytes]]:
        """Each queue's entries for its records in [start, end): (queue offset of the
        first, the entries packed as INDEX_ENTRY), sliced without decoding them."""
        found: dict[QueueKey, tuple[int, bytes]] = {}
        size = INDEX_ENTRY.size
        for key, queue in self.queues.items():
            low, high = queue.first_at_or_after(start), queue.first_at_or_after(end)
            if low < high:
                found[key] = (queue.base + low, bytes(queue.entries[low * size : high * size]))
        return found
