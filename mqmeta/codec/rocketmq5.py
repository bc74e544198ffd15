"""The RocketMQ 5 message codec: apache.rocketmq.v2.Message <-> our record.

`to_record` checks one message of a SendMessage and converts it into the Message the
store writes, with the queue the caller chose (FIFO: by message group) in its queue_id
field; `to_message` converts a stored record into the Message a consumer (or a
transaction checker) receives. What RocketMQ keeps as system properties that our record
has no field for rides in the record's properties under PROPERTY_PREFIX, which user
properties may not use; everything else maps to a record field:

    wire (Message / SystemProperties)      record
    topic.name                             topic
    (chosen by the caller)                 queue_id
    body                                   body
    tag                                    tags
    keys                                   keys, KEY_SEPARATOR-joined
    user_properties                        properties (without the prefix)
    message_id                             properties[MESSAGE_ID]
    message_type                           properties[MESSAGE_TYPE]
    born_timestamp (ms), born_host         properties[BORN_MS], properties[BORN_HOST]
    message_group (FIFO)                   properties[MESSAGE_GROUP]
    delivery_timestamp (DELAY)             properties[DELIVER_MS]
    (the sending client's id)              producer_id
    store_timestamp, queue_offset          store_timestamp_ms, queue_offset (read back)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

# The reserved properties are shared with the remoting codec (mqmeta.formats.properties,
# which imports no stubs); imported here under their names for this codec's users.
from mqmeta.formats.properties import (
    BORN_HOST,
    BORN_MS,
    DELIVER_MS,
    KEY_SEPARATOR,
    MESSAGE_GROUP,
    MESSAGE_ID,
    MESSAGE_TYPE,
    PROPERTY_PREFIX,
)
from mqmeta.formats.properties import DLQ_ORIGIN as DLQ_ORIGIN
from mqmeta.formats.properties import REAL_TOPIC as REAL_TOPIC
from mqmeta.formats.records import KEYS_BYTES_MAX, TAGS_BYTES_MAX, Message, StoredRecord
from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.rocketmq import BODY_BYTES_MAX, TYPE_OF_TOPIC, RmqError, check_name, delivery_ms, timestamp

MESSAGE_ID_CHARS_MAX = 128
MESSAGE_GROUP_CHARS_MAX = 128
USER_PROPERTIES_MAX = 128
BORN_HOST_CHARS_MAX = 255
PRODUCER_ID_CHARS_MAX = 255

QueueOf = Callable[[str], int]  # message group ("" unless FIFO) -> the queue to write to


@dataclass(frozen=True)
class Send:
    """One message of a SendMessage, checked: the record to write, its type and when it
    is to be delivered (0: now)."""

    record: Message
    message_type: int
    deliver_at_ms: int = 0


def send_topic(message: rdef.Message) -> str:
    """The topic a send names: well formed and not a system topic."""
    topic = check_name("topic", message.topic, rdef.ILLEGAL_TOPIC)
    if topic.startswith("%"):
        raise RmqError(rdef.ILLEGAL_TOPIC, f"topic {topic} is a system topic; send to your own topics")
    return topic


def to_record(
    message: rdef.Message, topic_type: str, producer_id: str, now_ms: int, queue_of: QueueOf
) -> Send:
    """Checks one message of a SendMessage to a topic of `topic_type` and converts it; the
    queue is `queue_of(message group)`. RmqError names the first thing wrong."""
    topic = send_topic(message)
    system = message.system_properties
    _check_body(message.body)
    tag = _checked_tag(system)
    keys = _checked_keys(system)
    if not system.message_id or len(system.message_id) > MESSAGE_ID_CHARS_MAX:
        raise RmqError(rdef.ILLEGAL_MESSAGE_ID, f"the message id must be 1-{MESSAGE_ID_CHARS_MAX} characters")
    props = _user_properties(message)
    kind = system.message_type or rdef.NORMAL
    if TYPE_OF_TOPIC.get(topic_type, rdef.NORMAL) != kind:
        raise RmqError(
            rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"topic {topic} takes {topic_type} messages, not {rdef.MessageType.Name(kind)}",
        )
    props[MESSAGE_ID] = system.message_id
    props[MESSAGE_TYPE] = str(kind)
    props[BORN_HOST] = system.born_host[:BORN_HOST_CHARS_MAX]
    props[BORN_MS] = str(system.born_timestamp.seconds * 1000 + system.born_timestamp.nanos // 1_000_000)
    group, deliver_at = _typed(kind, system, props, now_ms)
    record = Message(
        topic, queue_of(group), bytes(message.body), tag, keys, props, producer_id[:PRODUCER_ID_CHARS_MAX]
    )
    return Send(record, kind, deliver_at)


def _check_body(body: bytes) -> None:
    if not body:
        raise RmqError(rdef.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > BODY_BYTES_MAX:
        raise RmqError(
            rdef.MESSAGE_BODY_TOO_LARGE, f"the body is {len(body)} bytes; the limit is {BODY_BYTES_MAX}"
        )


def _checked_tag(system: rdef.SystemProperties) -> str:
    if not system.HasField("tag"):
        return ""
    tag = system.tag
    if not tag.strip() or "|" in tag or len(tag.encode()) > TAGS_BYTES_MAX:
        raise RmqError(rdef.ILLEGAL_MESSAGE_TAG, f"tag {tag[:64]!r} is blank, contains '|' or is too long")
    return tag


def _checked_keys(system: rdef.SystemProperties) -> str:
    if any(not k.strip() or KEY_SEPARATOR in k for k in system.keys):
        raise RmqError(rdef.ILLEGAL_MESSAGE_KEY, "a key is blank or contains a space")
    keys = KEY_SEPARATOR.join(system.keys)
    if len(keys.encode()) > KEYS_BYTES_MAX:
        raise RmqError(rdef.ILLEGAL_MESSAGE_KEY, f"the keys are over {KEYS_BYTES_MAX} bytes")
    return keys


def _user_properties(message: rdef.Message) -> dict[str, str]:
    if len(message.user_properties) > USER_PROPERTIES_MAX:
        raise RmqError(rdef.MESSAGE_PROPERTIES_TOO_LARGE, f"more than {USER_PROPERTIES_MAX} properties")
    for key in message.user_properties:
        if not key or key.startswith(PROPERTY_PREFIX):
            raise RmqError(
                rdef.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"property key {key!r} is blank or uses the reserved prefix {PROPERTY_PREFIX}",
            )
    return dict(message.user_properties)


def _typed(kind: int, system: rdef.SystemProperties, props: dict[str, str], now_ms: int) -> tuple[str, int]:
    """Type-specific checks and properties: (the FIFO message group or "", the delivery
    time of a DELAY message still ahead or 0)."""
    if kind == rdef.FIFO:
        group = system.message_group
        if not group or len(group) > MESSAGE_GROUP_CHARS_MAX:
            raise RmqError(
                rdef.ILLEGAL_MESSAGE_GROUP,
                f"a FIFO message needs a message group of 1-{MESSAGE_GROUP_CHARS_MAX} characters",
            )
        props[MESSAGE_GROUP] = group
        return group, 0
    if system.HasField("message_group"):
        raise RmqError(rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only FIFO messages carry a message group")
    if kind == rdef.DELAY:
        if not system.HasField("delivery_timestamp"):
            raise RmqError(rdef.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
        deliver_at = delivery_ms(system.delivery_timestamp, now_ms)
        props[DELIVER_MS] = str(deliver_at)
        return "", deliver_at if deliver_at > now_ms else 0
    if system.HasField("delivery_timestamp"):
        raise RmqError(
            rdef.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only DELAY messages carry a delivery timestamp"
        )
    return "", 0


def md5_digest(body: bytes) -> rdef.Digest:
    """MD5 in upper-case hex: what every official client checks the same way (CRC32 is
    formatted differently from client to client)."""
    return rdef.Digest(type=rdef.MD5, checksum=hashlib.md5(body).hexdigest().upper())  # type: ignore[arg-type]


def to_message(record: StoredRecord, topic: str, store_host: str) -> rdef.Message:
    """A stored record as the Message a consumer (or a transaction checker) receives, as
    `topic` (a parked delay or half message is shown as its real topic)."""
    props = record.properties
    system = rdef.SystemProperties(
        keys=[k for k in record.keys.split(KEY_SEPARATOR) if k],
        message_id=props.get(MESSAGE_ID) or record.msg_id,
        body_digest=md5_digest(record.body),
        body_encoding=rdef.IDENTITY,  # type: ignore[arg-type]
        message_type=int(props.get(MESSAGE_TYPE, rdef.NORMAL)),  # type: ignore[arg-type]
        born_timestamp=timestamp(int(props.get(BORN_MS, record.store_timestamp_ms))),
        born_host=props.get(BORN_HOST, ""),
        store_timestamp=timestamp(record.store_timestamp_ms),
        store_host=store_host,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
    )
    if record.tags:
        system.tag = record.tags
    if MESSAGE_GROUP in props:
        system.message_group = props[MESSAGE_GROUP]
    if DELIVER_MS in props:
        system.delivery_timestamp.CopyFrom(timestamp(int(props[DELIVER_MS])))
    user = {k: v for k, v in props.items() if not k.startswith(PROPERTY_PREFIX)}
    return rdef.Message(
        topic=rdef.Resource(name=topic), user_properties=user, system_properties=system, body=record.body
    )
