"""A short chaos run of the queue workload through the unchanged official RocketMQ 5 client
(`mqmeta chaos run --client rocketmq`): real processes behind the fault proxies, one kill -9
of the broker set's master.

Properties checked, by the same checkers and audit as the native workload's runs: the fault
was injected, many enqueues were acknowledged, none of them is lost, nothing unexpected is
delivered, each sharding key (a FIFO message group) is delivered in order, and the Spark
audit passes, its H1 finding every acknowledged enqueue in the commit logs.
"""

from __future__ import annotations

import pytest
from mqmeta.chaos.runner import RunConfig, run

from tests.support import audit_in_shared_session

# About 170 s (the official client needs up to 30 s to find the new master, and the run drains
# for 40 s): a long run, outside CI. CI covers the same kill -9 through the official client in
# tests/test_rocketmq_failover.py (every acknowledged send received, held messages redelivered).
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(240)]


def test_short_run_through_the_official_client(tmp_path):
    config = RunConfig(
        fault="leader-kill",
        output_dir=tmp_path / "rmq",
        fault_target="brokers",
        time_limit_s=8.0,
        interval_s=4.0,
        drain_s=40.0,
        client="rocketmq",
    )
    outcome = run(config, audit=audit_in_shared_session)
    result = outcome.result
    assert result["faults"] and not result["faults"][0]["what"].startswith("not injected"), result["faults"]
    queue = result["queue"]
    assert queue["enqueueSuccessCount"] >= 30, queue
    assert queue["lostMessageCount"] == 0, queue["lostMessages"]
    assert queue.get("unexpectedMessageCount", 0) == 0, queue
    assert result["order"]["isOrder"], result["order"]
    assert result["audit"]["passed"], result["audit"]
    assert outcome.passed, outcome.failures
