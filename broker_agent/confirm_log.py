"""The confirm log: the broker's audit trail of its confirm offset over time.

The confirm offset lives in memory (it is recomputed from the slaves' acks), but the
audit needs it: B1 compares replicas only below it and T1 checks that no tiered
segment ends beyond it. So every broker appends checksummed JSON lines to
`confirm.log` beside its store:

  {"t_ms", "broker_name", "broker_id", "role", "epoch", "confirm_offset", "max_offset",
   "acked": {"<broker id>": offset}, "crc32"}

as `mqmeta.formats.jsonlines` lines (the applied-entry log's format). A master
writes a line when its confirm offset advances (coalesced to one line per
`master_interval_ms`) and always before a tiered upload starts, so every uploaded
end offset is covered by a line written earlier; a slave writes the confirm offset
its master told it at most every `slave_interval_ms`. Lines go straight to the page
cache with one write() each: a kill -9 loses nothing written. A forced line (a new
master's first, the one before a tiered upload) is fdatasynced too: the upload itself
is durable, so the line that covers it must survive a power loss as well (T1 found its
absence after a power loss). A power loss can leave a torn final line: opening the log
cuts it, so the next line starts on a line of its own (B1 read a glued one as corrupt).
It can also lose any page written since the last fdatasync, not only the last one (the
kernel writes pages back in any order): opening the log cuts everything from the first
such page on, looking for it from the sync mark (`confirm.log.synced`, how far the log
is known durable), and the log is fdatasynced once a megabyte has been written since.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

from mqmeta.formats.jsonlines import SyncMark, format_line, parse_line, split_lines, unwritten_in, write_again

log = logging.getLogger(__name__)

MASTER_INTERVAL_MS = 50
SLAVE_INTERVAL_MS = 500
FILE_BYTES_MAX = 256 << 20  # past this the log stops growing (the audit then sees less)
SYNC_EVERY_BYTES = 1 << 20


class ConfirmLog:
    def __init__(self, path: Path, broker_name: str, sync_every_bytes: int = SYNC_EVERY_BYTES) -> None:
        self.path = path
        self.broker_name = broker_name
        self._mark = SyncMark(path, sync_every_bytes)
        _recover(path, self._mark)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._last_key: tuple[Any, ...] | None = None
        self._last_write_ms = 0
        self._pending: dict[str, Any] | None = None
        self._full = False

    def note(
        self,
        now_ms: int,
        broker_id: int,
        role: str,
        epoch: int,
        confirm_offset: int,
        max_offset: int,
        acked: dict[int, int],
        force: bool = False,
    ) -> None:
        """Records the current state; writes now when forced or due, else keeps it pending."""
        key = (broker_id, role, epoch, confirm_offset)
        if key == self._last_key and not force:
            return
        self._pending = {
            "t_ms": now_ms,
            "broker_name": self.broker_name,
            "broker_id": broker_id,
            "role": role,
            "epoch": epoch,
            "confirm_offset": confirm_offset,
            "max_offset": max_offset,
            "acked": {str(i): offset for i, offset in sorted(acked.items())},
        }
        self._last_key = key
        self.flush_due(now_ms, force)

    def flush_due(self, now_ms: int, force: bool = False) -> None:
        """Writes the pending line if forced or its coalescing interval has passed."""
        if self._pending is None or self._fd < 0:
            return
        interval_ms = MASTER_INTERVAL_MS if self._pending["role"] == "MASTER" else SLAVE_INTERVAL_MS
        if not force and now_ms - self._last_write_ms < interval_ms:
            return
        record = self._pending
        record["t_ms"] = now_ms
        line = format_line(record)
        if self._size + len(line) > FILE_BYTES_MAX:
            self._pending = None
            return
        try:
            written = os.write(self._fd, line)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            self._warn_full()
            return  # still pending: written once space returns (a forced note's caller checks)
        if written != len(line):  # a short write (the disk filled up): no torn line stays
            os.ftruncate(self._fd, self._size)
            self._warn_full()
            return
        self._pending = None
        self._size += written
        self._full = False
        if force:
            os.fdatasync(self._fd)
            if self._mark.due(self._size):
                self._mark.record(self._size)
        elif self._mark.due(self._size):
            self._sync_and_mark()
        self._last_write_ms = now_ms

    def _sync_and_mark(self) -> None:
        """Bounds the scan a power loss's recovery makes. A failure only leaves the mark
        behind (the next due line tries again): a line of this audit trail never fences."""
        try:
            os.fdatasync(self._fd)
            self._mark.record(self._size)
        except OSError as error:
            log.warning("%s: not made durable: %s", self.path, error)

    def _warn_full(self) -> None:
        if not self._full:  # once per full episode
            log.warning("%s: the disk is full; the confirm log's lines wait for space", self.path)
        self._full = True

    @property
    def behind(self) -> bool:
        """A line could not be written yet (a full disk)."""
        return self._pending is not None

    def close(self) -> None:
        """Later notes are dropped: a straggling thread must not write into whatever file
        reuses this descriptor number."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _recover(path: Path, mark: SyncMark) -> None:
    """Truncates an unterminated final line (a power loss's torn write), and before it
    everything from a never-written (zero) page after the sync mark on, durably; then
    writes what is left after the mark again, in place, and fsyncs it. After an fsync that
    failed (EIO: the broker fenced itself and exited), Linux keeps the pages it could not
    write readable but clean: a later fsync never writes them, so this log read whole at
    the restart, yet a power loss or an unmount later left zeros in its middle (the
    audit's B1 found one). Written again, they are dirty and this fsync makes them
    durable. That second step is best effort, as the mark's fsync is (a line of this audit
    trail never fences): a disk still full or failing leaves a warning, not a broker that
    cannot start."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        floor = mark.floor(size)
        hole = unwritten_in(fd, floor, size)
        end = size if hole < 0 else hole
        keep = end
        if end > 0 and os.pread(fd, 1, end - 1) != b"\n":
            keep, block = 0, 1 << 16
            while end > 0:  # the last newline, read backwards block by block
                start = max(0, end - block)
                found = os.pread(fd, end - start, start).rfind(b"\n")
                if found >= 0:
                    keep = start + found + 1
                    break
                end = start
        if keep != size:
            os.ftruncate(fd, keep)
            os.fsync(fd)
        try:
            write_again(fd, min(floor, keep), keep)
        except OSError as error:
            log.warning("%s: its lines after the sync mark were not made durable again: %s", path, error)
    finally:
        os.close(fd)


def read_confirm_log(path: Path) -> list[dict[str, Any]]:
    """Every verified line; an unterminated (torn) final line is skipped, a bad line raises."""
    lines, _torn_bytes = split_lines(path.read_bytes())
    return [
        parse_line(raw.decode(errors="replace"), f"{path}:{number}")
        for number, raw in enumerate(lines, start=1)
    ]
