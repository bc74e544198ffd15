"""The RocketMQ 5 codec (mqmeta.codec.rocketmq5) converts both ways without losing a field.

Properties checked (hypothesis, over valid sends of every message type):
- wire -> record -> commit-log bytes -> record -> wire gives back every field the client
  sent (topic, body, tag, keys, user properties, message id and type, born time and host,
  FIFO message group, DELAY delivery time), with the queue the broker chose in queue_id and
  no property the client did not send (the queue rides in no property);
- record -> wire -> record gives back the same record;
- the round-trip check can fail: a codec that drops any one of those fields fails it.

The checks run in a process of their own (tests/support/rocketmq5_codec_checks.py): this
process may hold the official client's apache.rocketmq.v2 stubs, which clash with ours.
"""

from __future__ import annotations

import pytest

from tests.support.checks_process import results_of

pytestmark = pytest.mark.timeout(180)

CHECKS = ("wire_record_wire", "record_wire_record", "a_dropped_field_fails_the_round_trip")


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    return results_of("tests.support.rocketmq5_codec_checks", CHECKS, timeout_s=170)


@pytest.mark.parametrize("check", CHECKS)
def test_round_trip(results: dict[str, str], check: str) -> None:
    assert results[check] == "ok", results[check]
