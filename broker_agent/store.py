"""The broker's message store: the sequencer of the commit log, the epoch file and what is
derived from the log — the queue index (queue_index.py), consumer progress
(consumer_progress.py) and the replicated copies' origins (origin_dedupe.py, with the pure
rules in origins.py) — and of truncation, whose intent file is truncation.py's.

Layout under `directory`:

    commitlog/{base:020d}.log       the records (the source of truth)
    epochs.json                     (epoch, start offset) entries
    index/{topic}/{queue_id}        per-queue index: header, then 12-byte entries
                                    (commit offset u64, size u32), RocketMQ ConsumeQueue style
    index/checkpoint.json           how far the index files are complete and durable, with
                                    the consumer offsets as of that point
    keys/{topic}                    per-topic key index: (key hash, commit offset) entries
                                    (key_index.py), listed with their CRC-32 in the checkpoint
    truncate.json                   a truncation in progress (present only during one)

The index, the consumer offsets and the origins are derived from the commit log. Index
entries are kept in memory and appended to their files lazily: every
`index_checkpoint_bytes` of log, on truncate and on close, the dirty index files are
fsynced and then the checkpoint is written (temp + fsync + rename). At open, entries at
or past the checkpoint are dropped and rebuilt by scanning the log from there; a missing
or corrupt checkpoint or index file means a full rebuild from the log.

Consumer offsets are records of the system topic %CONSUMER_OFFSET% (queue 0), so they
replicate with the data and follow truncation (consumer_progress.py).

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

import errno
import logging
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from mqmeta.broker_agent.commitlog import (
    APPEND_BYTES_MAX,
    SCAN_READ_BYTES,
    SEGMENT_BYTES_DEFAULT,
    CommitLog,
    FileRange,
)
from mqmeta.broker_agent.consumer_progress import (
    CONSUMER_OFFSET_TOPIC,
    ConsumerKey,
    ConsumerProgress,
    Progress,
    ProgressEntry,
    check_int,
    parse_progress,
    progress_records,
)
from mqmeta.broker_agent.key_index import KEY_FOUND_MAX, KeyIndex
from mqmeta.broker_agent.origin_dedupe import OriginDedupe
from mqmeta.broker_agent.origins import Incoming, OriginHead, OriginTable
from mqmeta.broker_agent.queue_index import QueueIndex, QueueKey
from mqmeta.broker_agent.truncation import TruncationIntent

from mqmeta.errors import CorruptData, FailedPrecondition, FencedEpoch, InvalidArgument
from mqmeta.formats import OFFSET_MAX
from mqmeta.formats.atomic import make_directories, write_atomically
from mqmeta.formats.checksummed import dump_checksummed, load_checksummed
from mqmeta.formats.epochs import EpochFile, epoch_covering
from mqmeta.formats.key_index import ID_KIND, KEY_KIND
from mqmeta.formats.origin import MSG_ID, Origin, OriginKey, origin_of
from mqmeta.formats.properties import MESSAGE_ID
from mqmeta.formats.records import (
    MSG_ID_PATTERN,
    QUEUE_ID_MAX,
    Message,
    MessageFields,
    RecordHead,
    StoredRecord,
    decode_record,
    encode_record,
    iter_records,
    msg_id_prefix,
    scan_records,
)
from mqmeta.pb import broker_pb2

log = logging.getLogger(__name__)

# What put_messages takes: its own Message, or the broker protocol's (the Send path)
_MESSAGE_TYPES = (Message, broker_pb2.Message)

PUT_BATCH_MAX = 1024
PUT_BATCH_BYTES_MAX = 32 << 20
GET_COUNT_MAX = 1024
GET_BYTES_DEFAULT = 8 << 20
GET_BYTES_MAX = 64 << 20
QUEUES_MAX = 1 << 20
INDEX_CHECKPOINT_BYTES_DEFAULT = 16 << 20
BROKER_NAME_BYTES_MAX = 255


class PutResult(NamedTuple):
    """Where a record was written (one per record: a NamedTuple is built in C, about half
    the cost of a frozen dataclass)."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    duplicate: bool = False  # a replicated copy stored before (its original's position; -1: too old)


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
        cut_corruption: bool = False,
    ) -> None:
        if not isinstance(broker_name, str) or not 0 < len(broker_name.encode()) <= BROKER_NAME_BYTES_MAX:
            raise InvalidArgument(f"broker_name {broker_name!r} must be 1-{BROKER_NAME_BYTES_MAX} bytes")
        check_int("index_checkpoint_bytes", index_checkpoint_bytes, 1, 1 << 40)
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
        self._intent = TruncationIntent(self.directory, fsync)
        self._index = QueueIndex(self._index_dir, str(self.directory))
        self._keys = KeyIndex(self.directory / "keys")
        self._progress = ConsumerProgress()
        self._checkpoint_offset = 0
        self.log = CommitLog(self.directory / "commitlog", segment_bytes, fsync, cut_corruption)
        self._origins = OriginDedupe(self.log, self._index, str(self.directory))
        try:
            self.epochs = EpochFile(self.directory / "epochs.json", fsync)
            self._open()
        except BaseException:
            self.log.close()
            raise

    # Opening ---------------------------------------------------------------------------------
    def _open(self) -> None:
        intent = self._intent.read()
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
            self._intent.remove()

    def _load_index(self) -> int:
        """Loads the durable part of the index; returns the offset to rebuild from."""
        checkpoint = self._read_checkpoint()
        loaded = False
        if checkpoint is not None:
            trusted = min(checkpoint[0], self.log.max_offset)
            loaded = self._index.load(checkpoint[2], trusted) and self._keys.load(checkpoint[4], trusted)
            loaded = loaded and checkpoint[0] >= self.log.min_offset  # else retention deleted unseen records
        if checkpoint is None or not loaded:
            if self._index_dir.exists():
                log.warning("%s: the index is incomplete; rebuilding it from the commit log", self.directory)
                shutil.rmtree(self._index_dir)
            self._index.reset()
            self._keys.reset(self.log.min_offset)
            self._progress.restore({}, {})
            self._origins.restore(OriginTable())
            self._checkpoint_offset = self.log.min_offset
            return self.log.min_offset
        indexed_offset, consumer_offsets, _, origins, _ = checkpoint
        if indexed_offset <= self.log.max_offset:
            current = consumer_offsets
            self._origins.restore(origins)
        else:  # the log was cut below the checkpoint: replay the offsets it still holds
            current = ConsumerProgress.replay({}, self._progress_records(self.log.min_offset, trusted))
            self._origins.replay_from(self.log.min_offset)
            self._origins.checkpointed()
        self._progress.restore(current, current)
        self._checkpoint_offset = trusted
        return trusted

    def _read_checkpoint(
        self,
    ) -> tuple[int, dict[ConsumerKey, Progress], list[Any], OriginTable, list[Any]] | None:
        """(indexed offset, consumer offsets, queue list, origins, key index list), or None
        when missing or unusable
        (the index is derived data: it is rebuilt, never trusted when in doubt)."""
        if not self._checkpoint_path.exists():
            return None
        try:
            body = load_checksummed(self._checkpoint_path)
            indexed_offset = body["indexed_offset"]
            offsets = ConsumerProgress.from_rows(body["consumer_offsets"])
            queues = body["queues"]
            if type(indexed_offset) is not int or not isinstance(queues, list):
                raise TypeError("indexed_offset or queues")
            # A checkpoint from before origins were kept: rebuilt once, from the whole log.
            origins = OriginTable.from_rows(body["origins"])  # type: ignore[arg-type]
            keys = body["keys"]  # a checkpoint from before the key index: rebuilt once
            if not isinstance(keys, list):
                raise TypeError("keys")
        except (CorruptData, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: unusable (%s); the index will be rebuilt", self._checkpoint_path, exc)
            return None
        return indexed_offset, offsets, queues, origins, keys

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
                self._index.add(
                    record.topic, record.queue_id, record.queue_offset, record.commit_offset, record.size
                )
                if record.keys or record.properties:
                    self._keys.add(
                        record.topic, record.keys, record.msg_id, record.commit_offset, record.properties
                    )
                if record.topic == CONSUMER_OFFSET_TOPIC:
                    self._progress.note(record)
                self._origins.note(record)
            offset += len(data)

    def _progress_records(self, start: int, end: int) -> Iterator[StoredRecord]:
        """The %CONSUMER_OFFSET% records in [start, end) of the log, found by the index."""
        queue = self._index.get((CONSUMER_OFFSET_TOPIC, 0))
        if queue is None:
            return
        for i in range(queue.first_at_or_after(max(start, self.log.min_offset)), queue.count):
            commit_offset, size = queue.entry(i)
            if commit_offset >= end:
                break
            yield self.log.read_record_at(commit_offset, size)

    # Checkpoint ----------------------------------------------------------------------------------
    def _write_checkpoint(self) -> None:
        self.log.sync()  # the checkpoint never names bytes a power loss could take
        self._index.flush(self.fsync)  # the files before the checkpoint that lists them
        self._keys.flush(self.fsync)
        indexed_offset = self.log.max_offset
        body: dict[str, object] = {
            "indexed_offset": indexed_offset,
            "queues": self._index.rows(),
            "consumer_offsets": self._progress.rows(),
            "origins": self._origins.rows(),
            "keys": self._keys.rows(),
        }
        write_atomically(self._checkpoint_path, dump_checksummed(body), self.fsync)
        self._checkpoint_offset = indexed_offset
        self._progress.checkpointed()
        self._origins.checkpointed()

    def _maybe_checkpoint(self) -> None:
        if self.log.max_offset - self._checkpoint_offset >= self.index_checkpoint_bytes:
            try:
                self._write_checkpoint()
            except OSError as error:
                if self.log.closed:  # its fdatasync failed: the log's pages' fate is unknown
                    raise OSError(errno.EIO, f"fdatasync before a checkpoint failed: {error}") from None
                if error.errno != errno.ENOSPC:
                    raise
                # The records are in the log already (the write must not be refused now);
                # the checkpoint is only a shortcut for the next open: try again later.
                log.warning("%s: no space for a checkpoint; the next write tries again", self.directory)

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
        """Where the copy of `origin` is (origin_dedupe.py looks back from its queue's head)."""
        record = self._origins.original_of(origin)
        if record is None:
            head = self._origins.table.heads[origin.key]
            return PutResult("", head.topic, head.queue_id, -1, -1, True)
        return PutResult(
            record.msg_id, record.topic, record.queue_id, record.queue_offset, record.commit_offset, True
        )

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
                queue_offset = self._index.next_offset(key)
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
        if len(self._index) + len(next_offsets.keys() - self._index.queues.keys()) > QUEUES_MAX:
            raise FailedPrecondition(
                f"this store already holds {len(self._index)} queues; the limit is {QUEUES_MAX}"
            )
        sizes = [len(record) for record in encoded]
        # encode_record made these bytes and their checksums just now: no re-check
        offsets = self.log.append_verified(b"".join(encoded), sizes, sync=not self.group_commit)
        assert offsets == [r.commit_offset for r in results], (offsets, results)
        self._index.add_batch(results, sizes)
        for message, result, size in zip(messages, results, sizes, strict=True):
            properties = message.properties
            if message.keys or properties:
                self._keys.add(result.topic, message.keys, result.msg_id, result.commit_offset, properties)
            origin = origin_of(properties) if properties else None
            if origin is not None:
                self._origins.note_stored(
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

    def commit_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int, epoch: int, now_ms: int
    ) -> PutResult:
        """Records `group`'s next offset in topic/queue_id as a %CONSUMER_OFFSET% record."""
        (result,) = self.commit_consumer_progress([(group, topic, queue_id, offset, ())], epoch, now_ms)
        return result

    def commit_consumer_progress(
        self, entries: list[ProgressEntry], epoch: int, now_ms: int
    ) -> list[PutResult]:
        """Records each (group, topic, queue id, consumed offset, acknowledged ranges above
        it) as a %CONSUMER_OFFSET% record, all in one commit-log write."""
        if not 0 < len(entries) <= PUT_BATCH_MAX:
            raise InvalidArgument(f"a progress commit carries 1 to {PUT_BATCH_MAX} entries")
        messages, progress = progress_records(entries)
        with self._lock:
            self._check_open()
            self._check_epoch(epoch)
            self._progress.check_room(progress)
            results = self._put_locked(messages, epoch, now_ms)
            self._progress.update(progress)
            return results

    def append_replicated(self, offset: int, data: bytes, sync: bool = True) -> int:
        """A slave's append of bytes read from its master at `offset` (which must be this
        store's max_offset); indexes them and returns the new max_offset. Nothing is
        written unless every record is valid and continues this store's epochs and queues.
        Durable on return; with sync=False only once sync_replicated() returns (the slave's
        fetch loop syncs right before its next fetch acknowledges the bytes)."""
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
                # Written, indexed, then made durable (here, or by sync_replicated once the
                # fetch loop has built the fetch that acknowledges them).
                written = self.log.append_verified(
                    data, [r.size for r in records], expected_offset=offset, sync=False
                )
                assert written[-1] == records[-1].commit_offset, (written, records)
            end = self.log.max_offset
            self._index.add_batch(records, [r.size for r in records])  # _plan_replicated checked the offsets
            for record in records:
                if record.properties:
                    self._origins.note(record)
                if record.keys or record.properties:
                    self._keys.add(
                        record.topic, record.keys, record.msg_id, record.commit_offset, record.properties
                    )
            self._progress.update(consumer_offsets)
            if records and sync:
                self.sync_replicated()
            self._maybe_checkpoint()  # syncs first (_write_checkpoint)
            return end

    def sync_replicated(self) -> int:
        """The fdatasync that ends a replicated append (in append_replicated, or after it
        with sync=False); returns how far the log is durable. A failed one closed the log
        (CommitLog.sync: its pages' fate is unknown, never retried): an I/O error even when
        the kernel said ENOSPC, so the broker fences itself rather than go on as if a full
        disk had refused the write (which would have undone it: a write that fills the
        disk, or an fdatasync before a new segment, still is)."""
        try:
            return self.log.sync()
        except OSError as error:
            raise OSError(errno.EIO, f"fdatasync of the replicated bytes failed: {error}") from None

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
                queue = self._index.get(key)
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
                consumer_key, value = parse_progress(whole)
                consumer_offsets[consumer_key] = value
        return new_epochs, consumer_offsets

    def truncate(self, offset: int) -> None:
        """Drops every record at or after `offset` (a record start), their index entries,
        the epoch entries starting at or after it, and recomputes consumer offsets.
        Crash-safe: see the module docstring for the order."""
        check_int("offset", offset, 0, OFFSET_MAX)
        with self._lock:
            self._check_open()
            if not self.log.is_boundary(offset) or offset < self.log.min_offset:
                raise InvalidArgument(
                    f"offset {offset} is not a record start in [{self.log.min_offset}, {self.log.max_offset}]"
                )
            self._intent.write(offset)
            self._truncate_durable(offset)
            self._index.cut(offset)
            self._keys.cut(offset)
            kept = offset >= self._checkpoint_offset  # the checkpoint's state is still true
            start = self._checkpoint_offset if kept else self.log.min_offset
            self._progress.roll_back(self._progress_records(start, offset), from_checkpoint=kept)
            self._origins.roll_back(start, from_checkpoint=kept)
            self._write_checkpoint()
            self._intent.remove()

    def index_runs_between(self, start: int, end: int) -> dict[QueueKey, tuple[int, bytes]]:
        """Each queue's entries for its records in [start, end): (queue offset of the
        first, the entries packed as (commit offset u64, size u32) little-endian, which is
        also the tiered index object's entry layout), sliced without decoding them."""
        with self._lock:
            self._check_open()
            return self._index.runs_between(start, end)

    def delete_before(self, offset: int) -> int:
        """Retention: deletes whole segments ending at or before `offset` (their range is
        already in the tiered store). Checkpoints first, so that the index and consumer
        offsets never need the deleted bytes again. Returns how many segments went."""
        with self._lock:
            self._check_open()
            self._write_checkpoint()
            return self.log.delete_segments_before(offset)

    def scrub(self, offset: int, bytes_max: int) -> tuple[int, int | None]:
        """One step of a background scrub of the commit log (see CommitLog.scrub)."""
        return self.log.scrub(max(offset, self.log.min_offset), bytes_max)

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
        check_int("queue_id", queue_id, 0, QUEUE_ID_MAX)
        check_int("queue_offset", queue_offset, 0, OFFSET_MAX)
        check_int("max_count", max_count, 1, GET_COUNT_MAX)
        check_int("max_commit_offset", max_commit_offset, 0, OFFSET_MAX)
        check_int("max_bytes", max_bytes, 1, GET_BYTES_MAX)
        with self._lock:
            self._check_open()
            queue = self._index.get((topic, queue_id))
            if queue is None:
                return []
            min_offset = queue.min_offset(self.log.min_offset)
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

    # Message query (admin) ------------------------------------------------------------------
    def records_by_key(self, topic: str, key: str, found_max: int = KEY_FOUND_MAX) -> list[StoredRecord]:
        """The records of `topic` that carry `key`, newest first (at most `found_max`), as
        far as the key index covers (key_covered_from) and retention kept them."""
        with self._lock:
            self._check_open()
            found = []
            for commit_offset in self._keys.find(topic, KEY_KIND, key, found_max):
                if commit_offset < self.log.min_offset:
                    continue  # deleted by retention (in the tiered store, not indexed there)
                record = self.log.read_record(commit_offset)
                if record.topic != topic:
                    raise CorruptData(
                        f"{self.directory}: the key index of {topic} names {commit_offset}, "
                        f"a record of {record.topic}"
                    )
                if key in record.keys.split(" "):  # not only a hash collision
                    found.append(record)
            return found

    def key_covered_from(self, topic: str) -> int:
        """The commit offset from which every record of `topic` with keys is indexed."""
        with self._lock:
            return max(self._keys.covered_from(topic), self.log.min_offset)

    def records_by_id(self, msg_id: str, topic: str = "") -> list[StoredRecord]:
        """The records with message id `msg_id`: the one this store gave it (its last 16
        hex digits are the commit offset, make_msg_id), and through the key index those
        that carry it as a RocketMQ client's id or a replicated copy's origin id (in
        `topic`, or in every topic when empty)."""
        with self._lock:
            self._check_open()
            found = []
            if MSG_ID_PATTERN.fullmatch(msg_id):
                commit_offset = int(msg_id[16:], 16)
                if self.log.min_offset <= commit_offset < self.log.max_offset and self.log.is_boundary(
                    commit_offset
                ):
                    record = self.log.read_record(commit_offset)
                    if record.msg_id == msg_id and (not topic or record.topic == topic):
                        found.append(record)
            for name in [topic] if topic else self._keys.topic_names():
                for commit_offset in self._keys.find(name, ID_KIND, msg_id):
                    if commit_offset < self.log.min_offset or any(
                        r.commit_offset == commit_offset for r in found
                    ):
                        continue
                    record = self.log.read_record(commit_offset)
                    if msg_id in (record.msg_id, record.properties.get(MESSAGE_ID)):
                        found.append(record)
            return found

    def record_at(self, topic: str, queue_id: int, queue_offset: int) -> StoredRecord | None:
        """The record at topic/queue_id/queue_offset, confirmed or not, or None when the
        queue has no such offset (or retention deleted it)."""
        with self._lock:
            self._check_open()
            queue = self._index.get((topic, queue_id))
            if queue is None or not queue.min_offset(self.log.min_offset) <= queue_offset < queue.max_offset:
                return None
            return self.log.read_record_at(*queue.entry(queue_offset - queue.base))

    def queue_offset_at_time(
        self, topic: str, queue_id: int, time_ms: int, max_commit_offset: int | None = None
    ) -> int:
        """The first queue offset of topic/queue_id whose record was stored at or after
        `time_ms`, by binary search (about log2(count) record reads; store times rise along
        a queue). Only records ending by `max_commit_offset` count when it is given (what
        consumers may read: the confirm offset); the end of those when none is at or after."""
        with self._lock:
            self._check_open()
            queue = self._index.get((topic, queue_id))
            if queue is None:
                return 0
            low = queue.first_at_or_after(self.log.min_offset)
            high = queue.count if max_commit_offset is None else queue.count_ending_by(max_commit_offset)
            while low < high:
                middle = (low + high) // 2
                if self.log.read_record_at(*queue.entry(middle)).store_timestamp_ms < time_ms:
                    low = middle + 1
                else:
                    high = middle
            return queue.base + low

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset of topic/queue_id (0 for an unknown queue)."""
        with self._lock:
            return self._index.next_offset((topic, queue_id))

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still readable (its record not deleted by retention)."""
        with self._lock:
            queue = self._index.get((topic, queue_id))
            return queue.min_offset(self.log.min_offset) if queue is not None else 0

    def readable_queue_max_offset(self, topic: str, queue_id: int, max_commit_offset: int) -> int:
        """The queue offset after the last record ending at or before `max_commit_offset`."""
        with self._lock:
            queue = self._index.get((topic, queue_id))
            return queue.base + queue.count_ending_by(max_commit_offset) if queue is not None else 0

    def queues(self) -> list[QueueKey]:
        """Every (topic, queue id) with an index, the system topic included."""
        with self._lock:
            return self._index.keys()

    def translate_origin(self, key: OriginKey, offset: int) -> int | None:
        """The target queue offset matching source consumer offset `offset` of origin queue
        `key` (OriginDedupe.translate), or None when this store holds no copy of `key`."""
        with self._lock:
            return self._origins.translate(key, offset)

    def consumer_offsets_of(self, topic: str, queue_id: int) -> list[tuple[str, int]]:
        """(group, committed offset) of every group with progress in topic/queue_id."""
        with self._lock:
            return self._progress.offsets_of(topic, queue_id)

    def consumer_keys(self) -> list[ConsumerKey]:
        """(group, topic, queue id) of every progress kept (CONSUMER_OFFSET_KEYS_MAX at most)."""
        with self._lock:
            return sorted(self._progress.current)

    def origin_head(self, key: OriginKey) -> OriginHead | None:
        """The highest copy of origin queue `key` this store holds, or None."""
        with self._lock:
            return self._origins.head(key)

    def consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The latest committed offset of group on topic/queue_id, or None."""
        with self._lock:
            progress = self._progress.get((group, topic, queue_id))
            return None if progress is None else progress[0]

    def consumer_progress(self, group: str, topic: str, queue_id: int) -> Progress | None:
        """The latest committed (offset, acknowledged ranges above it), or None."""
        with self._lock:
            return self._progress.get((group, topic, queue_id))

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
