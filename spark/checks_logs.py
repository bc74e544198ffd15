"""B1-B4 (broker replicas) and T1-T4 (tiered storage) as DataFrame computations.

Torn tails (decided here, documented in docs/audit.md): a broker's recovery cuts a bad
record that no valid record follows in its last segment (a crash interrupted the
append; the bytes may be short, zero-filled or half-written). So B3 flags invalid
bytes anywhere except past a replica's last valid record in its last segment; those
are counted in a note. Everything before the replica's last valid record end is
flagged, whether it fails its CRC or stops short.
"""

from __future__ import annotations

from typing import Any

from mqmeta.spark.checks import DESCRIPTIONS, SAMPLES_MAX, CheckResult, _result, _samples
from mqmeta.spark.data import AuditData
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

CHUNK_BYTES = 1 << 20  # B1's unit of comparison by fingerprint
_SAMPLE_COLUMNS = ["broker_set", "replica", "file", "offset", "length", "crc_valid", "truncated"]


def _end() -> Column:
    return F.col("offset") + F.col("length")


def chunk_table(data: AuditData) -> DataFrame:
    """The one pass over every replica record that B1-B3 make: per (segment file, chunk of
    CHUNK_BYTES offsets), a few rows per MiB of log, cached:

    - what the file spans need: records, bytes, where the last valid record ends, the
      first corrupt and truncated pieces, how many pieces are invalid;
    - B1's fingerprint of the records below the confirm offset: their count, the XOR and
      the sum of the 64-bit hashes of their (offset, length, digest), and the offsets
      they cover (lo, hi).
    """
    if "chunks" not in data.derived:
        below = _end() <= _bound_column(confirm_bounds(data))
        invalid = ~F.col("crc_valid")
        row_hash = F.xxhash64("offset", "length", "record_digest")
        table = (
            data.records.withColumn("chunk", F.floor(F.col("offset") / CHUNK_BYTES))
            .groupBy("broker_set", "replica", "file", "file_base", "last_file", "chunk")
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.sum("length").alias("bytes"),
                F.max(F.when(F.col("crc_valid"), _end())).alias("valid_end"),
                F.max(_end()).alias("end"),
                F.min(F.when(invalid & ~F.col("truncated"), F.col("offset"))).alias("corrupt_at"),
                F.min(F.when(F.col("truncated"), F.col("offset"))).alias("truncated_at"),
                F.sum(F.when(invalid, 1).otherwise(0)).alias("invalid"),
                F.sum(F.when(below, 1).otherwise(0)).alias("fp_n"),
                F.bit_xor(F.when(below, row_hash)).alias("fp_x"),
                # each term < 2**31, so no overflow below 2**32 records per chunk
                F.sum(F.when(below, row_hash.bitwiseAND(F.lit(0x7FFFFFFF)))).alias("fp_s"),
                F.min(F.when(below, F.col("offset"))).alias("fp_lo"),
                F.max(F.when(below, _end())).alias("fp_hi"),
            )
        )
        data.derived["chunks"] = data.keep(table)
    return data.derived["chunks"]


def file_spans(data: AuditData) -> DataFrame:
    """Per segment file: its records, bytes, valid end, first corrupt / truncated piece."""
    if "files" not in data.derived:
        spans = (
            chunk_table(data)
            .groupBy("broker_set", "replica", "file", "file_base", "last_file")
            .agg(
                F.sum("rows").alias("rows"),
                F.sum("bytes").alias("bytes"),
                F.max("valid_end").alias("valid_end"),
                F.max("end").alias("end"),
                F.min("corrupt_at").alias("corrupt_at"),
                F.min("truncated_at").alias("truncated_at"),
                F.sum("invalid").alias("invalid"),
            )
        )
        data.derived["files"] = data.keep(spans)
    return data.derived["files"]


def _files_with_invalid(data: AuditData) -> set[tuple[str, str, str]]:
    rows = file_spans(data).filter(F.col("invalid") > 0).select("broker_set", "replica", "file").collect()
    return {(r["broker_set"], r["replica"], r["file"]) for r in rows}


def _replica_spans(data: AuditData) -> DataFrame:
    """Per replica: the first offset it holds (retention may have cut the start), where its
    last valid record ends, and where its bytes end (past valid_end: a torn tail)."""
    return (
        file_spans(data)
        .groupBy("broker_set", "replica")
        .agg(
            F.min("file_base").alias("min_offset"),
            F.max("valid_end").alias("valid_end"),
            F.max("end").alias("end"),
        )
    )


