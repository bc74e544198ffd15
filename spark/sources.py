"""PySpark Python data sources for mqmeta's on-disk logs.

- `mqmeta_records`: commit-log segments of every replica and tiered segment objects,
  one row per record (or corrupt region, or truncated tail), partitioned by file and,
  for files larger than `split_bytes`, by offset range within the file.
- `mqmeta_jsonl`: checksummed JSON-line logs (controllers' applied.jsonl, brokers'
  confirm.log), partitioned by file; `kind` picks the rows: `applied` (one per entry),
  `effects` (one per broker-set or tiered-checkpoint change an entry made),
  `segments` (one per tiered segment the first time a checkpoint lists it), `confirm`.

Both take the files to read as a JSON option (`files`), built by `spark.layout`:
labels (broker set, replica, node, file) come from the directory layout, never from
paths recorded inside the files. A bad record or line yields a row that says so; the
readers never drop it and never raise on bad bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mqmeta.spark.fs import read_bytes
from mqmeta.spark.walk import DIGEST_MIX, Piece, piece_digest, scan
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from mqmeta.formats.records import CRC_AT, FIELD_AT, LENGTH_AT, audit_fields

SPLIT_BYTES_DEFAULT = 32 << 20
ARROW_BATCH_ROWS = 32_768

RECORD_FIELDS = [
    ("broker_set", "string"),
    ("replica", "string"),
    ("file", "string"),
    ("file_base", "bigint"),
    ("offset", "bigint"),
    ("length", "bigint"),
    ("crc_valid", "boolean"),
    ("truncated", "boolean"),
    ("epoch", "bigint"),
    ("record_digest", "bigint"),
    ("last_file", "boolean"),
    ("framed", "boolean"),
]
DETAIL_FIELDS = [
    ("store_ms", "bigint"),
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("topic", "string"),
    ("msg_id", "string"),
    ("body_digest", "string"),
    ("problem", "string"),
]


def _ddl(fields: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in fields)


@dataclass(frozen=True)
class FileRange(InputPartition):
    spec: dict[str, Any]
    lo: int
    hi: int


class FileRangeReader(DataSourceReader):
    """A reader of the `files` option's files, each split into FileRanges of `split_bytes`
    (one empty range when there is no file: Spark wants a partition)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.files: list[dict[str, Any]] = json.loads(options.get("files", "[]"))
        self.split_bytes = int(options.get("split_bytes", SPLIT_BYTES_DEFAULT))

    def partitions(self) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for spec in self.files:
            size = int(spec.get("size", 0))
            for lo in range(0, max(size, 1), self.split_bytes):
                parts.append(FileRange(spec, lo, min(size, lo + self.split_bytes)))
        return parts or [FileRange({}, 0, 0)]

    @staticmethod
    def range_bytes(partition: InputPartition) -> tuple[dict[str, Any], bytes, int, int] | None:
        """(spec, the whole file's bytes, lo, hi) of a range; None for the empty one. The
        last range of a file takes whatever the file holds now."""
        assert isinstance(partition, FileRange)
        if not partition.spec:
            return None
        spec, lo, hi = partition.spec, partition.lo, partition.hi
        buf = read_bytes(spec["path"])
        if hi >= int(spec.get("size", 0)):
            hi = len(buf) + 1
        return spec, buf, lo, hi


class _RecordReader(FileRangeReader):
    def __init__(self, options: dict[str, str], detail: bool) -> None:
        super().__init__(options)
        self.detail = detail

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import numpy as np

        ranged = self.range_bytes(partition)
        if ranged is None:
            return
        spec, buf, lo, hi = ranged
        found, others = scan(buf, spec["base_offset"], bool(spec.get("last")))
        valid = np.asarray(found, dtype=np.int64)
        valid = valid[(valid >= lo) & (valid < hi)]
        for first in range(0, len(valid), ARROW_BATCH_ROWS):
            yield _valid_batch(buf, spec, valid[first : first + ARROW_BATCH_ROWS], self.detail)
        others = [piece for piece in others if lo <= piece.pos < hi]
        if others:
            yield _other_batch(buf, spec, others, self.detail)


