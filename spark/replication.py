"""X1: what a replicator left at the target, checked against the source and the rules.

Over two clusters' data dirs (spark.replication_sites) and the rules file, with one
replica read per broker set (spark.replication_sites.chosen_specs), every record decoded
(spark.messages):

- expected: every source record a rule matches (topic exact or re:, never a system
  topic; its tag expression; the target cluster not on its `__ORIGIN_PATH`), from where
  the rule starts (earliest: the queue's start; an ISO time: the first matching record
  stored at or after it, as the worker skips; latest: the first copy the target holds of
  that origin queue, since the position the worker started from is not on disk), and
  ending at or below its broker set's confirm offset (records above it are not yet
  replicable). Several rules sending a record to one target topic expect one copy;
- copies: target records whose `__ORIGIN_CLUSTER` is the source cluster, keyed by their
  origin (cluster, broker set, topic, queue, offset) within their target topic.

Violations, each by name: `missing` (an expected record without a copy), `duplicated`
(an origin record with more than one copy in a target topic), `out_of_order` (along a
target queue, the origin offsets of one origin queue do not strictly increase; judged
over each origin record's first copy, so a duplicate is only a duplicate), `altered`
(body, tags, keys, user properties or message id differ from the source record's),
`orphan` (a copy whose origin record does not exist at the source; copies below the
first offset the source still holds of that queue are counted in a note: retention),
`malformed_origin` (origin properties a broker would refuse), and in mode full
`offset_ahead`, `offset_behind` and `offset_missing` (see _offset_violations).
"""

from __future__ import annotations

import json
import time
from functools import reduce
from pathlib import Path
from typing import Any

from mqmeta.spark.checks import DESCRIPTIONS, SAMPLES_MAX, CheckResult
from mqmeta.spark.messages import CONSUMER_OFFSET_TOPIC, MESSAGE_SCHEMA
from mqmeta.spark.replication_sites import Sites, chosen_specs, load_sites
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from mqmeta.errors import InvalidArgument

SAMPLES_PER_KIND = 5
# Mode full: a group's commit at the source, or a copy at the target, stored less than
# this before the target's offset commit may not have been seen by the worker's sync
# (it lists the source's offsets, asks the target to translate, then commits).
SYNC_SLACK_MS = 3000
OFFSET_NEVER = 2**62  # a start past every queue offset: nothing of that queue is expected
VIOLATION_KINDS = (
    "missing",
    "duplicated",
    "out_of_order",
    "altered",
    "orphan",
    "malformed_origin",
    "offset_ahead",
    "offset_behind",
    "offset_missing",
)
ORIGIN_QUEUE = ["o_broker", "o_topic", "o_queue"]
ORIGIN = [*ORIGIN_QUEUE, "o_offset"]
COMPARED = ("body_digest", "tags", "keys", "props_digest", "msg_id")
RULE_TABLE_SCHEMA = (
    "rule string, topic string, target_topic string, rule_tags array<string>, start string, "
    "start_ms bigint, mode string, rule_groups array<string>"
)


def _messages(spark: Any, specs: list[dict[str, Any]]) -> DataFrame:
    if not specs:
        return spark.createDataFrame([], MESSAGE_SCHEMA)
    return spark.read.format("mqmeta_messages").option("files", json.dumps(specs)).load()


def _confirm(spark: Any, sites: Sites) -> tuple[dict[str, str], dict[str, int]]:
    """Per broker set of either site (one job): the replica that was master last (by its
    confirm.log) and the highest confirm offset a master recorded."""
    from mqmeta.spark.data import AuditData
    from mqmeta.spark.layout import Inventory

    both = Inventory(confirm_logs=sites.source.inventory.confirm_logs + sites.target.inventory.confirm_logs)
    data = AuditData(spark, both)
    rows = (
        data.confirm.filter(F.col("valid") & (F.col("role") == "MASTER"))
        .groupBy("broker_set")
        .agg(F.max_by("replica", "t_ms").alias("master"), F.max("confirm_offset").alias("bound"))
        .collect()
    )
    data.unpersist()
    return {r["broker_set"]: r["master"] for r in rows}, {r["broker_set"]: int(r["bound"]) for r in rows}