def record_count(data: AuditData) -> int:
    """Rows of `data.records` (from the file spans, without another pass)."""
    return _total(file_spans(data), "rows")


def _total(frame: DataFrame, column: str) -> int:
    """The sum of `column` over a (small) frame; 0 when it has no rows."""
    row = frame.agg(F.sum(column)).first()
    return int(row[0] or 0) if row is not None else 0


def replica_ranges(data: AuditData) -> list[dict[str, Any]]:
    """_replica_spans on the driver (a few rows)."""
    return [row.asDict() for row in _replica_spans(data).collect()]


def confirm_bounds(data: AuditData) -> dict[str, int]:
    """Per broker set, the highest confirm offset any master recorded (a few rows)."""
    rows = (
        data.confirm.filter(F.col("valid") & (F.col("role") == "MASTER"))
        .groupBy("broker_set")
        .agg(F.max("confirm_offset").alias("bound"))
        .collect()
    )
    return {row["broker_set"]: int(row["bound"]) for row in rows}


def _holders(ranges: list[dict[str, Any]], offset: Column, end: Column) -> Column:
    """How many replicas of the row's broker set hold [offset, end) (valid records there)."""
    total: Column = F.lit(0)
    for item in ranges:
        holds = (
            (F.col("broker_set") == item["broker_set"])
            & (offset >= item["min_offset"])
            & (end <= F.lit(item["valid_end"] or 0))
        )
        total = total + F.when(holds, 1).otherwise(0)
    return total


def _bound_column(bounds: dict[str, int]) -> Column:
    column: Column = F.lit(-1)
    for broker_set, bound in bounds.items():
        column = F.when(F.col("broker_set") == broker_set, F.lit(bound)).otherwise(column)
    return column


def _details(records: DataFrame, keys: DataFrame) -> DataFrame:
    """The records at the sampled (broker set, offset) keys, for the report."""
    return records.join(F.broadcast(keys.select("broker_set", "offset")), ["broker_set", "offset"]).select(
        *_SAMPLE_COLUMNS, F.col("record_digest").alias("digest")
    )


def check_b1(data: AuditData) -> CheckResult:
    """Replicas compared chunk by chunk by their fingerprints (chunk_table). A chunk is
    clean when every replica holding records of it below the confirm offset has the same
    fingerprint and they are at least as many as the replicas whose ranges reach into it
    (each of those must hold each record in it, see _holders). Only the other chunks'
    records are compared record by record, so the cost of B1 is one aggregation, not a
    shuffle of every record."""
    bounds = confirm_bounds(data)
    notes = [f"{s}: compared below confirm offset {b}" for s, b in sorted(bounds.items())]
    if not bounds:
        notes.append("no confirm log found: nothing is known to be confirmed, B1 compared nothing")
    ranges = replica_ranges(data)
    per_replica = (
        chunk_table(data)
        .filter(F.col("fp_n") > 0)
        .groupBy("broker_set", "chunk", "replica")
        .agg(
            F.sum("fp_n").alias("n"),
            F.bit_xor("fp_x").alias("x"),
            F.sum("fp_s").alias("s"),
            F.min("fp_lo").alias("lo"),
            F.max("fp_hi").alias("hi"),
        )
    )
    per_chunk = per_replica.groupBy("broker_set", "chunk").agg(
        F.count(F.lit(1)).alias("k"),
        F.sum("n").alias("rows"),
        F.min("lo").alias("lo"),
        F.max("hi").alias("hi"),
        *[F.min(c).alias(f"{c}_min") for c in "nxs"],
        *[F.max(c).alias(f"{c}_max") for c in "nxs"],
    )
    # An upper bound of _holders over the chunk's records: the replicas whose ranges reach
    # into [lo, hi) (a record [o, e) there has o <= hi - 1 and e >= lo + 1).
    reaching = _holders(ranges, F.col("hi") - 1, F.col("lo") + 1)
    clean = (
        (F.col("n_min") == F.col("n_max"))
        & (F.col("x_min") == F.col("x_max"))
        & (F.col("s_min") == F.col("s_max"))
        & (reaching <= F.col("k"))
    )
    per_chunk = per_chunk.withColumn("clean", clean).persist()
    examined, chunks = _total(per_chunk, "rows"), per_chunk.count()
    suspect = [(r["broker_set"], int(r["chunk"])) for r in per_chunk.filter(~F.col("clean")).collect()]
    per_chunk.unpersist()
    found, samples = _compare_records(data, ranges, bounds, suspect) if suspect else (0, [])
    notes.append(
        f"{chunks - len(suspect)} of {chunks} chunks of "
        f"{CHUNK_BYTES >> 20} MiB agreed by fingerprint; {len(suspect)} compared record by record"
    )
    bad_lines = _bad_confirm_lines(data)
    line_count = bad_lines.count()
    if line_count and len(samples) < SAMPLES_MAX:
        samples += _samples(bad_lines)[: SAMPLES_MAX - len(samples)]
    count = found + line_count
    return CheckResult("B1", DESCRIPTIONS["B1"], count == 0, examined, count, samples, notes)


