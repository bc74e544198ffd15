"""A short chaos run of the queue workload through RocketMQ 4.x's C++ client
(`mqmeta chaos run --client remoting`): real processes, one kill -9 of the broker set's
master, the clients going through the nameserver's remoting proxy.

Properties checked, by the same checkers as the native workload's runs: the fault was
injected, many enqueues were acknowledged, none of them is lost, nothing unexpected is
delivered, and each sharding key (an orderly send to one queue, consumed by an orderly
consumer) is delivered in order. The Spark audit is left to the slow runs (CI's budget).
"""

from __future__ import annotations

import pytest
from mqmeta.chaos.remoting_workload import CLIENT_ENV, LIBRARY_ENV
from mqmeta.chaos.runner import RunConfig, run

from tests.support.remoting_clients import client

# About 60 s (a cluster, an 8 s run, the drain): outside CI's budget. CI covers the same
# kill -9 under the C++ client in tests/test_remoting_failover.py.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def test_short_run_through_the_cpp_client(tmp_path, monkeypatch):
    cpp = client("rocketmq-client-python", tmp_path / "home")
    monkeypatch.setenv(CLIENT_ENV, str(cpp.directory))
    monkeypatch.setenv(LIBRARY_ENV, str(cpp.library_dir))
    config = RunConfig(
        fault="leader-kill",
        output_dir=tmp_path / "remoting",
        fault_target="brokers",
        time_limit_s=8.0,
        interval_s=4.0,
        drain_s=30.0,
        client="remoting",
        audit=False,
    )
    outcome = run(config)
    result = outcome.result
    assert result["faults"] and not result["faults"][0]["what"].startswith("not injected"), result["faults"]
    queue = result["queue"]
    assert queue["enqueueSuccessCount"] >= 30, queue
    assert queue["lostMessageCount"] == 0, queue["lostMessages"]
    assert queue.get("unexpectedMessageCount", 0) == 0, queue
    assert result["order"]["isOrder"], result["order"]
    assert outcome.passed, outcome.failures
