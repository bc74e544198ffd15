"""X1, the Spark audit of cross-cluster replication, on two real clusters and a real worker.

Properties checked:
- a clean run (clusters a and b of real processes, `mqmeta replicator` with a rule in
  mode full for one topic with a tag filter and a re: rule with a renamed target topic,
  a source group that consumed part of the topic) passes X1, and X1 expected exactly the
  records the rules match (not a vacuous pass);
- each fault planted in a copy of b's data dir (records rewritten with the formats
  module, valid checksums, so only X1 can see them) is found by its name and no other: a
  duplicated copy, a missing copy, two copies swapped in order, an altered body / tag /
  key, an orphan copy, and a translated group offset moved ahead and one moved behind (mode full);
- `mqmeta audit SRC_DIR TARGET_DIR --rules FILE --report DIR` exits 1 with the report on
  a fault, and bad input exits 2 with one sentence (missing dir, bad rules file, dirs in
  the wrong order for the rules, a wrong number of dirs, X1 without --rules).
One pair of clusters (built once) and the run's one Spark session serve the module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.broker_client import Consumer, Producer
from mqmeta.formats import origin as origin_format
from mqmeta.formats.records import Message, StoredRecord, encode_record, split_records
from mqmeta.pb import broker_pb2, broker_pb2_grpc
from mqmeta.pb import controller_pb2 as pb
from tests.support import spark_session, wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

FLAGS = ["--ha-max-time-slave-not-catchup-ms", "1500", "--send-timeout-ms", "3000"]
QUEUES = 2
ORDERS = 120  # per tag TagA, TagB (replicated) and TagC (not)
EVENTS = 60
CONSUMED_PER_QUEUE = 25  # group G's progress at the source, translated to b (mode full)
REPLICATE_TIMEOUT_S = 60.0


def _rules(a: Cluster, b: Cluster) -> str:
    return f"""[replicator]