def _compare_records(
    data: AuditData, ranges: list[dict[str, Any]], bounds: dict[str, int], suspect: list[tuple[str, int]]
) -> tuple[int, list[dict[str, Any]]]:
    """B1 record by record in the suspect chunks: the offsets where the replicas holding a
    record disagree on its bytes, or fewer hold it than their ranges say must."""
    keys = data.spark.createDataFrame(suspect, "broker_set string, chunk bigint")
    files = chunk_table(data).join(F.broadcast(keys), ["broker_set", "chunk"])
    records = data.records_in(
        {(r[0], r[1], r[2]) for r in files.select("broker_set", "replica", "file").distinct().collect()}
    )
    below = (
        records.filter(_end() <= _bound_column(bounds))
        .withColumn("chunk", F.floor(F.col("offset") / CHUNK_BYTES))
        .join(F.broadcast(keys), ["broker_set", "chunk"])
    )
    grouped = below.groupBy("broker_set", "offset").agg(
        F.count(F.lit(1)).alias("holders"),
        F.min("record_digest").alias("d_min"),
        F.max("record_digest").alias("d_max"),
        F.max("length").alias("length"),
        F.min("length").alias("l_min"),
    )
    bad = grouped.filter(
        (F.col("d_min") != F.col("d_max"))
        | (F.col("l_min") != F.col("length"))
        | (F.col("holders") < _holders(ranges, F.col("offset"), _end()))
    )
    found = bad.count()
    samples: list[dict[str, Any]] = []
    if found:
        sampled = bad.orderBy("broker_set", "offset").limit(SAMPLES_MAX)
        rows = _details(records, sampled).orderBy("offset").limit(SAMPLES_MAX).collect()
        samples = [r.asDict() for r in rows]
    return found, samples


def _bad_confirm_lines(data: AuditData) -> DataFrame:
    """Bad confirm.log lines (not a torn last line): violations of B1."""
    return data.confirm.filter(~F.col("valid") & ~F.col("torn_tail")).select(
        F.col("node").alias("replica"), "file", "line_no", "byte_offset", "problem"
    )


def check_b2(data: AuditData) -> CheckResult:
    spans = file_spans(data)
    window = Window.partitionBy("broker_set", "replica").orderBy("file_base")
    spans = spans.withColumn("prev_end", F.lag(F.col("file_base") + F.col("bytes")).over(window))
    between = spans.filter(F.col("prev_end").isNotNull() & (F.col("file_base") != F.col("prev_end"))).select(
        F.when(F.col("file_base") > F.col("prev_end"), "gap").otherwise("overlap").alias("kind"),
        "broker_set",
        "replica",
        "file",
        F.col("file_base").alias("offset"),
        "prev_end",
    )
    # Bytes that frame no record before a valid record (or in a segment another follows):
    # a hole in the offsets. A framed record with a bad checksum is B3's alone.
    holes = (
        _not_torn(data.records_in(_files_with_invalid(data)), spans)
        .filter(~F.col("framed"))
        .select(F.lit("no whole record").alias("kind"), "broker_set", "replica", "file", "offset", "length")
    )
    return _result("B2", spans.count(), [between, holes])


