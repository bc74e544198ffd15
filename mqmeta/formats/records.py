"""Messages and their binary commit-log record format.

One record is laid out as (little-endian):

    magic b"MQ" | version u8 | total_length u32 | crc32 u32
    | epoch u64 | store_timestamp_ms u64 | queue_id u32 | queue_offset u64 | producer_seq u64
    | topic, msg_id, producer_id, tags, keys, properties: u16 length + bytes each
    | body: u32 length + bytes

`total_length` counts the whole record; the CRC-32 covers every byte after the CRC
field, and the field lengths must add up to exactly `total_length`, so a flipped
length byte shows up as a checksum or layout error. Properties are encoded as
u16 count, then (u16 length + UTF-8 key, u16 length + UTF-8 value) pairs sorted by key.

A record's commit offset is not stored in it: it is the record's byte position in the
commit log, so replicated bytes mean the same thing on every replica.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from mqmeta.errors import CorruptData, InvalidArgument
from mqmeta.validate import NAME_PATTERN

RECORD_MAGIC = b"MQ"
RECORD_VERSION = 1
_PREFIX = struct.Struct("<2sBII")  # magic, version, total length, crc32
_FIXED = struct.Struct("<QQIQQ")  # epoch, store ms, queue id, queue offset, producer seq
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
PREFIX_BYTES = _PREFIX.size
_CRC_START = PREFIX_BYTES  # the CRC covers everything after the CRC field

# The record's byte layout as positions from its first byte: the one place they are
# written. Readers that do not decode whole records (the commit log's bulk check, the
# audit's vectorized reader) take them from here.
RECORD_TAG = RECORD_MAGIC + bytes([RECORD_VERSION])  # magic and version as one field
RECORD_HEAD = struct.Struct("<3sII")  # the prefix read as (tag, total length, crc32)
LENGTH_AT = len(RECORD_TAG)
CRC_AT = LENGTH_AT + _U32.size
FIXED_FIELDS = ("epoch", "store_timestamp_ms", "queue_id", "queue_offset", "producer_seq")
FIELD_AT: dict[str, int] = {}  # fixed field -> byte position in the record
FIELD_BYTES: dict[str, int] = {}  # fixed field -> its width (all little-endian unsigned)
_position = PREFIX_BYTES
for _name, _code in zip(FIXED_FIELDS, _FIXED.format.lstrip("<"), strict=True):
    FIELD_AT[_name], FIELD_BYTES[_name] = _position, struct.calcsize("<" + _code)
    _position += FIELD_BYTES[_name]
VARIABLE_AT = _position  # where the u16-length-prefixed fields begin (topic first)
assert RECORD_HEAD.size == _PREFIX.size and CRC_AT + _U32.size == PREFIX_BYTES
assert VARIABLE_AT == PREFIX_BYTES + _FIXED.size

TOPIC_BYTES_MAX = 127
MSG_ID_CHARS = 32
PRODUCER_ID_BYTES_MAX = 255
TAGS_BYTES_MAX = 1024
KEYS_BYTES_MAX = 4096
PROPERTIES_BYTES_MAX = 32 << 10
RECORD_BODY_MAX = 4 << 20
QUEUE_ID_MAX = (1 << 16) - 1
U64_MAX = (1 << 64) - 1

RECORD_BYTES_MIN = PREFIX_BYTES + _FIXED.size + 6 * _U16.size + _U32.size + 1 + MSG_ID_CHARS
RECORD_BYTES_MAX = (
    PREFIX_BYTES
    + _FIXED.size
    + 6 * _U16.size
    + _U32.size
    + TOPIC_BYTES_MAX
    + MSG_ID_CHARS
    + PRODUCER_ID_BYTES_MAX
    + TAGS_BYTES_MAX
    + KEYS_BYTES_MAX
    + PROPERTIES_BYTES_MAX
    + RECORD_BODY_MAX
)

TOPIC_PATTERN = NAME_PATTERN  # also a safe file name (index files)
MSG_ID_PATTERN = re.compile(r"[0-9a-f]{32}")
TOPIC_FIELDS_CACHED_MAX = 4096  # topics whose encoded field encode_record remembers
_TOPIC_FIELDS: dict[str, bytes] = {}
_EMPTY_FIELD = _U16.pack(0)  # an empty text field, or no properties
_MSG_ID_LENGTH = _U16.pack(MSG_ID_CHARS)
_NO_PROPERTIES_FIELD = _U16.pack(_U16.size) + _EMPTY_FIELD  # u16 length 2, then a count of 0


_set_attribute = object.__setattr__


class TornRecord(Exception):
    """Fewer bytes are present than the record's header says: an interrupted append."""


