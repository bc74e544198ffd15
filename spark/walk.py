"""Walking a commit-log (or tiered) segment record by record, never crashing on bad bytes.

`walk(buf, base)` yields one `Piece` per record or bad region, covering the buffer
from start to end with no gap: a checksum-valid record, a corrupt region (bad magic,
impossible length or checksum mismatch, up to the next checksum-valid record), or a
truncated tail (the buffer ends inside a record and no valid record follows: an append
that a crash interrupted). In a replica's last segment (`last`), zeros from a record
boundary to the end are no piece: it ends in the zeros its broker writes ahead of its
records (a record starts with its magic, never a zero byte); anywhere else they are.
The walk is deterministic in the bytes, so the readers of two offset-range partitions of
one file (each walks the file from its start and keeps the pieces starting in its range)
agree on the boundaries.

Validity is `mqmeta.formats.records.check_record`'s; runs of valid records are found by
its tight loop `valid_run` (the one the commit log's bulk check uses too), and every
byte position comes from that module.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from mqmeta.errors import CorruptData
from mqmeta.formats.records import (
    CRC_AT,
    PREFIX_BYTES,
    RECORD_HEAD,
    TornRecord,
    is_valid_record,
    next_valid_record,
    peek_length,
    valid_run,
    zeros_to_end,
)

DIGEST_MIX = 0x9E3779B1  # odd: multiplying by it permutes the 32-bit values


class Piece(NamedTuple):
    pos: int  # position in the buffer
    length: int
    status: str  # "ok", "corrupt" (framed, bad checksum), "garbage" (no record) or "truncated"
    problem: str


def _resync(buf: bytes, pos: int) -> int:
    """The position of the next checksum-valid record after `pos` (len(buf) when none)."""
    found = next_valid_record(buf, pos)
    return len(buf) if found < 0 else found


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
    if end == size or (end < size and is_valid_record(buf, end)):
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


def scan(buf: bytes, base: int, last: bool = False) -> tuple[list[int], list[Piece]]:
    """The walk as columns: the positions of the checksum-valid records, and every other
    piece (corrupt, garbage, truncated). Together they are exactly `walk`'s pieces. `last`:
    the buffer is a replica's last segment, whose zeros to the end are no piece."""
    found: list[int] = []
    others: list[Piece] = []
    pos, size = 0, len(buf)
    while pos < size:
        pos = valid_run(buf, pos, found)
        if pos >= size:
            break
        if last and buf[pos] == 0 and zeros_to_end(buf, pos):
            break  # zeros to the end: what a broker writes ahead of its records, no piece
        piece = _slow_step(buf, pos, base)
        others.append(piece)
        pos = piece.pos + piece.length
    return found, others


def walk(buf: bytes, base: int, last: bool = False) -> Iterator[Piece]:
    """`scan`'s pieces one by one, in position order."""
    found, others = scan(buf, base, last)
    valid = (Piece(at, RECORD_HEAD.unpack_from(buf, at)[1], "ok", "") for at in found)
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
        stored = int.from_bytes(buf[piece.pos + CRC_AT : piece.pos + CRC_AT + 4], "little")
        computed = zlib.crc32(memoryview(buf)[piece.pos + PREFIX_BYTES : piece.pos + piece.length])
    else:  # no header to trust: the CRC of all its bytes, twice
        stored = computed = zlib.crc32(memoryview(buf)[piece.pos : piece.pos + piece.length])
    return _signed((stored << 32) | (computed * DIGEST_MIX & 0xFFFFFFFF))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