def _not_torn(records: DataFrame, spans: DataFrame) -> DataFrame:
    """Invalid pieces, except those past the last valid record of a replica's last segment:
    that torn tail is what a crash leaves and the broker cuts at restart."""
    ends = spans.select("broker_set", "replica", "file", F.col("valid_end").alias("file_valid_end"))
    return (
        records.filter(~F.col("crc_valid"))
        .join(ends, ["broker_set", "replica", "file"])
        .filter(~F.col("last_file") | (F.col("offset") < F.coalesce("file_valid_end", F.lit(-1))))
    )


def check_b3(data: AuditData) -> CheckResult:
    bad = _not_torn(data.records_in(_files_with_invalid(data)), file_spans(data))
    columns = _SAMPLE_COLUMNS + (["problem"] if data.detail else [])
    result = _result("B3", record_count(data), [bad.select(*columns)])
    invalid = _total(file_spans(data), "invalid")
    torn = invalid - result.violation_count
    if torn:
        result.notes.append(
            f"{torn} torn tail piece(s) past a replica's last valid record ignored "
            "(the broker cuts them at restart)"
        )
    return result


def _epoch_intervals(epochs: DataFrame) -> DataFrame:
    window = Window.partitionBy("broker_set", "replica").orderBy("position")
    return (
        epochs.filter(F.col("problem").isNull())
        .withColumn("prev_epoch", F.lag("epoch").over(window))
        .withColumn("prev_start", F.lag("start_offset").over(window))
        .withColumn("next_start", F.lead("start_offset").over(window))
    )


def _entry_violations(frame: DataFrame, kind: str, *extra: str) -> DataFrame:
    """B4's violation rows: which epoch-file entry, and why."""
    columns = ["broker_set", "replica", "file", "position", "epoch", "start_offset", *extra]
    return frame.select(F.lit(kind).alias("kind"), *columns)


def check_b4(data: AuditData) -> CheckResult:
    entries = _epoch_intervals(data.epochs)
    unreadable = data.epochs.filter(F.col("problem").isNotNull()).select(
        F.lit("unreadable").alias("kind"), "broker_set", "replica", "file", "position", "problem"
    )
    disorder = entries.filter(
        (F.col("epoch") <= F.col("prev_epoch")) | (F.col("start_offset") < F.col("prev_start"))
    )
    disorder = _entry_violations(disorder, "order", "prev_epoch", "prev_start")
    spans = _replica_spans(data)
    starts = data.records.filter("crc_valid").select(
        "broker_set", "replica", F.col("offset").alias("start_offset")
    )
    inside = entries.join(spans, ["broker_set", "replica"]).filter(
        (F.col("start_offset") >= F.col("min_offset"))
        & (F.col("start_offset") < F.coalesce("valid_end", F.lit(0)))
    )
    not_boundary = _entry_violations(
        inside.join(starts, ["broker_set", "replica", "start_offset"], "left_anti"), "not a record start"
    )
    beyond = _entry_violations(
        entries.join(spans, ["broker_set", "replica"]).filter(F.col("start_offset") > F.col("end")),
        "past the log end",
    )
    return _result(
        "B4",
        data.epochs.count() + record_count(data),
        [unreadable, disorder, not_boundary, beyond, _record_epochs(data, entries)],
    )


def _record_epochs(data: AuditData, entries: DataFrame) -> DataFrame:
    """Each valid record's epoch field must be the epoch of the entry covering its offset."""
    intervals = F.broadcast(
        entries.select(
            "broker_set", "replica", F.col("epoch").alias("entry_epoch"), "start_offset", "next_start"
        )
    )
    records = data.records.filter("crc_valid").select("broker_set", "replica", "file", "offset", "epoch")
    joined = records.join(
        intervals,
        (records["broker_set"] == intervals["broker_set"])
        & (records["replica"] == intervals["replica"])
        & (records["offset"] >= intervals["start_offset"])
        & (intervals["next_start"].isNull() | (records["offset"] < intervals["next_start"])),
        "left",
    )
    return joined.filter(F.col("entry_epoch").isNull() | (F.col("entry_epoch") != F.col("epoch"))).select(
        F.lit("record epoch").alias("kind"),
        records["broker_set"],
        records["replica"],
        "file",
        "offset",
        "epoch",
        "entry_epoch",
    )


# Tiered storage --------------------------------------------------------------------------------
def committed_segments(data: AuditData) -> DataFrame:
    """Each committed segment once (nodes that disagree are R1's business)."""
    return (
        data.segments.filter("valid")
        .groupBy("broker_set", "key", "base_offset", "end_offset")
        .agg(F.min("commit_epoch").alias("commit_epoch"), F.min("index").alias("index"))
    )