class MessageFields(Protocol):
    """What the store reads of a message to write: a Message, or the broker protocol's
    Message itself (same field names; the broker's Send passes those straight through)."""

    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str: ...
    @property
    def keys(self) -> str: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def producer_id(self) -> str: ...
    @property
    def producer_seq(self) -> int: ...


@dataclass(frozen=True, init=False)
class Message:
    """What a producer sends. `properties` takes no part in hashing (a dict is mutable)."""

    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    producer_id: str = ""
    producer_seq: int = 0

    def __init__(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        tags: str = "",
        keys: str = "",
        properties: Mapping[str, str] | None = None,
        producer_id: str = "",
        producer_seq: int = 0,
    ) -> None:
        # The generated __init__ of a frozen dataclass sets each field with its own
        # object.__setattr__ call; one message is built per record sent, so this sets
        # them all at once (same fields, same defaults).
        _set_attribute(
            self,
            "__dict__",
            {
                "topic": topic,
                "queue_id": queue_id,
                "body": body,
                "tags": tags,
                "keys": keys,
                "properties": {} if properties is None else properties,
                "producer_id": producer_id,
                "producer_seq": producer_seq,
            },
        )


@dataclass(frozen=True)
class StoredRecord:
    """A record read back from the commit log; `size` includes the header."""

    commit_offset: int
    size: int
    epoch: int
    store_timestamp_ms: int
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    producer_id: str
    producer_seq: int
    tags: str
    keys: str
    properties: Mapping[str, str] = field(hash=False)
    body: bytes

    @property
    def end_offset(self) -> int:
        return self.commit_offset + self.size

    @property
    def body_digest(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


@functools.lru_cache(maxsize=1024)
def msg_id_prefix(broker_address_or_name: str, epoch: int) -> str:
    """The first 16 hex digits of every id `broker` gives in `epoch` (make_msg_id)."""
    return hashlib.sha256(f"{broker_address_or_name}\x00{epoch}".encode()).hexdigest()[:16]


def make_msg_id(broker_address_or_name: str, commit_offset: int, epoch: int = 0) -> str:
    """A 32-hex-char id, deterministic in (broker, commit offset, epoch): 16 hex digits of
    a SHA-256 of (broker, epoch), then the commit offset in 16 hex digits (RocketMQ's
    offset message id also ends with the commit offset). One hash per broker and epoch,
    not per message (P11: the hash was 10 % of the master's send path).

    The epoch is mixed in because after a slave truncates a divergent tail, the same
    commit offset is reused by a different message of a later epoch.
    """
    if not 0 <= commit_offset <= U64_MAX:
        raise InvalidArgument(f"commit offset {commit_offset!r} is not in [0, {U64_MAX}]")
    return msg_id_prefix(broker_address_or_name, epoch) + format(commit_offset, "016x")


def legacy_msg_id(broker_address_or_name: str, commit_offset: int, epoch: int = 0) -> str:
    """The id records written before P11 carry: a SHA-256 of (broker, offset, epoch)."""
    seed = f"{broker_address_or_name}\x00{commit_offset}\x00{epoch}".encode()
    return hashlib.sha256(seed).hexdigest()[:MSG_ID_CHARS]


def is_msg_id_of(msg_id: str, broker_address_or_name: str, commit_offset: int, epoch: int) -> bool:
    """Whether `msg_id` is the id `broker` gave `commit_offset` in `epoch` (either form)."""
    return msg_id in (
        make_msg_id(broker_address_or_name, commit_offset, epoch),
        legacy_msg_id(broker_address_or_name, commit_offset, epoch),
    )


def _text(kind: str, value: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"{kind} must be a string, not {type(value).__name__}")
    data = value.encode("utf-8")
    if len(data) > limit:
        raise InvalidArgument(f"{kind} is {len(data)} bytes; the limit is {limit}")
    return data


def _text_field(kind: str, value: str, limit: int) -> bytes:
    """`value` as a record field: u16 length + UTF-8 (InvalidArgument past `limit`)."""
    if value == "" and type(value) is str:
        return _EMPTY_FIELD
    data = _text(kind, value, limit)
    return _U16.pack(len(data)) + data


def _properties_field(properties: Mapping[str, str]) -> bytes:
    """The properties as a record field: u16 length + their encoding (_encode_properties)."""
    if not properties:
        return _NO_PROPERTIES_FIELD
    encoded = _encode_properties(properties)
    return _U16.pack(len(encoded)) + encoded


def _encode_properties(properties: Mapping[str, str]) -> bytes:
    parts = [_U16.pack(len(properties))]
    for key in sorted(properties):
        for text in (key, properties[key]):
            data = _text("a property key or value", text, PROPERTIES_BYTES_MAX)
            parts.append(_U16.pack(len(data)))
            parts.append(data)
    encoded = b"".join(parts)
    if len(encoded) > PROPERTIES_BYTES_MAX:
        raise InvalidArgument(
            f"properties encode to {len(encoded)} bytes; the limit is {PROPERTIES_BYTES_MAX}"
        )
    return encoded


def _check_uint(kind: str, value: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidArgument(f"{kind} {value!r} is not an integer in [0, {maximum}]")


def validate_topic(topic: str) -> None:
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidArgument(
            f"topic {topic!r} is malformed: use 1-{TOPIC_BYTES_MAX} characters from A-Z a-z 0-9 _ - % |"
        )


def _topic_field(topic: str) -> bytes:
    """The record field of a valid topic (InvalidArgument otherwise), remembered: a broker
    writes few topics, and the pattern check is a large part of encoding a small record."""
    field = _TOPIC_FIELDS.get(topic) if type(topic) is str else None
    if field is None:
        validate_topic(topic)
        data = topic.encode()
        field = _U16.pack(len(data)) + data
        if len(_TOPIC_FIELDS) >= TOPIC_FIELDS_CACHED_MAX:
            _TOPIC_FIELDS.clear()
        _TOPIC_FIELDS[topic] = field
    return field


def encode_record(
    message: MessageFields, epoch: int, store_timestamp_ms: int, queue_offset: int, msg_id: str
) -> bytes:
    """The record bytes for `message`; InvalidArgument when a field is past its limit."""
    topic_field = _topic_field(message.topic)
    queue_id, producer_seq = message.queue_id, message.producer_seq
    if not (  # the common case in one test; _check_uint below names what is wrong
        type(queue_id) is int
        and type(epoch) is int
        and type(store_timestamp_ms) is int
        and type(queue_offset) is int
        and type(producer_seq) is int
        and 0 <= queue_id <= QUEUE_ID_MAX
        and 0 <= epoch <= U64_MAX
        and 0 <= store_timestamp_ms <= U64_MAX
        and 0 <= queue_offset <= U64_MAX
        and 0 <= producer_seq <= U64_MAX
    ):
        _check_uint("queue_id", queue_id, QUEUE_ID_MAX)
        _check_uint("epoch", epoch, U64_MAX)
        _check_uint("store_timestamp_ms", store_timestamp_ms, U64_MAX)
        _check_uint("queue_offset", queue_offset, U64_MAX)
        _check_uint("producer_seq", producer_seq, U64_MAX)
    if not isinstance(msg_id, str) or not MSG_ID_PATTERN.fullmatch(msg_id):
        raise InvalidArgument(f"msg_id {msg_id!r} is not {MSG_ID_CHARS} lowercase hex characters")
    body = message.body
    if type(body) is not bytes:
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidArgument(f"body must be bytes, not {type(body).__name__}")
        body = bytes(body)
    if len(body) > RECORD_BODY_MAX:
        raise InvalidArgument(f"body is {len(body)} bytes; the limit is {RECORD_BODY_MAX}")
    payload = b"".join(
        (
            _FIXED.pack(epoch, store_timestamp_ms, queue_id, queue_offset, producer_seq),
            topic_field,
            _MSG_ID_LENGTH,
            msg_id.encode(),
            _text_field("producer_id", message.producer_id, PRODUCER_ID_BYTES_MAX),
            _text_field("tags", message.tags, TAGS_BYTES_MAX),
            _text_field("keys", message.keys, KEYS_BYTES_MAX),
            _properties_field(message.properties),
            _U32.pack(len(body)),
            body,
        )
    )
    total = PREFIX_BYTES + len(payload)
    return _PREFIX.pack(RECORD_MAGIC, RECORD_VERSION, total, zlib.crc32(payload)) + payload


def peek_length(buf: bytes | bytearray | memoryview, pos: int, commit_offset: int) -> int:
    """The total length the header at `pos` announces (magic, version and bounds checked)."""
    available = len(buf) - pos
    if available < PREFIX_BYTES:
        head = bytes(buf[pos : pos + 3])
        if (RECORD_MAGIC + bytes([RECORD_VERSION])).startswith(head):
            raise TornRecord(
                f"record at commit offset {commit_offset}: only {available} "
                f"of {PREFIX_BYTES} header bytes present"
            )
        raise CorruptData(f"record at commit offset {commit_offset}: bad magic {head!r}")
    magic, version, total, _ = _PREFIX.unpack_from(buf, pos)
    if magic != RECORD_MAGIC or version != RECORD_VERSION:
        raise CorruptData(f"record at commit offset {commit_offset}: bad magic/version {magic!r}/{version}")
    if not RECORD_BYTES_MIN <= total <= RECORD_BYTES_MAX:
        raise CorruptData(f"record at commit offset {commit_offset}: impossible length {total}")
    return int(total)


def check_record(buf: bytes | bytearray | memoryview, pos: int, commit_offset: int) -> int:
    """The length of the whole, checksum-valid record at `pos`, without parsing its fields.

    Raises TornRecord when the buffer ends before the record does, CorruptData when the
    magic, version, length or checksum is wrong.
    """
    total = peek_length(buf, pos, commit_offset)
    available = len(buf) - pos
    crc = _U32.unpack_from(buf, pos + PREFIX_BYTES - _U32.size)[0]
    if available < total:
        raise TornRecord(f"record at commit offset {commit_offset}: {available} of {total} bytes present")
    if zlib.crc32(memoryview(buf)[pos + _CRC_START : pos + total]) != crc:
        raise CorruptData(f"record at commit offset {commit_offset}: checksum mismatch")
    return int(total)


def valid_run(buf: bytes, pos: int, found: list[int]) -> int:
    """Appends to `found` the positions of consecutive whole, checksum-valid records of
    `buf` from `pos`; returns where the run stops (len(buf), or the first piece that is
    not one: check_record there says why).

    check_record's checks (magic, version, length bounds, CRC-32) in one tight loop:
    the per-record Python overhead, not the CRC, dominates bulk reads and audit walks.
    """
    view = memoryview(buf)
    size = len(buf)
    unpack, crc32, append = RECORD_HEAD.unpack_from, zlib.crc32, found.append
    lo, hi, tag = RECORD_BYTES_MIN, RECORD_BYTES_MAX, RECORD_TAG
    while pos + PREFIX_BYTES <= size:
        head, total, stored = unpack(buf, pos)
        end = pos + total
        if (
            head != tag
            or end > size
            or not lo <= total <= hi
            or crc32(view[pos + _CRC_START : end]) != stored
        ):
            break
        append(pos)
        pos = end
    return pos


def is_valid_record(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    """Whether a whole, checksum-valid record starts at `pos` (check_record without the why)."""
    try:
        check_record(buf, pos, pos)
    except (TornRecord, CorruptData):
        return False
    return True


def zeros_to_end(buf: bytes, pos: int) -> bool:
    """Whether `buf` holds only zero bytes from `pos` on: a log's zeros written ahead of its
    next record (a commit-log record starts with RECORD_TAG, a journal record with a
    nonzero length, so neither starts there)."""
    return buf.count(0, pos) == len(buf) - pos


def next_valid_record(buf: bytes, pos: int) -> int:
    """The position of the first checksum-valid record after `pos`; -1 when none: where a
    reader resynchronises after a bad region, or the proof that a bad region is a torn tail."""
    start = buf.find(RECORD_TAG, pos + 1)
    while start != -1:
        if is_valid_record(buf, start):
            return start
        start = buf.find(RECORD_TAG, start + 1)
    return -1


class RecordHead(NamedTuple):
    """What a slave's append needs of a record (scan_records): where it is, its epoch,
    queue and properties; the other fields were checked but are not kept."""

    commit_offset: int
    size: int
    epoch: int
    topic: str
    queue_id: int
    queue_offset: int
    properties: Mapping[str, str]
    keys: str = ""  # the key index's inputs (broker_agent/key_index.py)
    msg_id: str = ""

    @property
    def end_offset(self) -> int:
        return self.commit_offset + self.size


_MSG_ID_BYTES = re.compile(rb"[0-9a-f]{32}")
_TEXT_LIMITS = (PRODUCER_ID_BYTES_MAX, TAGS_BYTES_MAX, KEYS_BYTES_MAX)
_TEXT_KINDS = ("producer_id", "tags", "keys")


def scan_records(buf: bytes, base_offset: int) -> list[RecordHead]:
    """The records of `buf` (whole records from commit offset `base_offset`) with the
    checks decode_record makes (CRC-32, magic, lengths, layout, UTF-8, topic and msg_id
    patterns, limits) but without building a StoredRecord per record: a slave's append
    of replicated bytes. CorruptData at the first bad record, also when `buf` does not
    end on a record boundary."""
    found: list[int] = []
    if valid_run(buf, 0, found) != len(buf):
        split_records(buf, base_offset)  # raises the precise CorruptData
        raise AssertionError("valid_run and split_records disagree")  # pragma: no cover
    heads: list[RecordHead] = []
    append, fixed, u16, u32 = heads.append, _FIXED.unpack_from, _U16.unpack_from, _U32.unpack_from
    topics: dict[bytes, str] = {}
    for pos in found:
        commit_offset = base_offset + pos
        size = _U32.unpack_from(buf, pos + LENGTH_AT)[0]
        end = pos + size
        epoch, _, queue_id, queue_offset, _ = fixed(buf, pos + PREFIX_BYTES)
        try:
            at = pos + VARIABLE_AT
            length = u16(buf, at)[0]
            raw_topic = buf[at + 2 : at + 2 + length]
            at += 2 + length
            length = u16(buf, at)[0]
            raw_id = buf[at + 2 : at + 2 + length]
            at += 2 + length
            for limit in _TEXT_LIMITS:  # producer id, tags, keys: UTF-8 within their limits
                length = u16(buf, at)[0]
                if length > limit:
                    raise ValueError
                text = buf[at + 2 : at + 2 + length].decode("utf-8")
                at += 2 + length
            keys = text  # the last of the three
            length = u16(buf, at)[0]
            raw_properties = buf[at + 2 : at + 2 + length]
            at += 2 + length
            body_length = u32(buf, at)[0]
            at += 4 + body_length
            topic = topics.get(raw_topic)
            if topic is None:
                topic = raw_topic.decode("utf-8")
                if not TOPIC_PATTERN.fullmatch(topic):
                    raise ValueError
                topics[raw_topic] = topic
            if (
                at != end
                or not _MSG_ID_BYTES.fullmatch(raw_id)
                or body_length > RECORD_BODY_MAX
                or queue_id > QUEUE_ID_MAX
            ):
                raise ValueError
            properties = (
                {} if raw_properties == _EMPTY_FIELD else _decode_properties(raw_properties, commit_offset)
            )
        except (ValueError, struct.error, CorruptData):
            decode_record(buf, pos, commit_offset)  # raises the precise CorruptData
            raise AssertionError(
                f"scan_records refused a record decode_record accepts ({commit_offset})"
            ) from None
        append(
            RecordHead(
                commit_offset, size, epoch, topic, queue_id, queue_offset, properties, keys, raw_id.decode()
            )
        )
    return heads


class AuditFields(NamedTuple):
    """What the audit reports of a record, without a full decode."""

    epoch: int
    store_timestamp_ms: int
    queue_id: int
    queue_offset: int
    topic: str
    msg_id: str
    body_digest: str  # SHA-256 hex of the body; "" when not asked for


def audit_fields(buf: bytes, pos: int, with_body: bool) -> AuditFields:
    """The audit's fields of the checksum-valid record at `pos` (see check_record): fixed
    fields, topic and message id, and with `with_body` the body's SHA-256 (skipping the
    other variable fields by their lengths). Text that is not UTF-8 is replaced, not
    refused: the audit reports records, decode_record judges them."""
    epoch, store_ms, queue_id, queue_offset, _ = _FIXED.unpack_from(buf, pos + PREFIX_BYTES)
    at = pos + VARIABLE_AT
    texts = []
    for _ in range(2):  # topic, msg_id
        length = _U16.unpack_from(buf, at)[0]
        texts.append(bytes(buf[at + _U16.size : at + _U16.size + length]).decode("utf-8", "replace"))
        at += _U16.size + length
    body_digest = ""
    if with_body:
        for _ in range(4):  # producer id, tags, keys, properties
            at += _U16.size + _U16.unpack_from(buf, at)[0]
        body_length = _U32.unpack_from(buf, at)[0]
        body = memoryview(buf)[at + _U32.size : at + _U32.size + body_length]
        body_digest = hashlib.sha256(body).hexdigest()
    return AuditFields(epoch, store_ms, queue_id, queue_offset, texts[0], texts[1], body_digest)


class _Reader:
    """Parses the variable part of one checksum-valid record; layout errors are CorruptData."""

    def __init__(self, buf: memoryview, pos: int, end: int, commit_offset: int) -> None:
        self.buf, self.pos, self.end, self.commit_offset = buf, pos, end, commit_offset

    def _take(self, length: int) -> bytes:
        if self.pos + length > self.end:
            raise CorruptData(
                f"record at commit offset {self.commit_offset}: a field runs past the record's end"
            )
        data = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return data

    def u16_bytes(self) -> bytes:
        return self._take(_U16.unpack(self._take(_U16.size))[0])

    def u32_bytes(self) -> bytes:
        return self._take(_U32.unpack(self._take(_U32.size))[0])

    def text(self, kind: str, limit: int) -> str:
        data = self.u16_bytes()
        if len(data) > limit:
            raise CorruptData(
                f"record at commit offset {self.commit_offset}: {kind} is {len(data)} bytes (limit {limit})"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptData(f"record at commit offset {self.commit_offset}: {kind} is not UTF-8") from None


def _decode_properties(data: bytes, commit_offset: int) -> dict[str, str]:
    reader = _Reader(memoryview(data), 0, len(data), commit_offset)
    (count,) = _U16.unpack(reader._take(_U16.size))
    properties: dict[str, str] = {}
    for _ in range(count):
        key = reader.text("a property key", PROPERTIES_BYTES_MAX)
        properties[key] = reader.text("a property value", PROPERTIES_BYTES_MAX)
    if reader.pos != len(data):
        raise CorruptData(f"record at commit offset {commit_offset}: trailing property bytes")
    return properties


def decode_record(buf: bytes | bytearray | memoryview, pos: int, commit_offset: int) -> StoredRecord:
    """The record at `pos` of `buf`, found at `commit_offset` in the log.

    Raises TornRecord (the buffer ends inside the record) or CorruptData (bad magic,
    length, checksum or layout).
    """
    total = check_record(buf, pos, commit_offset)
    view = memoryview(buf)
    epoch, stored_ms, queue_id, queue_offset, producer_seq = _FIXED.unpack_from(view, pos + PREFIX_BYTES)
    reader = _Reader(view, pos + PREFIX_BYTES + _FIXED.size, pos + total, commit_offset)
    topic = reader.text("topic", TOPIC_BYTES_MAX)
    msg_id = reader.text("msg_id", MSG_ID_CHARS)
    producer_id = reader.text("producer_id", PRODUCER_ID_BYTES_MAX)
    tags = reader.text("tags", TAGS_BYTES_MAX)
    keys = reader.text("keys", KEYS_BYTES_MAX)
    properties = _decode_properties(reader.u16_bytes(), commit_offset)
    body = reader.u32_bytes()
    if reader.pos != pos + total:
        raise CorruptData(
            f"record at commit offset {commit_offset}: fields end at {reader.pos - pos} of {total} bytes"
        )
    if not TOPIC_PATTERN.fullmatch(topic) or not MSG_ID_PATTERN.fullmatch(msg_id):
        raise CorruptData(
            f"record at commit offset {commit_offset}: malformed topic {topic!r} or msg_id {msg_id!r}"
        )
    if len(body) > RECORD_BODY_MAX or queue_id > QUEUE_ID_MAX:
        raise CorruptData(f"record at commit offset {commit_offset}: body or queue id past its limit")
    return StoredRecord(
        commit_offset=commit_offset,
        size=total,
        epoch=epoch,
        store_timestamp_ms=stored_ms,
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        msg_id=msg_id,
        producer_id=producer_id,
        producer_seq=producer_seq,
        tags=tags,
        keys=keys,
        properties=properties,
        body=body,
    )


def iter_records(buf: bytes | bytearray | memoryview, base_offset: int) -> Iterator[StoredRecord]:
    """Each record of a byte range made of whole records starting at commit offset
    `base_offset`; raises TornRecord or CorruptData at the first bad one."""
    pos = 0
    while pos < len(buf):
        record = decode_record(buf, pos, base_offset + pos)
        yield record
        pos += record.size


def split_records(data: bytes | bytearray | memoryview, base_offset: int) -> list[StoredRecord]:
    """Every record of `data`, which must be whole valid records (else CorruptData)."""
    try:
        return list(iter_records(data, base_offset))
    except TornRecord as exc:
        raise CorruptData(f"data does not end on a record boundary: {exc}") from None
