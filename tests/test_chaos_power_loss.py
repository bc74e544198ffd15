"""Power-loss chaos runs: every node's data dir on its own fault filesystem mount.

power-loss-node kills one node -9 and drops every write its disk had not synced (half the
dirty pages written back first, so tails are torn), then restarts it; power-loss-all does
it to every process at once. Each run must lose no acknowledged message, bring every
node back (recover_ms recorded, nothing in notRestarted), and pass the Spark audit over
the durable state the mounts leave behind.

In CI: one short power-loss-all run (one fault). It is the one that catches a missing
fsync: with every replica's page cache gone at once, an acknowledged write that no disk
held is lost (tests/test_planted_fsync_bug.py shows it failing with the commit log's
fdatasync removed). The longer runs of both faults are `slow`.
"""

from __future__ import annotations

import os

import pytest
from mqmeta.chaos.runner import RunConfig, run

from tests.support import audit_in_shared_session

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(480),  # the first spark test of a run starts the JVM; a loaded machine is slow
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]


def _check_power_loss_run(tmp_path, fault: str, time_limit_s: float, interval_s: float) -> None:
    config = RunConfig(
        fault=fault,
        output_dir=tmp_path / fault,
        time_limit_s=time_limit_s,
        interval_s=interval_s,
        drain_s=15.0,
    )
    result = run(config, audit=audit_in_shared_session).result
    faults = result["faults"]
    assert faults and all(f["what"].startswith("power lost on") for f in faults), faults
    for record in faults:  # each affected node with data really lost power, and came back
        assert "notRestarted" not in record, record
        assert record["recover_ms"] > 0, record
        for node in record["pagesLost"]:
            assert result["faultfs"][node]["power_losses"] >= 1, result["faultfs"]
    if fault == "power-loss-all":
        assert len(faults[0]["pagesLost"]) == 6, faults[0]  # 3 controllers and 3 brokers
    assert result["notRestarted"] == [], result["notRestarted"]
    queue = result["queue"]
    assert queue["enqueueSuccessCount"] >= 20, queue
    assert queue["lostMessageCount"] == 0, queue.get("lostMessages")
    assert queue["isValid"], queue
    assert result["audit"]["passed"], result["audit"]
    assert result["passed"], result["failures"]
    assert not any(
        os.path.ismount(tmp_path / fault / "cluster" / d) for d in ("controllers/c1", "brokers/broker-a-1")
    )


def test_short_power_loss_of_everything_loses_nothing_acknowledged(tmp_path):
    """CI's one power-loss run: one power loss of every process, 4 s into an 8 s run."""
    _check_power_loss_run(tmp_path, "power-loss-all", time_limit_s=8.0, interval_s=4.0)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["power-loss-node", "power-loss-all"])
def test_power_loss_run_loses_nothing_acknowledged_and_every_node_comes_back(tmp_path, fault):
    _check_power_loss_run(tmp_path, fault, time_limit_s=10.0, interval_s=4.0)