def _gather(u8: Any, positions: Any, at: int, dtype: str) -> Any:
    """The little-endian field `dtype` at `at` bytes into each record, as one array."""
    import numpy as np

    width = np.dtype(dtype).itemsize
    return u8[(positions + at)[:, None] + np.arange(width)].view(dtype).reshape(len(positions))


def _file_columns(spec: dict[str, Any], rows: int) -> dict[str, Any]:
    import pyarrow as pa

    return {
        "broker_set": pa.repeat(spec["broker_set"], rows),
        "replica": pa.repeat(spec["replica"], rows),
        "file": pa.repeat(spec["file"], rows),
        "file_base": pa.repeat(int(spec["base_offset"]), rows),
        "last_file": pa.repeat(bool(spec.get("last")), rows),
    }


def _valid_batch(buf: bytes, spec: dict[str, Any], positions: Any, detail: bool) -> Any:
    """Checksum-valid records, their header fields gathered with numpy (no per-record
    Python but the detail columns' strings): the reader's hot path."""
    import numpy as np
    import pyarrow as pa

    u8 = np.frombuffer(buf, dtype=np.uint8)
    rows = len(positions)
    crc = _gather(u8, positions, CRC_AT, "<u4").astype(np.uint64)
    mixed = crc * np.uint64(DIGEST_MIX) & np.uint64(0xFFFFFFFF)  # see walk.piece_digest
    columns = _file_columns(spec, rows)
    columns.update(
        offset=positions + int(spec["base_offset"]),
        length=_gather(u8, positions, LENGTH_AT, "<u4").astype(np.int64),
        crc_valid=np.ones(rows, dtype=bool),
        truncated=np.zeros(rows, dtype=bool),
        epoch=_gather(u8, positions, FIELD_AT["epoch"], "<u8").astype(np.int64),
        record_digest=((crc << np.uint64(32)) | mixed).view(np.int64),
        framed=np.ones(rows, dtype=bool),
    )
    if detail:
        columns.update(
            store_ms=_gather(u8, positions, FIELD_AT["store_timestamp_ms"], "<u8").astype(np.int64),
            queue_id=_gather(u8, positions, FIELD_AT["queue_id"], "<u4").astype(np.int32),
            queue_offset=_gather(u8, positions, FIELD_AT["queue_offset"], "<u8").astype(np.int64),
        )
        fields = [audit_fields(buf, int(pos), True) for pos in positions]
        columns.update(
            topic=[f.topic for f in fields],
            msg_id=[f.msg_id for f in fields],
            body_digest=[f.body_digest for f in fields],
            problem=pa.nulls(rows, pa.string()),
        )
    return pa.RecordBatch.from_pydict(columns, schema=_arrow_schema(detail))


def _other_batch(buf: bytes, spec: dict[str, Any], pieces: list[Piece], detail: bool) -> Any:
    """Corrupt regions and truncated tails (few): built row by row."""
    import pyarrow as pa

    rows = len(pieces)
    columns = _file_columns(spec, rows)
    columns.update(
        offset=[spec["base_offset"] + p.pos for p in pieces],
        length=[p.length for p in pieces],
        crc_valid=[False] * rows,
        truncated=[p.status == "truncated" for p in pieces],
        epoch=[None] * rows,
        record_digest=[piece_digest(buf, p) for p in pieces],
        framed=[p.status == "corrupt" for p in pieces],
    )
    if detail:
        for name in ("store_ms", "queue_id", "queue_offset", "topic", "msg_id", "body_digest"):
            columns[name] = [None] * rows
        columns["problem"] = [p.problem for p in pieces]
    return pa.RecordBatch.from_pydict(columns, schema=_arrow_schema(detail))


_ARROW_TYPES = {"string": "string", "bigint": "int64", "boolean": "bool", "int": "int32"}


