"""A crash-safe Raft journal for pysyncobj, and its reconciliation with the snapshot.

pysyncobj 0.3.17's FileJournal is an mmap without checksums or fsync; its compaction
rewrites the file in place (clear, then re-add), so a kill -9 during it truncates
the log; and when the process dies between writing a snapshot and compacting the
journal, pysyncobj finds the journal's head different from the snapshot's tail on
restart and clears the whole journal, dropping committed entries (both seen in
tests/test_durability.py). This journal:

- appends records `[length u32][crc32 u32][index u64][term u64][command]`, fsynced
  (fdatasync) before pysyncobj acknowledges anything (configurable); a leader's appends
  may be synced once after it has sent them (`deferred_sync`: its own fsync then runs
  while the followers write theirs; pysyncobj_compat.SendBeforeSync says why it is safe);
- writes each record over zeros written ahead of it (PREALLOCATE_BYTES at a time, with
  the record that needs them): an fdatasync of bytes written over a file's existing
  blocks does not change its size or allocate, so the filesystem commits no metadata
  for it (on ext4 here, 3 concurrent fdatasyncs of 1 KB: 0.22-0.29 ms over zeros against
  0.40-0.47 appended). The file therefore ends in zeros: a bad record with nothing but
  zeros after it is where the log ends, not a torn tail;
- compacts by writing the kept records to a temp file, fsync, rename;
- truncates a torn last record at open, and refuses (CorruptData) a bad record that
  has valid data after it;
- keeps term, vote and commit index in a checksummed side file written by
  temp + fsync + rename; term and vote synchronously (Raft requires it); the commit
  index is clamped to the journal's end at open (pysyncobj #197);
- stops the process (fail_stop: exit EXIT_DISK_FAILED) when a write or fsync of the log
  or of its side file fails (EIO, ENOSPC): pysyncobj would acknowledge entries its
  disk may not hold, or lose its tick thread to the exception. After a failed fsync
  Linux marks the unwritten pages clean (a retried fsync succeeds, a power loss still
  loses them), so the log is then distrusted: a marker file beside it makes the
  restart discard it and re-join from the others (controller/repair.py). A failed write
  or side-file save leaves no such doubt (a torn tail is cut at open) and no marker.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from mqmeta.controller.snapshot import read_position

from mqmeta.errors import CorruptData
from mqmeta.formats.atomic import write_atomically
from mqmeta.formats.records import zeros_to_end

log = logging.getLogger(__name__)

FILE_MAGIC = b"MQMJRNL1"
RECORD_HEADER = struct.Struct("<IIQQ")
RECORD_COMMAND_MAX = 256 << 20
PREALLOCATE_BYTES = 1 << 20  # zeros written past a record that needs more room
_ZEROS = bytes(PREALLOCATE_BYTES)

Entry = tuple[bytes, int, int]  # command, raft index, term

EXIT_DISK_FAILED = 74  # EX_IOERR: the Raft log's disk failed a write or an fsync
FAILED_MARKER_SUFFIX = ".failed"  # beside the journal: a failed fsync, the log is not trusted


def failed_marker(journal_path: Path) -> Path:
    return journal_path.with_name(journal_path.name + FAILED_MARKER_SUFFIX)


def fail_stop(journal_path: Path, what: str, error: OSError, distrust_log: bool) -> NoReturn:
    """Ends the process at once: nothing after a failed write or fsync may be
    acknowledged. With `distrust_log` (a failed fsync) it first leaves the marker that
    makes the restart discard the log (controller/repair.py)."""
    left = ""
    if distrust_log:
        marker = failed_marker(journal_path)
        try:
            write_atomically(marker, f"{what}: {error}\n".encode())
            left = f"; {marker.name} tells the restart to discard the log and re-join from the others"
        except OSError as marker_error:
            left = f"; could not leave {marker.name} ({marker_error}): move {journal_path} aside first"
    log.critical(
        "%s failed (%s): this node stops (exit %d) before it acknowledges anything its disk may not hold%s",
        what,
        error,
        EXIT_DISK_FAILED,
        left,
    )
    logging.shutdown()
    os._exit(EXIT_DISK_FAILED)


def _record(command: bytes, index: int, term: int) -> bytes:
    crc = zlib.crc32(struct.pack("<QQ", index, term) + command)
    return RECORD_HEADER.pack(len(command), crc, index, term) + command


def parse_records(data: bytes, where: str) -> tuple[list[Entry], list[int], int]:
    """Returns (entries, their offsets, end of the last good record)."""
    if data[: len(FILE_MAGIC)] != FILE_MAGIC:
        raise CorruptData(f"{where} is not an mqmeta journal (bad magic)")
    entries: list[Entry] = []
    offsets: list[int] = []
    pos = len(FILE_MAGIC)
    while pos < len(data):
        bad = _bad_record(data, pos)
        if bad:
            if zeros_to_end(data, pos):
                break  # the zeros written ahead of the next record
            if _any_good_record_after(data, pos):
                raise CorruptData(
                    f"{where}: record at byte {pos} is corrupt ({bad}) and valid "
                    "records follow it; refusing to use this journal"
                )
            log.warning("%s: cutting off a torn last record at byte %d (%s)", where, pos, bad)
            break
        length, _, index, term = RECORD_HEADER.unpack_from(data, pos)
        start = pos + RECORD_HEADER.size
        entries.append((bytes(data[start : start + length]), index, term))
        offsets.append(pos)
        pos = start + length
    return entries, offsets, pos


def _bad_record(data: bytes, pos: int) -> str:
    if pos + RECORD_HEADER.size > len(data):
        return "incomplete header"
    length, crc, index, term = RECORD_HEADER.unpack_from(data, pos)
    start = pos + RECORD_HEADER.size
    if length > RECORD_COMMAND_MAX or start + length > len(data):
        return "incomplete record"
    if zlib.crc32(struct.pack("<QQ", index, term) + data[start : start + length]) != crc:
        return "checksum mismatch"
    return ""


def _any_good_record_after(data: bytes, pos: int) -> bool:
    # A torn append can only be the last thing in the file: look for any valid record
    # starting after the bad one (bounded scan: records are small; a record has a
    # nonzero length, so none starts in the zeros at the end).
    window = data[pos + 1 : pos + 1 + (1 << 20)].rstrip(b"\0")
    for start in range(pos + 1, pos + 1 + len(window)):
        if not _bad_record(data, start):
            length = RECORD_HEADER.unpack_from(data, start)[0]
            if length > 0:
                return True
    return False


class DurableJournal:
    """Implements the Journal interface pysyncobj calls (names are pysyncobj's; the
    compat layer checks at install that every method of that interface is here)."""

    def __init__(self, path: Path, fsync: bool = True, stop_on_disk_error: bool = True) -> None:
        self.path = path
        self.meta_path = path.with_name(path.name + ".meta")
        self.fsync = fsync
        self.stop_on_disk_error = stop_on_disk_error  # False: the OSError is raised (unit tests)
        self._deferring = False  # appends wait for end_deferred_sync() (the leader's batch)
        self._unsynced = False
        if not path.exists():
            write_atomically(path, FILE_MAGIC)
        data = path.read_bytes()
        self._entries, self._offsets, end = parse_records(data, str(path))
        if end < len(data) and not zeros_to_end(data, end):  # a torn last record
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            data = data[:end]
        self._fd = os.open(path, os.O_WRONLY)
        if fsync:  # what a killed process wrote may still be only in the page cache: synced
            with self._disk(f"fdatasync of {path.name} at open", distrust_log=True):  # before
                os.fdatasync(self._fd)  # this node acknowledges any of it (to a leader)
        self._end = end
        self._allocated = len(data)  # the file's size: zeros from _end to it
        self._meta = self._load_meta()
        self._meta_dirty = False
        last_index = self._entries[-1][1] if self._entries else 0
        if self._meta["commit_index"] > max(1, last_index):  # 1: where a new journal starts
            log.warning(
                "%s: commit index %d is past the journal end %d; clamping",
                self.meta_path,
                self._meta["commit_index"],
                last_index,
            )
            self._meta["commit_index"] = max(1, last_index)
            self._save_meta()

    # Meta -----------------------------------------------------------------------------
    @staticmethod
    def read_commit_index(meta_path: Path) -> int:
        """The commit index a journal's side file records (CorruptData when it is bad)."""
        return int(DurableJournal._read_meta(meta_path).get("commit_index", 1))

    def _load_meta(self) -> dict[str, Any]:
        return self._read_meta(self.meta_path)

    @staticmethod
    def _read_meta(meta_path: Path) -> dict[str, Any]:
        if not meta_path.exists():
            return {"term": 0, "voted_for": None, "commit_index": 1}
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, UnicodeDecodeError):
            meta = {}
        body = {k: v for k, v in meta.items() if k != "crc32"}
        if meta.get("crc32") != zlib.crc32(json.dumps(body, sort_keys=True).encode()):
            raise CorruptData(
                f"{meta_path} is corrupt (checksum mismatch): the node's "
                "Raft term and vote are unknown, so it refuses to start"
            )
        return body

    def _save_meta(self) -> None:
        body = dict(self._meta)
        body["crc32"] = zlib.crc32(json.dumps(self._meta, sort_keys=True).encode())
        with self._disk(f"saving {self.meta_path.name}", distrust_log=False):
            write_atomically(self.meta_path, json.dumps(body, sort_keys=True).encode())
        self._meta_dirty = False

    @contextmanager
    def _disk(self, what: str, distrust_log: bool) -> Iterator[None]:
        """A disk operation of this journal: its OSError stops the node (fail_stop)."""
        try:
            yield
        except OSError as error:
            if not self.stop_on_disk_error:
                raise
            fail_stop(self.path, what, error, distrust_log)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        self._meta["term"] = term
        self._meta["voted_for"] = votedForNodeId
        self._save_meta()  # before any vote or term is sent (Raft section 5)

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta["term"])

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._meta["voted_for"]

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        self._meta["commit_index"] = raftCommitIndex
        self._meta_dirty = True  # Raft recomputes it; saved once a second

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta["commit_index"])

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty:
            self._save_meta()

    # Entries -----------------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        command = bytes(command)
        record = _record(command, idx, term)
        with self._disk(f"appending entry {idx} to {self.path.name}", distrust_log=False):
            end = self._end + len(record)
            if end <= self._allocated:
                written = os.pwrite(self._fd, record, self._end)
            else:  # zeros ahead for the next records, in the same write
                written = os.pwritev(self._fd, [record, _ZEROS], self._end)
                self._allocated = max(self._allocated, self._end + written)
            if written < len(record):  # a full disk may take part of it
                raise OSError(errno.ENOSPC, "short write: the disk took part of the record")
        if self.fsync:
            if self._deferring:
                self._unsynced = True
            else:
                with self._disk(f"fdatasync of {self.path.name}", distrust_log=True):
                    os.fdatasync(self._fd)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)

    def begin_deferred_sync(self) -> None:
        """Appends from now on are synced by end_deferred_sync(), once, not each."""
        self._deferring = True

    def end_deferred_sync(self) -> None:
        """Syncs every append since begin_deferred_sync(); appends sync at once again."""
        self._deferring = False
        if self._unsynced:
            with self._disk(f"fdatasync of {self.path.name}", distrust_log=True):
                os.fdatasync(self._fd)
            self._unsynced = False

    def clear(self) -> None:
        self._rewrite([])

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803
        if entryFrom >= len(self._entries):
            return
        log.info(
            "%s: dropping %d entries from index %d of term %d (they conflict with the leader's log)",
            self.path,
            len(self._entries) - entryFrom,
            self._entries[entryFrom][1],
            self._entries[entryFrom][2],
        )
        cut = self._offsets[entryFrom]
        with self._disk(f"truncating {self.path.name}", distrust_log=True):
            os.ftruncate(self._fd, cut)
            os.fsync(self._fd)
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._end = self._allocated = cut

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803
        self._rewrite(self._entries[entryTo:])

    def _rewrite(self, keep: list[Entry]) -> None:
        """Atomic: the old file stays whole until the new one is durable."""
        records = [_record(*entry) for entry in keep]
        with self._disk(f"compacting {self.path.name}", distrust_log=True):
            write_atomically(self.path, FILE_MAGIC + b"".join(records))
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY)
        self._entries = list(keep)
        self._offsets = []
        pos = len(FILE_MAGIC)
        for record in records:
            self._offsets.append(pos)
            pos += len(record)
        self._end = self._allocated = pos

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def flush(self) -> None:
        with self._disk(f"fsync of {self.path.name}", distrust_log=True):
            os.fsync(self._fd)

    def _destroy(self) -> None:
        if self._meta_dirty:
            self._save_meta()
        os.close(self._fd)


