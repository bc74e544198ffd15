"""Graceful handoff of a broker master, with real controller, nameserver and broker processes.

Properties checked (one cluster for the module, 3 replicas, acks from the whole SyncStateSet):
- `mqmeta admin handoff` refuses bad input with one sentence and exit 2, and changes
  nothing: an unknown broker set is NOT_FOUND; a successor that is not an in-sync slave
  is FAILED_PRECONDITION, and the master takes writes again at once;
- handoffs under a producer that retries: every send succeeds (none fails, none times
  out), the master changes each time to an in-sync slave, and every acknowledged
  message is consumable exactly once per queue offset; acknowledgements never pause as
  long as the failover's dead-after (1 s here), so it was the handoff that moved the role;
- SIGTERM on the master hands off before the process exits (status 0): no send fails,
  a slave is master before the old process is gone, and the old master restarted
  rejoins as a slave.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from mqmeta.cluster.harness import Cluster

from mqmeta.pb import controller_pb2 as pb
from tests.support import consume_all, wait_for, wait_in_sync
from tests.support.producing import FLAGS, ProduceLoop, check_no_loss

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

MQMETA = [sys.executable, "-m", "mqmeta.cli"]
HANDOFFS = 3
ACKED_BETWEEN_HANDOFFS_MIN = 30
EXIT_TIMEOUT_S = 10.0  # a SIGTERMed master: drain + election + leaving, each bounded at 2 s
# The harness declares a broker dead after 1000 ms: a pause in acknowledgements shorter than
# that cannot come from a failover (which waits for dead-after), only from the handoff.
ACK_GAP_MS_MAX = 800


def longest_gap_ms(loop: ProduceLoop) -> float:
    times = loop.ack_times
    return max(b - a for a, b in zip(times, times[1:], strict=False)) * 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("handoff"), broker_sets=1, replicas=3, broker_flags=FLAGS)
    try:
        cluster.start()
        with cluster.client() as client:
            client.call("CreateTopic", pb.TopicSpec(name="Orders", queue_count=4))
        yield cluster
    finally:
        cluster.stop()


def admin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    command = [*MQMETA, "admin", "--controllers", cluster.addresses, "handoff", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def assert_bad_input(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqmeta: error:"), result.stderr
    assert fragment in result.stderr, result.stderr


def test_bad_handoffs_are_refused_and_change_nothing(cluster):
    master = wait_in_sync(cluster, 3)
    epoch = cluster.broker_status(master).master_epoch
    assert_bad_input(admin(cluster, "--broker-name", "no-such-broker"), "no-such-broker")
    assert_bad_input(admin(cluster, "--broker-name", "broker-a", "--broker-id", "99"), "no in-sync slave 99")
    status = cluster.broker_status(master)
    assert status.role == "MASTER" and status.master_epoch == epoch
    assert status.writable, "nothing was asked of the controller: writes resume at once"


def test_handoffs_under_a_retrying_producer_fail_no_send(cluster):
    loop = ProduceLoop(cluster, "h")
    loop.start()
    try:
        for round_number in range(HANDOFFS):
            old = wait_in_sync(cluster, 3)
            acked_before = len(loop.acked)
            wait_for(
                lambda: len(loop.acked),
                15,
                f"{ACKED_BETWEEN_HANDOFFS_MIN} acknowledged sends before handoff {round_number}",
                until=lambda acked, start=acked_before: acked >= start + ACKED_BETWEEN_HANDOFFS_MIN,
            )
            result = admin(cluster, "--broker-name", "broker-a", "--json")
            assert result.returncode == 0, result.stderr
            new = cluster.master_of("broker-a", exclude=old, timeout_s=10)
            assert new != old
            assert cluster.broker_status(old).role == "SLAVE"
        acked_after = len(loop.acked)
        wait_for(
            lambda: len(loop.acked),
            15,
            "sends acknowledged by the last new master",
            until=lambda acked: acked >= acked_after + ACKED_BETWEEN_HANDOFFS_MIN,
        )
    finally:
        loop.stop()
    assert loop.unknown == [], f"{len(loop.unknown)} sends failed across {HANDOFFS} handoffs"
    assert longest_gap_ms(loop) < ACK_GAP_MS_MAX, f"acks paused {longest_gap_ms(loop):.0f} ms"
    check_no_loss(loop.acked, consume_all(cluster, "g-handoff", [v.encode() for v in loop.acked]))


def test_sigterm_on_the_master_hands_off_before_it_exits(cluster):
    old = wait_in_sync(cluster, 3)
    loop = ProduceLoop(cluster, "t")
    loop.start()
    try:
        wait_for(lambda: len(loop.acked), 15, "acknowledged sends before SIGTERM", until=lambda n: n >= 30)
        process = cluster.supervisor.children[old]
        process.send_signal(signal.SIGTERM)
        new = cluster.master_of("broker-a", exclude=old, timeout_s=10)
        assert process.wait(timeout=EXIT_TIMEOUT_S) == 0
        acked_after = len(loop.acked)
        wait_for(
            lambda: len(loop.acked),
            15,
            "sends acknowledged by the new master",
            until=lambda acked: acked >= acked_after + ACKED_BETWEEN_HANDOFFS_MIN,
        )
    finally:
        loop.stop()
    assert loop.unknown == [], f"{len(loop.unknown)} sends failed across the SIGTERM"
    assert longest_gap_ms(loop) < ACK_GAP_MS_MAX, f"acks paused {longest_gap_ms(loop):.0f} ms"
    cluster.start_broker(old)
    wait_for(
        lambda: cluster.broker_status(old).role,
        20,
        f"{old} to rejoin as a slave of {new}",
        until=lambda role: role == "SLAVE",
        retry_on=(Exception,),
    )
    wait_in_sync(cluster, 3)
    check_no_loss(loop.acked, consume_all(cluster, "g-sigterm", [v.encode() for v in loop.acked]))