def check_t1(data: AuditData) -> CheckResult:
    segments = committed_segments(data)
    masters = data.confirm.filter(F.col("valid") & (F.col("role") == "MASTER")).select(
        F.col("broker_set").alias("c_set"),
        F.col("epoch").alias("c_epoch"),
        "confirm_offset",
        F.col("replica").alias("c_replica"),
    )
    with_sets = {
        row["broker_set"] for row in masters.select(F.col("c_set").alias("broker_set")).distinct().collect()
    }
    checkable = segments.filter(F.col("broker_set").isin(sorted(with_sets)) if with_sets else F.lit(False))
    allowed = (
        checkable.join(
            masters,
            (checkable["broker_set"] == masters["c_set"]) & (masters["c_epoch"] <= checkable["commit_epoch"]),
            "left",
        )
        .groupBy("broker_set", "key", "base_offset", "end_offset", "commit_epoch", "index")
        .agg(F.max("confirm_offset").alias("confirm_offset"))
    )
    bad = allowed.filter(F.col("confirm_offset").isNull() | (F.col("end_offset") > F.col("confirm_offset")))
    skipped = segments.count() - checkable.count()
    notes = (
        [f"{skipped} committed segment(s) of broker sets without a master confirm log not checked"]
        if skipped
        else []
    )
    return _result(
        "T1",
        segments.count(),
        [
            bad.select(
                F.col("key").alias("file"),
                "broker_set",
                "base_offset",
                "end_offset",
                "commit_epoch",
                "confirm_offset",
                "index",
            )
        ],
        notes,
    )


def _committed_tiered_records(data: AuditData) -> DataFrame:
    file_end = F.regexp_extract("file", r"-(\d{20})\.seg$", 1).cast("bigint")
    segments = committed_segments(data).select(
        "broker_set", F.col("base_offset").alias("file_base"), F.col("end_offset").alias("file_end")
    )
    return data.tiered.withColumn("file_end", file_end).join(
        F.broadcast(segments), ["broker_set", "file_base", "file_end"]
    )


def check_t2(data: AuditData) -> CheckResult:
    tiered = _committed_tiered_records(data)
    ranges = replica_ranges(data)
    replicas = data.records.select(
        "broker_set",
        "offset",
        F.col("record_digest").alias("r_digest"),
        F.col("length").alias("r_length"),
        F.col("replica").alias("r_replica"),
    )
    differs = (F.col("r_digest") != F.col("record_digest")) | (F.col("r_length") != F.col("length"))
    compared = (
        tiered.join(replicas, ["broker_set", "offset"], "left")
        .groupBy("broker_set", "file", "offset", "length", "crc_valid")
        .agg(
            F.count("r_replica").alias("matches"),
            F.sort_array(F.collect_list(F.when(differs, F.col("r_replica")))).alias("differing_replicas"),
        )
    )
    expected = _holders(ranges, F.col("offset"), F.col("offset") + F.col("length"))
    bad = compared.filter(
        ~F.col("crc_valid") | (F.size("differing_replicas") > 0) | (F.col("matches") < expected)
    )
    return _result("T2", tiered.count(), [bad.withColumn("replicas_holding", expected)])


def check_t3(data: AuditData) -> CheckResult:
    segments = committed_segments(data)
    window = Window.partitionBy("broker_set").orderBy("base_offset", "end_offset")
    ordered = segments.withColumn("prev_end", F.lag("end_offset").over(window))
    tiling = ordered.filter(F.coalesce("prev_end", F.lit(0)) != F.col("base_offset")).select(
        F.when(F.col("base_offset") > F.coalesce("prev_end", F.lit(0)), "gap")
        .otherwise("overlap")
        .alias("kind"),
        "broker_set",
        F.col("key").alias("file"),
        "base_offset",
        "end_offset",
        "prev_end",
    )
    files = data.inventory.tiered_segments
    stored = data.spark.createDataFrame(
        [(f["broker_set"], f["base_offset"], f["base_offset"] + f["size"]) for f in files],
        "broker_set string, base_offset bigint, stored_end bigint",
    )
    missing = segments.join(
        stored.withColumnRenamed("stored_end", "end_offset"),
        ["broker_set", "base_offset", "end_offset"],
        "left_anti",
    ).select(
        F.lit("object missing or wrong size").alias("kind"),
        "broker_set",
        F.col("key").alias("file"),
        "base_offset",
        "end_offset",
    )
    return _result("T3", segments.count(), [tiling, missing])


