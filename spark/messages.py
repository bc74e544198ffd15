"""`mqmeta_messages`: commit-log records decoded whole, for the replication check X1.

One row per checksum-valid record of the named segment files (bad bytes are B3's
business; X1 compares what the brokers would serve): its position, queue, message id,
tags, keys, digests of its body and of its user properties (those not starting with
`__ORIGIN_`), its origin (mqmeta.formats.origin) when it is a replicated copy, the
clusters on its path, and for a `%CONSUMER_OFFSET%` record the group's progress it
holds. Decoding is mqmeta.formats.records' own (`decode_record`), so a record means
here what it means to the broker. Partitioned like `mqmeta_records`: per file and per
`split_bytes` range of a larger file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from mqmeta.spark.sources import FileRangeReader, _ddl
from mqmeta.spark.walk import scan
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

CONSUMER_OFFSET_TOPIC = "%CONSUMER_OFFSET%"  # broker_agent.store's system topic of group progress

MESSAGE_FIELDS = [
    ("broker_set", "string"),
    ("replica", "string"),
    ("file", "string"),
    ("offset", "bigint"),  # commit offset
    ("length", "bigint"),
    ("store_ms", "bigint"),
    ("topic", "string"),
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("msg_id", "string"),
    ("tags", "string"),
    ("keys", "string"),
    ("body_digest", "string"),
    ("props_digest", "string"),
    ("path", "array<string>"),
    ("o_cluster", "string"),
    ("o_broker", "string"),
    ("o_topic", "string"),
    ("o_queue", "int"),
    ("o_offset", "bigint"),
    ("o_msg_id", "string"),
    ("origin_problem", "string"),
    ("c_group", "string"),
    ("c_topic", "string"),
    ("c_queue", "int"),
    ("c_offset", "bigint"),
]
MESSAGE_SCHEMA = _ddl(MESSAGE_FIELDS)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _progress(body: bytes) -> tuple[Any, Any, Any, Any]:
    """(group, topic, queue id, offset) of a consumer-offset record's body; Nones when malformed."""
    try:
        value = json.loads(body)
        group, topic, queue_id, offset = value["group"], value["topic"], value["queue_id"], value["offset"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None, None, None, None
    if not (
        isinstance(group, str) and isinstance(topic, str) and type(queue_id) is int and type(offset) is int
    ):
        return None, None, None, None
    return group, topic, queue_id, offset


def message_row(spec: dict[str, Any], record: Any) -> tuple[Any, ...]:
    """The row of one decoded record (a mqmeta.formats.records.StoredRecord)."""
    from mqmeta.errors import InvalidArgument
    from mqmeta.formats.origin import MSG_ID, origin_of, path_of, user_properties

    properties = record.properties
    user = json.dumps(user_properties(properties), sort_keys=True, separators=(",", ":"))
    origin: Any = None
    problem = None
    try:
        origin = origin_of(properties)
    except InvalidArgument as exc:
        problem = exc.message
    o_fields: tuple[Any, ...] = (None,) * 6
    if origin is not None:
        key = origin.key
        o_fields = (
            key.cluster,
            key.broker_name,
            key.topic,
            key.queue_id,
            origin.offset,
            properties.get(MSG_ID),
        )
    progress: tuple[Any, ...] = (None,) * 4
    if record.topic == CONSUMER_OFFSET_TOPIC:
        progress = _progress(record.body)
    return (
        spec["broker_set"],
        spec["replica"],
        spec["file"],
        record.commit_offset,
        record.size,
        record.store_timestamp_ms,
        record.topic,
        record.queue_id,
        record.queue_offset,
        record.msg_id,
        record.tags,
        record.keys,
        _digest(record.body),
        _digest(user.encode()),
        path_of(properties),
        *o_fields,
        problem,
        *progress,
    )


class _MessageReader(FileRangeReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from mqmeta.errors import CorruptData
        from mqmeta.formats.records import TornRecord, decode_record

        ranged = self.range_bytes(partition)
        if ranged is None:
            return
        spec, buf, lo, hi = ranged
        base = int(spec["base_offset"])
        found, _ = scan(buf, base, bool(spec.get("last")))
        for pos in found:
            if not lo <= pos < hi:
                continue
            try:
                record = decode_record(buf, pos, base + pos)
            except (CorruptData, TornRecord):
                continue  # checksum-valid but malformed inside: B3 and B1 judge the bytes
            yield message_row(spec, record)


class MessageSource(DataSource):
    """spark.read.format("mqmeta_messages").option("files", json): decoded records."""

    @classmethod
    def name(cls) -> str:
        return "mqmeta_messages"

    def schema(self) -> str:
        return MESSAGE_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _MessageReader(dict(self.options))
