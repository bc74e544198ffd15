"""The applied-entry log: one checksummed JSON line per Raft entry a node applied.

It is the audit's view of a controller node (R1/R2 and the M1-M4 replay). Each line:
  {"index", "term", "node_id", "command_type", "command_digest", "state_digest",
   "commands", "effects", "crc32"}
where command_digest is the SHA-256 of the Raft entry's bytes (the JSON list of commands)
and crc32 covers the canonical JSON of every other field. Lines go to the page cache
(a kill -9 loses nothing); the file is fsynced once a megabyte has been appended since
its last fsync, and its sync mark (`applied.jsonl.synced`) records how far it is durable.
After a crash the torn last line (if any) is cut off; after a power loss also everything
from the first never-written (zero) page after the mark on, wherever it lies; what is
left after the mark is then written again in place and fsynced (`write_again`: lines an
fsync failed to write read whole but are never written back by Linux). Entries the node
replays from its Raft journal are not written twice.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from mqmeta.errors import CorruptData
from mqmeta.formats.jsonlines import (
    SyncMark,
    format_line,
    parse_line,
    split_lines,
    unwritten_in,
    write_again,
)

log = logging.getLogger(__name__)

TAIL_SCAN_BYTES = 1 << 20  # where the last index is looked for
SYNC_EVERY_BYTES = 1 << 20


class AppliedLog:
    def __init__(self, path: Path, node_id: str, sync_every_bytes: int = SYNC_EVERY_BYTES) -> None:
        self.path = path
        self.node_id = node_id
        self._mark = SyncMark(path, sync_every_bytes)
        self.last_index = self._recover()
        self._file = open(path, "ab")
        self._size = self._file.tell()

    def _recover(self) -> int:
        """Returns the last index on disk, cutting off a torn final line."""
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            hole = unwritten_in(f.fileno(), self._mark.floor(size), size)
            end = size if hole < 0 else hole
            if hole >= 0:  # after a power loss: a page never written back, and all after it
                log.warning(
                    "%s: cutting off %d bytes after a power loss's unwritten page", self.path, size - hole
                )
            start = max(0, end - TAIL_SCAN_BYTES)
            f.seek(start)
            tail = f.read(end - start)
        complete, torn_bytes = split_lines(tail)
        keep_end = end - torn_bytes
        if torn_bytes:
            log.warning("%s: cutting off a torn last line of %d bytes", self.path, torn_bytes)
        complete = [ln for ln in complete if ln]
        if start > 0 and complete:
            complete = complete[1:]  # the first line of the window may be partial
        last_index = 0
        for raw in reversed(complete):
            try:
                last_index = parse_line(raw.decode(), str(self.path))["index"]
                break
            except CorruptData as exc:
                log.error("%s (left in place for the audit to report)", exc)
        with open(self.path, "r+b") as f:
            if keep_end != size:
                f.truncate(keep_end)
            try:  # best effort, as the mark's fsync is: a full disk must not stop the node
                write_again(f.fileno(), min(self._mark.floor(size), keep_end), keep_end)
            except OSError as error:
                log.warning(
                    "%s: its lines after the sync mark were not made durable again: %s", self.path, error
                )
        return last_index

    def append(self, record: dict[str, Any]) -> None:
        if record["index"] <= self.last_index:
            return  # replayed after a restart: already on disk
        record["node_id"] = self.node_id
        line = format_line(record)
        self._file.write(line)
        self._file.flush()  # in the page cache: survives kill -9 of this process
        self._size += len(line)
        self.last_index = record["index"]
        if self._mark.due(self._size):
            self.fsync()

    def fsync(self) -> None:
        """Makes every appended line durable and moves the sync mark to the end."""
        os.fsync(self._file.fileno())
        self._mark.record(self._size)

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.fsync()
        except OSError as error:  # the lines stay in the page cache; recovery scans them
            log.warning("%s: not made durable at close: %s", self.path, error)
        self._file.close()