discovery_interval_ms = 300
offsets_interval_ms = 200
[[rules]]
name = "orders"
source_namesrv = "{a.namesrv}"
target_namesrv = "{b.namesrv}"
topic = "Orders"
tags = "TagA || TagB"
mode = "full"
start = "earliest"
[[rules]]
name = "events"
source_namesrv = "{a.namesrv}"
target_namesrv = "{b.namesrv}"
topic = "re:Ev.*"
target_topic = "{{topic}}-from-{{source_cluster}}"
start = "earliest"
"""


def _create(site: Cluster, cluster: str, *topics: str) -> None:
    with site.client() as client:
        for topic in topics:
            client.call("CreateTopic", pb.TopicSpec(name=topic, cluster=cluster, queue_count=QUEUES))


def _produce(a: Cluster) -> None:
    producer = Producer(a.namesrv, timeout_s=8.0)
    try:
        for i in range(0, ORDERS, 10):
            for tag in ("TagA", "TagB", "TagC"):
                bodies = [f"order-{tag}-{i + k}".encode() for k in range(10)]
                producer.send("Orders", bodies, tags=tag, keys=[f"k{i + k}" for k in range(10)])
        for i in range(0, EVENTS, 10):
            producer.send("Events", [f"event-{i + k}".encode() for k in range(10)], tags="E")
    finally:
        producer.close()


def _target_offsets(b: Cluster) -> list[int]:
    master = b.broker(b.master_of("broker-a")).grpc
    with grpc.insecure_channel(master) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        request = broker_pb2.QueryOffsetRequest
        return [
            stub.QueryOffset(request(group="G", topic="Orders", queue_id=q), timeout=5).offset for q in (0, 1)
        ]


def _copies(b: Cluster, topic: str, count: int) -> list[broker_pb2.StoredMessage]:
    """Every copy in `topic` at b, once `count` are there (read by a group of b's own)."""
    consumer = Consumer(b.namesrv, topic, f"check-{topic}")
    seen: list[broker_pb2.StoredMessage] = []

    def read() -> int:
        seen.extend(consumer.poll())
        return len(seen)

    try:
        wait_for(read, REPLICATE_TIMEOUT_S, f"{count} copies in {topic}", until=lambda n: n >= count)
    finally:
        consumer.close()
    return seen


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Clusters a and b, a worker between them, load, G's progress at a synced to b; then
    everything stopped. Yields (a's dir, b's dir, rules file, facts about the run)."""
    root = tmp_path_factory.mktemp("x1")
    made = []
    try:
        for name in ("a", "b"):
            site = Cluster(
                root / f"site-{name}",
                count=1,
                embedded=True,
                broker_sets=1,
                replicas=2,
                broker_flags=[*FLAGS, "--cluster", name],
            )
            made.append(site)
            site.start()
        a, b = made
        _create(a, "a", "Orders", "Events")
        _create(b, "b", "Orders", "Events-from-a")
        _produce(a)
        primary = Consumer(a.namesrv, "Orders", "G")
        consumed = primary.poll(max_count=CONSUMED_PER_QUEUE)
        primary.commit()
        primary.close()
        assert len(consumed) == QUEUES * CONSUMED_PER_QUEUE
        rules = root / "rules.toml"
        rules.write_text(_rules(a, b))
        command = [
            sys.executable,
            "-m",
            "mqmeta.cli",
            "replicator",
            "--config",
            str(rules),
            "--worker-id",
            "w1",
        ]
        worker = b.supervisor.start("w-x1", command)
        copies = _copies(b, "Orders", 2 * ORDERS)
        _copies(b, "Events-from-a", EVENTS)
        # G's translated offset per target queue: past every copy of an origin offset below 25.
        wanted = [
            sum(
                1
                for m in copies
                if m.queue_id == q and int(m.properties[origin_format.OFFSET]) < CONSUMED_PER_QUEUE
            )
            for q in (0, 1)
        ]
        wait_for(
            lambda: _target_offsets(b),
            REPLICATE_TIMEOUT_S,
            "G's offsets at b",
            until=lambda o: o == wanted,
            retry_on=(grpc.RpcError,),
        )
        worker.terminate()
        worker.wait(timeout=30)
    finally:
        for site in made:
            site.stop()
    yield made[0].root, made[1].root, rules, {"expected": 2 * ORDERS + EVENTS}


@pytest.fixture(scope="module")
def spark():
    return spark_session()  # stopped after the last spark-marked test (conftest)


def x1(spark, run, target: Path | None = None, report: Path | None = None) -> dict:
    from mqmeta.spark.replication import audit_replication

    source, clean_target, rules, _ = run
    target = target or clean_target
    return audit_replication(spark, source, target, rules, report or target.parent / "x1-report")


def _found(outcome: dict) -> dict[str, int]:
    return {kind: n for kind, n in outcome["violations"].items() if n}


def test_clean_replication_passes_x1(spark, run, tmp_path):
    """Through the chaos runner's hook (the run's one session): what audit_replication returns."""
    from mqmeta.spark.cli import shared_session_replication_audit

    source, target, rules, _ = run
    outcome = shared_session_replication_audit(source, target, rules, tmp_path / "report")
    assert outcome["ok"], json.dumps(outcome, indent=1)[:3000]
    assert outcome["expected"] == run[3]["expected"], "X1 must expect exactly the records the rules match"
    assert outcome["copies"] == run[3]["expected"]
    document = json.loads((tmp_path / "report" / "report.json").read_text())
    check = document["checks"][0]
    assert document["passed"] and check["id"] == "X1" and check["violation_count"] == 0
    assert set(check["violations"]) >= {
        "missing",
        "duplicated",
        "out_of_order",
        "altered",
        "orphan",
        "offset_ahead",
    }


# Planting faults in a copy of b's data dir -----------------------------------------------------
def _encode(
    record: StoredRecord, queue_offset: int | None = None, store_ms: int | None = None, **changes
) -> bytes:
    """The record's bytes, with `changes` to its message fields and its queue offset."""
    fields = dict(
        topic=record.topic,
        queue_id=record.queue_id,
        body=record.body,
        tags=record.tags,
        keys=record.keys,
        properties=dict(record.properties),
        producer_id=record.producer_id,
        producer_seq=record.producer_seq,
    )
    fields.update(changes)
    message = Message(**fields)
    offset = record.queue_offset if queue_offset is None else queue_offset
    stored = record.store_timestamp_ms if store_ms is None else store_ms
    return encode_record(message, record.epoch, stored, offset, record.msg_id)


def rewrite_target(run, destination: Path, change) -> Path:
    """A copy of b's dir where `change(records) -> list of record bytes` rewrote the last
    segment of every replica (each the same way; records re-encoded with valid checksums)."""
    target = destination / "site-b"
    shutil.copytree(run[1], target)
    for replica in sorted((target / "brokers").iterdir()):
        segment = sorted((replica / "store" / "commitlog").glob("*.log"))[-1]
        data = segment.read_bytes()
        records = split_records(data, int(segment.stem))
        assert b"".join(_encode(r) for r in records) == data, "re-encoding must reproduce the log"
        segment.write_bytes(b"".join(change(records)))
    return target


