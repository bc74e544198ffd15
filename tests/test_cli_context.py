"""Where the client commands find the cluster, and how produce sends, in real subprocesses.

Properties checked:
- admin, produce and consume take their addresses from the flag, else --cluster-dir DIR
  (DIR/cluster.json), else MQMETA_CONTROLLERS / MQMETA_NAMESRV: each source alone works,
  and a source earlier in that order wins over a later one that points nowhere;
- with none of them, or a DIR without cluster.json, the command exits 2 with one sentence
  that says how to give the addresses;
- `local up`'s export line names the cluster's addresses;
- produce batches by default (a batch goes to one queue: 64 messages land as two runs of
  32 consecutive offsets) and its --rate batches hold what is ready within --linger-ms;
- produce to an address where nothing listens is one error line and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.context import ENV_CONTROLLERS, ENV_NAMESRV, export_lines
from mqmeta.data_cli import BATCH_DEFAULT, _batches
from mqmeta.pb import controller_pb2 as pb

pytestmark = [pytest.mark.timeout(120)]
MQMETA = [sys.executable, "-m", "mqmeta.cli"]
NOWHERE = "127.0.0.1:1"  # nothing listens on port 1


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in (ENV_CONTROLLERS, ENV_NAMESRV)}
    return subprocess.run(
        [*MQMETA, *args], capture_output=True, text=True, timeout=timeout, env={**clean, **(env or {})}
    )


def cluster_dir(root: Path, controllers: str, namesrv: str) -> Path:
    """A DIR whose cluster.json names these addresses, as `local up` writes it."""
    root.mkdir(parents=True, exist_ok=True)
    document = {
        "controllers": [{"id": f"c{i}", "grpc": a} for i, a in enumerate(controllers.split(","), 1)],
        "namesrv": [{"grpc": a} for a in namesrv.split(",")],
        "brokers": [],
    }
    (root / "cluster.json").write_text(json.dumps(document))
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("context"), count=1, broker_sets=1, replicas=1)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        cluster.master_of("broker-a")
        yield cluster
    finally:
        cluster.stop()


def assert_one_sentence(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqmeta: error:"), result.stderr
    assert all(f in lines[0] for f in fragments), result.stderr


def test_each_source_alone_gives_the_addresses(cluster, tmp_path):
    here = cluster_dir(tmp_path / "here", cluster.addresses, cluster.namesrv)
    by_flag = run("admin", "--controllers", cluster.addresses, "cluster-status", "--json")
    by_dir = run("admin", "--cluster-dir", str(here), "cluster-status", "--json")
    by_env = run("admin", "cluster-status", "--json", env={ENV_CONTROLLERS: cluster.addresses})
    for result in (by_flag, by_dir, by_env):
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["leader"] == "c1"
    for source in (["--namesrv", cluster.namesrv], ["--cluster-dir", str(here)]):
        produced = run("produce", *source, "--topic", "Orders", "--count", "3", "--json")
        assert produced.returncode == 0, produced.stderr
        assert json.loads(produced.stdout)["acked"] == 3
    produced = run(
        "produce", "--topic", "Orders", "--count", "3", "--json", env={ENV_NAMESRV: cluster.namesrv}
    )
    assert produced.returncode == 0 and json.loads(produced.stdout)["acked"] == 3, produced.stderr
    consumed = run(
        "consume",
        "--cluster-dir",
        str(here),
        "--topic",
        "Orders",
        "--group",
        "g",
        "--until-idle",
        "1",
        "--json",
    )
    assert consumed.returncode == 0 and json.loads(consumed.stdout)["received"] == 9, consumed.stderr


def test_flag_beats_cluster_dir_beats_environment(cluster, tmp_path):
    here = cluster_dir(tmp_path / "here", cluster.addresses, cluster.namesrv)
    nowhere = cluster_dir(tmp_path / "nowhere", NOWHERE, NOWHERE)
    dead_env = {ENV_CONTROLLERS: NOWHERE, ENV_NAMESRV: NOWHERE}
    flag_wins = run(
        "admin", "--controllers", cluster.addresses, "--cluster-dir", str(nowhere), "--timeout", "3",
        "cluster-status", "--json", env=dead_env,
    )  # fmt: skip
    dir_wins = run(
        "admin", "--cluster-dir", str(here), "--timeout", "3", "cluster-status", "--json", env=dead_env
    )
    for result in (flag_wins, dir_wins):
        assert result.returncode == 0, result.stderr
    produced = run(
        "produce", "--cluster-dir", str(here), "--topic", "Orders", "--count", "1", "--json", env=dead_env
    )
    assert produced.returncode == 0, produced.stderr


def test_no_source_is_one_sentence_saying_how_to_give_one(tmp_path):
    assert_one_sentence(run("admin", "cluster-status"), "--controllers", "--cluster-dir", ENV_CONTROLLERS)
    assert_one_sentence(
        run("produce", "--topic", "T", "--count", "1"), "--namesrv", "--cluster-dir", ENV_NAMESRV
    )
    assert_one_sentence(
        run("consume", "--topic", "T", "--group", "g"), "--namesrv", "--cluster-dir", ENV_NAMESRV
    )
    assert_one_sentence(
        run("admin", "--cluster-dir", str(tmp_path), "cluster-status"), "no cluster.json", "local up"
    )
    (tmp_path / "cluster.json").write_text("{not json")
    assert_one_sentence(
        run("produce", "--cluster-dir", str(tmp_path), "--topic", "T", "--count", "1"), "JSON"
    )


def test_export_line_names_the_clusters_addresses():
    document = {"controllers": [{"grpc": "h:1"}, {"grpc": "h:2"}], "namesrv": [{"grpc": "h:3"}]}
    lines = export_lines(document, Path("D"))
    assert lines[-1] == f"export {ENV_CONTROLLERS}=h:1,h:2 {ENV_NAMESRV}=h:3"
    assert all(line.startswith(("#", "export ")) for line in lines), "every line pastes into a shell"


def test_produce_batches_by_default(cluster, tmp_path):
    record = tmp_path / "sent.jsonl"
    count = 2 * BATCH_DEFAULT
    produced = run("produce", "--namesrv", cluster.namesrv, "--topic", "Orders", "--count", str(count),
                   "--record", str(record))  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    runs: list[list[dict]] = []
    for line in sent:  # one send = one queue, consecutive offsets
        if runs and runs[-1][-1]["queue_id"] == line["queue_id"]:
            runs[-1].append(line)
        else:
            runs.append([line])
    assert [len(r) for r in runs] == [BATCH_DEFAULT, BATCH_DEFAULT], [
        (r[0]["queue_id"], len(r)) for r in runs
    ]
    for batch in runs:
        offsets = [line["queue_offset"] for line in batch]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


def test_rate_batches_hold_what_is_ready_within_the_linger():
    start = time.monotonic()
    assert [len(b) for b in _batches(10, 4, 0.0, None, start)] == [4, 4, 2], "no --rate: full batches"
    assert [len(b) for b in _batches(6, 32, 0.0, 2000.0, start)] == [1] * 6, "no linger: one at a time"
    # at 2,000 msg/s a message is ready every 0.5 ms: a 2 ms linger holds the first and 4 more
    assert [len(b) for b in _batches(12, 32, 0.002, 2000.0, start)] == [5, 5, 2]
    assert [len(b) for b in _batches(12, 3, 0.002, 2000.0, start)] == [3, 3, 3, 3], "--batch bounds it"
    began = time.monotonic()
    list(_batches(20, 32, 0.0, 1000.0, began))
    assert time.monotonic() - began >= 0.019, "--rate still paces the sends"


def test_produce_to_nothing_is_one_error_line():
    result = run("produce", "--namesrv", NOWHERE, "--topic", "T", "--count", "500", timeout=30)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "no nameserver answered" in lines[0] and "Traceback" not in result.stderr


def test_status_text_shows_the_json_fields(cluster):
    """cluster-status and ha-status print, as text, every field their --json document has."""
    for command in (["cluster-status"], ["ha-status", "--broker-name", "broker-a"]):
        text = run("admin", "--controllers", cluster.addresses, *command, env={"COLUMNS": "100"})
        document = run("admin", "--controllers", cluster.addresses, *command, "--json")
        assert text.returncode == 0 and document.returncode == 0, (text.stderr, document.stderr)
        parsed = json.loads(document.stdout)
        rows = parsed.get("nodes") or parsed["replicas"]
        keys = {k for k in parsed if k not in ("nodes", "replicas")} | {k for row in rows for k in row}
        flat = "".join(text.stdout.split())  # a narrow table folds a header or a value
        missing = sorted(k for k in keys if "".join(k.split()) not in flat)
        assert not missing, (command, missing, text.stdout)
        if command == ["cluster-status"]:
            # two calls: the state (and so its digest) may change between them; the text must
            # show a digest of the same form
            digest = re.search(r"state_digest:\s*(\S+)", text.stdout)
            assert "term: " in text.stdout and digest, text.stdout
            assert len(digest.group(1)) == len(parsed["state_digest"]), (digest.group(1), parsed)
