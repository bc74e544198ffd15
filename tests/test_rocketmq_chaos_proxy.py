"""`mqmeta chaos run --client rocketmq --liveness defaults` through the nameservers as the
official client's proxy: kill -9 of the broker set's master with the controller's default
liveness settings, no Spark audit (tests/test_rocketmq_chaos.py runs it). About 45 s on a
loaded 2-core machine: slow; CI proves the same kill through the proxy in
tests/test_rocketmq_proxy.py.

Properties checked: the fault was injected, many enqueues were acknowledged, none of them
is lost, nothing unexpected is delivered, and each sharding key (a FIFO message group) is
delivered in order. The drain is short: through the proxy the client needs no route refresh
to find the new master.
"""

from __future__ import annotations

import pytest
from mqmeta.chaos.runner import RunConfig, run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(150)]


def test_master_kills_with_default_liveness_through_the_proxy(tmp_path):
    config = RunConfig(
        fault="leader-kill",
        output_dir=tmp_path / "rmq",
        fault_target="brokers",
        time_limit_s=12.0,
        interval_s=6.0,
        drain_s=20.0,
        client="rocketmq",
        liveness="defaults",
        audit=False,
    )
    outcome = run(config)
    result = outcome.result
    injected = [f for f in result["faults"] if not f["what"].startswith("not injected")]
    assert injected, result["faults"]
    queue = result["queue"]
    assert queue["enqueueSuccessCount"] >= 30, queue
    assert queue["lostMessageCount"] == 0, queue["lostMessages"]
    assert queue.get("unexpectedMessageCount", 0) == 0, queue
    assert result["order"]["isOrder"], result["order"]
    assert outcome.passed, outcome.failures
