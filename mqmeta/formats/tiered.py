"""The object layout of one broker set in tiered storage, and its checks.

Keys (offsets zero-padded to 20 digits so that a key listing sorts by offset):

    {cluster}/{broker_name}/commitlog/{base_offset}-{end_offset}.seg
        the commit log's records in [base_offset, end_offset): the raw record bytes,
        byte-identical to every replica's commit log for those offsets (T2), so the
        tiered copy can be served, verified and compared without re-encoding;
    {cluster}/{broker_name}/index/{topic}/{queue_id}/{first_queue_offset}.idx
        the queue's entries for the records of one uploaded range: a header, then
        fixed-size (commit offset u64, size u32) entries for consecutive queue offsets
        from first_queue_offset, and a CRC-32 of the entries;
    {cluster}/{broker_name}/epochs/{end_offset}.json
        the (epoch, start_offset) lineage valid for the uploaded log up to end_offset,
        as checksummed JSON (mqmeta.formats.checksummed), so that a new master or an empty
        slave can rebuild its epoch file from the tiered store alone;
    {cluster}/{broker_name}/uploads/{upload_id}.json
        upload markers (their content is the uploader's business).

Every object is immutable (see tiered_backend): a re-upload of the same range writes
the same bytes, a different range gets a different key.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from mqmeta.errors import CorruptData, InvalidArgument
from mqmeta.formats import OFFSET_MAX
from mqmeta.formats.checksum import CHECKSUM_PATTERN, object_checksum
from mqmeta.formats.checksummed import dump_checksummed, loads_checksummed
from mqmeta.formats.epochs import EPOCH_ENTRIES_MAX, EpochEntry
from mqmeta.formats.records import (
    QUEUE_ID_MAX,
    StoredRecord,
    is_msg_id_of,
    split_records,
    validate_topic,
)
from mqmeta.validate import NAME_PATTERN  # cluster and broker names are safe key segments

OBJECT_BYTES_MAX = 1 << 30  # one object; a segment is one commit-log read (64 MiB) in practice
_UPLOAD_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SEGMENT_NAME = re.compile(r"(\d{20})-(\d{20})\.seg")

INDEX_MAGIC = b"MQTI"
INDEX_VERSION = 1
_INDEX_HEADER = struct.Struct("<4sIIQI")  # magic, version, queue id, first queue offset, count
_INDEX_ENTRY = struct.Struct("<QI")  # commit offset, size
INDEX_ENTRY_BYTES = _INDEX_ENTRY.size
_INDEX_TRAILER = struct.Struct("<I")  # crc32 of header + entries


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidArgument(f"{kind} {value!r} is malformed: use 1-127 characters from A-Z a-z 0-9 _ - % |")
    return value


def check_offset(kind: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= OFFSET_MAX:
        raise InvalidArgument(f"{kind} {value!r} is not an integer in [0, {OFFSET_MAX}]")
    return value


# Keys ------------------------------------------------------------------------------------------
def broker_prefix(cluster: str, broker_name: str) -> str:
    return f"{_check_name('cluster', cluster)}/{_check_name('broker_name', broker_name)}/"


def segments_prefix(cluster: str, broker_name: str) -> str:
    return broker_prefix(cluster, broker_name) + "commitlog/"


def segment_key(cluster: str, broker_name: str, base_offset: int, end_offset: int) -> str:
    check_offset("base_offset", base_offset)
    check_offset("end_offset", end_offset)
    if base_offset >= end_offset:
        raise InvalidArgument(f"segment range [{base_offset}, {end_offset}) is empty")
    return f"{segments_prefix(cluster, broker_name)}{base_offset:020d}-{end_offset:020d}.seg"


def parse_segment_key(key: str) -> tuple[int, int]:
    """(base_offset, end_offset) of a key made by segment_key; InvalidArgument otherwise."""
    parts = key.split("/") if isinstance(key, str) else []
    match = _SEGMENT_NAME.fullmatch(parts[-1]) if len(parts) == 4 and parts[2] == "commitlog" else None
    if match is None or int(match[1]) >= int(match[2]):
        raise InvalidArgument(f"{key!r} is not a commit-log segment key")
    return int(match[1]), int(match[2])


def index_key(cluster: str, broker_name: str, topic: str, queue_id: int, first_queue_offset: int) -> str:
    validate_topic(topic)
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id <= QUEUE_ID_MAX:
        raise InvalidArgument(f"queue_id {queue_id!r} is not an integer in [0, {QUEUE_ID_MAX}]")
    check_offset("first_queue_offset", first_queue_offset)
    return f"{broker_prefix(cluster, broker_name)}index/{topic}/{queue_id}/{first_queue_offset:020d}.idx"


def epochs_key(cluster: str, broker_name: str, end_offset: int) -> str:
    check_offset("end_offset", end_offset)
    return f"{broker_prefix(cluster, broker_name)}epochs/{end_offset:020d}.json"


def upload_marker_key(cluster: str, broker_name: str, upload_id: str) -> str:
    if not isinstance(upload_id, str) or not _UPLOAD_ID_PATTERN.fullmatch(upload_id):
        raise InvalidArgument(
            f"upload_id {upload_id!r} is malformed: use 1-64 characters from A-Z a-z 0-9 _ -"
        )
    return f"{broker_prefix(cluster, broker_name)}uploads/{upload_id}.json"


# Segments --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SegmentMeta:
    """What the uploader knows of one commit-log segment object; checked at construction.

    `sha256` is the object's checksum in either format of mqmeta.formats.checksum
    (`crc32c:` + 8 hex digits since P11, a SHA-256 before); the name stays because it is
    the field's name in the controller's checkpoint, the proto and the audit."""

    key: str
    base_offset: int
    end_offset: int
    size: int
    sha256: str
    record_count: int
    first_epoch: int
    last_epoch: int

    def __post_init__(self) -> None:
        if parse_segment_key(self.key) != (self.base_offset, self.end_offset):
            raise InvalidArgument(
                f"segment key {self.key!r} does not name [{self.base_offset}, {self.end_offset})"
            )
        if self.size != self.end_offset - self.base_offset:
            raise InvalidArgument(f"segment {self.key!r}: size {self.size} is not end - base")
        if not isinstance(self.sha256, str) or not CHECKSUM_PATTERN.fullmatch(self.sha256):
            raise InvalidArgument(
                f"segment {self.key!r}: checksum {self.sha256!r} is neither crc32c:<8 hex digits> "
                "nor a SHA-256 (64 hex digits)"
            )
        for kind in ("record_count", "first_epoch", "last_epoch"):
            value = getattr(self, kind)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"segment {self.key!r}: {kind} {value!r} is not positive")
        if self.first_epoch > self.last_epoch or self.record_count > self.size:
            raise InvalidArgument(
                f"segment {self.key!r}: epochs {self.first_epoch}..{self.last_epoch}"
                f" or record count {self.record_count} impossible"
            )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: object) -> SegmentMeta:
        """The meta `to_dict` wrote; CorruptData when it is malformed (it came from storage)."""
        try:
            if not isinstance(body, dict) or set(body) != set(cls.__dataclass_fields__):
                raise InvalidArgument(f"fields {sorted(body) if isinstance(body, dict) else body!r}")
            return cls(**body)
        except (InvalidArgument, TypeError) as exc:
            raise CorruptData(f"malformed segment metadata: {exc}") from None


def build_segment(
    data: bytes, base_offset: int, *, cluster: str, broker_name: str
) -> tuple[bytes, SegmentMeta]:
    """The object for commit-log bytes `data` read from `base_offset`, and its meta.

    `data` must be whole, checksum-valid records of `broker_name`'s log at those
    offsets, whose epochs never decrease (CorruptData otherwise); the object is `data`
    itself.
    """
    check_offset("base_offset", base_offset)
    if not isinstance(data, bytes | bytearray | memoryview) or not 0 < len(data) <= OBJECT_BYTES_MAX:
        raise InvalidArgument(f"a segment holds 1 to {OBJECT_BYTES_MAX} bytes of records")
    data = bytes(data)
    key = segment_key(cluster, broker_name, base_offset, base_offset + len(data))
    records = split_records(data, base_offset)
    check_records(records, broker_name)
    end_offset = base_offset + len(data)
    meta = SegmentMeta(
        key=key,
        base_offset=base_offset,
        end_offset=end_offset,
        size=len(data),
        sha256=object_checksum(data),
        record_count=len(records),
        first_epoch=records[0].epoch,
        last_epoch=records[-1].epoch,
    )
    return data, meta


def check_records(records: Sequence[StoredRecord], broker_name: str) -> None:
    """Epochs never decrease, and each record sits at the offset its message id names.

    A record does not store its commit offset, but its message id is
    make_msg_id(broker_name, commit_offset, epoch) (or, written before P11,
    legacy_msg_id): checking it catches bytes labelled with the wrong base offset or
    taken from another broker set's log.
    """
    for before, after in zip(records, records[1:], strict=False):
        if after.epoch < before.epoch:
            raise CorruptData(
                f"the record at {after.commit_offset} has epoch {after.epoch}, older "
                f"than epoch {before.epoch} before it: not one master's log"
            )
    for record in records:
        if record.epoch == 0:
            raise CorruptData(f"the record at {record.commit_offset} has epoch 0")
        if not is_msg_id_of(record.msg_id, broker_name, record.commit_offset, record.epoch):
            raise CorruptData(
                f"the record at {record.commit_offset} has message id "
                f"{record.msg_id}, which {broker_name} did not give that offset in "
                f"epoch {record.epoch}: wrong base offset or another broker's log"
            )


# Reading ---------------------------------------------------------------------------------------
def find_gaps_and_overlaps(segments: Iterable[SegmentMeta]) -> list[str]:
    """Each gap between and overlap of the segments (sorted by base), as a sentence;
    [] when they tile one contiguous range."""
    ordered = sorted(segments, key=lambda s: (s.base_offset, s.end_offset, s.key))
    problems: list[str] = []
    reach: SegmentMeta | None = None  # the segment reaching furthest so far
    for segment in ordered:
        if reach is not None:
            if segment.base_offset > reach.end_offset:
                problems.append(
                    f"gap: [{reach.end_offset}, {segment.base_offset}) is in no segment "
                    f"(between {reach.key} and {segment.key})"
                )
            elif segment.base_offset < reach.end_offset:
                problems.append(
                    f"overlap: {segment.key} starts at {segment.base_offset}, inside "
                    f"{reach.key} (ends at {reach.end_offset})"
                )
        if reach is None or segment.end_offset > reach.end_offset:
            reach = segment
    return problems


# Per-queue index -------------------------------------------------------------------------------
def build_index_segments(
    records: Iterable[StoredRecord], *, cluster: str, broker_name: str
) -> dict[str, bytes]:
    """One index object per queue present in `records` (one uploaded range, in log order).

    A queue's records must have consecutive queue offsets (CorruptData otherwise).
    """
    queues: dict[tuple[str, int], tuple[int, bytearray]] = {}
    for record in records:
        first, entries = queues.setdefault(
            (record.topic, record.queue_id), (record.queue_offset, bytearray())
        )
        expected = first + len(entries) // _INDEX_ENTRY.size
        if record.queue_offset != expected:
            raise CorruptData(
                f"the record at {record.commit_offset} has queue offset "
                f"{record.queue_offset} in {record.topic}/{record.queue_id}; "
                f"{expected} expected"
            )
        entries += _INDEX_ENTRY.pack(record.commit_offset, record.size)
    objects: dict[str, bytes] = {}
    for (topic, queue_id), (first, entries) in sorted(queues.items()):
        body = _INDEX_HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, queue_id, first, len(entries) // _INDEX_ENTRY.size
        ) + bytes(entries)
        objects[index_key(cluster, broker_name, topic, queue_id, first)] = body + _INDEX_TRAILER.pack(
            zlib.crc32(body)
        )
    return objects


def build_index_objects(
    runs: dict[tuple[str, int], tuple[int, bytes]], *, cluster: str, broker_name: str
) -> dict[str, bytes]:
    """Index objects from a store's own index (MessageStore.index_runs_between): {(topic,
    queue): (first queue offset, packed (commit offset u64, size u32) entries)} - the same
    objects build_index_segments makes by decoding records, without touching each entry."""
    objects: dict[str, bytes] = {}
    for (topic, queue_id), (first, packed) in sorted(runs.items()):
        count, rest = divmod(len(packed), _INDEX_ENTRY.size)
        if rest or not count:
            raise CorruptData(f"index entries of {topic}/{queue_id} are {len(packed)} bytes")
        body = _INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, queue_id, first, count) + packed
        objects[index_key(cluster, broker_name, topic, queue_id, first)] = body + _INDEX_TRAILER.pack(
            zlib.crc32(body)
        )
    return objects


def parse_index_segment(data: bytes, queue_id: int, first_queue_offset: int) -> list[tuple[int, int, int]]:
    """(queue offset, commit offset, size) of each entry of an index object made by
    build_index_segments for that queue; CorruptData when it does not check out."""
    fixed = _INDEX_HEADER.size + _INDEX_TRAILER.size
    if len(data) < fixed:
        raise CorruptData(f"index object of {len(data)} bytes is shorter than its header")
    magic, version, stored_queue_id, first, count = _INDEX_HEADER.unpack_from(data)
    if (magic, version, stored_queue_id, first) != (
        INDEX_MAGIC,
        INDEX_VERSION,
        queue_id,
        first_queue_offset,
    ) or len(data) != fixed + count * _INDEX_ENTRY.size:
        raise CorruptData(
            f"index object header {(magic, version, stored_queue_id, first, count)} "
            f"does not match queue {queue_id} from {first_queue_offset} and "
            f"{len(data)} bytes"
        )
    if zlib.crc32(data[: -_INDEX_TRAILER.size]) != _INDEX_TRAILER.unpack_from(data, len(data) - 4)[0]:
        raise CorruptData("index object checksum mismatch")
    return [
        (first + i, *_INDEX_ENTRY.unpack_from(data, _INDEX_HEADER.size + i * _INDEX_ENTRY.size))
        for i in range(count)
    ]


# Epoch lineage ---------------------------------------------------------------------------------
def build_epoch_lineage(
    entries: Sequence[EpochEntry], end_offset: int, *, cluster: str, broker_name: str
) -> tuple[str, bytes]:
    """The key and checksummed JSON of the lineage valid for the log up to `end_offset`:
    the entries starting before it (an epoch starting at or after it has no record there)."""
    check_offset("end_offset", end_offset)
    kept = [(int(epoch), int(start)) for epoch, start in entries if start < end_offset]
    _check_lineage(kept, "epoch lineage")
    body: dict[str, object] = {"end_offset": end_offset, "entries": [list(e) for e in kept]}
    return epochs_key(cluster, broker_name, end_offset), dump_checksummed(body)


def parse_epoch_lineage(data: bytes) -> tuple[int, list[EpochEntry]]:
    """(end_offset, entries) written by build_epoch_lineage; CorruptData when malformed."""
    body = loads_checksummed(data, "epoch lineage")
    end_offset, raw = body.get("end_offset"), body.get("entries")
    if (
        type(end_offset) is not int
        or not isinstance(raw, list)
        or not all(
            isinstance(e, list) and len(e) == 2 and all(type(v) is int and v >= 0 for v in e) for e in raw
        )
    ):
        raise CorruptData("epoch lineage: end_offset or entries malformed")
    entries = [(e[0], e[1]) for e in raw]
    _check_lineage(entries, "epoch lineage")
    if any(start >= end_offset for _, start in entries):
        raise CorruptData(f"epoch lineage has an entry starting at or past its end {end_offset}")
    return end_offset, entries


def _check_lineage(entries: Sequence[EpochEntry], where: str) -> None:
    if len(entries) > EPOCH_ENTRIES_MAX:
        raise CorruptData(f"{where}: {len(entries)} entries; the limit is {EPOCH_ENTRIES_MAX}")
    for (epoch, start), (next_epoch, next_start) in zip(entries, entries[1:], strict=False):
        if next_epoch <= epoch or next_start < start:
            raise CorruptData(
                f"{where}: ({epoch}, {start}) then ({next_epoch}, {next_start}) break "
                "the order (epochs strictly increase, starts never decrease)"
            )
    if entries and entries[0][0] < 1:
        raise CorruptData(f"{where}: epoch {entries[0][0]} (epochs start at 1)")