def _arrow_schema(detail: bool) -> Any:
    import pyarrow as pa

    fields = RECORD_FIELDS + (DETAIL_FIELDS if detail else [])
    return pa.schema([(name, pa.type_for_alias(_ARROW_TYPES[kind])) for name, kind in fields])


class RecordSource(DataSource):
    """spark.read.format("mqmeta_records").option("files", json).option("detail", "true")"""

    @classmethod
    def name(cls) -> str:
        return "mqmeta_records"

    def schema(self) -> str:
        detail = self.options.get("detail", "true") == "true"
        return _ddl(RECORD_FIELDS + (DETAIL_FIELDS if detail else []))

    def reader(self, schema: Any) -> DataSourceReader:
        return _RecordReader(dict(self.options), self.options.get("detail", "true") == "true")


# JSON-line logs ---------------------------------------------------------------------------

LINE_FIELDS = [
    ("node", "string"),
    ("file", "string"),
    ("line_no", "bigint"),
    ("byte_offset", "bigint"),
    ("valid", "boolean"),
    ("torn_tail", "boolean"),
    ("problem", "string"),
]
KIND_FIELDS: dict[str, list[tuple[str, str]]] = {
    "applied": [
        ("index", "bigint"),
        ("term", "bigint"),
        ("command_type", "string"),
        ("command_digest", "string"),
        ("state_digest", "string"),
    ],
    "effects": [
        ("index", "bigint"),
        ("key", "string"),
        ("broker_set", "string"),
        ("master_broker_id", "bigint"),
        ("master_epoch", "bigint"),
        ("sync_state_set", "array<bigint>"),
        ("sync_state_set_epoch", "bigint"),
        ("uploaded_offset", "bigint"),
        ("checkpoint_epoch", "bigint"),
    ],
    "segments": [
        ("index", "bigint"),
        ("broker_set", "string"),
        ("key", "string"),
        ("base_offset", "bigint"),
        ("end_offset", "bigint"),
        ("sha256", "string"),
        ("commit_epoch", "bigint"),
    ],
    "confirm": [
        ("broker_set", "string"),
        ("replica", "string"),
        ("t_ms", "bigint"),
        ("broker_id", "bigint"),
        ("role", "string"),
        ("epoch", "bigint"),
        ("confirm_offset", "bigint"),
        ("max_offset", "bigint"),
    ],
}


@dataclass(frozen=True)
class WholeFile(InputPartition):
    spec: dict[str, Any]


def _lines(buf: bytes) -> Iterator[tuple[int, int, bytes, bool]]:
    """(line number, byte offset, text, is the unterminated last line) of each line."""
    pos, number = 0, 0
    while pos < len(buf):
        end = buf.find(b"\n", pos)
        last = end == -1
        end = len(buf) if last else end
        number += 1
        if end > pos:
            yield number, pos, buf[pos:end], last
        pos = end + 1


