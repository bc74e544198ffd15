"""K1: the brokers' key index agrees with their records (broker_agent/key_index.py).

For each replica, as its index checkpoint lists it (index/checkpoint.json: indexed
offset; per topic the entry count, CRC-32 and covered_from): every entry (name hash,
commit offset) of `keys/{topic}` names a checksum-valid record of that topic that
carries that name (a key, a client id, a copy's id: mqmeta.formats.key_index), and every
such record in [covered_from, indexed offset) has an entry for each of its names
(entries naming offsets that retention deleted are skipped, as the broker skips them). A key
file whose first entries do not match the checkpoint's CRC is not trusted by the broker
(it rebuilds it at open): a note, not a violation.

One task per replica, on the executors (a Python data source, a partition per replica): it reads the
checkpoint, the key files and the commit-log segments with mqmeta.formats only, and
emits one row per violation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from mqmeta.spark.checks import CheckResult, _result
from mqmeta.spark.data import AuditData
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

VIOLATION_SCHEMA = (
    "kind string, broker_set string, replica string, topic string, commit_offset bigint, name_hash string"
)
_EXAMINED = "_examined"  # a row carrying the count of records examined in commit_offset
_STALE = "_stale"  # a key file the broker would rebuild at open


def replica_rows(spec: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """K1's rows for one replica (runs on an executor)."""
    from mqmeta.spark.fs import read_bytes
    from mqmeta.spark.messages import CONSUMER_OFFSET_TOPIC
    from mqmeta.spark.walk import walk

    from mqmeta.errors import CorruptData
    from mqmeta.formats.checksummed import loads_checksummed
    from mqmeta.formats.key_index import indexed_hashes, iter_entries, parse_entries
    from mqmeta.formats.records import decode_record

    where = (spec["broker_set"], spec["replica"])
    store = spec["path"].rstrip("/") + "/store"
    try:
        body = loads_checksummed(read_bytes(store + "/index/checkpoint.json"), "index checkpoint")
        indexed_offset, listed = int(body["indexed_offset"]), body["keys"]
    except (OSError, CorruptData, KeyError, TypeError, ValueError):
        return  # no usable checkpoint: the broker rebuilds every index at open
    covered = {row[0]: row[3] for row in listed}
    actual: dict[str, set[tuple[int, int]]] = {}
    for topic, count, crc, _ in listed:
        path = f"{store}/keys/{topic}"
        try:
            entries = parse_entries(read_bytes(path), count, crc, path)
        except (OSError, CorruptData) as exc:
            yield (_STALE, *where, topic, 0, str(exc)[:200])
            actual[topic] = set()
            covered[topic] = indexed_offset  # nothing of it is trusted
            continue
        actual[topic] = set(iter_entries(entries))
    expected: dict[str, set[tuple[int, int]]] = {}
    examined = 0
    low = min((s["base_offset"] for s in spec["segments"]), default=0)
    for segment in sorted(spec["segments"], key=lambda s: s["base_offset"]):
        base = segment["base_offset"]
        if base >= indexed_offset:
            break
        buf = read_bytes(segment["path"])
        for piece in walk(buf, base, bool(segment.get("last"))):
            commit_offset = base + piece.pos
            if piece.status != "ok" or commit_offset >= indexed_offset:
                continue
            record = decode_record(buf, piece.pos, commit_offset)
            if record.topic == CONSUMER_OFFSET_TOPIC:
                continue
            examined += 1
            if commit_offset < covered.get(record.topic, low):
                continue
            for name_hash in indexed_hashes(record.keys, record.msg_id, commit_offset, record.properties):
                expected.setdefault(record.topic, set()).add((name_hash, commit_offset))
    yield (_EXAMINED, *where, "", examined, "")
    for topic in sorted(actual.keys() | expected.keys()):
        have, want = actual.get(topic, set()), expected.get(topic, set())
        start = max(covered.get(topic, low), low)
        for name_hash, offset in sorted(have - want):
            if offset >= start:  # below: not covered, or deleted by retention (the broker skips them)
                yield ("indexed, no such record or name", *where, topic, offset, format(name_hash, "016x"))
        for name_hash, offset in sorted(want - have):
            yield ("record not indexed", *where, topic, offset, format(name_hash, "016x"))


class _ReplicaSpec(InputPartition):
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec


class _KeyIndexReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.specs: list[dict[str, Any]] = json.loads(options.get("replicas", "[]"))

    def partitions(self) -> list[InputPartition]:
        return [_ReplicaSpec(spec) for spec in self.specs]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _ReplicaSpec)
        return replica_rows(partition.spec)


class KeyIndexSource(DataSource):
    """spark.read.format("mqmeta_key_index").option("replicas", json): K1's rows, one
    partition per replica (no shuffle: each task reads its replica's files)."""

    @classmethod
    def name(cls) -> str:
        return "mqmeta_key_index"

    def schema(self) -> str:
        return VIOLATION_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _KeyIndexReader(dict(self.options))


def check_k1(data: AuditData) -> CheckResult:
    specs = []
    for replica in data.inventory.replicas:
        segments = [
            {"path": s["path"], "base_offset": s["base_offset"]}
            for s in data.inventory.segments
            if (s["broker_set"], s["replica"]) == (replica.broker_set, replica.name)
        ]
        specs.append(
            {
                "path": replica.path,
                "broker_set": replica.broker_set,
                "replica": replica.name,
                "segments": segments,
            }
        )
    if not specs:
        return _result("K1", 0, [], ["no broker replicas in the inputs: nothing to check"])
    data.spark.dataSource.register(KeyIndexSource)
    frame = data.spark.read.format("mqmeta_key_index").option("replicas", json.dumps(specs)).load().cache()
    try:
        examined = sum(r.commit_offset for r in frame.filter(frame.kind == _EXAMINED).collect())
        stale = frame.filter(frame.kind == _STALE).count()
        notes = [f"{stale} key file(s) do not match their checkpoint: rebuilt at open"] if stale else []
        violations = frame.filter(~frame.kind.isin(_EXAMINED, _STALE))
        return _result("K1", examined, [violations], notes)
    finally:
        frame.unpersist()
