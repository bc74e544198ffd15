"""The Spark audit (`mqmeta audit`) on the logs of a real cluster run.

Properties checked:
- a clean run (3 controllers, a broker set of 3 replicas with tiered uploads, a kill -9
  of the master in the middle and its restart as a slave) passes every check, and the
  report files are written (JSON per check; HTML with plots);
- the same data dir moved elsewhere audits the same (nodes are found by the layout);
- files read in offset-range partitions give exactly the rows of whole-file partitions;
- each fault crafted in a copy of that real data is caught by the right check: a
  replica byte flipped below the confirm offset (B1, B3), a checksum-valid divergent
  record on one replica (B1 alone, found by the chunk fingerprints), bytes cut out of a record
  (B2, B3), an epoch entry regressed (B4), two masters recorded in one epoch (M2), a
  tiered segment past the confirm offset (T1), a tiered segment differing from the
  replicas (T2), one node's applied entry changed (R1), a key index entry moved to
  another record with its checkpoint CRC made to match (K1), bad confirm.log lines (B1,
  every one counted), while a torn last confirm line and a torn segment tail are not violations;
- bad input exits 2 with one sentence on stderr and no Java stack trace.
One Spark session (local[2]) serves every test of this module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mqmeta.formats.checksummed import dump_checksummed, load_checksummed
from mqmeta.formats.jsonlines import line_crc
from tests.support.audit_data import clean_data_dir, copy_data_dir, spark_session

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(180),
    # pyspark 4.3 warns that pandas 3 is newer than the versions it was tested with; the
    # audit reads through Arrow and never converts to pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


@pytest.fixture(scope="module")
def spark():
    session = spark_session()
    try:
        yield session
    finally:
        from mqmeta.spark.session import stop_session

        stop_session()


def test_the_driver_jvm_runs_with_the_options_of_mqmeta_spark_java_options(spark):
    """tests/conftest.py gives -XX:TieredStopAtLevel=1; the session passes it to the JVM."""
    assert os.environ["MQMETA_SPARK_JAVA_OPTIONS"] == "-XX:TieredStopAtLevel=1"
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert "-XX:TieredStopAtLevel=1" in list(runtime.getInputArguments())


def audit(spark, data_dir: Path, report: Path, checks: str | None = None) -> dict:
    from mqmeta.spark.cli import run_checks
    from mqmeta.spark.registry import parse_ids
    from rich.console import Console

    status = run_checks([str(data_dir)], report, "local[2]", parse_ids(checks), Console(quiet=True))
    document = json.loads((report / "report.json").read_text())
    assert status == (0 if document["passed"] else 1)
    return document


def failed(document: dict) -> set[str]:
    return {c["id"] for c in document["checks"] if not c["passed"]}


def _summary(document: dict) -> list[tuple]:
    return [(c["id"], c["passed"], c["rows_examined"], c["violation_count"]) for c in document["checks"]]


_clean_report: dict = {}


def test_clean_run_passes_every_check(spark, tmp_path):
    data_dir = clean_data_dir()
    epochs = load_checksummed(data_dir / "brokers" / "broker-a-1" / "store" / "epochs.json")["entries"]
    assert len(epochs) >= 2, "the run must include a failover"
    document = audit(spark, data_dir, tmp_path / "report")
    assert failed(document) == set(), json.dumps(document["checks"], indent=1)[:4000]
    assert [c["id"] for c in document["checks"]] == [
        "R1",
        "R2",
        "M1",
        "M2",
        "M3",
        "M4",
        "B1",
        "B2",
        "B3",
        "B4",
        "T1",
        "T2",
        "T3",
        "T4",
        "H1",
        "K1",
    ]
    assert all(c["rows_examined"] > 0 for c in document["checks"] if c["id"] != "H1")
    h1 = document["checks"][-2]  # a local run has no chaos history: H1 says so and passes
    assert h1["rows_examined"] == 0 and "no chaos history" in h1["notes"][0]
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2, "confirm-offset and election plots"
    _clean_report.update(document)


# The checks that read files located through the layout (every kind of input).
LAYOUT_CHECKS = "R1,B1,B4,T1,T2,T3"
# Over s3a, the checks whose Spark workers read the files (applied logs, segments, confirm
# logs, tiered objects); B4 and T3 read small JSON files in the driver through the same
# fsspec filesystem, and each check more costs this test seconds of Spark jobs over S3.
S3A_CHECKS = "R1,B1,T1,T2"


def test_moved_data_dir_audits_the_same(spark, tmp_path):
    moved = tmp_path / "elsewhere" / "copied-cluster"
    shutil.copytree(clean_data_dir(), moved)
    document = audit(spark, moved, tmp_path / "report", LAYOUT_CHECKS)
    if not _clean_report:
        _clean_report.update(audit(spark, clean_data_dir(), tmp_path / "clean-report"))
    chosen = set(LAYOUT_CHECKS.split(","))
    assert _summary(document) == [s for s in _summary(_clean_report) if s[0] in chosen]
    assert all(c["passed"] for c in document["checks"])


@pytest.fixture
def s3_endpoint(monkeypatch):
    """A real S3 API (moto's server, the one S3 that runs here) on loopback, and the
    environment fsspec's s3fs reads its endpoint and credentials from."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "audit-test",
        "AWS_SECRET_ACCESS_KEY": "audit-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        yield env
    finally:
        server.stop()


def test_s3a_input_audits_the_same(spark, tmp_path, s3_endpoint):
    """The clean data dir uploaded to an S3 bucket and audited from its s3a:// URL by the
    CLI (a fresh process: its Spark workers read the segments and logs from S3)."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.mkdir("audit-bucket")
    fs.put(str(clean_data_dir()), "audit-bucket/runs/clean", recursive=True)
    report = tmp_path / "report"
    result = _cli(
        "s3a://audit-bucket/runs/clean", "--report", str(report), "--checks", S3A_CHECKS, timeout_s=150
    )
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads((report / "report.json").read_text())
    if not _clean_report:
        _clean_report.update(audit(spark, clean_data_dir(), tmp_path / "clean-report"))
    chosen = set(S3A_CHECKS.split(","))
    assert _summary(document) == [s for s in _summary(_clean_report) if s[0] in chosen]
    b1 = next(c for c in document["checks"] if c["id"] == "B1")
    assert b1["rows_examined"] > 0


def test_s3a_input_that_does_not_exist_exits_2(tmp_path, s3_endpoint):
    result = _cli("s3a://no-such-bucket/run", "--report", str(tmp_path / "report"))
    assert result.returncode == 2
    _one_sentence(result.stderr)
    assert "s3a://no-such-bucket/run" in result.stderr


def test_offset_range_partitions_read_the_same_records(spark):
    from mqmeta.spark.data import AuditData
    from mqmeta.spark.layout import discover

    inventory = discover([str(clean_data_dir())])
    one_replica = inventory.segments[0]["replica"]  # one replica's files: a third of the tasks
    inventory.segments = [s for s in inventory.segments if s["replica"] == one_replica]
    split_bytes = 4096
    assert max(s["size"] for s in inventory.segments) > 4 * split_bytes, "some files must be split"
    whole, split = AuditData(spark, inventory), AuditData(spark, inventory, split_bytes=split_bytes)
    try:
        assert split.records.rdd.getNumPartitions() > whole.records.rdd.getNumPartitions()
        assert split.records.count() == whole.records.count() > 0
        assert split.records.exceptAll(whole.records).count() == 0
        assert whole.records.exceptAll(split.records).count() == 0
    finally:
        whole.unpersist()
        split.unpersist()


# Crafted faults ---------------------------------------------------------------------------------
def _first_segment(data_dir: Path, replica: str) -> Path:
    return sorted((data_dir / "brokers" / replica / "store" / "commitlog").glob("*.log"))[0]


def test_flipped_byte_below_the_confirm_offset(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    segment = _first_segment(data_dir, "broker-a-2")  # offsets from 0: below the confirm offset
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x40
    segment.write_bytes(bytes(data))
    document = audit(spark, data_dir, tmp_path / "report", "B1,B3")
    assert failed(document) == {"B1", "B3"}
    assert next(c for c in document["checks"] if c["id"] == "B1")["violation_count"] == 1
    b3 = next(c for c in document["checks"] if c["id"] == "B3")
    assert b3["samples"][0]["replica"] == "broker-a-2" and b3["samples"][0]["file"].endswith(segment.name)


def test_checksum_valid_divergent_record_is_caught_by_b1_alone(spark, tmp_path):
    """A replica whose record differs but carries a valid CRC (a divergent write, not bit
    rot): only the replica comparison can see it, through the chunk fingerprints."""
    import zlib

    from mqmeta.spark.walk import walk

    data_dir = copy_data_dir(tmp_path)
    segment = _first_segment(data_dir, "broker-a-2")
    data = bytearray(segment.read_bytes())
    base = int(segment.stem)
    piece = [p for p in walk(bytes(data), base) if p.status == "ok"][10]
    data[piece.pos + piece.length - 1] ^= 0x01  # the body's last byte
    crc = zlib.crc32(data[piece.pos + 11 : piece.pos + piece.length])
    data[piece.pos + 7 : piece.pos + 11] = crc.to_bytes(4, "little")
    segment.write_bytes(bytes(data))
    document = audit(spark, data_dir, tmp_path / "report", "B1,B3")
    assert failed(document) == {"B1"}
    b1 = next(c for c in document["checks"] if c["id"] == "B1")
    assert b1["violation_count"] == 1
    assert {s["offset"] for s in b1["samples"]} == {base + piece.pos}
    assert {s["replica"] for s in b1["samples"]} >= {"broker-a-2"}
    assert any("1 compared record by record" in note for note in b1["notes"]), b1["notes"]


def test_planted_key_index_entry_is_caught_by_k1(spark, tmp_path):
    """A key index entry moved to another record, with the CRC in the checkpoint made to
    match (an index the broker would trust): the entry names a record without that key,
    and the record that has it is no longer indexed."""
    import struct

    from mqmeta.formats.key_index import KEY_ENTRY, KEY_INDEX_HEADER, entries_crc

    data_dir = copy_data_dir(tmp_path)
    store = data_dir / "brokers" / "broker-a-1" / "store"
    checkpoint = load_checksummed(store / "index" / "checkpoint.json")
    row = next(r for r in checkpoint["keys"] if r[0] == "Orders")
    key_file = store / "keys" / "Orders"
    data = bytearray(key_file.read_bytes())
    entry = KEY_INDEX_HEADER.size + KEY_ENTRY.size  # entry 1: the first record's unique key
    other = struct.unpack_from("<Q", data, KEY_INDEX_HEADER.size + 3 * KEY_ENTRY.size + 8)[0]
    moved_from = struct.unpack_from("<Q", data, entry + 8)[0]
    assert other != moved_from, "entries 1 and 3 name two records"
    struct.pack_into("<Q", data, entry + 8, other)
    key_file.write_bytes(bytes(data))
    row[2] = entries_crc(data[KEY_INDEX_HEADER.size : KEY_INDEX_HEADER.size + row[1] * KEY_ENTRY.size])
    (store / "index" / "checkpoint.json").write_bytes(dump_checksummed(checkpoint))
    document = audit(spark, data_dir, tmp_path / "report", "K1")
    assert failed(document) == {"K1"}
    k1 = document["checks"][0]
    assert k1["violation_count"] == 2, k1
    assert {(s["kind"], s["commit_offset"]) for s in k1["samples"]} == {
        ("indexed, no such record or name", other),
        ("record not indexed", moved_from),
    }


def test_truncated_record(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    segment = _first_segment(data_dir, "broker-a-3")
    data = segment.read_bytes()
    middle = len(data) // 2
    segment.write_bytes(data[:middle] + data[middle + 40 :])  # 40 bytes cut out of a record
    document = audit(spark, data_dir, tmp_path / "report", "B2,B3")
    assert failed(document) == {"B2", "B3"}


def test_regressed_epoch_entry(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    path = data_dir / "brokers" / "broker-a-1" / "store" / "epochs.json"
    entries = load_checksummed(path)["entries"]
    assert isinstance(entries, list) and len(entries) >= 2
    entries[-1][0] = entries[-2][0]  # the last epoch no longer increases
    path.write_bytes(dump_checksummed({"entries": entries}))
    document = audit(spark, data_dir, tmp_path / "report", "B4")
    assert failed(document) == {"B4"}


def _rewrite_lines(path: Path, change) -> int:
    """Applies `change(record) -> bool` to each line, re-checksumming changed ones."""
    out, changed = [], 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if change(record):
            changed += 1
            record.pop("crc32")
            record["crc32"] = line_crc(record)
        out.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    path.write_text("\n".join(out) + "\n")
    return changed


def test_two_masters_in_one_epoch(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    seen: dict[int, int] = {}

    def second_master(record: dict) -> bool:
        for key, value in (record.get("effects") or {}).items():
            if key.startswith("brokerset/") and value["master_broker_id"]:
                epoch, master = value["master_epoch"], value["master_broker_id"]
                if epoch in seen and not seen.get(-1):
                    other = next(int(i) for i in value["replicas"] if int(i) != master)
                    value["master_broker_id"] = other
                    value["sync_state_set"] = sorted(set(value["sync_state_set"]) | {other})
                    seen[-1] = 1
                    return True
                seen[epoch] = master
        return False

    assert _rewrite_lines(data_dir / "controllers" / "c2" / "applied.jsonl", second_master) == 1
    document = audit(spark, data_dir, tmp_path / "report", "M2,R1")
    assert failed(document) == {"M2"}, "effects are not part of the command digest: R1 holds"


def _committed_end(data_dir: Path) -> int:
    end = 0
    for line in (data_dir / "controllers" / "c1" / "applied.jsonl").read_text().splitlines():
        for key, value in json.loads(line).get("effects", {}).items():
            if key.startswith("tiered/"):
                end = max(end, value["uploaded_offset"])
    return end


def test_tiered_segment_past_the_confirm_offset(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    end = _committed_end(data_dir)
    assert end > 0
    for log in (data_dir / "brokers").glob("*/confirm.log"):  # the masters never confirmed the last range
        kept = [
            ln
            for ln in log.read_text().splitlines()
            if not (json.loads(ln)["role"] == "MASTER" and json.loads(ln)["confirm_offset"] >= end)
        ]
        log.write_text("".join(ln + "\n" for ln in kept))
    document = audit(spark, data_dir, tmp_path / "report", "T1")
    assert failed(document) == {"T1"}


def test_tiered_segment_differs_from_the_replicas(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    segment = sorted((data_dir / "tiered").rglob("*.seg"))[1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0x01
    segment.write_bytes(bytes(data))
    document = audit(spark, data_dir, tmp_path / "report", "T2")
    assert failed(document) == {"T2"}
    assert document["checks"][0]["samples"][0]["file"].endswith(segment.name)


def test_changed_applied_entry_on_one_node(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)

    def change(record: dict) -> bool:
        if record["index"] != 10:
            return False
        record["command_digest"] = "0" * 64
        return True

    assert _rewrite_lines(data_dir / "controllers" / "c3" / "applied.jsonl", change) == 1
    document = audit(spark, data_dir, tmp_path / "report", "R1,R2")
    assert failed(document) == {"R1"}
    assert document["checks"][0]["samples"][0]["index"] == 10


def test_bad_confirm_lines_are_counted_torn_tails_are_not(spark, tmp_path):
    data_dir = copy_data_dir(tmp_path)
    log = max((data_dir / "brokers").glob("*/confirm.log"), key=lambda p: len(p.read_text().splitlines()))
    lines = log.read_text().splitlines()
    bad = 25  # more than the 20 samples a check keeps: the count must not stop there
    assert len(lines) > bad + 5
    changed = [ln.replace('"role":', '"rolE":', 1) for ln in lines[:bad]]  # valid JSON, wrong CRC
    assert all(new != old for new, old in zip(changed, lines, strict=False))
    torn_line = lines[-1][:40]  # an unterminated last line: a write cut short
    log.write_text("".join(ln + "\n" for ln in changed + lines[bad:]) + torn_line)
    segment = sorted((data_dir / "brokers" / "broker-a-1" / "store" / "commitlog").glob("*.log"))[-1]
    torn_record = _first_segment(data_dir, "broker-a-1").read_bytes()[:30]
    segment.write_bytes(segment.read_bytes() + torn_record)  # an append a crash interrupted
    document = audit(spark, data_dir, tmp_path / "report", "B1,B2,B3")
    assert failed(document) == {"B1"}
    b1, _, b3 = document["checks"]
    assert b1["violation_count"] == bad
    assert len(b1["samples"]) == 20 and all(s["file"].endswith("confirm.log") for s in b1["samples"])
    assert any("torn tail" in note for note in b3["notes"]), b3["notes"]


# Bad input --------------------------------------------------------------------------------------
def _cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mqmeta.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _one_sentence(stderr: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqmeta: error: "), stderr
    assert "Traceback" not in stderr and "at org.apache" not in stderr


def test_missing_input_exits_2(tmp_path):
    result = _cli(str(tmp_path / "no-such-dir"), "--report", str(tmp_path / "report"))
    assert result.returncode == 2
    _one_sentence(result.stderr)
    assert "does not exist" in result.stderr


def test_nothing_auditable_exits_2(tmp_path):
    (tmp_path / "empty" / "some" / "dir").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("hello")
    result = _cli(str(tmp_path / "empty"), "--report", str(tmp_path / "report"))
    assert result.returncode == 2
    _one_sentence(result.stderr)
    assert "nothing to audit" in result.stderr


def test_unknown_check_exits_2(tmp_path):
    result = _cli(str(tmp_path), "--report", str(tmp_path / "report"), "--checks", "B1,Z9")
    assert result.returncode == 2
    _one_sentence(result.stderr)
    assert "'Z9'" in result.stderr  # not the empty input's "nothing to audit"
