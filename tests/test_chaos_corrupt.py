"""Short corrupt-replica chaos runs (P16): a byte flipped where a checksum guards it.

Each fault kills one slave of the broker set and one follower controller, flips a byte of
the slave's commit log below the confirm offset and of the follower's Raft journal (or
snapshot), and restarts them. Each run must lose nothing acknowledged, every damaged
node must start, count a repair (result.json's faults[].repaired, unrepaired empty) and
serve again, and the audit of every log the run left must pass (the bad bytes were
neither served nor spread). The long runs are `mqmeta chaos run --fault corrupt-replica
-t 60`, by hand.
"""

from __future__ import annotations

import pytest
from mqmeta.chaos.runner import RunConfig, run

from tests.support import audit_in_shared_session

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(240)]


def corrupt_run(tmp_path, workload: str) -> dict:
    config = RunConfig(
        fault="corrupt-replica",
        workload=workload,
        output_dir=tmp_path / workload,
        time_limit_s=10.0,
        interval_s=4.0,
        drain_s=15.0,
    )
    result = run(config, audit=audit_in_shared_session).result
    faults = result["faults"]
    assert faults, result
    for record in faults:
        assert record["flipped"], record
        assert all(count >= 1 for count in record["repaired"].values()), record
        assert "notRestarted" not in record, record
    assert result["unrepaired"] == [] and result["notRestarted"] == [], result
    assert result["audit"]["passed"], result["audit"]
    assert result["passed"], result["failures"]
    return result


def test_corrupt_replica_under_the_queue_workload(tmp_path):
    queue = corrupt_run(tmp_path, "queue")["queue"]
    assert queue["enqueueSuccessCount"] >= 30, queue
    assert queue["lostMessageCount"] == 0, queue.get("lostMessages")
    assert queue["isValid"], queue


@pytest.mark.slow
def test_corrupt_replica_under_the_metadata_workload(tmp_path):
    result = corrupt_run(tmp_path, "metadata")
    assert result["linearizable"] is True, result["linearizability"]
