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
import heapq
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

_FIXED = struct.Struct("<QQIQQ")  # epoch, store ms, queue id, queue offset, producer seq
_HEAD = struct.Struct("<3sII")  # records.py's prefix: magic and version as one, total length, crc32
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
DIGEST_MIX = 0x9E3779B1  # odd: multiplying by it permutes the 32-bit values
_NEEDLE = RECORD_MAGIC + bytes([RECORD_VERSION])
assert _HEAD.size == PREFIX_BYTES


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


def _fast_run(buf: bytes, view: memoryview, pos: int, found: list[int]) -> int:
    """Appends to `found` the positions of consecutive checksum-valid records from `pos`;
    returns where the run stops (the end of the buffer, or a piece the slow path decides)."""
    size = len(buf)
    unpack, crc, append = _HEAD.unpack_from, zlib.crc32, found.append
    lo, hi = RECORD_BYTES_MIN, RECORD_BYTES_MAX
    while pos + PREFIX_BYTES <= size:
        head, total, stored = unpack(buf, pos)
        end = pos + total
        if (
            head != _NEEDLE
            or end > size
            or not lo <= total <= hi
            or crc(view[pos + PREFIX_BYTES : end]) != stored
        ):
            break
        append(pos)
        pos = end
    return pos


def _slow_step(buf: bytes, pos: int, base: int) -> Piece:
    """The piece at `pos`, which the fast path refused."""
    size = len(buf)
    try:
        total = peek_length(buf, pos, base + pos)
    except TornRecord as exc:
        return Piece(pos, size - pos, "truncated", str(exc))
    except CorruptData as exc:
        return Piece(pos, _resync(buf, pos) - pos, "garbage", str(exc))
    # A sound header (peek_length) that the fast path refused: a bad checksum or a
    # record past the end of the buffer. Keep the announced length only when a valid
    # record (or the end of the buffer) follows it; else find the next valid record.
    end = pos + total
    if end == size or (end < size and _valid_at(buf, end)):
        return Piece(pos, total, "corrupt", f"record at commit offset {base + pos}: checksum mismatch")
    resumed = _resync(buf, pos)
    if resumed == size and end > size:
        return Piece(
            pos,
            size - pos,
            "truncated",
            f"record at commit offset {base + pos}: {size - pos} of {total} bytes present",
        )
    return Piece(
        pos,
        resumed - pos,
        "garbage",
        f"record at commit offset {base + pos}: checksum mismatch or bad length",
    )


def scan(buf: bytes, base: int) -> tuple[list[int], list[Piece]]:
    """The walk as columns: the positions of the checksum-valid records, and every other
    piece (corrupt, garbage, truncated). Together they are exactly `walk`'s pieces."""
    view = memoryview(buf)
    found: list[int] = []
    others: list[Piece] = []
    pos, size = 0, len(buf)
    while pos < size:
        pos = _fast_run(buf, view, pos, found)
        if pos >= size:
            break
        piece = _slow_step(buf, pos, base)
        others.append(piece)
        pos = piece.pos + piece.length
    return found, others


def walk(buf: bytes, base: int) -> Iterator[Piece]:
    """`scan`'s pieces one by one, in position order."""
    found, others = scan(buf, base)
    valid = (Piece(at, _HEAD.unpack_from(buf, at)[1], "ok", "") for at in found)
    return heapq.merge(valid, others)  # both lists are in position order


def piece_digest(buf: bytes, piece: Piece) -> int:
    """A signed 64-bit digest of a piece's bytes, for comparing replicas: the stored
    CRC-32 (high half) and the CRC-32 of the bytes it covers (low half, times the odd
    DIGEST_MIX mod 2**32: a bijection, so that the halves of a valid record, equal CRCs,
    do not cancel in Java's Long.hashCode, which Spark's cache encoder hashes with).
    For a valid record both CRCs are its header's, so the reader takes them from there
    without another pass over the bytes; a replica whose copy differs anywhere in the
    record, the stored CRC included, gets another digest (its length is compared beside
    it). CRC-32 finds every burst of up to 32 flipped bits."""
    if piece.status in ("ok", "corrupt"):
        stored = _U32.unpack_from(buf, piece.pos + PREFIX_BYTES - 4)[0]
        computed = zlib.crc32(memoryview(buf)[piece.pos + PREFIX_BYTES : piece.pos + piece.length])
    else:  # no header to trust: the CRC of all its bytes, twice
        stored = computed = zlib.crc32(memoryview(buf)[piece.pos : piece.pos + piece.length])
    return _signed((stored << 32) | (computed * DIGEST_MIX & 0xFFFFFFFF))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


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
