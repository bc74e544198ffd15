"""Walking a commit-log (or tiered) segment record by record, never crashing on bad bytes.

`walk(buf, base)` yields one `Piece` per record or bad region, covering the buffer
from start to end with no gap: a checksum-valid record, a corrupt region (bad magic,
impossible length or checksum mismatch, up to the next checksum-valid record), or a
truncated tail (the buffer ends inside a record and no valid record follows: an append
that a crash interrupted). The walk is deterministic in the bytes, so the readers of
two offset-range partitions of one file (each walks the file from its start and keeps
the pieces starting in its range) agree on the boundaries.

Validity is `broker_agent.records.check_record`'s; the fast path below repeats its
checks inline (as `commitlog.check_whole_records` does) because the per-record Python
overhead, not the CRC, dominates a walk.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from broker_agent.records import (
    PREFIX_BYTES,
    RECORD_BYTES_MAX,
    RECORD_BYTES_MIN,
    RECORD_MAGIC,
    RECORD_VERSION,
    TornRecord,
    check_record,
    peek_length,
)
from mqmeta.errors import CorruptData

_HEADER = struct.Struct("<2sBII")  # records.py's prefix: magic, version, total length, crc32
_FIXED = struct.Struct("<QQIQQ")  # epoch, store ms, queue id, queue offset, producer seq
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_NEEDLE = RECORD_MAGIC + bytes([RECORD_VERSION])
assert _HEADER.size == PREFIX_BYTES


class Piece(NamedTuple):
    pos: int  # position in the buffer
    length: int
    status: str  # "ok", "corrupt" (framed, bad checksum), "garbage" (no record) or "truncated"
    problem: str


def _valid_at(buf: bytes, pos: int) -> bool:
    try:
        check_record(buf, pos, pos)
    except (TornRecord, CorruptData):
        return False
    return True


def _resync(buf: bytes, pos: int) -> int:
    """The position of the next checksum-valid record after `pos` (len(buf) when none)."""
    start = buf.find(_NEEDLE, pos + 1)
    while start != -1:
        if _valid_at(buf, start):
            return start
        start = buf.find(_NEEDLE, start + 1)
    return len(buf)


def walk(buf: bytes, base: int) -> Iterator[Piece]:
    size = len(buf)
    view = memoryview(buf)
    pos = 0
    while pos < size:
        if pos + PREFIX_BYTES <= size:  # fast path: a well-formed header, checksum valid
            magic, version, total, stored = _HEADER.unpack_from(buf, pos)
            end = pos + total
            if (magic == RECORD_MAGIC and version == RECORD_VERSION
                    and RECORD_BYTES_MIN <= total <= RECORD_BYTES_MAX
                    and end <= size and zlib.crc32(view[pos + PREFIX_BYTES:end]) == stored):
                yield Piece(pos, total, "ok", "")
                pos = end
                continue
        try:
            total = peek_length(buf, pos, base + pos)
        except TornRecord as exc:
            yield Piece(pos, size - pos, "truncated", str(exc))
            return
        except CorruptData as exc:
            end = _resync(buf, pos)
            yield Piece(pos, end - pos, "garbage", str(exc))
            pos = end
            continue
        # A sound header (peek_length) that the fast path refused: a bad checksum or a
        # record past the end of the buffer. Keep the announced length only when a valid
        # record (or the end of the buffer) follows it; else find the next valid record.
        end = pos + total
        if end == size or (end < size and _valid_at(buf, end)):
            yield Piece(pos, total, "corrupt", f"record at commit offset {base + pos}: checksum mismatch")
            pos = end
            continue
        resumed = _resync(buf, pos)
        if resumed == size and end > size:
            yield Piece(
                pos,
                size - pos,
                "truncated",
                f"record at commit offset {base + pos}: {size - pos} of {total} bytes present",
            )
            return
        yield Piece(
            pos,
            resumed - pos,
            "garbage",
            f"record at commit offset {base + pos}: checksum mismatch or bad length",
        )
        pos = resumed


def record_digest(view: memoryview) -> int:
    """A signed 64-bit digest of a record's bytes (BLAKE2b), for comparing replicas."""
    return int.from_bytes(hashlib.blake2b(view, digest_size=8).digest(), "little", signed=True)


class Fields(NamedTuple):
    epoch: int
    store_ms: int
    queue_id: int
    queue_offset: int
    topic: str
    msg_id: str
    body_digest: str


def parse_fields(buf: bytes, pos: int, with_body: bool) -> Fields:
    """The fields the audit reports of a checksum-valid record at `pos` (no full decode)."""
    epoch, store_ms, queue_id, queue_offset, _ = _FIXED.unpack_from(buf, pos + PREFIX_BYTES)
    at = pos + PREFIX_BYTES + _FIXED.size
    texts = []
    for _ in range(2):  # topic, msg_id
        length = _U16.unpack_from(buf, at)[0]
        texts.append(buf[at + 2 : at + 2 + length].decode("utf-8", "replace"))
        at += 2 + length
    body_digest = ""
    if with_body:
        for _ in range(4):  # producer id, tags, keys, properties
            at += 2 + _U16.unpack_from(buf, at)[0]
        body_length = _U32.unpack_from(buf, at)[0]
        body_digest = hashlib.sha256(memoryview(buf)[at + 4 : at + 4 + body_length]).hexdigest()
    return Fields(epoch, store_ms, queue_id, queue_offset, texts[0], texts[1], body_digest)
