"""The broker's message store: commit log + per-queue index + epoch file + consumer offsets.

Layout under `directory`:

    commitlog/{base:020d}.log       the records (the source of truth)
    epochs.json                     (epoch, start offset) entries
    index/{topic}/{queue_id}        per-queue index: header, then 12-byte entries
                                    (commit offset u64, size u32), RocketMQ ConsumeQueue style
    index/checkpoint.json           how far the index files are complete and durable, with
                                    the consumer offsets as of that point
    truncate.json                   a truncation in progress (present only during one)

The index and the consumer offsets are derived from the commit log. Index entries are
kept in memory and appended to their files lazily: every `index_checkpoint_bytes` of
log, on truncate and on close, the dirty index files are fsynced and then the
checkpoint is written (temp + fsync + rename). At open, entries at or past the
checkpoint are dropped and rebuilt by scanning the log from there; a missing or
corrupt checkpoint or index file means a full rebuild from the log.

Consumer offsets are records of the system topic %CONSUMER_OFFSET% (queue 0), so they
replicate with the data and follow truncation. A record holds a group's progress in one
queue: the offset below which everything is consumed and, for consumers that acknowledge
messages one by one (the RocketMQ 5 service), the ranges above it already acknowledged;
the latest record of a (group, topic, queue) is its whole progress.

Order of effects, each chosen so that a crash between two steps is recovered at open:
- master append: the epoch entry (begin_epoch) is durable before any record of it;
- slave append: new epoch entries first, then the records. A crash between leaves an
  entry starting at or past the log's end: past it, it is dropped at open; at it, it
  names an epoch without records, which the next truncation to the consistent point
  drops;
- truncate: write truncate.json, then the epoch file, then the commit log, then the
  index files and checkpoint, then delete truncate.json. At open an intent found is
  redone (every step is idempotent) before the index is loaded, so the epoch file never
  keeps an entry for records that are gone and the log never keeps records whose epoch
  entry is gone.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import struct
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from mqmeta.broker_agent.commitlog import (
    APPEND_BYTES_MAX,
    SEGMENT_BYTES_DEFAULT,
    CommitLog,
    FileRange,
)
from mqmeta.broker_agent.origins import Incoming, OriginHead, OriginTable

from mqmeta.errors import CorruptData, FailedPrecondition, FencedEpoch, InvalidArgument
from mqmeta.formats.atomic import fsync_dir, make_directories, write_atomically
from mqmeta.formats.checksummed import dump_checksummed, load_checksummed
from mqmeta.formats.epochs import EpochFile, epoch_covering
from mqmeta.formats.origin import MSG_ID, Origin, OriginKey, origin_of
from mqmeta.formats.records import (
    MSG_ID_PATTERN,
    QUEUE_ID_MAX,
    TOPIC_PATTERN,
    Message,
    MessageFields,
    RecordHead,
    StoredRecord,
    decode_record,
    encode_record,
    iter_records,
    msg_id_prefix,
    scan_records,
    validate_topic,
)
from mqmeta.pb import broker_pb2

log = logging.getLogger(__name__)

# What put_messages takes: its own Message, or the broker protocol's (the Send path)
_MESSAGE_TYPES = (Message, broker_pb2.Message)

CONSUMER_OFFSET_TOPIC = "%CONSUMER_OFFSET%"
PUT_BATCH_MAX = 1024
PUT_BATCH_BYTES_MAX = 32 << 20
GET_COUNT_MAX = 1024
GET_BYTES_DEFAULT = 8 << 20
GET_BYTES_MAX = 64 << 20
QUEUES_MAX = 1 << 20
CONSUMER_OFFSET_KEYS_MAX = 1 << 20
INDEX_CHECKPOINT_BYTES_DEFAULT = 16 << 20
SCAN_READ_BYTES = 4 << 20
BROKER_NAME_BYTES_MAX = 255
OFFSET_MAX = (1 << 63) - 1
COPY_SEARCH_RECORDS_MAX = 16384  # how far back a resend's original copy is looked for

_INDEX_MAGIC = b"MQIX"
_INDEX_HEADER = struct.Struct("<4sIQ")  # magic, version, queue offset of the first entry
_INDEX_ENTRY = struct.Struct("<QI")  # commit offset, size

QueueKey = tuple[str, int]
ConsumerKey = tuple[str, str, int]  # group, topic, queue id
AckedRanges = tuple[tuple[int, int], ...]  # [start, end) queue offsets above the consumed offset
Progress = tuple[int, AckedRanges]  # consumed offset, acknowledged ranges above it
ACKED_RANGES_MAX = 4096  # per progress record: bounds its size (about 40 KB)


class PutResult(NamedTuple):
    """Where a record was written (one per record: a NamedTuple is built in C, about half
    the cost of a frozen dataclass)."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    duplicate: bool = False  # a replicated copy stored before (its original's position; -1: too old)


