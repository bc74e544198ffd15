"""The broker's and the proxy's RocketMQ 5 plumbing without gRPC
(tests/support/rmq_plumbing_checks.py, in a process of its own: this one may hold the
official client's stubs, which clash with ours).

Properties checked:
- a receive of 32 over a queue with 1,000 waiting records decodes at most two chunks of
  32 records, not the whole scan window its candidates span;
- a read the store answers short (its byte limit) goes on from the last record it got:
  every offset asked for is read once, in order, none skipped; runs of offsets with gaps
  are read run by run;
- an AckMessage of 16 entries over two queues appends one progress record per queue and
  waits for the latest, not one append and wait per entry; a stale lease in the batch is
  refused on its own;
- the proxy's merged AckMessage (controller/coalesce.py): its answer is split back so that
  each caller gets its own entries and the status they make (a lone stale handle gets
  exactly the master's INVALID_RECEIPT_HANDLE), a refusal of the whole call is every
  caller's answer, and calls merge only when their headers differ in the request id alone
  (the same client, the same signature); only one plain message (NORMAL, no delivery time, no message
  group, at most 64 KiB) is merged with others, and a merged SendMessage's answer gives
  each caller its own message's entry and status; three AckMessages waiting together go
  upstream as one call, and as three with `--rocketmq-merge-calls off`; one merged send
  of a client is upstream at a time, the sends that arrive meanwhile go together in the
  next, as one request whose messages are theirs in order, and each caller gets its own
  message's entry; a send request over 128 KiB (e.g. a field we do not know) goes alone;
- a client that sent NotifyClientTermination is not made a member again by its own requests
  that arrive later (a receive or heartbeat still in flight): its queues go to the other
  members at their next QueryAssignment, not after the 30 s expiry.
"""

from __future__ import annotations

import pytest

from tests.support.checks_process import results_of

pytestmark = pytest.mark.timeout(60)

CHECKS = (
    "a_receive_of_32_decodes_about_32_records",
    "a_short_answer_goes_on_from_the_last_record",
    "runs_with_gaps_are_read_run_by_run",
    "a_batch_of_acks_appends_once_per_queue_and_waits_once",
    "a_merged_ack_answer_is_split_back_per_caller",
    "a_refused_merged_ack_is_everyones_answer",
    "calls_merge_only_with_the_same_identity",
    "only_plain_small_sends_are_merged",
    "a_merged_send_answer_is_split_back_per_caller",
    "the_proxy_merges_waiting_acks_unless_told_not_to",
    "one_merged_send_per_client_is_in_flight",
    "a_large_send_request_goes_alone",
    "a_terminated_client_is_not_brought_back_by_its_late_requests",
)


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    return results_of("tests.support.rmq_plumbing_checks", CHECKS, timeout_s=50)


@pytest.mark.parametrize("check", CHECKS)
def test_plumbing(results: dict[str, str], check: str) -> None:
    assert results[check] == "ok", results[check]
