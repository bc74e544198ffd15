#!/usr/bin/env python
"""Benchmark of the Spark audit's replica checks (B1-B3) against a pure-Python baseline.

    .venv/bin/python -m bench.audit_bench [--quick] [--sizes 1000000,10000000] [--keep]

Prints ONE JSON document on stdout; progress goes to stderr. For each size N:

generate  a real MessageStore (broker_agent.store, fsync off) of one broker set's first
          replica, filled with N messages (48-byte bodies, 8 queues, put_messages in
          batches of 1024, epoch 1, 16 MiB segments), so records are exactly what a
          broker writes. Replicas 2 and 3 are byte copies of replica 1 (what B1 expects
          of healthy replicas below the confirm offset) - the audit reads all three, so
          3 N records. A confirm.log with one MASTER line (confirm offset = the log's
          end), written with the real line checksum, lets B1 compare everything.
spark     `mqmeta audit --checks B1-B3` internals with a local[2] session, started and
          warmed (one audit of a 20k-record set: JVM JIT, Python workers) before the
          timing; both are reported apart. Timed from discovery to the last check's
          result: every record is read once through the Python data source (numpy
          columns, no per-record Python but the walk) into the per-(file, MiB chunk)
          table, B1 compares chunk fingerprints (and record by record only suspect
          chunks: none here), B2/B3 read again only files with invalid pieces (none).
baseline  the same checks in one process of pure Python, streaming: each replica's
          segments walked with the same deterministic walk (spark.walk: CRC-32 per
          record, the same record digest, spark.walk.piece_digest), B2 from segment
          continuity and unframed bytes, B3 from invalid pieces, B1 by merging the three
          replicas' (offset, length, digest) streams in offset order (heapq.merge), so
          memory stays flat at 10 M.
Reported per size: seconds and records audited per second of both, the ratio
(spark rate / baseline rate), and time growth from the smallest to the largest size
for both (10x the data: near-linear = ~10x the time).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mqmeta.broker_agent.store import MessageStore  # noqa: E402
from mqmeta.spark.walk import Piece, piece_digest, walk  # noqa: E402

from bench import benchlib  # noqa: E402
from mqmeta.formats.jsonlines import line_crc  # noqa: E402
from mqmeta.formats.records import Message  # noqa: E402

log = benchlib.make_log("audit-bench")
SEGMENT_BYTES = 16 << 20
BATCH = 1024
WARM_UP_RECORDS = 20_000


def generate(root: Path, count: int) -> Path:
    """root/brokers/broker-a-{1,2,3} of `count` records each; returns root."""
    first = root / "brokers" / "broker-a-1"
    store = MessageStore(first / "store", segment_bytes=SEGMENT_BYTES, fsync=False, broker_name="broker-a")
    store.begin_epoch(1)
    now_ms = 1_800_000_000_000
    written = 0
    while written < count:
        size = min(BATCH, count - written)
        store.put_messages(
            [Message("Orders", (written + i) % 8, b"%040d-payload" % (written + i)) for i in range(size)],
            1,
            now_ms,
        )
        written += size
    end = store.log.max_offset
    store.close()
    line: dict[str, Any] = {
        "t_ms": now_ms,
        "broker_name": "broker-a",
        "broker_id": 1,
        "role": "MASTER",
        "epoch": 1,
        "confirm_offset": end,
        "max_offset": end,
        "acked": {"2": end, "3": end},
    }
    line["crc32"] = line_crc(line)
    (first / "confirm.log").write_text(json.dumps(line) + "\n")
    (first / "identity.json").write_text(
        json.dumps(
            {"broker_id": 1, "cluster": "DefaultCluster", "broker_name": "broker-a", "check_code": "bench"}
        )
    )
    for replica in (2, 3):
        target = root / "brokers" / f"broker-a-{replica}"
        shutil.copytree(first / "store", target / "store")
        (target / "identity.json").write_text(
            json.dumps(
                {
                    "broker_id": replica,
                    "cluster": "DefaultCluster",
                    "broker_name": "broker-a",
                    "check_code": "bench",
                }
            )
        )
    return root


# The pure-Python baseline --------------------------------------------------------------------------
def _replica_stream(commitlog: Path, problems: dict[str, int]) -> Iterator[tuple[int, int, int]]:
    files = sorted(commitlog.glob("*.log"))
    expected = None
    for i, path in enumerate(files):
        base = int(path.stem)
        if expected is not None and base != expected:
            problems["B2"] += 1
        data = path.read_bytes()
        last = i == len(files) - 1
        pieces: Iterable[Piece] = list(walk(data, base)) if last else walk(data, base)
        torn_from = len(data)  # the last segment: a bad tail past the last valid record is cut
        if last:
            torn_from = max((p.pos + p.length for p in pieces if p.status == "ok"), default=0)
        for piece in pieces:
            if piece.status != "ok" and piece.pos < torn_from:
                problems["B3"] += 1
                problems["B2"] += piece.status != "corrupt"  # Spark's B2: bytes that frame no record
            yield base + piece.pos, piece.length, piece_digest(data, piece)
        expected = base + len(data)


def baseline(root: Path, confirm_offset: int) -> dict[str, Any]:
    problems = {"B1": 0, "B2": 0, "B3": 0}
    replicas = sorted((root / "brokers").iterdir())
    streams = [_replica_stream(r / "store" / "commitlog", problems) for r in replicas]
    records = 0
    group: list[tuple[int, int, int]] = []
    for item in heapq.merge(*streams):
        records += 1
        if group and item[0] != group[0][0]:
            _compare(group, len(replicas), confirm_offset, problems)
            group = []
        group.append(item)
    if group:
        _compare(group, len(replicas), confirm_offset, problems)
    return {"records": records, "violations": problems}


def _compare(
    group: list[tuple[int, int, int]], replicas: int, confirm_offset: int, problems: dict[str, int]
) -> None:
    offset, length, _ = group[0]
    if offset + length > confirm_offset:
        return
    if len(group) != replicas or len({(g[1], g[2]) for g in group}) != 1:
        problems["B1"] += 1


# The Spark audit -----------------------------------------------------------------------------------
def spark_audit(root: Path) -> dict[str, Any]:
    from mqmeta.spark import checks_logs
    from mqmeta.spark.data import AuditData
    from mqmeta.spark.layout import discover
    from mqmeta.spark.session import get_session

    spark = get_session()
    started = time.monotonic()
    inventory = discover([str(root)])
    data = AuditData(spark, inventory, detail=False)
    results, check_s = [], {}
    for check in (checks_logs.check_b1, checks_logs.check_b2, checks_logs.check_b3):
        began = time.monotonic()
        results.append(check(data))
        check_s[results[-1].id] = round(time.monotonic() - began, 2)
    elapsed = time.monotonic() - started
    data.unpersist()
    return {
        "elapsed_s": elapsed,
        "check_s": check_s,
        "records": results[2].rows_examined,
        "violations": {r.id: r.violation_count for r in results},
        "partitions": len(inventory.segments),
    }


def run_size(root: Path, count: int, out: dict[str, Any]) -> None:
    log(f"generating {count} records x 3 replicas")
    started = time.monotonic()
    generate(root, count)
    entry: dict[str, Any] = {
        "messages_per_replica": count,
        "generate_s": round(time.monotonic() - started, 1),
        "bytes_per_replica": sum(p.stat().st_size for p in (root / "brokers" / "broker-a-1").rglob("*.log")),
    }
    out[str(count)] = entry
    log("spark audit (B1-B3)")
    result = spark_audit(root)
    entry["spark"] = {
        "elapsed_s": round(result["elapsed_s"], 2),
        "records": result["records"],
        "records_per_s": round(result["records"] / result["elapsed_s"]),
        "violations": result["violations"],
        "segment_files": result["partitions"],
        "check_s_B1_includes_the_one_read": result["check_s"],
    }
    log(f"spark: {entry['spark']}")
    log("pure-Python baseline (B1-B3)")
    started = time.monotonic()
    confirm = json.loads((root / "brokers" / "broker-a-1" / "confirm.log").read_text())["confirm_offset"]
    base = baseline(root, confirm)
    elapsed = time.monotonic() - started
    entry["baseline"] = {
        "elapsed_s": round(elapsed, 2),
        "records": base["records"],
        "records_per_s": round(base["records"] / elapsed),
        "violations": base["violations"],
    }
    entry["ratio_spark_to_baseline"] = round(
        entry["spark"]["records_per_s"] / entry["baseline"]["records_per_s"], 3
    )
    log(f"baseline: {entry['baseline']}")
    shutil.rmtree(root, ignore_errors=True)


def summarize(result: dict[str, Any]) -> None:
    sizes = result.get("sizes", {})
    done = [k for k in sizes if "baseline" in sizes[k]]
    if len(done) >= 2:
        small, large = sizes[done[0]], sizes[done[-1]]
        factor = large["messages_per_replica"] / small["messages_per_replica"]
        result["growth"] = {
            "data_factor": factor,
            "spark_time_factor": round(large["spark"]["elapsed_s"] / small["spark"]["elapsed_s"], 2),
            "baseline_time_factor": round(large["baseline"]["elapsed_s"] / small["baseline"]["elapsed_s"], 2),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100k and 1M records instead of 1M and 10M")
    p.add_argument("--sizes", help="comma-separated record counts per replica")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000])
    )
    args.budget_s = 3600.0
    root = Path(tempfile.mkdtemp(prefix="mqmeta-audit-bench-"))
    result: dict[str, Any] = {
        "bench": "audit",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "spark_master": "local[2]",
        "spark_driver_memory": os.environ.get("MQMETA_SPARK_DRIVER_MEMORY", "6g"),
        "replicas": 3,
        "replica_copies": "replicas 2 and 3 are byte copies of replica 1",
        "sizes": {},
    }

    def run(t0: float) -> None:
        os.environ["MQMETA_SPARK_MASTER"] = "local[2]"
        os.environ.setdefault("MQMETA_SPARK_DRIVER_MEMORY", "6g")  # 30 M cached rows and the B1 shuffle
        from mqmeta.spark.session import get_session

        started = time.monotonic()
        get_session("local[2]")
        result["spark_session_start_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        generate(root / "warm-up", WARM_UP_RECORDS)
        spark_audit(root / "warm-up")
        shutil.rmtree(root / "warm-up", ignore_errors=True)
        result["spark_warm_up_s"] = round(time.monotonic() - started, 1)
        for count in sizes:
            run_size(root / str(count), count, result["sizes"])

    def cleanup() -> None:
        from mqmeta.spark.session import stop_session

        stop_session()

    return benchlib.run_main(args, root, result, run, summarize, cleanup, log, watchdog_grace_s=60)


if __name__ == "__main__":
    sys.exit(main())
