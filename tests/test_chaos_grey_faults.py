"""The grey faults in one short chaos run, with the controller's default liveness and the
audit: slow-disk, fsync-eio, disk-full, slow-replica and clock-jump, one round each (a fault
list: round k injects the k-th). What each must show, beyond the run passing (nothing
acknowledged lost, every node back, no false failover, the audit clean):

- fsync-eio: the master is replaced during the fault (it fenced itself, handed off, exited)
  and came back (restarted by the heal);
- disk-full: the master's disk refused writes (ENOSPC counted) and producers saw the definite
  DISK_FULL refusal;
- slow-replica: the delayed slave left the SyncStateSet during the fault, with no master change;
- clock-jump: the controller leader's wall clock stepped by 30 s and no master changed;
- slow-disk (2 s fsyncs, above the 1.2 s lease): the master was replaced during the fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mqmeta.chaos.runner import RunConfig, run

from mqmeta.formats.jsonlines import parse_line, split_lines
from tests.support import audit_in_shared_session

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(600),  # the first spark test of a run starts the JVM; a loaded machine is slow
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]
# slow-disk first: the last round's fault may be healed early when the run's time runs out
FAULTS = ("slow-disk", "fsync-eio", "disk-full", "slow-replica", "clock-jump")
GRACE_MS = 10_000


def _set_timeline(cluster_dir: Path) -> list[tuple[int, int, tuple[int, ...]]]:
    """(time, master epoch, SyncStateSet) of broker-a after each change, from every controller's
    applied.jsonl (their union by index)."""
    records: dict[int, dict[str, Any]] = {}
    for path in sorted(cluster_dir.glob("**/applied.jsonl")):
        for raw in split_lines(path.read_bytes())[0]:
            record = parse_line(raw.decode(), str(path))
            records.setdefault(record["index"], record)
    timeline, at_ms = [], 0
    for index in sorted(records):
        commands = records[index]["commands"]
        at_ms = max([at_ms] + [int(c["now_ms"]) for c in commands if "now_ms" in c])
        for key, value in (records[index].get("effects") or {}).items():
            if key.startswith("brokerset/") and key.endswith("/broker-a") and value:
                timeline.append((at_ms, value["master_epoch"], tuple(value["sync_state_set"])))
    return timeline


def test_grey_faults_lose_nothing_and_each_gets_its_reaction(tmp_path):
    out = tmp_path / "grey"
    config = RunConfig(
        fault=",".join(FAULTS),
        output_dir=out,
        time_limit_s=8.0 * len(FAULTS) + 2.0,
        interval_s=4.0,
        drain_s=20.0,
        liveness="defaults",
    )
    result = run(config, audit=audit_in_shared_session).result
    faults = {f["fault"]: f for f in result["faults"]}
    assert set(faults) == set(FAULTS), [f["what"] for f in result["faults"]]
    assert not any(f["what"].startswith("not injected") for f in faults.values()), faults
    queue = result["queue"]
    assert queue["lostMessageCount"] == 0 and queue["isValid"], queue.get("lostMessages")
    assert result["notRestarted"] == [], result["notRestarted"]
    assert result["failover"]["falseFailoverCount"] == 0, result["failover"]
    assert result["audit"]["passed"], result["audit"]
    assert result["passed"], result["failures"]

    changes = result["failover"]["masterChanges"]

    def master_changed_during(fault: dict[str, Any], grace_ms: int = 0) -> bool:
        return any(fault["start_ms"] <= c["at_ms"] <= fault["end_ms"] + grace_ms for c in changes)

    assert master_changed_during(faults["fsync-eio"], GRACE_MS), (faults["fsync-eio"], changes)
    assert master_changed_during(faults["slow-disk"], GRACE_MS), (faults["slow-disk"], changes)
    assert not master_changed_during(faults["clock-jump"]), changes
    assert faults["clock-jump"]["clockStepMs"] == 30_000 and faults["clock-jump"]["affected"][0].startswith(
        "c"
    )
    assert not master_changed_during(faults["slow-replica"]), changes

    full = faults["disk-full"]
    assert result["faultfs"][full["affected"][0]]["enospc_refusals"] > 0, result["faultfs"]
    history = (out / "history.tsv").read_text()
    assert "DISK_FULL" in history, "no producer saw the full disk's definite refusal"

    slow = faults["slow-replica"]
    layout = json.loads((out / "cluster" / "layout.json").read_text())
    addresses = {b["name"]: b["grpc"] for b in layout["brokers"]}
    ids = _broker_ids(out / "cluster", addresses)
    slave_id = ids[slow["affected"][0]]
    during = [s for at, _, s in _set_timeline(out / "cluster") if slow["start_ms"] <= at <= slow["end_ms"]]
    assert any(slave_id not in members for members in during), (slave_id, during)


def _broker_ids(cluster_dir: Path, addresses: dict[str, str]) -> dict[str, int]:
    """Each broker's id, from its identity.json."""
    return {
        name: json.loads((cluster_dir / "brokers" / name / "identity.json").read_text())["broker_id"]
        for name in addresses
    }
