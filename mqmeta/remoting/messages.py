"""Messages of the remoting protocol as our records, and back.

A send carries RocketMQ's message properties as one `k\\x01v\\x02` string: TAGS and KEYS
become the record's tags and keys, UNIQ_KEY (the client-made message id) its
__RMQ_MSG_ID property (what the RocketMQ 5 service reports as the message id), and the
client's born time and address the __RMQ_ born properties; a few properties that only
mean something on the way (WAIT, MIN_OFFSET, ...) are dropped and the rest are kept as the
record's properties. A pull gives every record back with TAGS, KEYS and UNIQ_KEY (the
record's own id for a message that never had one), so a message keeps its id, tags,
keys and properties whichever protocol wrote it and whichever reads it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from mqmeta.codec.remoting import WireMessage, decode_properties
from mqmeta.formats.properties import BORN_HOST, BORN_MS, KEY_SEPARATOR, MESSAGE_ID, PROPERTY_PREFIX
from mqmeta.formats.records import KEYS_BYTES_MAX, TAGS_BYTES_MAX, Message, StoredRecord

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
RECONSUME_TIME = "RECONSUME_TIME"
# Properties a client or broker sets for the trip only: not kept in the record.
TRANSIENT = frozenset(
    ("WAIT", "MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME", "MSG_REGION", "TRACE_ON", DELAY)
)
MESSAGE_ID_CHARS_MAX = 128
PROPERTIES_MAX = 128
_LOOPBACK = (b"\x7f\x00\x00\x01", 0)


class MessageRefused(ValueError):
    """A sent message that breaks a limit of the record format (why, for the remark)."""


@dataclass(frozen=True)
class SentMessage:
    """A send's message as the record to write, and its delay level (0 = none)."""

    record: Message
    message_id: str
    delay_level: int


def to_record(
    topic: str,
    queue_id: int,
    body: bytes,
    properties_text: str,
    born_timestamp_ms: int,
    born_host: str,
    producer: str,
) -> SentMessage:
    """A send's fields as a record (its message id: UNIQ_KEY, or `fallback` by the caller)."""
    properties = decode_properties(properties_text)
    tags = properties.pop(TAGS, "")
    keys = properties.pop(KEYS, "")
    message_id = properties.pop(UNIQ_KEY, "")
    delay = properties.get(DELAY, "0")
    kept = {k: v for k, v in properties.items() if k not in TRANSIENT}
    if len(tags.encode()) > TAGS_BYTES_MAX or "|" in tags:
        raise MessageRefused(f"the tag is over {TAGS_BYTES_MAX} bytes or contains '|'")
    if len(keys.encode()) > KEYS_BYTES_MAX:
        raise MessageRefused(f"the keys are over {KEYS_BYTES_MAX} bytes")
    if len(message_id) > MESSAGE_ID_CHARS_MAX:
        raise MessageRefused(f"the message id (UNIQ_KEY) is over {MESSAGE_ID_CHARS_MAX} characters")
    if len(kept) > PROPERTIES_MAX or any(k.startswith(PROPERTY_PREFIX) for k in kept):
        raise MessageRefused(
            f"over {PROPERTIES_MAX} properties, or a property uses the reserved prefix {PROPERTY_PREFIX}"
        )
    try:
        delay_level = int(delay)
    except ValueError:
        raise MessageRefused(f"the delay level {delay[:16]!r} is not a whole number") from None
    if message_id:
        kept[MESSAGE_ID] = message_id
    kept[BORN_MS] = str(born_timestamp_ms)
    kept[BORN_HOST] = born_host[:255]
    keys = KEY_SEPARATOR.join(k for k in keys.split(KEY_SEPARATOR) if k)
    record = Message(topic, queue_id, body, tags, keys, kept, producer[:255])
    return SentMessage(record, message_id, delay_level)


def to_wire(record: StoredRecord, store_host: tuple[bytes, int], reconsume_times: int = 0) -> WireMessage:
    """A stored record as a pull answer carries it."""
    properties: dict[str, str] = {
        k: v for k, v in record.properties.items() if not k.startswith(PROPERTY_PREFIX)
    }
    if record.tags:
        properties[TAGS] = record.tags
    if record.keys:
        properties[KEYS] = record.keys
    properties[UNIQ_KEY] = record.properties.get(MESSAGE_ID) or record.msg_id
    born_ms = _number(record.properties.get(BORN_MS), record.store_timestamp_ms)
    return WireMessage(
        topic=record.topic,
        queue_id=record.queue_id,
        body=record.body,
        properties=properties,
        queue_offset=record.queue_offset,
        commit_offset=record.commit_offset,
        store_timestamp_ms=record.store_timestamp_ms,
        born_timestamp_ms=born_ms,
        store_host=store_host,
        born_host=ipv4_host(record.properties.get(BORN_HOST, "")),
        reconsume_times=reconsume_times,
    )


def _number(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def ipv4_host(address: str) -> tuple[bytes, int]:
    """HOST:PORT as a V1 record's host field (4 address bytes, port); loopback when the
    host is not an IPv4 address (a V1 record has room for nothing else)."""
    host, _, port = address.rpartition(":")
    try:
        return ipaddress.IPv4Address(host).packed, int(port)
    except ValueError:
        return _LOOPBACK


def tag_set(expression: str) -> frozenset[str] | None:
    """A subscription expression `a || b` as its tags; None for every tag (`*` or empty)."""
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return None if not tags or "*" in tags else tags


def matches(tags: frozenset[str] | None, record_tags: str) -> bool:
    return tags is None or record_tags in tags


def properties_of(record: StoredRecord) -> Mapping[str, str]:
    return to_wire(record, _LOOPBACK).properties