def _copies_of(records: list[StoredRecord], topic: str = "Orders", queue_id: int = 0) -> list[int]:
    return [i for i, r in enumerate(records) if r.topic == topic and r.queue_id == queue_id]


def _plain(records: list[StoredRecord]) -> list[bytes]:
    return [_encode(r) for r in records]


def _plant(records: list[StoredRecord], planted: dict) -> list[bytes]:
    """Every fault at once, each where it cannot disturb another's verdict (a copy removed
    or duplicated in a queue changes G's translated offset there, so those go where the
    translation does not look or into the other queue). Records what it did in `planted`."""
    out = _plain(records)
    q0, q1 = _copies_of(records, queue_id=0), _copies_of(records, queue_id=1)
    events = _copies_of(records, topic="Events-from-a")

    def origin(i: int) -> int:
        return int(records[i].properties[origin_format.OFFSET])

    # missing: a copy in queue 0 past what G consumed (its translation stays)
    gone = next(i for i in q0 if origin(i) >= CONSUMED_PER_QUEUE + 10)
    planted["missing"] = origin(gone)
    # two copies of queue 1 swapped: each keeps its queue position, their origins trade places
    first, second = [i for i in q1 if origin(i) >= CONSUMED_PER_QUEUE + 10][:2]
    x, y = records[first], records[second]
    out[first], out[second] = _encode(y, queue_offset=x.queue_offset), _encode(x, queue_offset=y.queue_offset)
    planted["swapped"] = (x.queue_offset, y.queue_offset)
    # altered: a body, a tag and a key of three copies of queue 1
    for i, change in zip(
        q1[3:6], ({"body": b"changed"}, {"tags": "TagZ"}, {"keys": "other-key"}), strict=True
    ):
        out[i] = _encode(records[i], **change)
    # G's offset at b on queue 0 moved 5 ahead of its translation
    latest = max(i for i, r in enumerate(records) if _progress(r) == ("G", 0))
    body = json.loads(records[latest].body)
    body["offset"] += 5
    out[latest] = _encode(
        records[latest], body=json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    )
    planted["ahead"] = body["offset"]
    # G's offset at b on queue 1 moved 3 behind, committed 10 s after the copies it skips
    # back over were stored (the worker had them then: not a lag)
    latest = max(i for i, r in enumerate(records) if _progress(r) == ("G", 1))
    body = json.loads(records[latest].body)
    body["offset"] -= 3
    late_ms = records[latest].store_timestamp_ms + 10_000
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    out[latest] = _encode(records[latest], store_ms=late_ms, body=encoded)
    planted["behind"] = body["offset"]
    # appended: a second copy of a queue-1 copy, and an orphan (an origin offset a never had)
    last1, last_event = records[q1[-1]], records[events[-1]]
    out.append(_encode(records[q1[10]], queue_offset=last1.queue_offset + 1))
    planted["duplicated"] = origin(q1[10])
    properties = dict(last_event.properties)
    properties.update(
        {
            origin_format.OFFSET: str(origin(events[-1]) + 1000),
            origin_format.PREVIOUS: str(origin(events[-1])),
        }
    )
    out.append(_encode(last_event, queue_offset=last_event.queue_offset + 1, properties=properties))
    planted["orphan"] = origin(events[-1]) + 1000
    return [b for i, b in enumerate(out) if i != gone]


def _progress(record: StoredRecord) -> tuple[str, int] | None:
    if record.topic != "%CONSUMER_OFFSET%":
        return None
    body = json.loads(record.body)
    return body["group"], body["queue_id"]


@pytest.fixture(scope="module")
def planted(spark, run, tmp_path_factory):
    """X1 over a copy of b's dir with every fault planted (one run serves the fault tests)."""
    where: dict = {}
    root = tmp_path_factory.mktemp("planted")
    target = rewrite_target(run, root, lambda records: _plant(records, where))
    return x1(spark, run, target, root / "report"), where, target


def test_planted_faults_are_found_by_name_and_nothing_else(planted):
    outcome, _, _ = planted
    assert _found(outcome) == {
        "missing": 1,
        "duplicated": 1,
        "out_of_order": 1,
        "altered": 3,
        "orphan": 1,
        "offset_ahead": 1,
        "offset_behind": 1,
    }, outcome["samples"]
    assert not outcome["ok"]


