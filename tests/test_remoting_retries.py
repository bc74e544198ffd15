"""A RocketMQ 4.x consumer that fails a message (the C++ client through the nameserver's
remoting proxy): the client sends it back, the broker delivers it again through
%RETRY%GROUP after each delay level, and past the client's max reconsume times (16, its
default) moves it to %DLQ%GROUP, where a consumer of that topic reads it.

Properties checked (one broker set, `--message-delay-levels` of 100 ms each so that the
16 retries take seconds instead of RocketMQ's default hours):
- the failing consumer gets the message exactly 17 times, with reconsume times 0 to 16 in
  order, each time under the message's own id; never an 18th time;
- each retry waits its delay level (no delivery follows the one before sooner than it);
- the dead-lettered message is read from %DLQ%GROUP by the C++ client with its body and id;
- a malformed `--message-delay-levels` stops the broker at parse time with one sentence.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.errors import AlreadyExists
from mqmeta.pb import controller_pb2 as cpb
from tests.support.remoting_clients import client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "RemotingRetries"
GROUP = "cg-failing"
DELAY_MS = 100
RECONSUME_TIMES_MAX = 16  # the C++ client's default maxReconsumeTimes


def test_a_failed_message_is_retried_by_level_then_dead_lettered(tmp_path):
    levels = " ".join([f"{DELAY_MS}ms"] * 18)
    cluster = Cluster(
        tmp_path / "c", count=1, broker_sets=1, replicas=1, broker_flags=["--message-delay-levels", levels]
    ).start()
    try:
        with cluster.client() as admin:
            try:
                admin.call("CreateTopic", cpb.TopicSpec(name=TOPIC, queue_count=1))
            except AlreadyExists:
                pass
        rocketmq = client("rocketmq-client-python", tmp_path / "home")
        namesrv = cluster.layout.namesrv_remoting
        (sent,) = rocketmq.produce(namesrv, TOPIC, 1, tag="t", prefix="fails")
        assert sent["status"] == 0, sent
        deliveries = rocketmq.run(
            "consume-failing", namesrv, TOPIC, GROUP, str(RECONSUME_TIMES_MAX + 1), "90", timeout_s=150
        )
        assert [d["reconsume_times"] for d in deliveries] == list(range(RECONSUME_TIMES_MAX + 1)), deliveries
        assert {(d["value"], d["msg_id"]) for d in deliveries} == {("fails-0", sent["msg_id"])}
        waits_s = [later["t"] - earlier["t"] for earlier, later in itertools.pairwise(deliveries)]
        assert min(waits_s) >= DELAY_MS / 1000 * 0.9, waits_s
        (dead,) = rocketmq.consume(namesrv, "%DLQ%" + GROUP, "cg-dlq-reader", 1)
        assert (dead["value"], dead["msg_id"]) == ("fails-0", sent["msg_id"])
    finally:
        cluster.stop()


def test_malformed_delay_levels_are_refused_with_one_sentence(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mqmeta.cli", "broker", "--broker-name", "b", "--listen", "127.0.0.1:1",
         "--controllers", "127.0.0.1:2", "--data-dir", str(tmp_path), "--message-delay-levels", "1s 5x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        "--message-delay-levels: delay level '5x' is not a positive whole number with a unit" in done.stderr
    )
    assert "Traceback" not in done.stderr
