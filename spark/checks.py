"""The audit's checks (docs/design/properties.md: R1, R2, M1-M4, B1-B4, T1-T4) as DataFrame computations.

Each check builds a DataFrame of violations on the executors (joins, aggregations,
windows) and brings back only counts and at most SAMPLES_MAX sample rows. The driver
only ever collects small metadata: per-replica held ranges and per-set confirm offsets
(a few rows each), used to build column expressions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mqmeta.spark.data import AuditData
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

SAMPLES_MAX = 20


@dataclass
class CheckResult:
    id: str
    description: str
    passed: bool
    rows_examined: int
    violation_count: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kinds: dict[str, int] | None = None  # X1: violations by name (reported as "violations")

    def to_dict(self) -> dict[str, Any]:
        extra = {} if self.kinds is None else {"violations": dict(self.kinds)}
        return {
            "id": self.id,
            "description": self.description,
            "passed": self.passed,
            "rows_examined": self.rows_examined,
            "violation_count": self.violation_count,
            "samples": self.samples,
            "notes": self.notes,
            **extra,
        }


def _samples(violations: DataFrame) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in row.asDict(recursive=True).items() if v is not None}
        for row in violations.limit(SAMPLES_MAX).collect()
    ]


def _result(
    check_id: str, examined: int, violations: list[DataFrame], notes: list[str] | None = None
) -> CheckResult:
    count, samples = 0, list[dict[str, Any]]()
    for frame in violations:
        found = frame.count()
        count += found
        if found and len(samples) < SAMPLES_MAX:
            samples += _samples(frame)[: SAMPLES_MAX - len(samples)]
    return CheckResult(
        check_id, DESCRIPTIONS[check_id], count == 0, examined, count, samples, list(notes or [])
    )


DESCRIPTIONS = {
    "R1": "log agreement: nodes that applied index i applied the same entry (term, command digest)",
    "R2": "determinism: nodes at index i have the same state digest",
    "M1": "master epoch strictly increases per broker set (every master change bumps it)",
    "M2": "at most one master per (broker set, master epoch)",
    "M3": "a master is always in its SyncStateSet",
    "M4": "each SyncStateSet change bumps its epoch",
    "B1": "below the confirm offset, every replica holding a byte range holds the same bytes",
    "B2": "each replica's offsets have no gaps and no overlaps",
    "B3": "every record's checksum is valid and no record is truncated (a torn tail is cut at restart)",
    "B4": "the epoch file agrees with the records",
    "T1": "no tiered segment ends beyond the confirm offset of a master with epoch <= the upload's",
    "T2": "tiered bytes equal the replicas' bytes at the same offsets",
    "T3": "committed tiered segments have no gaps or overlaps, and each object exists",
    "T4": "the committed checkpoint never moves backwards; its epoch is the master epoch in force",
    "H1": "every enqueue a chaos history acknowledged is in a valid record of a replica or the tiered store",
    "K1": "every key index entry names a record with that key (or id), and every record with keys is indexed",
    "X1": "every source record a replication rule matches is at the target exactly once, in origin order, "
    "unaltered; no orphan copies; mode full: translated consumer offsets consistent",
}


# Controller logs -------------------------------------------------------------------------------
def _bad_lines(frame: DataFrame) -> DataFrame:
    """Lines failing their CRC anywhere but as the torn last line of a file."""
    return frame.filter(~F.col("valid") & ~F.col("torn_tail")).select(
        F.lit("bad line").alias("kind"), "node", "file", "line_no", "byte_offset", "problem"
    )


def _disagreement(applied: DataFrame, columns: list[str]) -> DataFrame:
    valid = applied.filter("valid")
    distinct = [F.countDistinct(c).alias(f"n_{c}") for c in columns]
    detail = F.sort_array(F.collect_list(F.concat_ws(":", "node", *[F.substring(c, 1, 16) for c in columns])))
    grouped = valid.groupBy("index").agg(*distinct, detail.alias("nodes"), F.first("file").alias("file"))
    condition: Column = F.lit(False)
    for c in columns:
        condition = condition | (F.col(f"n_{c}") > 1)
    return grouped.filter(condition).select(F.lit("disagree").alias("kind"), "index", "nodes", "file")


def check_r1(data: AuditData) -> CheckResult:
    examined = data.applied.count()
    return _result(
        "R1", examined, [_disagreement(data.applied, ["term", "command_digest"]), _bad_lines(data.applied)]
    )


def check_r2(data: AuditData) -> CheckResult:
    return _result(
        "R2", data.applied.filter("valid").count(), [_disagreement(data.applied, ["state_digest"])]
    )


# Metadata history (replayed from each node's effects) -----------------------------------------
def _broker_sets(data: AuditData) -> DataFrame:
    window = Window.partitionBy("node", "key").orderBy("index")
    return (
        data.effects.filter(F.col("valid") & F.col("key").startswith("brokerset/"))
        .withColumn("prev_master", F.lag("master_broker_id").over(window))
        .withColumn("prev_epoch", F.lag("master_epoch").over(window))
        .withColumn("prev_set", F.lag("sync_state_set").over(window))
        .withColumn("prev_set_epoch", F.lag("sync_state_set_epoch").over(window))
    )


_M_COLUMNS = ["node", "file", "index", "broker_set", "master_broker_id", "master_epoch"]


def check_m1(data: AuditData) -> CheckResult:
    rows = _broker_sets(data)
    bad = rows.filter(
        (F.col("master_epoch") < F.col("prev_epoch"))
        | (
            (F.col("master_broker_id") != F.col("prev_master"))
            & (F.col("master_epoch") <= F.col("prev_epoch"))
        )
    )
    return _result("M1", rows.count(), [bad.select(*_M_COLUMNS, "prev_master", "prev_epoch")])


def check_m2(data: AuditData) -> CheckResult:
    rows = _broker_sets(data).filter(F.col("master_broker_id") != 0)
    bad = (
        rows.groupBy("node", "broker_set", "master_epoch")
        .agg(
            F.countDistinct("master_broker_id").alias("masters"),
            F.sort_array(F.collect_set("master_broker_id")).alias("master_ids"),
            F.min("index").alias("index"),
            F.first("file").alias("file"),
        )
        .filter(F.col("masters") > 1)
    )
    return _result("M2", rows.count(), [bad])


def check_m3(data: AuditData) -> CheckResult:
    rows = _broker_sets(data)
    bad = rows.filter(
        (F.col("master_broker_id") != 0) & ~F.array_contains("sync_state_set", F.col("master_broker_id"))
    )
    return _result("M3", rows.count(), [bad.select(*_M_COLUMNS, "sync_state_set")])


def check_m4(data: AuditData) -> CheckResult:
    rows = _broker_sets(data)
    changed = F.sort_array("sync_state_set") != F.sort_array("prev_set")
    bad = rows.filter(
        (changed & (F.col("sync_state_set_epoch") <= F.col("prev_set_epoch")))
        | (F.col("sync_state_set_epoch") < F.col("prev_set_epoch"))
    )
    return _result(
        "M4",
        rows.count(),
        [
            bad.select(
                "node",
                "file",
                "index",
                "broker_set",
                "sync_state_set",
                "sync_state_set_epoch",
                "prev_set",
                "prev_set_epoch",
            )
        ],
    )