def test_missing_copy(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["missing"]
    assert (sample["topic"], sample["o_queue"], sample["o_offset"]) == ("Orders", 0, where["missing"])
    assert sample["s_broker_set"] == "a/broker-a" and sample["s_commit"] >= 0  # where it is at the source


def test_duplicated_copy(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["duplicated"]
    assert sample["o_offset"] == where["duplicated"] and len(sample["positions"]) == 2


def test_swapped_copies_are_out_of_order(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["out_of_order"]
    assert (sample["prev_queue_offset"], sample["queue_offset"]) == where["swapped"]
    assert sample["o_offset"] < sample["prev_o_offset"]


def test_altered_body_tag_and_key(planted):
    outcome, _, _ = planted
    assert sorted(s["differing"] for s in outcome["samples"]["altered"]) == [
        ["body_digest"],
        ["keys"],
        ["tags"],
    ]


def test_orphan_copy(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["orphan"]
    assert (sample["topic"], sample["o_offset"]) == ("Events-from-a", where["orphan"])


def test_translated_offset_ahead(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["offset_ahead"]
    assert sample["group"] == "G" and sample["queue_id"] == 0
    assert sample["target_offset"] == where["ahead"] == sample["translated"] + 5


def test_translated_offset_behind(planted):
    outcome, where, _ = planted
    (sample,) = outcome["samples"]["offset_behind"]
    assert sample["group"] == "G" and sample["queue_id"] == 1
    assert sample["target_offset"] == where["behind"] < sample["translated"]


# The command line ------------------------------------------------------------------------------
def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mqmeta.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _one_sentence(result: subprocess.CompletedProcess, words: str) -> None:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("mqmeta: error: "), result.stderr
    assert words in lines[0], lines[0]


def test_fault_exits_1_with_the_report(spark, run, planted, tmp_path):
    """The command's path (in this process's Spark session): exit 1, report.json and .html."""
    from mqmeta.spark.cli import run_replication
    from rich.console import Console

    source, _, rules, _ = run
    status = run_replication(str(source), str(planted[2]), rules, tmp_path / "r", None, Console(quiet=True))
    assert status == 1
    document = json.loads((tmp_path / "r" / "report.json").read_text())
    assert document["checks"][0]["violations"]["missing"] == 1 and not document["passed"]
    assert (tmp_path / "r" / "report.html").exists()


def test_bad_input_exits_2(run, tmp_path):
    source, target, rules, _ = run
    report = str(tmp_path / "r")
    _one_sentence(
        _cli(str(tmp_path / "nope"), str(target), "--rules", str(rules), "--report", report), "does not exist"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[rules]]\nname = "x"\nsource_namesrv = "127.0.0.1:1"\ntarget_namesrv = "127.0.0.1:2"\n'
        'topic = "T"\nmode = "mirror"\n'
    )
    _one_sentence(_cli(str(source), str(target), "--rules", str(bad), "--report", report), "'mode'")
    _one_sentence(_cli(str(target), str(source), "--rules", str(rules), "--report", report), "no rule of")
    from mqmeta.spark.cli import shared_session_replication_audit

    refused = shared_session_replication_audit(target, source, rules, tmp_path / "hook")
    assert not refused["ok"] and "no rule of" in refused["error"]
    _one_sentence(_cli(str(source), "--rules", str(rules), "--report", report), "two INPUTs")
    _one_sentence(_cli(str(source), "--checks", "X1", "--report", report), "needs --rules")
    _one_sentence(_cli(str(source), str(source), "--rules", str(rules), "--report", report), "both cluster a")


def test_chaos_hook_bad_input_is_exit_2(run, tmp_path, capsys):
    """The chaos runner's X1 hook (an exit status): dirs in the wrong order are 2, one sentence."""
    from mqmeta.spark.cli import shared_session_replication_status

    source, target, rules, _ = run
    assert shared_session_replication_status(target, source, rules, tmp_path / "hook") == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("X1 audit of ") and "no rule of" in lines[0], lines


def test_a_two_cluster_data_dir_counts_each_clusters_files(run, tmp_path):
    """`local up --clusters 2` keeps cluster b in DIR/cluster-b: X1's source inventory leaves
    b's files out and keeps every kind of a's (its summary once said 0 controllers and 0
    tiered segments for a)."""
    from mqmeta.spark.layout import discover
    from mqmeta.spark.replication_sites import load_sites

    source, target, rules, _ = run
    nested = tmp_path / "local"
    shutil.copytree(source, nested)
    shutil.copytree(target, nested / "cluster-b")
    sites = load_sites(str(nested), str(nested / "cluster-b"), rules)
    alone = discover([str(source)])
    assert sites.source.inventory.summary() == alone.summary().replace(str(source), str(nested))
    assert len(sites.source.inventory.controllers) == 1, sites.source.inventory.summary()
    assert sites.target.inventory.summary() == discover([str(target)]).summary()