class _Frames:
    """The decoded records of both sites (cached) and what X1 derives from them."""

    def __init__(self, spark: Any, sites: Sites, notes: list[str]) -> None:
        self.spark, self.sites, self.notes = spark, sites, notes
        self._cached: list[DataFrame] = []
        self.sizes: dict[str, DataFrame] = {}  # counted with the violations, in the same job
        masters, bounds = _confirm(spark, sites)
        self.bounds = {s: b for s, b in bounds.items() if s.split("/", 1)[0] == sites.source.cluster}
        specs, chosen = chosen_specs(sites.source.inventory, masters)
        self.src = self._keep(
            _messages(spark, specs).withColumn("broker_name", F.split("broker_set", "/").getItem(1))
        )
        t_specs, t_chosen = chosen_specs(sites.target.inventory, masters)
        self.tgt = self._keep(_messages(spark, t_specs))
        notes.append(f"read source replicas {_listing(chosen)}; target replicas {_listing(t_chosen)}")
        unbounded = sorted(set(chosen) - set(self.bounds))
        if unbounded:
            notes.append(f"no master confirm.log line for {', '.join(unbounded)}: every record expected")
        self.copies = self.tgt.filter(F.col("o_cluster") == sites.source.cluster).select(
            F.col("broker_set").alias("t_broker_set"),
            F.col("offset").alias("t_commit"),
            "topic",
            "queue_id",
            "queue_offset",
            "store_ms",
            *ORIGIN,
            *COMPARED,
        )

    def _keep(self, frame: DataFrame) -> DataFrame:
        from pyspark import StorageLevel

        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(frame)
        return frame

    def unpersist(self) -> None:
        for frame in self._cached:
            frame.unpersist()

    def confirmed(self) -> Column:
        """Whether a source record ends at or below its broker set's confirm offset."""
        column: Column = F.lit(True)  # a set without confirm lines: every record
        for broker_set, bound in self.bounds.items():
            column = F.when(
                F.col("broker_set") == broker_set, (F.col("offset") + F.col("length")) <= bound
            ).otherwise(column)
        return column

    def source_by_origin(self) -> DataFrame:
        """Source records keyed as a copy names its origin; their compared fields s_*."""
        return self.src.select(
            F.col("broker_name").alias("o_broker"),
            F.col("topic").alias("o_topic"),
            F.col("queue_id").alias("o_queue"),
            F.col("queue_offset").alias("o_offset"),
            F.col("broker_set").alias("s_broker_set"),
            F.col("offset").alias("s_commit"),
            *[F.col(c).alias(f"s_{c}") for c in COMPARED],
        )


def _listing(chosen: dict[str, str]) -> str:
    return ", ".join(f"{s}: {r}" for s, r in sorted(chosen.items())) or "none"


def _rule_table(frames: _Frames) -> DataFrame:
    """(rule, source topic, target topic, ...) for every source topic a rule matches (a few rows)."""
    sites = frames.sites
    topics = [r["topic"] for r in frames.src.select("topic").distinct().collect()]
    rows = []
    for rule in sites.rules:
        for topic in sorted(topics):
            if not rule.matches_topic(topic):
                continue
            try:
                target_topic = rule.target_topic_of(topic, sites.source.cluster)
            except InvalidArgument as exc:  # the worker cannot copy it either
                frames.notes.append(f"rule {rule.name}: topic {topic} not judged: {exc.message}")
                continue
            start = rule.start if rule.start in ("earliest", "latest") else "time"
            tags = sorted(rule.tags.tags) if rule.tags.tags is not None else None
            groups = sorted(rule.groups.tags) if rule.groups.tags is not None else None
            rows.append((rule.name, topic, target_topic, tags, start, rule.start_ms, rule.mode, groups))
    return frames.spark.createDataFrame(rows, RULE_TABLE_SCHEMA)


