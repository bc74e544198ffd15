"""Reading and verifying the objects of a broker set in the tiered store.

The object layout itself (keys, segment metas, index objects, epoch lineages) is the
format in mqmeta.formats.tiered; these functions read a backend through it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from mqmeta.broker_agent.commitlog import READ_BYTES_MAX
from mqmeta.broker_agent.tiered_backend import TieredBackend

from mqmeta.errors import CorruptData, InvalidArgument
from mqmeta.formats.checksum import checksum_matches
from mqmeta.formats.epochs import EpochEntry, epoch_covering
from mqmeta.formats.records import PREFIX_BYTES, TornRecord, check_record, peek_length, split_records
from mqmeta.formats.tiered import SegmentMeta, check_offset, check_records, find_gaps_and_overlaps


def verify_segment(
    backend: TieredBackend, meta: SegmentMeta, epochs: Sequence[EpochEntry] | None = None
) -> None:
    """Re-reads the object: its length, checksum (CRC32C, or SHA-256 for objects uploaded
    before P11), and that it is whole valid records from
    base_offset matching the meta (CorruptData otherwise; NotFound when missing).
    With `epochs`, each record's epoch must be the one the lineage gives its offset."""
    size = backend.size(meta.key)
    if size != meta.size:
        raise CorruptData(f"{meta.key}: {size} bytes stored, {meta.size} expected")
    data = backend.get(meta.key)
    if len(data) != meta.size or not checksum_matches(data, meta.sha256):
        raise CorruptData(f"{meta.key}: checksum mismatch (the stored object is not what was uploaded)")
    try:
        records = split_records(data, meta.base_offset)
        check_records(records, meta.key.split("/")[1])
    except CorruptData as exc:
        raise CorruptData(f"{meta.key}: {exc}") from None
    found = (len(records), records[0].epoch, records[-1].epoch) if records else (0, 0, 0)
    if found != (meta.record_count, meta.first_epoch, meta.last_epoch):
        raise CorruptData(
            f"{meta.key}: holds (records, first epoch, last epoch) {found}, meta says "
            f"{(meta.record_count, meta.first_epoch, meta.last_epoch)}"
        )
    if epochs is not None:
        for record in records:
            covering = epoch_covering(epochs, record.commit_offset)
            if covering != record.epoch:
                raise CorruptData(
                    f"{meta.key}: the record at {record.commit_offset} has epoch "
                    f"{record.epoch} but the lineage says {covering}"
                )


def read_range(backend: TieredBackend, segments: Sequence[SegmentMeta], offset: int, max_bytes: int) -> bytes:
    """Whole records of the tiered copy from `offset` (a record start), as CommitLog.read
    serves them: at most `max_bytes` unless the first record alone is larger, continuing
    into the next segment while the segments are contiguous. b"" at the end of the
    last segment. Each record's checksum is checked (CorruptData otherwise)."""
    check_offset("offset", offset)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= READ_BYTES_MAX:
        raise InvalidArgument(f"max_bytes {max_bytes!r} is outside [1, {READ_BYTES_MAX}]")
    ordered = sorted(segments, key=lambda s: s.base_offset)
    problems = find_gaps_and_overlaps(ordered)
    if any(p.startswith("overlap") for p in problems):
        raise InvalidArgument(f"segments overlap, so offsets are ambiguous: {problems[0]}")
    i = bisect.bisect_right(ordered, offset, key=lambda s: s.base_offset) - 1
    if ordered and i == len(ordered) - 1 and offset == ordered[-1].end_offset:
        return b""
    if i < 0 or offset >= ordered[i].end_offset:
        raise InvalidArgument(f"offset {offset} is in no tiered segment", code="OFFSET_NOT_TIERED")
    parts: list[bytes] = []
    total = 0
    while i < len(ordered) and total < max_bytes:
        segment = ordered[i]
        data = _read_records(backend, segment, offset + total, max_bytes - total, first=not parts)
        parts.append(data)
        total += len(data)
        if (
            offset + total < segment.end_offset
            or i + 1 == len(ordered)
            or ordered[i + 1].base_offset != segment.end_offset
        ):
            break
        i += 1
    return b"".join(parts)


def _read_records(
    backend: TieredBackend, segment: SegmentMeta, offset: int, budget: int, first: bool
) -> bytes:
    """The whole records of `segment` from `offset` within `budget` bytes; when `first`,
    at least one record (even past the budget)."""
    remaining = segment.end_offset - offset
    length = min(max(budget, PREFIX_BYTES if first else 0), remaining)
    buf = backend.get_range(segment.key, offset - segment.base_offset, length)
    if len(buf) != length:
        raise CorruptData(f"{segment.key}: shorter than its meta says ({segment.size} bytes)")
    pos = 0
    try:
        while pos < len(buf):
            try:
                pos += check_record(buf, pos, offset + pos)
            except TornRecord:
                break
        if pos == 0 and first:  # the first record alone is larger than the budget
            total = peek_length(buf, 0, offset)
            if total > remaining:
                raise CorruptData(f"the record at {offset} runs past the segment's end")
            buf = backend.get_range(segment.key, offset - segment.base_offset, total)
            pos = check_record(buf, 0, offset)
    except (CorruptData, TornRecord) as exc:
        if pos == 0 and first and offset != segment.base_offset:
            raise InvalidArgument(
                f"no valid record starts at {offset} in {segment.key}: not a "
                "record start (or the object is corrupt: verify_segment "
                "tells)"
            ) from None
        raise CorruptData(f"{segment.key}: {exc}; never served") from None
    return buf[:pos]


def verify_stored(backend: TieredBackend, meta: SegmentMeta) -> None:
    """After a put: the object is exactly the bytes checked (size and checksum). A backend
    whose puts are verified (LocalBackend with fsync: the checksum was taken over the
    fsynced file it publishes, or an existing object compared byte for byte) is checked
    by size alone: re-reading a file just written would read the page cache, not the disk."""
    if backend.puts_are_verified:
        size = backend.size(meta.key)
        if size != meta.size:
            raise CorruptData(f"{meta.key}: {size} bytes stored, {meta.size} uploaded")
        return
    data = backend.get(meta.key)
    if len(data) != meta.size or not checksum_matches(data, meta.sha256):
        raise CorruptData(f"{meta.key}: the stored object is not what was uploaded")