def check_t4(data: AuditData) -> CheckResult:
    window = Window.partitionBy("node", "key").orderBy("index")
    tiered = (
        data.effects.filter(F.col("valid") & F.col("key").startswith("tiered/"))
        .withColumn("prev_uploaded", F.lag("uploaded_offset").over(window))
        .withColumn("prev_checkpoint_epoch", F.lag("checkpoint_epoch").over(window))
    )
    backwards = tiered.filter(
        (F.col("uploaded_offset") < F.col("prev_uploaded"))
        | (F.col("checkpoint_epoch") < F.col("prev_checkpoint_epoch"))
    ).select(
        F.lit("backwards").alias("kind"),
        "node",
        "file",
        "index",
        "broker_set",
        "uploaded_offset",
        "prev_uploaded",
        "checkpoint_epoch",
        "prev_checkpoint_epoch",
    )
    commits = tiered.filter(F.col("uploaded_offset") > F.coalesce("prev_uploaded", F.lit(0))).select(
        "node", "file", "index", "broker_set", "checkpoint_epoch"
    )
    masters = data.effects.filter(F.col("valid") & F.col("key").startswith("brokerset/")).select(
        F.col("node").alias("m_node"),
        F.col("broker_set").alias("m_set"),
        F.col("index").alias("m_index"),
        "master_epoch",
    )
    in_force = (
        commits.join(
            masters,
            (commits["node"] == masters["m_node"])
            & (commits["broker_set"] == masters["m_set"])
            & (masters["m_index"] <= commits["index"]),
            "left",
        )
        .groupBy("node", "file", "index", "broker_set", "checkpoint_epoch")
        .agg(
            F.max(F.when(F.col("m_index") < F.col("index"), F.col("master_epoch"))).alias("epoch_before"),
            F.max(F.when(F.col("m_index") == F.col("index"), F.col("master_epoch"))).alias("epoch_after"),
        )
    )
    wrong = in_force.filter(
        ~F.coalesce(F.col("checkpoint_epoch") == F.col("epoch_before"), F.lit(False))
        & ~F.coalesce(F.col("checkpoint_epoch") == F.col("epoch_after"), F.lit(False))
    )
    return _result(
        "T4", tiered.count(), [backwards, wrong.select(F.lit("epoch not in force").alias("kind"), "*")]
    )


def check_h1(data: AuditData) -> CheckResult:
    """Every enqueue a chaos history acknowledged (SUCCESS) is a checksum-valid record of
    some replica or of a committed tiered segment: the body the queue workload sends is
    `value|sharding key|request ms` (chaos.workloads), matched by its SHA-256."""
    if not data.inventory.histories:
        return _result("H1", 0, [], ["no chaos history.tsv in the inputs: nothing to check"])
    if not data.detail:
        return _result("H1", 0, [], ["records read without body digests (lean mode): H1 compared nothing"])
    history = data.history
    enqueue = F.col("f1") == "enqueue"
    requests = history.filter(enqueue & (F.col("f2") == "REQUEST")).select(
        "file",
        F.col("f0").alias("client"),
        F.col("f3").alias("value"),
        F.col("f4").alias("key"),
        F.col("f5").alias("sent_ms"),
    )
    acked = history.filter(enqueue & (F.col("f2") == "RESPONSE") & (F.col("f3") == "SUCCESS")).select(
        "file", F.col("f0").alias("client"), F.col("f4").alias("value")
    )
    bodies = acked.join(requests, ["file", "client", "value"], "left").withColumn(
        "body_digest", F.sha2(F.concat_ws("|", "value", "key", "sent_ms"), 256)
    )
    stored = (
        data.records.filter("crc_valid")
        .select("body_digest")
        .unionByName(_committed_tiered_records(data).filter("crc_valid").select("body_digest"))
    )
    missing = bodies.join(stored, ["body_digest"], "left_anti").select(
        F.lit("acknowledged, in no log").alias("kind"), "file", "client", "value", "key", "sent_ms"
    )
    return _result("H1", acked.count(), [missing])