def _expected(frames: _Frames, rules: DataFrame) -> DataFrame:
    """The (target topic, origin) of every copy the rules require (see the module docstring)."""
    target_cluster = frames.sites.target.cluster
    matched = (
        frames.src.filter(~F.col("topic").startswith("%"))
        .join(F.broadcast(rules), "topic")
        .filter(F.col("rule_tags").isNull() | F.array_contains("rule_tags", F.col("tags")))
        .filter(~F.array_contains("path", target_cluster))
    )
    per_queue = ["rule", "broker_name", "topic", "queue_id"]
    by_time = (
        matched.filter((F.col("start") == "time") & (F.col("store_ms") >= F.col("start_ms")))
        .groupBy(*per_queue)
        .agg(F.min("queue_offset").alias("from_offset"))
    )
    first_copies = frames.copies.groupBy(F.col("topic").alias("target_topic"), *ORIGIN_QUEUE).agg(
        F.min("o_offset").alias("from_offset")
    )
    by_latest = (
        rules.filter(F.col("start") == "latest")
        .join(first_copies.withColumnRenamed("o_topic", "topic"), ["target_topic", "topic"])
        .select(
            "rule",
            F.col("o_broker").alias("broker_name"),
            "topic",
            F.col("o_queue").alias("queue_id"),
            "from_offset",
        )
    )
    starts = by_time.unionByName(by_latest)
    judged = matched.join(starts, per_queue, "left").withColumn(
        "started",
        (F.col("start") == "earliest")
        | (F.col("queue_offset") >= F.coalesce("from_offset", F.lit(OFFSET_NEVER))),
    )
    frames.sizes["unjudged"] = judged.filter((F.col("start") == "latest") & F.col("from_offset").isNull())
    return (
        judged.filter(F.col("started") & frames.confirmed())
        .select(
            F.col("target_topic").alias("topic"),
            F.col("broker_name").alias("o_broker"),
            F.col("topic").alias("o_topic"),
            F.col("queue_id").alias("o_queue"),
            F.col("queue_offset").alias("o_offset"),
            F.col("broker_set").alias("s_broker_set"),
            F.col("offset").alias("s_commit"),
        )
        .dropDuplicates(["topic", *ORIGIN])
    )


def _copy_violations(frames: _Frames, expected: DataFrame) -> dict[str, DataFrame]:
    copies, source = frames.copies, frames.source_by_origin()
    position = ["t_broker_set", "topic", "queue_id", "queue_offset", "t_commit"]
    missing = expected.join(copies, ["topic", *ORIGIN], "left_anti")
    duplicated = (
        copies.groupBy("topic", *ORIGIN)
        .agg(
            F.count(F.lit(1)).alias("copies"),
            F.sort_array(
                F.collect_list(F.struct("t_broker_set", "queue_id", "queue_offset", "t_commit"))
            ).alias("positions"),
        )
        .filter(F.col("copies") > 1)
    )
    first = Window.partitionBy("topic", *ORIGIN).orderBy("t_broker_set", "queue_id", "queue_offset")
    along = Window.partitionBy("t_broker_set", "topic", "queue_id", *ORIGIN_QUEUE).orderBy("queue_offset")
    out_of_order = (
        copies.withColumn("nth", F.row_number().over(first))
        .filter(F.col("nth") == 1)
        .withColumn("prev_o_offset", F.lag("o_offset").over(along))
        .withColumn("prev_queue_offset", F.lag("queue_offset").over(along))
        .filter(F.col("o_offset") < F.col("prev_o_offset"))
        .select(*position, *ORIGIN, "prev_o_offset", "prev_queue_offset")
    )
    joined = copies.join(source, ORIGIN)
    differing = F.filter(
        F.array(*[F.when(~F.col(c).eqNullSafe(F.col(f"s_{c}")), F.lit(c)) for c in COMPARED]),
        lambda name: name.isNotNull(),
    )
    altered = (
        joined.withColumn("differing", differing)
        .filter(F.size("differing") > 0)
        .select(*position, *ORIGIN, "s_broker_set", "s_commit", "differing")
    )
    return {
        "missing": missing,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "altered": altered,
        **_orphans(frames, copies, source),
    }


def _orphans(frames: _Frames, copies: DataFrame, source: DataFrame) -> dict[str, DataFrame]:
    held = frames.src.groupBy(
        F.col("broker_name").alias("o_broker"),
        F.col("topic").alias("o_topic"),
        F.col("queue_id").alias("o_queue"),
    ).agg(F.min("queue_offset").alias("source_first"))
    unmatched = copies.join(source, ORIGIN, "left_anti").join(held, ORIGIN_QUEUE, "left")
    retained = F.col("source_first").isNull() | (F.col("o_offset") >= F.col("source_first"))
    frames.sizes["retention"] = unmatched.filter(~retained)
    malformed = frames.tgt.filter(F.col("origin_problem").isNotNull()).select(
        F.col("broker_set").alias("t_broker_set"),
        "topic",
        "queue_id",
        "queue_offset",
        F.col("offset").alias("t_commit"),
        "origin_problem",
    )
    orphan = unmatched.filter(retained).select(
        "t_broker_set", "topic", "queue_id", "queue_offset", "t_commit", *ORIGIN, "source_first"
    )
    return {"orphan": orphan, "malformed_origin": malformed}


