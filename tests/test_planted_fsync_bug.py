"""A planted bug must be caught: with the commit log's fdatasync removed (a sitecustomize on
PYTHONPATH patches it out of every process of the run; tests/fixtures/planted_fsync_bug),
the short power-loss-all chaos run of tests/test_chaos_power_loss.py must fail: acknowledged
messages lost, or a broker refusing to start on a log that lost pages in its middle (seen by
hand: two of three brokers refused, "checksum mismatch; valid records follow it"). Without
the patch the same run passes (that test)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mqmeta.chaos.runner import RunConfig, run

PLANTED = Path(__file__).parent / "fixtures" / "planted_fsync_bug"

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.timeout(480),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]


def test_power_loss_of_everything_catches_a_missing_commit_log_fdatasync(tmp_path, monkeypatch):
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{PLANTED}{os.pathsep}{path}" if path else str(PLANTED))
    config = RunConfig(
        fault="power-loss-all",
        output_dir=tmp_path / "planted",
        time_limit_s=8.0,
        interval_s=4.0,
        drain_s=15.0,
        audit=False,
    )
    result = run(config).result
    assert result["faults"] and result["faults"][0]["what"].startswith("power lost on"), result["faults"]
    queue = result["queue"]
    assert queue["enqueueSuccessCount"] > 0, queue
    # Either symptom fails the run: acknowledged messages gone, or a broker whose log lost
    # pages in the middle (valid records after a torn one) refusing to start.
    lost, not_back = queue["lostMessageCount"], result["notRestarted"]
    assert lost > 0 or not_back, "the power loss took nothing acknowledged and every node came back"
    assert not result["passed"], result["failures"]
