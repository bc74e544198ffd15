"""The audit's segment walk and its two forms, without Spark.

Properties checked:
- on real records with random damage (flipped bytes, cut-out bytes, zero-filled and
  torn tails) the pieces tile the buffer with no gap or overlap (as a replica's last
  segment: up to zeros that run to its end from a piece's start, a broker's zeros written
  ahead, which are no piece), every piece
  called valid passes the broker's own `records.check_record` with that length, and
  every other piece fails it;
- records followed by a broker's zeros written ahead are those records and nothing else;
- one flipped byte spoils exactly the record it is in: every other record is still
  found valid at its own position (the walk resynchronises);
- the reader's vectorized digest of each valid record is `piece_digest`'s, and any
  single flipped byte of a record (its stored CRC included) changes its digest;
- an Arrow batch from the reader has the declared schema and one row per piece.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqmeta.spark.sources import FileRange, _RecordReader
from mqmeta.spark.walk import piece_digest, scan, walk

from mqmeta.errors import CorruptData
from mqmeta.formats.records import Message, TornRecord, check_record, encode_record

BASE = 1 << 20


def _segment(count: int) -> bytes:
    return b"".join(
        encode_record(
            Message("Orders", i % 4, b"body-%06d" % i * (1 + i % 3)),
            1 + i // 7,
            1_800_000_000_000 + i,
            i // 4,
            "%032x" % (BASE + i),
        )
        for i in range(count)
    )


SEGMENT = _segment(60)


def _damage(data: bytes, flips: list[tuple[int, int]], cut: tuple[int, int] | None, tail: int) -> bytes:
    buf = bytearray(data)
    for at, mask in flips:
        buf[at % len(buf)] ^= mask
    if cut is not None:
        lo = cut[0] % len(buf)
        del buf[lo : lo + cut[1]]
    if tail:
        buf += bytes(tail) if tail % 2 else SEGMENT[:tail]  # zero-filled or a torn record
    return bytes(buf)


def _record_positions(data: bytes) -> list[int]:
    """Where each record of an undamaged buffer starts (from the lengths it announces)."""
    positions, pos = [], 0
    while pos < len(data):
        positions.append(pos)
        pos += int.from_bytes(data[pos + 3 : pos + 7], "little")
    return positions


@settings(max_examples=150, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
    cut=st.none() | st.tuples(st.integers(0, 10**6), st.integers(1, 300)),
    tail=st.integers(0, 200),
)
def test_pieces_tile_the_buffer_and_agree_with_the_broker(flips, cut, tail):
    buf = _damage(SEGMENT, flips, cut, tail)
    pieces = list(walk(buf, BASE))
    found, others = scan(buf, BASE)
    assert [p.pos for p in pieces if p.status == "ok"] == found
    assert [p for p in pieces if p.status != "ok"] == others
    position = 0
    for piece in pieces:
        assert piece.pos == position and piece.length > 0
        position += piece.length
        if piece.status == "ok":
            assert check_record(buf, piece.pos, BASE + piece.pos) == piece.length
        else:
            with pytest.raises((TornRecord, CorruptData)):
                check_record(buf, piece.pos, BASE + piece.pos)
    assert position == len(buf)
    # as a replica's last segment: the same pieces up to zeros that run to the end
    last = list(walk(buf, BASE, last=True))
    assert last == pieces[: len(last)]
    end = sum(p.length for p in last)
    assert end == len(buf) or buf.count(0, end) == len(buf) - end


def test_the_inventory_sizes_a_last_segment_without_the_zeros_written_ahead(tmp_path):
    from mqmeta.spark.layout import ZERO_TAIL_READ_BYTES, _size_before_zeros

    path = tmp_path / "00000000000001048576.log"
    for zeros in (0, 10, 3 * ZERO_TAIL_READ_BYTES + 5):
        path.write_bytes(SEGMENT + bytes(zeros))
        assert _size_before_zeros(path) == len(SEGMENT), zeros
    path.write_bytes(bytes(ZERO_TAIL_READ_BYTES + 1))
    assert _size_before_zeros(path) == 0


def test_records_then_the_zeros_a_broker_writes_ahead_are_those_records_alone():
    found, others = scan(SEGMENT + bytes(4096), BASE, last=True)
    assert len(found) == 60 and others == []
    found, others = scan(SEGMENT + bytes(4096), BASE)  # not a last segment: zeros are a piece
    assert len(found) == 60 and [p.status for p in others] == ["garbage"]
    torn = SEGMENT[:-5] + bytes(4096)  # the last record's end never reached the disk
    found, others = scan(torn, BASE, last=True)
    assert len(found) == 59 and [p.status for p in others] == ["garbage"]
    assert others[0].pos + others[0].length == len(torn)


@pytest.mark.parametrize("record", [0, 17, 59])
def test_one_flipped_byte_spoils_only_its_record(record):
    starts = _record_positions(SEGMENT)
    damaged = bytearray(SEGMENT)
    damaged[starts[record] + 40] ^= 0x08  # inside the record, past its header
    found, others = scan(bytes(damaged), BASE)
    assert found == [p for i, p in enumerate(starts) if i != record]
    assert [(p.pos, p.status) for p in others] == [(starts[record], "corrupt")]


def test_an_undamaged_segment_is_all_valid_records():
    found, others = scan(SEGMENT, BASE)
    assert len(found) == 60 and others == []


def _reader_rows(buf: bytes, tmp_path, detail: bool) -> list[dict]:
    path = tmp_path / "00000000000001048576.log"
    path.write_bytes(buf)
    spec = {
        "path": str(path),
        "base_offset": BASE,
        "broker_set": "b",
        "replica": "b-1",
        "file": "b-1/x.log",
        "size": len(buf),
        "last": True,
    }
    reader = _RecordReader({"files": "[]"}, detail)
    batches = list(reader.read(FileRange(spec, 0, len(buf))))
    from mqmeta.spark.sources import _arrow_schema

    assert all(batch.schema == _arrow_schema(detail) for batch in batches)
    return sorted((row for batch in batches for row in batch.to_pylist()), key=lambda r: r["offset"])


@pytest.mark.parametrize("detail", [False, True])
def test_reader_rows_are_the_pieces_with_their_digests(tmp_path, detail):
    buf = _damage(SEGMENT, [(len(SEGMENT) // 3, 0x10)], None, 6)  # a flipped byte, a torn tail
    rows = _reader_rows(buf, tmp_path, detail)
    pieces = list(walk(buf, BASE))
    assert [(r["offset"] - BASE, r["length"], r["crc_valid"]) for r in rows] == [
        (p.pos, p.length, p.status == "ok") for p in pieces
    ]
    assert [r["record_digest"] for r in rows] == [piece_digest(buf, p) for p in pieces]
    assert [r["truncated"] for r in rows][-1] is True and sum(not r["crc_valid"] for r in rows) == 2
    if detail:
        first = rows[0]
        assert first["topic"] == "Orders" and first["queue_offset"] == 0 and len(first["body_digest"]) == 64


def test_any_flipped_byte_changes_what_b1_compares():
    """B1 compares (length, digest) at each offset: one flipped byte anywhere in a record
    (header included) changes one of them there."""
    for piece in list(walk(SEGMENT, BASE))[:3]:
        original = (piece.length, piece_digest(SEGMENT, piece))
        for at in range(piece.pos, piece.pos + piece.length):
            damaged = bytearray(SEGMENT)
            damaged[at] ^= 0x01
            there = next(p for p in walk(bytes(damaged), BASE) if p.pos == piece.pos)
            assert (there.length, piece_digest(bytes(damaged), there)) != original, f"byte {at - piece.pos}"
