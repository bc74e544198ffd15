"""The commit log: records appended to segment files, addressed by global byte offset.

A segment file is named by the commit offset of its first byte (`{base:020d}.log`,
Kafka style); the next segment starts exactly where the previous one ends, so commit
offsets have no gaps and mean the same on every replica whatever its segment size. A
record never spans two segments: a batch that does not fit rolls to a new one.

Crash safety:
- an append is one pwrite per segment it touches, then fdatasync; a segment is made
  durable before the next one is created, so only the last segment can end torn;
- with fsync, records are written over zeros written ahead of them (PREALLOCATE_BYTES
  at a time, in the write of the record that needs them): an fdatasync of bytes written
  over a file's existing blocks changes neither its size nor its allocation, so the
  filesystem commits no metadata for it (on ext4 here, three concurrent fdatasyncs of
  1 KB: 0.22-0.29 ms over zeros against 0.40-0.47 appended). The last segment therefore
  ends in zeros, which recovery reads as the log's end, quietly; a full segment is cut to
  its records before the next one is created, and close() cuts the last one;
- group commit: an append with sync=False only writes, and `sync` makes everything
  written so far durable with one fdatasync, however many appends wait for it (a
  master's writers each call it; whoever comes while one runs finds its bytes covered
  by the next). `durable_offset` says how far the disk holds the log; a failed
  fdatasync closes the log (the kernel may have dropped the dirty pages, so a retry
  could report success for data that is gone);
- recovery scans every record (CRC-32 each). In the last segment, zeros from a record
  boundary to the file's end are the zeros written ahead (no record starts with a zero
  byte); a bad record with no valid record after it is a torn tail (an append the crash
  interrupted: the bytes may be short, zero-filled or half-written, which a checksum
  cannot tell from a flipped bit) and is cut off with a warning. A bad record anywhere else, or followed by a
  valid record, raises CorruptData naming the file and offset: it is never dropped
  silently nor served;
- truncation deletes the later segments newest first, then cuts the segment holding
  the offset, fsyncing as it goes, so a crash leaves a gap-free prefix of the old log;
- retention deletes segments oldest first, leaving a gap-free suffix.

Every read checks each record's CRC (outside the lock, in one tight pass); only
read(check=False), read_bulk(check=False) and open_bulk leave that to their caller (a
slave checks the bytes of a fetch before it writes them, the tiered uploader the bytes
it stored before it publishes them). A sparse in-memory list of record starts (one
every MARK_INTERVAL_BYTES) makes "is this offset a record boundary?" exact and cheap.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from mqmeta.errors import CorruptData, FailedPrecondition, InvalidArgument
from mqmeta.formats.atomic import fsync_dir, make_directories
from mqmeta.formats.records import (
    PREFIX_BYTES,
    RECORD_BYTES_MIN,
    StoredRecord,
    TornRecord,
    check_record,
    decode_record,
    next_valid_record,
    peek_length,
    scan_records,
    valid_run,
    zeros_to_end,
)

log = logging.getLogger(__name__)

SEGMENT_BYTES_DEFAULT = 64 << 20
SEGMENT_BYTES_MIN = 4 << 10
SEGMENT_BYTES_MAX = 1 << 30
READ_BYTES_MAX = 16 << 20
BULK_READ_BYTES_MAX = 64 << 20  # read_bulk: one tiered upload is one read
COPY_CHUNK_BYTES = 16 << 20  # FileRange.write_to: one copy_file_range call (a check follows it)
APPEND_BYTES_MAX = 64 << 20
APPEND_RECORDS_MAX = 16_384
MARK_INTERVAL_BYTES = 4096
# The record starts of the latest appends, remembered: a slave fetches from where its last
# answer ended, a record start the marks alone would find only by reading the lengths of
# up to four records before it (a pread each, on every fetch of a send's path).
RECENT_STARTS_MAX = 8192
OPEN_SEGMENTS_MAX = 16
SCAN_READ_BYTES = 4 << 20  # what a scan of the log (index rebuild, origin replay) reads at once
PREALLOCATE_BYTES = 1 << 20  # zeros written past an append that needs more room (with fsync)
_ZEROS = bytes(PREALLOCATE_BYTES)
_SEGMENT_NAME = re.compile(r"(\d{20})\.log")


class _Segment:
    __slots__ = ("base", "path", "size", "allocated", "marks", "fd")

    def __init__(self, base: int, path: Path) -> None:
        self.base = base
        self.path = path
        self.size = 0  # the records' bytes
        self.allocated = 0  # the file's size: zeros written ahead from `size` to it
        self.marks: list[int] = []  # commit offsets of some record starts, sorted
        self.fd: int | None = None

    @property
    def end(self) -> int:
        return self.base + self.size

    def add_mark(self, offset: int) -> None:
        if not self.marks or offset - self.marks[-1] >= MARK_INTERVAL_BYTES:
            self.marks.append(offset)

    def cut_marks(self, offset: int) -> None:
        del self.marks[bisect.bisect_left(self.marks, offset) :]


class FileRange:
    """Whole records of one segment file, [position, position + length) of it: an
    ObjectSource (broker_agent.tiered_backend) that the kernel copies to another file
    without the bytes passing through Python. It holds its own duplicate of the
    segment's descriptor (retention or the descriptor cache closing the log's own fd
    does not disturb it): use it as a context manager, or close() it."""

    def __init__(self, fd: int, position: int, length: int, path: Path) -> None:
        self.fd, self.position, self._length, self.path = fd, position, length, path

    @property
    def length(self) -> int:
        return self._length

    def write_to(self, fd: int, progress: Callable[[int], None] | None = None) -> None:
        copied = 0
        for _ in range(self._length // COPY_CHUNK_BYTES + 2):  # bounded: each pass copies or fails
            if copied == self._length:
                return
            count = min(COPY_CHUNK_BYTES, self._length - copied)
            try:
                done = os.copy_file_range(self.fd, fd, count, self.position + copied, copied)
            except OSError:  # not supported between these files: copy through memory
                done = os.pwrite(fd, os.pread(self.fd, count, self.position + copied), copied)
            if done <= 0:
                break
            copied += done
            if progress is not None:
                progress(copied)
        if copied != self._length:
            raise CorruptData(f"{self.path}: copied {copied} of {self._length} bytes; the file is shorter")

    def read(self) -> bytes:
        data = os.pread(self.fd, self._length, self.position)
        if len(data) != self._length:
            raise CorruptData(f"{self.path}: read {len(data)} of {self._length} bytes; the file is shorter")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_whole_records(buf: bytes, offset: int) -> int:
    """How many records `buf` (read from commit `offset`) holds; it must be whole,
    checksum-valid records end to end (CorruptData otherwise)."""
    found: list[int] = []
    pos = valid_run(buf, 0, found)
    if pos != len(buf):
        try:
            check_record(buf, pos, offset + pos)  # names what is wrong
        except TornRecord as exc:
            raise CorruptData(f"data does not end on a record boundary: {exc}") from None
        raise AssertionError(f"check_whole_records stopped at a valid record ({offset + pos})")
    return len(found)


def _check_max_bytes(max_bytes: int, limit: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= limit:
        raise InvalidArgument(f"max_bytes {max_bytes!r} is outside [1, {limit}]")


class CommitLog:
    """Segmented, checksummed, append-only log; every method is thread-safe."""

    def __init__(
        self,
        directory: Path | str,
        segment_bytes: int = SEGMENT_BYTES_DEFAULT,
        fsync: bool = True,
        cut_corruption: bool = False,
    ) -> None:
        """cut_corruption: a bad record that is not a torn tail cuts the log there (a
        replica that can fetch the rest from its master again, P16) instead of refusing
        to open; `corruption_cut_at` then says where."""
        if not SEGMENT_BYTES_MIN <= segment_bytes <= SEGMENT_BYTES_MAX:
            raise InvalidArgument(
                f"segment_bytes {segment_bytes} is outside [{SEGMENT_BYTES_MIN}, {SEGMENT_BYTES_MAX}]"
            )
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one group fdatasync at a time; taken before _lock
        self._open: OrderedDict[int, _Segment] = OrderedDict()  # segments holding an fd
        self._closed = False
        self._truncations = 0  # a sync that overlapped a truncation does not move _durable
        self._recent_starts: set[int] = set()  # see RECENT_STARTS_MAX; emptied by truncate and undo
        self.cut_corruption = cut_corruption
        self.corruption_cut_at: int | None = None
        make_directories(self.directory, self.fsync)
        self._segments = self._recover()
        if self.fsync:  # what a killed process wrote may still be only in the page cache
            os.fdatasync(self._fd(self._segments[-1]))
        self._durable = self._segments[-1].end

    # Recovery ---------------------------------------------------------------------------
    def _recover(self) -> list[_Segment]:
        bases = sorted(
            int(m.group(1)) for name in os.listdir(self.directory) if (m := _SEGMENT_NAME.fullmatch(name))
        )
        if not bases:
            return [self._create_segment(0)]
        segments: list[_Segment] = []
        for i, base in enumerate(bases):
            segment = _Segment(base, self._path(base))
            if segments and segments[-1].end != base:
                raise CorruptData(
                    f"{segment.path}: starts at {base} but the previous segment "
                    f"ends at {segments[-1].end}; the log has a gap"
                )
            self._scan(segment, last=i == len(bases) - 1)
            segments.append(segment)
            if self.corruption_cut_at is not None:
                for later in reversed(bases[i + 1 :]):  # newest first: a crash leaves a prefix
                    self._path(later).unlink()
                    if self.fsync:
                        fsync_dir(self.directory)
                break
        return segments

    def _scan(self, segment: _Segment, last: bool) -> None:
        data = segment.path.read_bytes()
        pos = 0
        while pos < len(data):
            try:
                length = check_record(data, pos, segment.base + pos)
            except (TornRecord, CorruptData) as exc:
                if last and zeros_to_end(data, pos):
                    segment.allocated = len(data)  # the zeros written ahead
                    break
                if last and next_valid_record(data, pos) < 0:
                    log.warning(
                        "%s: cutting off a torn tail of %d bytes at commit offset %d (%s)",
                        segment.path,
                        len(data) - pos,
                        segment.base + pos,
                        exc,
                    )
                    self._cut_file(segment.path, pos)
                    break
                if self.cut_corruption:
                    log.error(
                        "%s: a corrupt record at commit offset %d (%s): cutting the log there; "
                        "the rest is fetched from the master again",
                        segment.path,
                        segment.base + pos,
                        exc,
                    )
                    self._cut_file(segment.path, pos)
                    self.corruption_cut_at = segment.base + pos
                    break
                raise CorruptData(
                    f"{segment.path}: {exc}; "
                    + ("valid records follow it" if last else "it is not the last segment")
                    + "; refusing to open this commit log"
                ) from None
            segment.add_mark(segment.base + pos)
            pos += length
        segment.size = pos
        segment.allocated = max(segment.allocated, pos)

    def _cut_file(self, path: Path, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            if self.fsync:
                os.fsync(f.fileno())

    # Segments and file descriptors -------------------------------------------------------
    def _path(self, base: int) -> Path:
        return self.directory / f"{base:020d}.log"

    def _create_segment(self, base: int) -> _Segment:
        segment = _Segment(base, self._path(base))
        fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        if self.fsync:
            fsync_dir(self.directory)
        return segment

    def _fd(self, segment: _Segment) -> int:
        if segment.fd is None:
            segment.fd = os.open(segment.path, os.O_RDWR)
            self._open[segment.base] = segment
            while len(self._open) > OPEN_SEGMENTS_MAX:
                oldest = next(iter(self._open.values()))
                self._close_fd(oldest)
        else:
            self._open.move_to_end(segment.base)
        return segment.fd

    def _close_fd(self, segment: _Segment) -> None:
        if segment.fd is not None:
            os.close(segment.fd)
            segment.fd = None
        self._open.pop(segment.base, None)

    def _segment_for(self, offset: int) -> _Segment:
        i = bisect.bisect_right(self._segments, offset, key=lambda s: s.base) - 1
        return self._segments[max(i, 0)]

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPrecondition(f"commit log {self.directory} is closed")

    def _pread(self, segment: _Segment, offset: int, length: int) -> bytes:
        data = os.pread(self._fd(segment), length, offset - segment.base)
        if len(data) != length:
            raise CorruptData(
                f"{segment.path}: read {len(data)} of {length} bytes at commit "
                f"offset {offset}; the file is shorter than the log says"
            )
        return data

    # Offsets -------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        with self._lock:
            return self._segments[0].base

    @property
    def max_offset(self) -> int:
        """The next write position: the end of the last good record."""
        with self._lock:
            return self._segments[-1].end

    @property
    def closed(self) -> bool:
        """Closed by close(), or by a failed fdatasync or undo."""
        return self._closed

    @property
    def durable_offset(self) -> int:
        """How far the log is on disk: appends with sync=False wait for `sync`."""
        with self._lock:
            return self._durable if self.fsync else self._segments[-1].end

    def sync(self, end: int | None = None) -> int:
        """Group commit: on return the log is durable up to `end` (default: everything
        appended before the call); returns the durable offset. The fdatasync runs outside
        the append lock, so appends go on meanwhile, and one fdatasync serves every
        caller waiting for it."""
        if not self.fsync:
            return self.max_offset
        with self._sync_lock:
            with self._lock:
                self._check_open()
                target = self._segments[-1].end
                if self._durable >= (target if end is None else min(end, target)):
                    return self._durable
                fd = os.dup(self._fd(self._segments[-1]))  # a close meanwhile cannot reuse it
                truncations = self._truncations
            try:
                os.fdatasync(fd)
            except OSError:
                with self._lock:
                    self._closed = True
                log.exception("%s: fdatasync failed; closing the commit log", self.directory)
                raise
            finally:
                os.close(fd)
            with self._lock:
                if truncations == self._truncations:
                    self._durable = max(self._durable, target)
                return self._durable

    def segment_paths(self) -> list[Path]:
        with self._lock:
            return [s.path for s in self._segments]

    def is_boundary(self, offset: int) -> bool:
        """Whether a record starts at `offset` (max_offset counts as one)."""
        with self._lock:
            return self._is_boundary(offset)

    def _is_boundary(self, offset: int) -> bool:
        if offset == self._segments[-1].end:
            return True
        if not self._segments[0].base <= offset < self._segments[-1].end:
            return False
        if offset in self._recent_starts:
            return True
        segment = self._segment_for(offset)
        pos = segment.marks[bisect.bisect_right(segment.marks, offset) - 1]
        while pos < offset:
            pos += self._length_at(segment, pos)
        return pos == offset

    def _length_at(self, segment: _Segment, offset: int) -> int:
        try:
            return peek_length(self._pread(segment, offset, PREFIX_BYTES), 0, offset)
        except (TornRecord, CorruptData) as exc:
            raise CorruptData(f"{segment.path}: {exc}; never served") from None

    def _require_boundary(self, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgument(f"offset {offset!r} is not an integer")
        if not self._segments[0].base <= offset <= self._segments[-1].end:
            raise InvalidArgument(
                f"offset {offset} is outside the log [{self._segments[0].base}, {self._segments[-1].end}]"
            )
        if not self._is_boundary(offset):
            raise InvalidArgument(f"offset {offset} is not the start of a record")

    # Appends -------------------------------------------------------------------------------
    def append(self, encoded_records: list[bytes], expected_offset: int | None = None) -> list[int]:
        """Appends whole encoded records; returns their commit offsets. Durable on return
        (when fsync): one write and one fdatasync per segment touched. With
        `expected_offset`, the log must end there (FailedPrecondition otherwise)."""
        if not encoded_records:
            return []
        for record in encoded_records:
            try:
                length = check_record(record, 0, -1)  # the checksum is checked when writing too
            except TornRecord as exc:
                raise InvalidArgument(f"not a whole record: {exc}") from None
            if length != len(record):
                raise InvalidArgument(f"an encoded record is {len(record)} bytes but says {length}")
        return self.append_verified(
            b"".join(encoded_records), [len(r) for r in encoded_records], expected_offset
        )

    def append_verified(
        self, data: bytes, sizes: list[int], expected_offset: int | None = None, sync: bool = True
    ) -> list[int]:
        """`append` of records whose bytes the caller has just made or checked itself
        (encode_record's output, or replicated bytes scan_records verified): `data` is
        the records end to end, `sizes` their lengths. Their checksums are not checked
        again; the reads and the recovery scan still check every record. With sync=False
        the bytes are written but durable only after `sync` (group commit)."""
        if not 0 < len(sizes) <= APPEND_RECORDS_MAX:
            if not sizes:
                return []
            raise InvalidArgument(f"{len(sizes)} records in one append; the limit is {APPEND_RECORDS_MAX}")
        if len(data) > APPEND_BYTES_MAX:
            raise InvalidArgument(f"an append of {len(data)} bytes; the limit is {APPEND_BYTES_MAX}")
        ends = list(itertools.accumulate(sizes))
        if ends[-1] != len(data) or min(sizes) < RECORD_BYTES_MIN:
            raise InvalidArgument(f"record sizes add up to {ends[-1]}, not the {len(data)} bytes given")
        with self._lock:
            self._check_open()
            if expected_offset is not None and expected_offset != self._segments[-1].end:
                raise FailedPrecondition(
                    f"replicated data starts at {expected_offset} but this "
                    f"log ends at {self._segments[-1].end}"
                )
            return self._append_locked(memoryview(data), ends, sync)

    def append_raw(self, offset: int, data: bytes) -> int:
        """A slave's append of bytes copied from its master; returns the new max_offset.

        `offset` must be this log's max_offset (FailedPrecondition otherwise) and `data`
        whole valid records (CorruptData otherwise); nothing is written unless all are.
        """
        if len(data) > APPEND_BYTES_MAX:
            raise InvalidArgument(f"{len(data)} bytes in one append; the limit is {APPEND_BYTES_MAX}")
        records = scan_records(data, offset)
        if not records:
            with self._lock:
                if offset != self._segments[-1].end:
                    raise FailedPrecondition(
                        f"replicated data starts at {offset} but this log ends at {self._segments[-1].end}"
                    )
                return offset
        offsets = self.append_verified(data, [r.size for r in records], expected_offset=offset)
        assert offsets == [r.commit_offset for r in records], (offsets, records)
        return offsets[-1] + records[-1].size

    def _append_locked(self, data: memoryview, ends: list[int], sync: bool = True) -> list[int]:
        """Writes the records ending at `ends` (positions in `data`): as many as fit in
        the active segment in one write, then a new segment for the rest (a record never
        spans two; one larger than a segment gets an empty segment to itself)."""
        offsets: list[int] = []
        undo: list[tuple[_Segment, int]] = []
        created: list[_Segment] = []
        try:
            active = self._segments[-1]
            first = 0  # the first record not written yet
            while first < len(ends):
                start = ends[first - 1] if first else 0
                fit = bisect.bisect_right(ends, start + self.segment_bytes - active.size, lo=first)
                if fit == first and active.size == 0:
                    fit = first + 1  # alone in an empty segment
                if fit > first:
                    starts = [start, *ends[first : fit - 1]]
                    base = active.end - start
                    offsets.extend(base + s for s in starts)
                    self._write(active, data[start : ends[fit - 1]], starts, base, undo, sync)
                    first = fit
                if first < len(ends):  # durable before the next segment exists
                    if active.allocated > active.size:  # ends where its records do (also a log
                        os.ftruncate(self._fd(active), active.size)  # written with fsync, reopened without)
                        active.allocated = active.size
                        if self.fsync:
                            os.fdatasync(self._fd(active))  # the new size, with the data
                            self._durable = active.end
                    if self.fsync and self._durable < active.end:
                        os.fdatasync(self._fd(active))
                        self._durable = active.end
                    active = self._create_segment(active.end)
                    self._segments.append(active)
                    created.append(active)
        except BaseException:
            self._undo(undo, created)
            raise
        return offsets

    def _write(
        self,
        segment: _Segment,
        data: memoryview,
        starts: list[int],
        base: int,
        undo: list[tuple[_Segment, int]],
        sync: bool = True,
    ) -> None:
        """`data` at the segment's end, then fdatasync (unless not `sync`); `starts` are
        its records' positions in the append's buffer, `base` + a position is its commit
        offset."""
        undo.append((segment, segment.size))
        fd = self._fd(segment)
        written = 0
        end = segment.size + len(data)
        if self.fsync and end > segment.allocated:  # zeros ahead, in the same write
            ahead = min(PREALLOCATE_BYTES, max(0, self.segment_bytes - end))
            written = os.pwritev(fd, [data, memoryview(_ZEROS)[:ahead]], segment.size)
            segment.allocated = max(segment.allocated, segment.size + written)
        while written < len(data):
            written += os.pwrite(fd, data[written:], segment.size + written)
        if self.fsync and sync:
            os.fdatasync(fd)  # everything before it in this segment too
            self._durable = segment.end + len(data)
        marks = segment.marks
        last = marks[-1] if marks else -MARK_INTERVAL_BYTES
        for start in starts:
            if base + start - last >= MARK_INTERVAL_BYTES:
                last = base + start
                marks.append(last)
        if len(self._recent_starts) + len(starts) > RECENT_STARTS_MAX:
            self._recent_starts.clear()
        self._recent_starts.update([base + start for start in starts])
        segment.size += len(data)
        segment.allocated = max(segment.allocated, segment.size)

    def _undo(self, undo: list[tuple[_Segment, int]], created: list[_Segment]) -> None:
        """Puts the files back as they were before a failed append (e.g. disk full)."""
        self._recent_starts.clear()
        try:
            for segment in reversed(created):
                self._close_fd(segment)
                segment.path.unlink(missing_ok=True)
                self._segments.remove(segment)
            for segment, size in reversed(undo):
                if segment in self._segments:
                    os.ftruncate(self._fd(segment), size)
                    segment.size = segment.allocated = size
                    segment.cut_marks(segment.base + size)
            self._durable = min(self._durable, self._segments[-1].end)
            self._truncations += 1
        except BaseException:
            self._closed = True  # the in-memory view may no longer match the files
            log.exception("%s: could not undo a failed append; closing the log", self.directory)
            raise

    # Reads ---------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, check: bool = True) -> bytes:
        """Whole records from `offset` (a record start, or max_offset for b""), at most
        `max_bytes` unless the first record alone is larger, never past the end of the
        segment holding `offset`. Each record's checksum is checked, unless check=False:
        then the caller must check them before trusting the bytes (a master serving a
        slave's fetch: the slave checks every record before it writes one)."""
        return self._read(offset, max_bytes, READ_BYTES_MAX, check)

    def read_bulk(self, offset: int, max_bytes: int, check: bool = True) -> bytes:
        """`read` with up to BULK_READ_BYTES_MAX bytes: the tiered uploader's one read
        of a range (larger batches amortise an upload's fixed costs). With check=False
        the bytes are whole records by their headers but their checksums are NOT checked:
        the caller must run check_whole_records before trusting them (the uploader does,
        while it writes them)."""
        return self._read(offset, max_bytes, BULK_READ_BYTES_MAX, check)

    def open_bulk(self, offset: int, max_bytes: int) -> FileRange:
        """The whole records read_bulk(check=False) would return, as a FileRange of the
        segment file instead of a copy in memory: the tiered uploader's one read. Their
        checksums are NOT checked: the caller checks the bytes it copied."""
        _check_max_bytes(max_bytes, BULK_READ_BYTES_MAX)
        with self._lock:
            self._check_open()
            self._require_boundary(offset)
            if offset == self._segments[-1].end:
                return FileRange(
                    os.dup(self._fd(self._segments[-1])), self._segments[-1].size, 0, self.directory
                )
            segment = self._segment_for(offset)
            end = self._records_end(segment, offset, min(offset + max_bytes, segment.end))
            return FileRange(os.dup(self._fd(segment)), offset - segment.base, end - offset, segment.path)

    def _read(self, offset: int, max_bytes: int, max_bytes_limit: int, check: bool = True) -> bytes:
        """Under the lock: find where the last whole record within `max_bytes` ends (from
        the sparse marks, a few header reads) and pread exactly that; the checksums are
        checked after the lock is released (the bytes are a private copy by then), so
        writers wait only for the pread."""
        _check_max_bytes(max_bytes, max_bytes_limit)
        with self._lock:
            self._check_open()
            self._require_boundary(offset)
            if offset == self._segments[-1].end:
                return b""
            segment = self._segment_for(offset)
            end = self._records_end(segment, offset, min(offset + max_bytes, segment.end))
            buf = self._pread(segment, offset, end - offset)
            path = segment.path
        if not check:
            return buf
        try:
            check_whole_records(buf, offset)
        except CorruptData as exc:
            raise CorruptData(f"{path}: {exc}; never served") from None
        return buf

    def _records_end(self, segment: _Segment, offset: int, limit: int) -> int:
        """The end of the last whole record in [offset, limit), or of the first record
        when it alone passes `limit`; `offset` is a record start inside `segment`."""
        if limit >= segment.end:
            return segment.end
        position = max(offset, segment.marks[bisect.bisect_right(segment.marks, limit) - 1])
        for _ in range(MARK_INTERVAL_BYTES // RECORD_BYTES_MIN + 2):  # marks are <= 4 KiB apart
            length = self._length_at(segment, position)
            if position + length > limit:
                return position if position > offset else position + length
            position += length
        raise AssertionError(
            f"{segment.path}: no record mark within {MARK_INTERVAL_BYTES} bytes before {limit}"
        )

    def scrub(self, offset: int, bytes_max: int) -> tuple[int, int | None]:
        """Checks the records from `offset` (a record start) for about `bytes_max` bytes,
        as a background scrub does (P16): returns where the next step starts and the
        commit offset of the first bad record found (None: all good). Reads the disk's
        bytes, whatever the in-memory marks say: a flipped length or checksum shows."""
        with self._lock:
            self._check_open()
            segment = self._segment_for(offset)
            if offset >= segment.end:
                return offset, None
            length = min(max(bytes_max, PREFIX_BYTES), segment.end - offset)
            buf = os.pread(self._fd(segment), length, offset - segment.base)
            limit = segment.end - offset
        position = 0
        while position < len(buf):
            try:
                position += check_record(buf, position, offset + position)
            except TornRecord:
                if position > 0:  # the buffer ends inside a good record: the next step reads it
                    return offset + position, None
                try:  # one record longer than bytes_max: read it whole (if the segment holds it)
                    whole = peek_length(buf, 0, offset)
                    if whole > limit:
                        return offset, offset
                    return self.scrub(offset, whole)
                except (TornRecord, CorruptData):
                    return offset, offset
            except CorruptData:
                return offset + position, offset + position
        return offset + position, None

    def read_record(self, offset: int) -> StoredRecord:
        """The record starting at `offset`, checksum verified (CorruptData otherwise)."""
        with self._lock:
            self._check_open()
            self._require_boundary(offset)
            if offset == self._segments[-1].end:
                raise InvalidArgument(f"offset {offset} is the end of the log; no record there")
            segment = self._segment_for(offset)
            return self._decode_at(segment, offset, self._length_at(segment, offset))

    def read_record_at(self, offset: int, size: int) -> StoredRecord:
        """The record of `size` bytes at `offset`, as an index entry names it; checksum
        verified, and CorruptData when the bytes there are not such a record."""
        with self._lock:
            self._check_open()
            if not (
                self._segments[0].base <= offset
                and RECORD_BYTES_MIN <= size
                and offset + size <= self._segments[-1].end
            ):
                raise InvalidArgument(
                    f"record [{offset}, {offset + size}) is outside the log "
                    f"[{self._segments[0].base}, {self._segments[-1].end})"
                )
            segment = self._segment_for(offset)
            if offset + size > segment.end:
                raise CorruptData(
                    f"{segment.path}: an index entry names [{offset}, "
                    f"{offset + size}), which crosses the segment end {segment.end}"
                )
            record = self._decode_at(segment, offset, size)
            if record.size != size:
                raise CorruptData(
                    f"{segment.path}: record at {offset} is {record.size} bytes, not {size} as indexed"
                )
            return record

    def _decode_at(self, segment: _Segment, offset: int, size: int) -> StoredRecord:
        try:
            return decode_record(self._pread(segment, offset, size), 0, offset)
        except (TornRecord, CorruptData) as exc:
            raise CorruptData(f"{segment.path}: {exc}; never served") from None

    # Truncation and retention ----------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drops every record at or after `offset` (a record start). Crash-safe: later
        segments go newest first, then the holding segment is cut and fsynced."""
        with self._lock:
            self._check_open()
            self._require_boundary(offset)
            if offset == self._segments[-1].end:
                return
            while self._segments[-1].base > offset:
                segment = self._segments.pop()
                self._close_fd(segment)
                segment.path.unlink()
                if self.fsync:
                    fsync_dir(self.directory)
            segment = self._segments[-1]
            fd = self._fd(segment)
            os.ftruncate(fd, offset - segment.base)
            if self.fsync:
                os.fsync(fd)
            segment.size = segment.allocated = offset - segment.base
            segment.cut_marks(offset)
            self._recent_starts.clear()  # starts past offset name other bytes once it grows again
            self._durable = min(self._durable, offset)
            self._truncations += 1
            log.info("%s: truncated to %d", self.directory, offset)

    def delete_segments_before(self, offset: int) -> int:
        """Deletes whole segments that end at or before `offset`, oldest first, never the
        last one; returns how many went. min_offset moves to the first one kept."""
        with self._lock:
            self._check_open()
            if not 0 <= offset <= self._segments[-1].end:
                raise InvalidArgument(f"offset {offset} is outside [0, {self._segments[-1].end}]")
            deleted = 0
            while len(self._segments) > 1 and self._segments[0].end <= offset:
                segment = self._segments.pop(0)
                self._close_fd(segment)
                segment.path.unlink()
                if self.fsync:
                    fsync_dir(self.directory)
                deleted += 1
            return deleted

    def close(self) -> None:
        """Closes every file; the last segment is first cut to its records (a stopped
        broker's files end where its log does). A cut that fails leaves the zeros, which
        the next open reads as the end."""
        with self._lock:
            last = self._segments[-1]
            if not self._closed and last.allocated > last.size:
                try:
                    fd = self._fd(last)
                    os.ftruncate(fd, last.size)
                    if self.fsync:
                        os.fsync(fd)
                    last.allocated = last.size
                except OSError as exc:
                    log.warning("%s: could not cut the zeros written ahead at close (%s)", last.path, exc)
            for segment in list(self._open.values()):
                self._close_fd(segment)
            self._closed = True