class _WholeFileReader(DataSourceReader):
    """One partition per file of the `files` option (one empty partition when none)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.files: list[dict[str, Any]] = json.loads(options.get("files", "[]"))

    def partitions(self) -> list[InputPartition]:
        return [WholeFile(spec) for spec in self.files] or [WholeFile({})]


class _JsonlReader(_WholeFileReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kind = options.get("kind", "applied")

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from mqmeta.errors import CorruptData
        from mqmeta.formats.jsonlines import parse_line

        assert isinstance(partition, WholeFile)
        spec = partition.spec
        if not spec:
            return
        seen: set[tuple[str, str]] = set()  # tiered segments listed by an earlier checkpoint
        for number, offset, text, last in _lines(read_bytes(spec["path"])):
            head = (spec["node"], spec["file"], number, offset)
            try:
                record = parse_line(text.decode("utf-8", "replace"), f"{spec['file']} line {number}")
            except CorruptData as exc:
                # A torn *last* line is what a kill -9 leaves (cut at restart); not a violation.
                yield head + (False, last, str(exc)) + (None,) * len(KIND_FIELDS[self.kind])
                continue
            for values in _kind_rows(self.kind, record, spec, seen):
                yield head + (True, False, None) + values


def _kind_rows(
    kind: str, record: dict[str, Any], spec: dict[str, Any], seen: set[tuple[str, str]]
) -> Iterator[tuple[Any, ...]]:
    if kind == "applied":
        yield (
            record.get("index"),
            record.get("term"),
            record.get("command_type"),
            record.get("command_digest"),
            record.get("state_digest"),
        )
    elif kind == "confirm":
        yield (
            spec.get("broker_set"),
            spec.get("replica"),
            record.get("t_ms"),
            record.get("broker_id"),
            record.get("role"),
            record.get("epoch"),
            record.get("confirm_offset"),
            record.get("max_offset"),
        )
    elif kind == "effects":
        yield from _effect_rows(record)
    elif kind == "segments":
        yield from _segment_rows(record, seen)


def _effect_rows(record: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    for key, value in sorted((record.get("effects") or {}).items()):
        if not isinstance(value, dict):
            continue
        broker_set = f"{value.get('cluster')}/{value.get('broker_name')}"
        if key.startswith("brokerset/"):
            yield (
                record.get("index"),
                key,
                broker_set,
                value.get("master_broker_id"),
                value.get("master_epoch"),
                [int(i) for i in value.get("sync_state_set") or []],
                value.get("sync_state_set_epoch"),
                None,
                None,
            )
        elif key.startswith("tiered/"):
            yield (
                record.get("index"),
                key,
                broker_set,
                None,
                None,
                None,
                None,
                value.get("uploaded_offset"),
                value.get("checkpoint_epoch"),
            )


def _segment_rows(record: dict[str, Any], seen: set[tuple[str, str]]) -> Iterator[tuple[Any, ...]]:
    for key, value in sorted((record.get("effects") or {}).items()):
        if not key.startswith("tiered/") or not isinstance(value, dict):
            continue
        broker_set = f"{value.get('cluster')}/{value.get('broker_name')}"
        for segment in value.get("segments") or []:
            name = (broker_set, str(segment.get("key")))
            if name in seen:
                continue
            seen.add(name)
            yield (
                record.get("index"),
                broker_set,
                segment.get("key"),
                segment.get("base_offset"),
                segment.get("end_offset"),
                segment.get("sha256"),
                value.get("checkpoint_epoch"),
            )


class JsonlSource(DataSource):
    """spark.read.format("mqmeta_jsonl").option("files", json).option("kind", "applied")"""

    @classmethod
    def name(cls) -> str:
        return "mqmeta_jsonl"

    def schema(self) -> str:
        return _ddl(LINE_FIELDS + KIND_FIELDS[self.options.get("kind", "applied")])

    def reader(self, schema: Any) -> DataSourceReader:
        return _JsonlReader(dict(self.options))


# Chaos histories --------------------------------------------------------------------------

HISTORY_COLUMNS = 10  # the longest line (a response); shorter lines are padded with nulls


class _HistoryReader(_WholeFileReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, WholeFile)
        if not partition.spec:
            return
        for number, _, text, _ in _lines(read_bytes(partition.spec["path"])):
            fields = [None if f == "null" else f for f in text.decode("utf-8", "replace").split("\t")]
            fields = (fields + [None] * HISTORY_COLUMNS)[:HISTORY_COLUMNS]
            yield (partition.spec["file"], number, *fields)


class HistorySource(DataSource):
    """spark.read.format("mqmeta_history").option("files", json): OpenChaos history.tsv
    lines, fields by position (`null` fields become nulls)."""

    @classmethod
    def name(cls) -> str:
        return "mqmeta_history"

    def schema(self) -> str:
        return "file string, line_no bigint, " + ", ".join(f"f{i} string" for i in range(HISTORY_COLUMNS))

    def reader(self, schema: Any) -> DataSourceReader:
        return _HistoryReader(dict(self.options))


def register_sources(spark: Any) -> None:
    spark.dataSource.register(RecordSource)
    spark.dataSource.register(JsonlSource)
    spark.dataSource.register(HistorySource)
