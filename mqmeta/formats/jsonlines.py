"""Checksummed JSON lines, and the torn-tail rule for files appended line by line.

One line = the canonical JSON of a record with a `crc32` field over the canonical JSON
of every other field. Written by the controller's applied-entry log and the broker's
confirm log, read by the audit. Lines are appended with one write() each, so a crash
can leave at most one unterminated last line: it is torn, never a record. A power loss
can also leave never-written (zero) pages anywhere after the last fsync; `SyncMark` says
where that region starts and `unwritten_in` finds the first such page.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from mqmeta.errors import CorruptData
from mqmeta.formats.atomic import write_atomically
from mqmeta.formats.checksummed import canonical_json, dump_checksummed, load_checksummed

SYNC_MARK_SUFFIX = ".synced"
SCAN_CHUNK_BYTES = 1 << 20


def line_crc(record: dict[str, Any]) -> int:
    """The CRC-32 a line carries: over the canonical JSON of every field but crc32."""
    body = {k: v for k, v in record.items() if k != "crc32"}
    return zlib.crc32(canonical_json(body).encode())


def format_line(record: dict[str, Any]) -> bytes:
    """The line for `record` (a non-empty dict without crc32), newline included: its
    canonical JSON with the crc32 field appended last (parse_line recomputes the CRC
    over the other fields, so the field's position does not matter)."""
    assert record and "crc32" not in record, record
    body = canonical_json(record).encode()  # serialized once: the CRC covers exactly this
    return body[:-1] + b',"crc32":' + str(zlib.crc32(body)).encode() + b"}\n"


def parse_line(text: str, where: str) -> dict[str, Any]:
    """Parses and verifies one line; raises CorruptData naming `where`."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptData(f"{where}: not a JSON line ({exc.msg})") from None
    if not isinstance(record, dict) or record.get("crc32") != line_crc(record):
        raise CorruptData(f"{where}: checksum mismatch")
    return record


def split_lines(data: bytes) -> tuple[list[bytes], int]:
    """(the complete lines of `data`, the byte count of its unterminated tail).

    Everything after the last newline is a torn append (or nothing); empty lines are
    kept as they are (the caller reports them).
    """
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1] if end else []
    return lines, len(data) - end


def unwritten_in(fd: int, start: int, end: int) -> int:
    """Where a power loss's unwritten region begins in an append-only file, looked for
    from `start` (a line's start) to `end` a chunk at a time: the start of the line that
    holds the first NUL byte (a page the cache never wrote back reads as zeros, and a
    formatted line never holds a NUL), or -1 when there is none. Everything from there on
    was not durable and is cut off on recovery."""
    position = start
    while position < end:
        chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - position), position)
        if not chunk:
            return -1
        hole = chunk.find(b"\0")
        if hole < 0:
            position += len(chunk)
            continue
        newline = chunk.rfind(b"\n", 0, hole)
        if newline >= 0:
            return position + newline + 1
        while position > start:  # the line began in an earlier chunk
            low = max(start, position - SCAN_CHUNK_BYTES)
            newline = os.pread(fd, position - low, low).rfind(b"\n")
            if newline >= 0:
                return low + newline + 1
            position = low
        return start
    return -1


def write_again(fd: int, start: int, end: int) -> None:
    """Writes bytes [start, end) of the file back where they are, a chunk at a time, and
    fsyncs them. After an fsync that failed (EIO), Linux keeps the pages it could not write
    readable but clean: the file reads whole, a later fsync never writes them, and a power
    loss or an unmount after it leaves zeros in its middle. Written again, they are dirty,
    and this fsync makes them durable. A log calls it at open for what lies after its sync
    mark; an OSError (the disk still full or failing) is the caller's to report."""
    position = start
    while position < end:
        chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - position), position)
        if not chunk:
            break
        os.pwrite(fd, chunk, position)
        position += len(chunk)
    os.fsync(fd)


class SyncMark:
    """How much of an append-only line file is known durable, kept beside it in
    `<name>.synced` (checksummed, replaced atomically after the file's fsync).

    A power loss can lose any page written since a file's last fsync, not only its tail:
    the kernel writes dirty pages back in any order, so the survivors may sit after a lost
    page. Recovery therefore looks for unwritten pages from the mark on (`floor`), and
    the owner fsyncs the file and moves the mark once `every_bytes` were appended since
    (`due`), which bounds that scan. A missing, damaged or stale mark only makes the scan
    longer: the mark never says more than was fsynced."""

    def __init__(self, path: Path, every_bytes: int) -> None:
        self.path = path.with_name(path.name + SYNC_MARK_SUFFIX)
        self.every_bytes = every_bytes
        try:
            self.marked = int(load_checksummed(self.path)["durable_bytes"])
        except (FileNotFoundError, CorruptData, KeyError, TypeError, ValueError):
            self.marked = 0

    def floor(self, size: int) -> int:
        """Where the scan of a `size`-byte file starts: the mark, or 0 when the file is
        shorter than the mark (it was replaced or cut by hand)."""
        return self.marked if self.marked <= size else 0

    def due(self, size: int) -> bool:
        return size - self.marked >= self.every_bytes

    def record(self, size: int) -> None:
        """After an fsync of the file's first `size` bytes."""
        write_atomically(self.path, dump_checksummed({"durable_bytes": size}))
        self.marked = size
