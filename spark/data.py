"""The audit's DataFrames, loaded from an Inventory (see spark.layout).

Large inputs (commit-log and tiered records, applied entries, confirm lines) are read
on the executors through the Python data sources of spark.sources; small ones (epoch
files, tiered lineages) are parsed on the driver and become DataFrames.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from mqmeta.spark.fs import open_path, read_bytes
from mqmeta.spark.layout import Inventory
from mqmeta.spark.sources import DETAIL_FIELDS, KIND_FIELDS, LINE_FIELDS, RECORD_FIELDS, _ddl

from mqmeta.errors import CorruptData
from mqmeta.formats.checksummed import load_checksummed
from mqmeta.formats.tiered import parse_epoch_lineage

LINEAGE_SCHEMA = (
    "broker_set string, file string, end_offset bigint, position int, epoch bigint, "
    "start_offset bigint, problem string"
)
EPOCH_SCHEMA = (
    "broker_set string, replica string, file string, position int, epoch bigint, "
    "start_offset bigint, problem string"
)


class AuditData:
    """The DataFrames of one audit, each created (and cached) when a check first asks for
    it: planning a Python data source costs a Python worker round trip, and a selection
    of checks needs only some of them."""

    def __init__(
        self,
        spark: Any,
        inventory: Inventory,
        detail: bool = True,
        split_bytes: int | None = None,
        cache_records: bool = False,
    ) -> None:
        self.spark, self.inventory, self.detail, self.split_bytes = spark, inventory, detail, split_bytes
        self.cache_records = cache_records
        self.derived: dict[str, Any] = {}  # small cached tables the checks derive (see checks_logs)
        self._cached: list[Any] = []

    def keep(self, frame: Any) -> Any:
        from pyspark import StorageLevel

        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(frame)
        return frame

    @cached_property
    def records(self) -> Any:
        """Replica records: one row per record, corrupt region or truncated tail. Cached
        only when asked (`cache_records`: the checks that rescan every record, B4, T2
        and H1); B1-B3 read every record once, into checks_logs' chunk table, and then only
        the files that table names."""
        frame = _records(self.spark, self.inventory.segments, self.detail, self.split_bytes)
        return self.keep(frame) if self.cache_records else frame

    def records_in(self, files: set[tuple[str, str, str]]) -> Any:
        """The records of the named (broker set, replica, file) segment files only."""
        from pyspark.sql import functions as F

        if self.cache_records:
            if not files:
                return self.records.limit(0)
            keys = self.spark.createDataFrame(sorted(files), "broker_set string, replica string, file string")
            return self.records.join(F.broadcast(keys), ["broker_set", "replica", "file"])
        specs = [
            spec
            for spec in self.inventory.segments
            if (spec["broker_set"], spec["replica"], spec["file"]) in files
        ]
        return _records(self.spark, specs, self.detail, self.split_bytes)

    @cached_property
    def tiered(self) -> Any:
        """Tiered segment records (every .seg object found, committed or not)."""
        return self.keep(_records(self.spark, self.inventory.tiered_segments, self.detail, self.split_bytes))

    @cached_property
    def applied(self) -> Any:
        return self.keep(_jsonl(self.spark, self.inventory.controllers, "applied"))

    @cached_property
    def effects(self) -> Any:
        return self.keep(_jsonl(self.spark, self.inventory.controllers, "effects"))

    @cached_property
    def segments(self) -> Any:
        """Committed tiered segments, the first time each node's checkpoint lists them."""
        return self.keep(_jsonl(self.spark, self.inventory.controllers, "segments"))

    @cached_property
    def confirm(self) -> Any:
        return self.keep(_jsonl(self.spark, self.inventory.confirm_logs, "confirm"))

    @cached_property
    def history(self) -> Any:
        """Chaos histories (OpenChaos history.tsv), one row per line, fields by position
        (f0 client, f1 operation, f2 REQUEST/RESPONSE, then per kind; see chaos.history)."""
        files = self.inventory.histories or [{}]
        frame = self.spark.read.format("mqmeta_history").option("files", json.dumps(files)).load()
        return self.keep(frame)

    @cached_property
    def epochs(self) -> Any:
        return self.spark.createDataFrame(_epoch_rows(self.inventory), EPOCH_SCHEMA)

    @cached_property
    def lineages(self) -> Any:
        return self.spark.createDataFrame(_lineage_rows(self.inventory), LINEAGE_SCHEMA)

    def unpersist(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()


def _records(spark: Any, files: list[dict[str, Any]], detail: bool, split_bytes: int | None) -> Any:
    if not files:
        return spark.createDataFrame([], _ddl(RECORD_FIELDS + (DETAIL_FIELDS if detail else [])))
    reader = (
        spark.read.format("mqmeta_records")
        .option("files", json.dumps(files))
        .option("detail", "true" if detail else "false")
    )
    if split_bytes:
        reader = reader.option("split_bytes", str(split_bytes))
    return reader.load()


def _jsonl(spark: Any, files: list[dict[str, Any]], kind: str) -> Any:
    if not files:
        return spark.createDataFrame([], _ddl(LINE_FIELDS + KIND_FIELDS[kind]))
    return spark.read.format("mqmeta_jsonl").option("files", json.dumps(files)).option("kind", kind).load()


def _epoch_rows(inventory: Inventory) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for replica in inventory.replicas:
        path = open_path(replica.path) / "store" / "epochs.json"
        label = f"{replica.label}/store/epochs.json"
        if not path.exists():
            continue
        try:
            body = load_checksummed(path)
            entries = body.get("entries")
            if not isinstance(entries, list):
                raise CorruptData(f"{label}: no entries list")
        except (CorruptData, OSError) as exc:
            rows.append((replica.broker_set, replica.name, label, -1, None, None, str(exc)))
            continue
        for position, entry in enumerate(entries):
            ok = isinstance(entry, list) and len(entry) == 2 and all(type(v) is int for v in entry)
            rows.append(
                (
                    replica.broker_set,
                    replica.name,
                    label,
                    position,
                    entry[0] if ok else None,
                    entry[1] if ok else None,
                    None if ok else f"entry {entry!r} is not [epoch, start_offset]",
                )
            )
    return rows


def _lineage_rows(inventory: Inventory) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for item in inventory.tiered_lineages:
        try:
            end, entries = parse_epoch_lineage(read_bytes(item["path"]))
        except (CorruptData, OSError) as exc:
            rows.append((item["broker_set"], item["file"], None, -1, None, None, str(exc)))
            continue
        for position, (epoch, start) in enumerate(entries):
            rows.append((item["broker_set"], item["file"], end, position, epoch, start, None))
    return rows