def _latest_progress(frame: DataFrame, keys: list[str]) -> DataFrame:
    """The latest %CONSUMER_OFFSET% record (highest commit offset) per `keys`."""
    window = Window.partitionBy(*keys).orderBy(F.col("offset").desc())
    return (
        frame.filter((F.col("topic") == CONSUMER_OFFSET_TOPIC) & F.col("c_group").isNotNull())
        .withColumn("nth", F.row_number().over(window))
        .filter(F.col("nth") == 1)
    )


def _offset_violations(frames: _Frames, rules: DataFrame) -> dict[str, DataFrame]:
    """Mode full. Per (rule in mode full, group its `groups` match, origin queue): S is the
    group's latest committed offset at the source, G its latest at the target queue
    holding the copies (committed at target commit offset P, stored at t_P), and the
    translation is the worker's (QueryOrigin translate): one past the copy of the highest
    origin offset below S, else the lowest copy. E translates S through every copy.
    - offset_ahead: G > E (a consumer of the group at the target would skip records the
      source's had not consumed);
    - offset_behind: G is below a copy of an origin offset below S that the target held
      SYNC_SLACK_MS before P, while S was committed SYNC_SLACK_MS before P too (the worker
      had seen both and still committed less: records consumed again beyond those not yet
      replicated);
    - offset_missing: no committed offset at the target although the group has consumed
      (at the source) a record whose copy the target holds."""
    full = rules.filter(F.col("mode") == "full")
    src = _latest_progress(frames.src, ["broker_name", "c_topic", "c_queue", "c_group"]).select(
        F.col("broker_name").alias("o_broker"),
        F.col("c_topic").alias("o_topic"),
        F.col("c_queue").alias("o_queue"),
        F.col("c_group").alias("group"),
        F.col("c_offset").alias("source_offset"),
        F.col("store_ms").alias("t_s"),
    )
    groups = (
        src.join(F.broadcast(full.withColumnRenamed("topic", "o_topic")), "o_topic")
        .filter(F.col("rule_groups").isNull() | F.array_contains("rule_groups", F.col("group")))
        .select(*ORIGIN_QUEUE, "group", "source_offset", "t_s", F.col("target_topic").alias("topic"))
        .dropDuplicates([*ORIGIN_QUEUE, "group", "topic"])
    )
    target = _latest_progress(frames.tgt, ["broker_set", "c_topic", "c_queue", "c_group"]).select(
        F.col("broker_set").alias("t_broker_set"),
        F.col("c_topic").alias("topic"),
        F.col("c_queue").alias("queue_id"),
        F.col("c_group").alias("group"),
        F.col("c_offset").alias("target_offset"),
        F.col("offset").alias("p"),
        F.col("store_ms").alias("t_p"),
    )
    below = F.col("o_offset") < F.col("source_offset")
    seen = (F.col("t_commit") < F.col("p")) & (F.col("store_ms") <= F.col("t_p") - SYNC_SLACK_MS)
    keys = ["t_broker_set", "topic", "queue_id", *ORIGIN_QUEUE, "group", "source_offset", "t_s"]
    judged = (
        groups.join(frames.copies, [*ORIGIN_QUEUE, "topic"])
        .join(target, ["t_broker_set", "topic", "queue_id", "group"], "left")
        .groupBy(*keys, "target_offset", "t_p")
        .agg(
            F.min("queue_offset").alias("lowest"),
            F.max(F.when(below, F.col("queue_offset"))).alias("below"),
            F.sum(F.when(below & seen & (F.col("queue_offset") >= F.col("target_offset")), 1)).alias("stale"),
        )
        .withColumn("translated", F.coalesce(F.col("below") + 1, F.col("lowest")))
    )
    shown = [*keys, "target_offset", "translated"]
    return {
        "offset_ahead": judged.filter(F.col("target_offset") > F.col("translated")).select(*shown),
        "offset_behind": judged.filter(
            (F.col("stale") > 0) & (F.col("t_s") <= F.col("t_p") - SYNC_SLACK_MS)
        ).select(*shown),
        "offset_missing": judged.filter(F.col("target_offset").isNull() & F.col("below").isNotNull()).select(
            *shown
        ),
    }