def _check_int(kind: str, value: object, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{kind} {value!r} is not an integer in [{minimum}, {maximum}]")
    return value


def _consumer_offset_body(
    group: str, topic: str, queue_id: int, offset: int, acked: AckedRanges = ()
) -> bytes:
    body: dict[str, object] = {"group": group, "offset": offset, "queue_id": queue_id, "topic": topic}
    if acked:  # absent when empty: a plain consumer offset record keeps its old bytes
        body["acked"] = [list(r) for r in acked]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def check_acked_ranges(offset: int, acked: Any) -> AckedRanges:
    """`acked` as sorted, disjoint, non-adjacent [start, end) ranges above `offset`;
    ValueError when it is not."""
    if not isinstance(acked, list | tuple) or len(acked) > ACKED_RANGES_MAX:
        raise ValueError(f"acked must be a list of at most {ACKED_RANGES_MAX} ranges")
    ranges: list[tuple[int, int]] = []
    previous_end = offset
    for item in acked:
        if not isinstance(item, list | tuple) or len(item) != 2 or any(type(v) is not int for v in item):
            raise ValueError(f"acked range {item!r} is not [start, end)")
        start, end = item
        if not previous_end < start < end <= OFFSET_MAX:
            raise ValueError(f"acked range {item!r} is not sorted, disjoint and above {offset}")
        ranges.append((start, end))
        previous_end = end
    return tuple(ranges)


def _parse_consumer_offset(record: StoredRecord) -> tuple[ConsumerKey, Progress]:
    try:
        body = json.loads(record.body)
        key = (body["group"], body["topic"], body["queue_id"])
        offset = body["offset"]
        if not (
            isinstance(key[0], str)
            and isinstance(key[1], str)
            and type(key[2]) is int
            and type(offset) is int
            and offset >= 0
        ):
            raise TypeError("group, topic, queue_id or offset")
        acked = check_acked_ranges(offset, body.get("acked", []))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise CorruptData(
            f"consumer offset record at {record.commit_offset} has a malformed body {record.body[:200]!r}"
        ) from None
    return key, (offset, acked)


class _QueueIndex:
    """One queue's entries in memory (12 bytes each), mirrored lazily to its file."""

    def __init__(self, topic: str, queue_id: int, base: int, path: Path) -> None:
        self.topic, self.queue_id, self.base, self.path = topic, queue_id, base, path
        self.entries = bytearray()
        self.flushed = 0  # entries durable in the file
        self.dirty = True  # the file needs writing (or cutting) and an fsync

    @property
    def count(self) -> int:
        return len(self.entries) // _INDEX_ENTRY.size

    @property
    def max_offset(self) -> int:
        return self.base + self.count

    def entry(self, i: int) -> tuple[int, int]:
        commit_offset, size = _INDEX_ENTRY.unpack_from(self.entries, i * _INDEX_ENTRY.size)
        return commit_offset, size

    def append(self, commit_offset: int, size: int) -> None:
        self.entries += _INDEX_ENTRY.pack(commit_offset, size)
        self.dirty = True

    def first_at_or_after(self, commit_offset: int) -> int:
        return bisect.bisect_left(range(self.count), commit_offset, key=lambda i: self.entry(i)[0])

    def count_ending_by(self, end_offset: int) -> int:
        return bisect.bisect_right(range(self.count), end_offset, key=lambda i: sum(self.entry(i)))

    def cut(self, commit_offset: int) -> None:
        """Drops the entries at or after `commit_offset`."""
        keep = self.first_at_or_after(commit_offset)
        if keep < self.count:
            del self.entries[keep * _INDEX_ENTRY.size :]
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
            size = _INDEX_ENTRY.size
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


class MessageStore:
    """The broker's storage; every public method is thread-safe (one lock)."""

    def __init__(
        self,
        directory: Path | str,
        segment_bytes: int = SEGMENT_BYTES_DEFAULT,
        fsync: bool = True,
        broker_name: str = "b",
        *,
        index_checkpoint_bytes: int = INDEX_CHECKPOINT_BYTES_DEFAULT,
        group_commit: bool = False,
    ) -> None:
        if not isinstance(broker_name, str) or not 0 < len(broker_name.encode()) <= BROKER_NAME_BYTES_MAX:
            raise InvalidArgument(f"broker_name {broker_name!r} must be 1-{BROKER_NAME_BYTES_MAX} bytes")
        _check_int("index_checkpoint_bytes", index_checkpoint_bytes, 1, 1 << 40)
        self.directory = Path(directory)
        make_directories(self.directory, fsync)
        self.broker_name = broker_name
        self.fsync = fsync
        # group_commit: a put only writes; the caller makes it durable with sync() (the
        # broker's master: one fdatasync for every writer waiting, outside the locks)
        self.group_commit = group_commit
        self.index_checkpoint_bytes = index_checkpoint_bytes
        self._lock = threading.Lock()
        self._closed = False
        self._index_dir = self.directory / "index"
        self._checkpoint_path = self._index_dir / "checkpoint.json"
        self._intent_path = self.directory / "truncate.json"
        self._queues: dict[QueueKey, _QueueIndex] = {}
        self._consumer_offsets: dict[ConsumerKey, Progress] = {}
        self._checkpoint_offset = 0
        self._checkpoint_consumer_offsets: dict[ConsumerKey, Progress] = {}
        self._origins = OriginTable()  # per origin queue, the highest copy held (broker_agent.origins)
        self._checkpoint_origins = OriginTable()
        self.log = CommitLog(self.directory / "commitlog", segment_bytes, fsync)
        try:
            self.epochs = EpochFile(self.directory / "epochs.json", fsync)
            self._open()
        except BaseException:
            self.log.close()
            raise

    # Opening ---------------------------------------------------------------------------------
    def _open(self) -> None:
        intent = self._read_intent()
        if intent is not None:
            log.warning("%s: finishing a truncation to %d that a crash interrupted", self.directory, intent)
            self._truncate_durable(intent)
        max_offset = self.log.max_offset
        if any(start > max_offset for _, start in self.epochs.entries):
            log.warning(
                "%s: dropping epoch entries that start past the log's end %d (a crash "
                "came between writing them and their records)",
                self.directory,
                max_offset,
            )
            self.epochs.truncate_from(max_offset + 1)
        if max_offset > self.log.min_offset and not self.epochs.entries:
            raise CorruptData(
                f"{self.directory}: the commit log holds records but the epoch file "
                "has no entry; refusing to guess which master wrote them"
            )
        trusted = self._load_index()
        self._scan_into_index(trusted)
        self._write_checkpoint()
        if intent is not None:
            self._remove_intent()

    def _read_intent(self) -> int | None:
        if not self._intent_path.exists():
            return None
        body = load_checksummed(self._intent_path)
        offset = body.get("offset")
        if type(offset) is not int or offset < 0:
            raise CorruptData(f"{self._intent_path}: no valid offset")
        return offset

    def _remove_intent(self) -> None:
        self._intent_path.unlink(missing_ok=True)
        if self.fsync:
            fsync_dir(self.directory)

    def _load_index(self) -> int:
        """Loads the durable part of the index; returns the offset to rebuild from."""
        checkpoint = self._read_checkpoint()
        queues = self._load_queue_files(checkpoint[2]) if checkpoint is not None else None
        if checkpoint is not None and checkpoint[0] < self.log.min_offset:
            queues = None  # retention deleted records the index never saw
        if checkpoint is None or queues is None:
            if self._index_dir.exists():
                log.warning("%s: the index is incomplete; rebuilding it from the commit log", self.directory)
                shutil.rmtree(self._index_dir)
            self._queues, self._consumer_offsets = {}, {}
            self._origins = OriginTable()
            self._checkpoint_offset = self.log.min_offset
            self._checkpoint_consumer_offsets = {}
            self._checkpoint_origins = OriginTable()
            return self.log.min_offset
        indexed_offset, consumer_offsets, _, origins = checkpoint
        trusted = min(indexed_offset, self.log.max_offset)
        self._queues = queues
        for queue in queues.values():
            queue.cut(trusted)
        if indexed_offset <= self.log.max_offset:
            self._consumer_offsets = dict(consumer_offsets)
            self._origins = origins
        else:  # the log was cut below the checkpoint: replay the offsets it still holds
            self._consumer_offsets = self._replay_consumer_offsets({}, self.log.min_offset, trusted)
            self._origins = self._replay_origins(OriginTable(), self.log.min_offset)
        self._checkpoint_offset = trusted
        self._checkpoint_consumer_offsets = dict(self._consumer_offsets)
        self._checkpoint_origins = self._origins.copy()
        return trusted

    def _read_checkpoint(self) -> tuple[int, dict[ConsumerKey, Progress], list[Any], OriginTable] | None:
        """(indexed offset, consumer offsets, queue list), or None when missing or unusable
        (the index is derived data: it is rebuilt, never trusted when in doubt)."""
        if not self._checkpoint_path.exists():
            return None
        try:
            body = load_checksummed(self._checkpoint_path)
            indexed_offset = body["indexed_offset"]
            offsets = {
                (row[0], row[1], row[2]): (row[3], check_acked_ranges(row[3], row[4] if len(row) > 4 else []))
                for row in body["consumer_offsets"]  # type: ignore[attr-defined]
            }
            queues = body["queues"]
            if type(indexed_offset) is not int or not isinstance(queues, list):
                raise TypeError("indexed_offset or queues")
            # A checkpoint from before origins were kept: rebuilt once, from the whole log.
            origins = OriginTable.from_rows(body["origins"])  # type: ignore[arg-type]
        except (CorruptData, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: unusable (%s); the index will be rebuilt", self._checkpoint_path, exc)
            return None
        return indexed_offset, offsets, queues, origins

    def _load_queue_files(self, listed: list[Any]) -> dict[QueueKey, _QueueIndex] | None:
        queues: dict[QueueKey, _QueueIndex] = {}
        try:
            for topic, queue_id, base, count in listed:
                if (
                    not TOPIC_PATTERN.fullmatch(topic)
                    or type(queue_id) is not int
                    or type(base) is not int
                    or type(count) is not int
                ):
                    raise ValueError(f"bad queue {topic!r}/{queue_id!r}")
                queue = self._load_queue_file(topic, queue_id, base, count)
                if queue is None:
                    return None
                queues[(topic, queue_id)] = queue
        except (TypeError, ValueError) as exc:
            log.warning("%s: unusable queue list (%s)", self._checkpoint_path, exc)
            return None
        names = {(topic, str(queue_id)) for topic, queue_id in queues}
        for path in self._index_dir.glob("*/*"):
            if (path.parent.name, path.name) not in names:
                path.unlink()  # written after the checkpoint: rebuilt from the log
        return queues

    def _load_queue_file(self, topic: str, queue_id: int, base: int, count: int) -> _QueueIndex | None:
        path = self._index_dir / topic / str(queue_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            log.warning("%s: missing although the checkpoint lists it", path)
            return None
        size = _INDEX_ENTRY.size
        if (
            len(data) < _INDEX_HEADER.size
            or _INDEX_HEADER.unpack_from(data) != (_INDEX_MAGIC, 1, base)
            or len(data) < _INDEX_HEADER.size + count * size
        ):
            log.warning("%s: header or length does not match the checkpoint", path)
            return None
        queue = _QueueIndex(topic, queue_id, base, path)
        queue.entries = bytearray(data[_INDEX_HEADER.size : _INDEX_HEADER.size + count * size])
        queue.flushed = count
        queue.dirty = len(data) != _INDEX_HEADER.size + count * size
        return queue

    def _scan_into_index(self, start: int) -> None:
        """Indexes the records in [start, max_offset), checking each one's epoch entry."""
        end = self.log.max_offset
        if start < end:
            log.info("%s: indexing the commit log from %d to %d", self.directory, start, end)
        entries = self.epochs.entries
        offset = start
        while offset < end:
            data = self.log.read(offset, SCAN_READ_BYTES)
            for record in iter_records(data, offset):
                covering = epoch_covering(entries, record.commit_offset)
                if covering != record.epoch:
                    raise CorruptData(
                        f"{self.directory}: the record at {record.commit_offset} has epoch "
                        f"{record.epoch} but the epoch file says {covering} for that offset"
                    )
                self._index_record(
                    record.topic, record.queue_id, record.queue_offset, record.commit_offset, record.size
                )
                if record.topic == CONSUMER_OFFSET_TOPIC:
                    key, value = _parse_consumer_offset(record)
                    self._consumer_offsets[key] = value
                self._note_origin(self._origins, record)
            offset += len(data)

    def _index_record(
        self, topic: str, queue_id: int, queue_offset: int, commit_offset: int, size: int
    ) -> None:
        self._queue_at(topic, queue_id, queue_offset, commit_offset).append(commit_offset, size)

    def _queue_at(self, topic: str, queue_id: int, queue_offset: int, commit_offset: int) -> _QueueIndex:
        """The index of topic/queue_id, whose next entry must be `queue_offset` (made at it
        when new); CorruptData otherwise, naming the record at `commit_offset`."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            queue = _QueueIndex(topic, queue_id, queue_offset, self._index_dir / topic / str(queue_id))
            self._queues[(topic, queue_id)] = queue
        elif queue_offset != queue.max_offset:
            raise CorruptData(
                f"{self.directory}: the record at {commit_offset} has queue offset "
                f"{queue_offset} in {topic}/{queue_id}, which expects {queue.max_offset}"
            )
        return queue

    def _replay_consumer_offsets(
        self, start_from: dict[ConsumerKey, Progress], start: int, end: int
    ) -> dict[ConsumerKey, Progress]:
        """`start_from` updated with the consumer offset records in [start, end)."""
        offsets = dict(start_from)
        queue = self._queues.get((CONSUMER_OFFSET_TOPIC, 0))
        if queue is None:
            return offsets
        for i in range(queue.first_at_or_after(max(start, self.log.min_offset)), queue.count):
            commit_offset, size = queue.entry(i)
            if commit_offset >= end:
                break
            key, value = _parse_consumer_offset(self.log.read_record_at(commit_offset, size))
            offsets[key] = value
        return offsets

    def _note_origin(self, table: OriginTable, record: StoredRecord | RecordHead) -> None:
        try:
            origin = origin_of(record.properties)
        except InvalidArgument as error:  # checked when it was sent: written by another version
            log.warning("%s: record at %d: %s", self.directory, record.commit_offset, error.message)
            return
        if origin is not None:
            table.note(origin, _head(origin, record.topic, record.queue_id, record.queue_offset, record))

    def _replay_origins(self, table: OriginTable, start: int) -> OriginTable:
        """`table` updated with the replicated copies in [start, max_offset) of the log."""
        offset, end = max(start, self.log.min_offset), self.log.max_offset
        while offset < end:
            data = self.log.read(offset, SCAN_READ_BYTES)
            for record in iter_records(data, offset):
                self._note_origin(table, record)
            offset += len(data)
        return table

    # Checkpoint ----------------------------------------------------------------------------------
    def _write_checkpoint(self) -> None:
        self.log.sync()  # the checkpoint never names bytes a power loss could take
        make_directories(self._index_dir, self.fsync)
        made_dirs: set[Path] = set()
        for queue in self._queues.values():
            if queue.flush(self.fsync):
                made_dirs.add(queue.path.parent)
        if self.fsync:
            for directory in made_dirs:
                fsync_dir(directory)
            fsync_dir(self._index_dir)
        indexed_offset = self.log.max_offset
        body: dict[str, object] = {
            "indexed_offset": indexed_offset,
            "queues": [[q.topic, q.queue_id, q.base, q.count] for q in self._queues.values()],
            "consumer_offsets": [
                [g, t, q, o, [list(r) for r in acked]] if acked else [g, t, q, o]
                for (g, t, q), (o, acked) in sorted(self._consumer_offsets.items())
            ],
            "origins": self._origins.to_rows(),
        }
        write_atomically(self._checkpoint_path, dump_checksummed(body), self.fsync)
        self._checkpoint_offset = indexed_offset
        self._checkpoint_consumer_offsets = dict(self._consumer_offsets)
        self._checkpoint_origins = self._origins.copy()

    def _maybe_checkpoint(self) -> None:
        if self.log.max_offset - self._checkpoint_offset >= self.index_checkpoint_bytes:
            self._write_checkpoint()

    def checkpoint(self) -> None:
        """Makes the index and consumer offsets durable up to max_offset (fast reopen)."""
        with self._lock:
            self._check_open()
            self._write_checkpoint()

    # Writes ----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise FailedPrecondition(f"message store {self.directory} is closed")

    def _check_epoch(self, epoch: int) -> None:
        last = self.epochs.last_epoch
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise InvalidArgument(f"epoch {epoch!r} is not a positive integer")
        if epoch < last:
            raise FencedEpoch(f"epoch {epoch} is older than this store's epoch {last}")
        if epoch > last:
            raise FailedPrecondition(
                f"epoch {epoch} has not begun in this store (its last epoch "
                f"is {last}); call begin_epoch first"
            )

    def begin_epoch(self, epoch: int) -> None:
        """Starts writing as master of `epoch`: appends (epoch, max_offset) to the epoch file."""
        with self._lock:
            self._check_open()
            self.log.sync()  # the epoch never starts past bytes a power loss could take
            self.epochs.append(epoch, self.log.max_offset)

    def put_messages(self, messages: Sequence[MessageFields], epoch: int, now_ms: int) -> list[PutResult]:
        """Appends `messages` (Message, or the broker protocol's Message: one commit-log
        write, durable on return when fsync, or after sync() with group_commit) at the
        next offset of each queue; `epoch` must be the store's current epoch."""
        if not 0 < len(messages) <= PUT_BATCH_MAX:
            raise InvalidArgument(f"a put carries 1 to {PUT_BATCH_MAX} messages, not {len(messages)}")
        origins: list[Origin | None] = []
        for message in messages:
            if type(message) not in _MESSAGE_TYPES:
                raise InvalidArgument(f"expected a Message, got {type(message).__name__}")
            if message.topic == CONSUMER_OFFSET_TOPIC:
                raise InvalidArgument(f"{CONSUMER_OFFSET_TOPIC} is written by commit_consumer_offset only")
            properties = message.properties
            # InvalidArgument when malformed; a message without properties is no copy
            origins.append(origin_of(properties) if properties else None)
        with self._lock:
            self._check_open()
            self._check_epoch(epoch)
            if not any(origins):
                return self._put_locked(messages, epoch, now_ms)
            return self._put_copies_locked(messages, origins, epoch, now_ms)

    def _put_copies_locked(
        self, messages: Sequence[MessageFields], origins: list[Origin | None], epoch: int, now_ms: int
    ) -> list[PutResult]:
        """A send of replicated copies: judged against the origin table and appended under
        the one lock, so no other send of the same origin queue comes between. Copies
        stored before are not stored again; they are answered with the original's position."""
        incoming = [Incoming(o, m.topic, m.queue_id) for m, o in zip(messages, origins, strict=True)]
        duplicates = self._origins.judge(incoming)
        new = [m for m, duplicate in zip(messages, duplicates, strict=True) if not duplicate]
        stored = iter(self._put_locked(new, epoch, now_ms) if new else [])
        return [
            self._original_of(origin) if duplicate and origin is not None else next(stored)
            for origin, duplicate in zip(origins, duplicates, strict=True)
        ]

    def _original_of(self, origin: Origin) -> PutResult:
        """Where the copy of `origin` is: looked for back from its queue's head (bounded)."""
        head = self._origins.heads[origin.key]
        queue = self._queues[(head.topic, head.queue_id)]
        low = max(queue.first_at_or_after(self.log.min_offset), head.queue_offset - COPY_SEARCH_RECORDS_MAX)
        for i in range(head.queue_offset - queue.base, low - queue.base - 1, -1):
            record = self.log.read_record_at(*queue.entry(i))
            found = origin_of(record.properties)
            if found is None or found.key != origin.key:
                continue
            if found.offset < origin.offset:
                break  # a filtered-out offset: never sent, so never stored
            if found.offset == origin.offset:
                return PutResult(
                    record.msg_id,
                    record.topic,
                    record.queue_id,
                    record.queue_offset,
                    record.commit_offset,
                    True,
                )
        return PutResult("", head.topic, head.queue_id, -1, -1, True)

    def _put_locked(self, messages: Sequence[MessageFields], epoch: int, now_ms: int) -> list[PutResult]:
        start = position = self.log.max_offset
        next_offsets: dict[QueueKey, int] = {}
        encoded: list[bytes] = []
        results: list[PutResult] = []
        id_prefix = msg_id_prefix(self.broker_name, epoch)
        for message in messages:
            key = (message.topic, message.queue_id)
            queue_offset = next_offsets.get(key)
            if queue_offset is None:
                queue = self._queues.get(key)
                queue_offset = queue.max_offset if queue is not None else 0
            properties = message.properties
            msg_id = properties.get(MSG_ID, "") if properties else ""  # a replicated copy keeps its id
            if not msg_id or not MSG_ID_PATTERN.fullmatch(msg_id):
                msg_id = id_prefix + format(position, "016x")  # make_msg_id, prefix once a batch
            record = encode_record(message, epoch, now_ms, queue_offset, msg_id)
            if position + len(record) - start > PUT_BATCH_BYTES_MAX:
                raise InvalidArgument(f"a put of more than {PUT_BATCH_BYTES_MAX} bytes")
            encoded.append(record)
            results.append(PutResult(msg_id, key[0], key[1], queue_offset, position))
            next_offsets[key] = queue_offset + 1
            position += len(record)
        if len(self._queues) + len(next_offsets.keys() - self._queues.keys()) > QUEUES_MAX:
            raise FailedPrecondition(
                f"this store already holds {len(self._queues)} queues; the limit is {QUEUES_MAX}"
            )
        sizes = [len(record) for record in encoded]
        # encode_record made these bytes and their checksums just now: no re-check
        offsets = self.log.append_verified(b"".join(encoded), sizes, sync=not self.group_commit)
        assert offsets == [r.commit_offset for r in results], (offsets, results)
        self._index_batch(results, sizes)
        for message, result, size in zip(messages, results, sizes, strict=True):
            origin = origin_of(message.properties) if message.properties else None
            if origin is not None:
                self._origins.note(
                    origin,
                    OriginHead(
                        origin.offset,
                        result.topic,
                        result.queue_id,
                        result.queue_offset,
                        result.commit_offset,
                        size,
                    ),
                )
        self._maybe_checkpoint()
        return results

    def _index_batch(self, results: Sequence[PutResult | RecordHead], sizes: list[int]) -> None:
        """_index_record of each record just appended, with one entry write per queue."""
        entries: dict[QueueKey, list[bytes]] = {}
        first: dict[QueueKey, PutResult | RecordHead] = {}
        pack = _INDEX_ENTRY.pack
        for result, size in zip(results, sizes, strict=True):
            key = (result.topic, result.queue_id)
            found = entries.get(key)
            if found is None:
                entries[key] = found = []
                first[key] = result
            found.append(pack(result.commit_offset, size))
        for key, packed in entries.items():
            head = first[key]
            queue = self._queue_at(head.topic, head.queue_id, head.queue_offset, head.commit_offset)
            queue.entries += b"".join(packed)
            queue.dirty = True

    def commit_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int, epoch: int, now_ms: int
    ) -> PutResult:
        """Records `group`'s next offset in topic/queue_id as a %CONSUMER_OFFSET% record."""
        (result,) = self.commit_consumer_progress([(group, topic, queue_id, offset, ())], epoch, now_ms)
        return result

    def commit_consumer_progress(
        self, entries: list[tuple[str, str, int, int, AckedRanges]], epoch: int, now_ms: int
    ) -> list[PutResult]:
        """Records each (group, topic, queue id, consumed offset, acknowledged ranges above
        it) as a %CONSUMER_OFFSET% record, all in one commit-log write."""
        if not 0 < len(entries) <= PUT_BATCH_MAX:
            raise InvalidArgument(f"a progress commit carries 1 to {PUT_BATCH_MAX} entries")
        messages: list[Message] = []
        progress: dict[ConsumerKey, Progress] = {}
        for group, topic, queue_id, offset, acked in entries:
            if not isinstance(group, str) or not TOPIC_PATTERN.fullmatch(group):
                raise InvalidArgument(
                    f"group {group!r} is malformed: use 1-127 characters from A-Z a-z 0-9 _ - % |"
                )
            validate_topic(topic)
            _check_int("queue_id", queue_id, 0, QUEUE_ID_MAX)
            _check_int("offset", offset, 0, OFFSET_MAX)
            try:
                ranges = check_acked_ranges(offset, acked)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            progress[(group, topic, queue_id)] = (offset, ranges)
            messages.append(
                Message(
                    CONSUMER_OFFSET_TOPIC, 0, _consumer_offset_body(group, topic, queue_id, offset, ranges)
                )
            )
        with self._lock:
            self._check_open()
            self._check_epoch(epoch)
            new_keys = len(progress.keys() - self._consumer_offsets.keys())
            if len(self._consumer_offsets) + new_keys > CONSUMER_OFFSET_KEYS_MAX:
                raise FailedPrecondition(f"{CONSUMER_OFFSET_KEYS_MAX} consumer offsets already kept")
            results = self._put_locked(messages, epoch, now_ms)
            self._consumer_offsets.update(progress)
            return results

    def append_replicated(self, offset: int, data: bytes) -> int:
        """A slave's append of bytes read from its master at `offset` (which must be this
        store's max_offset); indexes them and returns the new max_offset. Nothing is
        written unless every record is valid and continues this store's epochs and queues."""
        if len(data) > APPEND_BYTES_MAX:
            raise InvalidArgument(f"{len(data)} bytes in one append; the limit is {APPEND_BYTES_MAX}")
        records = scan_records(data, offset)
        with self._lock:
            self._check_open()
            if offset != self.log.max_offset:
                raise FailedPrecondition(
                    f"replicated data starts at {offset} but this store ends at {self.log.max_offset}"
                )
            new_epochs, consumer_offsets = self._plan_replicated(data, offset, records)
            for epoch, start in new_epochs:
                self.epochs.append(epoch, start)  # the epoch file leads the log
            if records:  # scan_records checked every record's bytes and layout
                written = self.log.append_verified(data, [r.size for r in records], expected_offset=offset)
                assert written[-1] == records[-1].commit_offset, (written, records)
            end = self.log.max_offset
            self._index_batch(records, [r.size for r in records])  # _plan_replicated checked the offsets
            for record in records:
                if record.properties:
                    self._note_origin(self._origins, record)
            self._consumer_offsets.update(consumer_offsets)
            self._maybe_checkpoint()
            return end

    def _plan_replicated(
        self, data: bytes, offset: int, records: Iterable[RecordHead]
    ) -> tuple[list[tuple[int, int]], dict[ConsumerKey, Progress]]:
        last_epoch = self.epochs.last_epoch
        new_epochs: list[tuple[int, int]] = []
        next_offsets: dict[QueueKey, int] = {}
        consumer_offsets: dict[ConsumerKey, Progress] = {}
        for record in records:
            if record.epoch == 0:
                raise CorruptData(f"replicated record at {record.commit_offset} has epoch 0")
            if record.epoch < last_epoch:
                raise FailedPrecondition(
                    f"replicated record at {record.commit_offset} has epoch {record.epoch}, older "
                    f"than this store's epoch {last_epoch}: truncate to the consistent point first"
                )
            if record.epoch > last_epoch:
                new_epochs.append((record.epoch, record.commit_offset))
                last_epoch = record.epoch
            key = (record.topic, record.queue_id)
            expected = next_offsets.get(key)
            if expected is None:
                queue = self._queues.get(key)
                expected = queue.max_offset if queue is not None else record.queue_offset
            if record.queue_offset != expected:
                raise CorruptData(
                    f"replicated record at {record.commit_offset} has queue offset "
                    f"{record.queue_offset} in {record.topic}/{record.queue_id}, "
                    f"which expects {expected}"
                )
            next_offsets[key] = expected + 1
            if record.topic == CONSUMER_OFFSET_TOPIC:  # its body is read: decode it whole
                whole = decode_record(data, record.commit_offset - offset, record.commit_offset)
                consumer_key, value = _parse_consumer_offset(whole)
                consumer_offsets[consumer_key] = value
        return new_epochs, consumer_offsets

    def truncate(self, offset: int) -> None:
        """Drops every record at or after `offset` (a record start), their index entries,
        the epoch entries starting at or after it, and recomputes consumer offsets.
        Crash-safe: see the module docstring for the order."""
        _check_int("offset", offset, 0, OFFSET_MAX)
        with self._lock:
            self._check_open()
            if not self.log.is_boundary(offset) or offset < self.log.min_offset:
                raise InvalidArgument(
                    f"offset {offset} is not a record start in [{self.log.min_offset}, {self.log.max_offset}]"
                )
            write_atomically(self._intent_path, dump_checksummed({"offset": offset}), self.fsync)
            self._truncate_durable(offset)
            for queue in self._queues.values():
                queue.cut(offset)
            if offset >= self._checkpoint_offset:
                self._consumer_offsets = self._replay_consumer_offsets(
                    self._checkpoint_consumer_offsets, self._checkpoint_offset, offset
                )
                self._origins = self._replay_origins(self._checkpoint_origins.copy(), self._checkpoint_offset)
            else:
                self._consumer_offsets = self._replay_consumer_offsets({}, self.log.min_offset, offset)
                self._origins = self._replay_origins(OriginTable(), self.log.min_offset)
            self._write_checkpoint()
            self._remove_intent()

    def index_runs_between(self, start: int, end: int) -> dict[QueueKey, tuple[int, bytes]]:
        """Each queue's entries for its records in [start, end): (queue offset of the
        first, the entries packed as (commit offset u64, size u32) little-endian, which is
        also the tiered index object's entry layout), sliced without decoding them."""
        with self._lock:
            self._check_open()
            found: dict[QueueKey, tuple[int, bytes]] = {}
            for key, queue in self._queues.items():
                low, high = queue.first_at_or_after(start), queue.first_at_or_after(end)
                if low < high:
                    size = _INDEX_ENTRY.size
                    found[key] = (queue.base + low, bytes(queue.entries[low * size : high * size]))
            return found

    def delete_before(self, offset: int) -> int:
        """Retention: deletes whole segments ending at or before `offset` (their range is
        already in the tiered store). Checkpoints first, so that the index and consumer
        offsets never need the deleted bytes again. Returns how many segments went."""
        with self._lock:
            self._check_open()
            self._write_checkpoint()
            return self.log.delete_segments_before(offset)

    def _truncate_durable(self, offset: int) -> None:
        self.epochs.truncate_from(offset)
        if offset < self.log.max_offset:
            self.log.truncate(offset)

    # Reads -------------------------------------------------------------------------------------------
    def read_bytes(self, offset: int, max_bytes: int, check: bool = True) -> bytes:
        """Whole records from `offset` for a slave (see CommitLog.read: with check=False
        their checksums are the reader's to check)."""
        return self.log.read(offset, max_bytes, check)

    def read_bulk(self, offset: int, max_bytes: int, check: bool = True) -> bytes:
        """read_bytes up to 64 MiB, for the tiered uploader (see CommitLog.read_bulk)."""
        return self.log.read_bulk(offset, max_bytes, check)

    def open_bulk(self, offset: int, max_bytes: int) -> FileRange:
        """read_bulk(check=False)'s bytes as a FileRange, for the tiered uploader
        (see CommitLog.open_bulk)."""
        return self.log.open_bulk(offset, max_bytes)

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        max_commit_offset: int,
        *,
        max_bytes: int = GET_BYTES_DEFAULT,
    ) -> list[StoredRecord]:
        """Up to `max_count` records of topic/queue_id from `queue_offset`, only those
        ending at or before `max_commit_offset` (the confirm offset), at most `max_bytes`
        (but at least one record). Each record's checksum is verified (CorruptData)."""
        _check_int("queue_id", queue_id, 0, QUEUE_ID_MAX)
        _check_int("queue_offset", queue_offset, 0, OFFSET_MAX)
        _check_int("max_count", max_count, 1, GET_COUNT_MAX)
        _check_int("max_commit_offset", max_commit_offset, 0, OFFSET_MAX)
        _check_int("max_bytes", max_bytes, 1, GET_BYTES_MAX)
        with self._lock:
            self._check_open()
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return []
            min_offset = self._queue_min_offset(queue)
            if queue_offset < min_offset:
                raise InvalidArgument(
                    f"queue offset {queue_offset} of {topic}/{queue_id} is below "
                    f"its minimum {min_offset} (deleted)",
                    code="OFFSET_TOO_SMALL",
                )
            records: list[StoredRecord] = []
            total = 0
            first = queue_offset - queue.base
            for i in range(first, min(queue.count, first + max_count)):
                commit_offset, size = queue.entry(i)
                if commit_offset + size > max_commit_offset or (records and total + size > max_bytes):
                    break
                record = self.log.read_record_at(commit_offset, size)
                if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, queue.base + i):
                    raise CorruptData(
                        f"{self.directory}: the index entry {topic}/{queue_id}/"
                        f"{queue.base + i} points at a record of {record.topic}/"
                        f"{record.queue_id}/{record.queue_offset}"
                    )
                records.append(record)
                total += size
            return records

    def _queue_min_offset(self, queue: _QueueIndex) -> int:
        return queue.base + queue.first_at_or_after(self.log.min_offset)

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset of topic/queue_id (0 for an unknown queue)."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            return queue.max_offset if queue is not None else 0

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still readable (its record not deleted by retention)."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            return self._queue_min_offset(queue) if queue is not None else 0

    def readable_queue_max_offset(self, topic: str, queue_id: int, max_commit_offset: int) -> int:
        """The queue offset after the last record ending at or before `max_commit_offset`."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            return queue.base + queue.count_ending_by(max_commit_offset) if queue is not None else 0

    def queues(self) -> list[QueueKey]:
        """Every (topic, queue id) with an index, the system topic included."""
        with self._lock:
            return sorted(self._queues)

    def translate_origin(self, key: OriginKey, offset: int) -> int | None:
        """The target queue offset matching source consumer offset `offset` of origin queue
        `key` (everything below `offset` consumed): one past the copy of the highest origin
        offset below it, or the first copy held when none is below it (an earlier one was
        filtered or is too old to look up). None when this store holds no copy of `key`."""
        with self._lock:
            head = self._origins.heads.get(key)
            if head is None:
                return None
            if head.offset < offset:
                return head.queue_offset + 1
            queue = self._queues[(head.topic, head.queue_id)]
            low = max(
                queue.first_at_or_after(self.log.min_offset), head.queue_offset - COPY_SEARCH_RECORDS_MAX
            )
            lowest_copy = head.queue_offset
            for i in range(head.queue_offset - queue.base, low - queue.base - 1, -1):
                record = self.log.read_record_at(*queue.entry(i))
                found = origin_of(record.properties)
                if found is None or found.key != key:
                    continue
                if found.offset < offset:
                    return record.queue_offset + 1
                lowest_copy = record.queue_offset
            return lowest_copy

    def consumer_offsets_of(self, topic: str, queue_id: int) -> list[tuple[str, int]]:
        """(group, committed offset) of every group with progress in topic/queue_id."""
        with self._lock:
            return sorted(
                (g, p[0]) for (g, t, q), p in self._consumer_offsets.items() if (t, q) == (topic, queue_id)
            )

    def origin_head(self, key: OriginKey) -> OriginHead | None:
        """The highest copy of origin queue `key` this store holds, or None."""
        with self._lock:
            return self._origins.heads.get(key)

    def consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The latest committed offset of group on topic/queue_id, or None."""
        with self._lock:
            progress = self._consumer_offsets.get((group, topic, queue_id))
            return None if progress is None else progress[0]

    def consumer_progress(self, group: str, topic: str, queue_id: int) -> Progress | None:
        """The latest committed (offset, acknowledged ranges above it), or None."""
        with self._lock:
            return self._consumer_offsets.get((group, topic, queue_id))

    @property
    def max_offset(self) -> int:
        return self.log.max_offset

    @property
    def min_offset(self) -> int:
        return self.log.min_offset

    @property
    def durable_offset(self) -> int:
        return self.log.durable_offset

    @property
    def log_closed(self) -> bool:
        """The commit log is closed: by close(), or by itself after a failed fdatasync."""
        return self.log.closed

    def sync(self, end: int | None = None) -> int:
        """Group commit (CommitLog.sync): durable up to `end` on return."""
        return self.log.sync(end)

    def close(self) -> None:
        """Makes the index durable and closes the files; idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if not self.log.closed:  # a failed fdatasync closed it: the next open rebuilds
                    self._write_checkpoint()
            finally:
                self._closed = True
                self.log.close()


def _head(
    origin: Origin, topic: str, queue_id: int, queue_offset: int, record: StoredRecord | RecordHead
) -> OriginHead:
    return OriginHead(origin.offset, topic, queue_id, queue_offset, record.commit_offset, record.size)