def read_snapshot_tail(path: Path) -> tuple[Entry, Entry] | None:
    """The (last applied, previous) entries a pysyncobj snapshot was taken at.

    Reading the whole file checks its CRC-32: a corrupt snapshot is refused.
    pysyncobj itself logs a failed load and carries on with an empty state on top of
    a compacted journal, which would silently serve wrong metadata.
    """
    if not path.exists():
        return None
    try:
        return read_position(path)  # type: ignore[return-value]
    except Exception as exc:  # CorruptData, or gzip/zlib/pickle's own kinds
        raise CorruptData(
            f"Raft snapshot {path} is corrupt ({type(exc).__name__}: {exc}); this node refuses "
            "to start with it. Move the node's data directory aside and restart it empty: it "
            "will copy the state from the leader (only while the other nodes form a majority)"
        ) from None


def reconcile_with_snapshot(
    journal_path: Path, snapshot_path: Path, tail: tuple[Entry, Entry] | None = None
) -> None:
    """Compacts the journal up to the snapshot when a crash came between the two.

    pysyncobj keeps its journal on restart only if the journal starts with exactly the
    snapshot's last two entries; otherwise it clears it. If the process died after the
    snapshot was written but before the journal was compacted, the journal still holds
    older entries first, and every committed entry after the snapshot would be lost.
    `tail`: the snapshot's (last, previous) entries when the caller has read it already.
    """
    if tail is None:
        tail = read_snapshot_tail(snapshot_path)
    if tail is None or not journal_path.exists():
        return
    last, previous = tail
    journal = DurableJournal(journal_path)
    try:
        entries = journal[:]
        for position in range(len(entries) - 1):
            if entries[position] == previous and entries[position + 1] == last:
                if position > 0:
                    log.warning(
                        "%s: compacting %d entries already in the snapshot (a crash interrupted compaction)",
                        journal_path,
                        position,
                    )
                    journal.deleteEntriesTo(position)
                return
    finally:
        journal._destroy()
