"""Checksummed JSON lines, and the torn-tail rule for files appended line by line.

One line = the canonical JSON of a record with a `crc32` field over the canonical JSON
of every other field. Written by the controller's applied-entry log and the broker's
confirm log, read by the audit. Lines are appended with one write() each, so a crash
can leave at most one unterminated last line: it is torn, never a record.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from mqmeta.errors import CorruptData
from mqmeta.formats.checksummed import canonical_json


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


def unwritten_from(data: bytes) -> int:
    """Where a power loss's unwritten region begins in an append-only file's `data`: the
    start of the line that holds its first NUL byte (a page the cache never wrote back
    reads as zeros, and a formatted line never holds a NUL), or -1 when there is none.
    Everything from there on was not durable and is cut off on recovery."""
    hole = data.find(b"\0")
    return -1 if hole < 0 else data.rfind(b"\n", 0, hole) + 1