def _gather(
    frames: dict[str, DataFrame], sizes: dict[str, DataFrame]
) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Per violation kind its count and at most SAMPLES_PER_KIND samples, and the count of
    each frame of `sizes`, in one Spark job (each job re-plans the Python data sources)."""
    parts = [
        frame.select(F.lit(kind).alias("kind"), F.to_json(F.struct(*frame.columns)).alias("detail"))
        for kind, frame in frames.items()
    ]
    parts += [
        frame.agg(F.count(F.lit(1)).cast("string").alias("detail")).select(
            F.lit(f"#{name}").alias("kind"), "detail"
        )
        for name, frame in sizes.items()
    ]
    window = Window.partitionBy("kind")
    rows = (
        reduce(DataFrame.unionByName, parts)
        .withColumn("found", F.count(F.lit(1)).over(window))
        .withColumn("nth", F.row_number().over(window.orderBy("detail")))
        .filter(F.col("nth") <= SAMPLES_PER_KIND)
        .collect()
    )
    counts = {kind: 0 for kind in VIOLATION_KINDS}
    samples: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: (r["kind"], r["nth"])):
        if row["kind"].startswith("#"):
            totals[row["kind"][1:]] = int(row["detail"])
            continue
        counts[row["kind"]] = int(row["found"])
        samples.setdefault(row["kind"], []).append(json.loads(row["detail"]))
    return counts, samples, totals


def check_x1(spark: Any, sites: Sites) -> tuple[CheckResult, dict[str, list[dict[str, Any]]], dict[str, int]]:
    """X1's result, its samples by violation kind, and how many copies were expected and found."""
    notes = list(sites.notes)
    frames = _Frames(spark, sites, notes)
    try:
        rules = F.broadcast(_rule_table(frames))
        expected = _expected(frames, rules)
        found = _copy_violations(frames, expected)
        full_rules = [r.name for r in sites.rules if r.mode == "full"]
        if full_rules:
            found.update(_offset_violations(frames, rules))
        frames.sizes.update(source=frames.src, target=frames.tgt, expected=expected, copies=frames.copies)
        counts, samples, sizes = _gather(found, frames.sizes)
    finally:
        frames.unpersist()
    notes.append(
        f"{sizes['expected']} source records expected at the target, {sizes['copies']} copies found; "
        f"rules {', '.join(r.name for r in sites.rules)}"
        + (f" (offsets checked for mode full: {', '.join(full_rules)})" if full_rules else "")
    )
    if sizes.get("unjudged"):
        notes.append(
            f"{sizes['unjudged']} matching source records of queues without a copy at the target not "
            "judged (start = latest: where the worker started is not on disk)"
        )
    if sizes.get("retention"):
        notes.append(
            f"{sizes['retention']} copies of origin offsets below what the source still holds (retention)"
        )
    examined = sizes["source"] + sizes["target"]
    sizes = {"expected": sizes["expected"], "copies": sizes["copies"]}
    flat = [{"kind": kind, **s} for kind in VIOLATION_KINDS for s in samples.get(kind, [])][:SAMPLES_MAX]
    total = sum(counts.values())
    result = CheckResult("X1", DESCRIPTIONS["X1"], total == 0, examined, total, flat, notes, kinds=counts)
    return result, samples, sizes


def audit_replication(
    spark: Any, source_dir: str | Path, target_dir: str | Path, rules_path: str | Path, report_dir: str | Path
) -> dict[str, Any]:
    """X1 over a source and a target cluster's data dirs and the replicator's rules file, in
    `spark`'s session; writes report_dir/report.json and report.html (the audit's format)
    and returns {"ok", "violations": {kind: count}, "samples": {kind: [...]}, "notes",
    "rows_examined", "expected", "copies", "report"}. Raises spark.errors.BadInput (an InvalidArgument, one
    sentence) when the dirs or the rules file do not fit."""
    from mqmeta.spark.report import build_document, write_report

    started = time.monotonic()
    sites = load_sites(str(source_dir), str(target_dir), Path(rules_path))
    result, samples, sizes = check_x1(spark, sites)
    found = (
        f"source cluster {sites.source.cluster} ({sites.source.inventory.summary()}); "
        f"target cluster {sites.target.cluster} ({sites.target.inventory.summary()})"
    )
    document = build_document([result], [str(source_dir), str(target_dir)], found, time.monotonic() - started)
    write_report(Path(report_dir), document, None)
    return {
        "ok": result.passed,
        "violations": dict(result.kinds or {}),
        "samples": samples,
        "notes": result.notes,
        "rows_examined": result.rows_examined,
        **sizes,
        "report": str(Path(report_dir) / "report.json"),
    }
