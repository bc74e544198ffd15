"""Checkers over a parsed queue-workload history; each is a pure function returning a JSON-able dict.

- `check_queue`: delivery guarantees (OpenChaos's QueueChecker fields, Jepsen's total-queue
  ideas). A message is *lost* when its enqueue answered SUCCESS and no dequeue ever returned it;
  *duplicated* when dequeued more than once; *recovered* when its enqueue answered UNKNOWN (or
  never answered) and it was dequeued anyway, which is allowed; *unexpected* when dequeued
  although its enqueue certainly FAILED or it was never enqueued, which is a bug. The history
  is valid when nothing is lost and nothing is unexpected; duplicates only cost exactly-once.
- `check_recovery`: windows of unavailability (OpenChaos's RecoveryChecker). A window opens at
  the request time of a FAILURE/UNKNOWN response and closes at the next SUCCESS response;
  failures within `flap_gap_ms` after a window closed open no new window (a flap of the same
  outage, as in OpenChaos).
- `check_rto`: per fault interval (fault start..end), whether the service became unavailable
  in it, whether and when it recovered, and the RTO: from the request time of the first failed
  response inside the interval to the next SUCCESS response (even one after the fault ended).
- `check_order`: per sharding key, the dequeued values must contain the key's successfully
  enqueued (and dequeued) values in enqueue order (OpenChaos's OrderChecker). Re-deliveries
  are skipped; loss is left to `check_queue` rather than also reported as disorder.
- `latency_buckets`: counts of dequeue end-to-end latency and of enqueue send latency
  (SUCCESS responses) in the buckets <=1, <=5, <=10, <=100, <=1000, <=3000, >3000 ms.

Responses are taken in timestamp order (file order breaks ties), which is the recorded order
when one thread records each client.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any, NamedTuple

from mqmeta.chaos.history import (
    FaultEvent,
    FaultPhase,
    HistoryEvent,
    RequestEvent,
    ResponseEvent,
    Result,
    responses,
)

ENQUEUE = "enqueue"
DEQUEUE = "dequeue"
SAMPLE_COUNT_MAX_DEFAULT = 100
FLAP_GAP_MS_DEFAULT = 2000  # OpenChaos's RecoveryChecker constant
LATENCY_BUCKET_BOUNDS_MS = (1, 5, 10, 100, 1000, 3000)


class EnqueueStatus(Enum):
    """What the history says about a value's enqueue, best outcome first."""

    SUCCESS = "success"
    UNKNOWN = "unknown"
    FAILED = "failed"
    NEVER = "never"


def enqueue_statuses(history: Sequence[HistoryEvent]) -> dict[str, EnqueueStatus]:
    """Each enqueued value's best outcome: SUCCESS > UNKNOWN (or no response) > FAILED."""
    request_counts: Counter[str] = Counter()
    response_counts: Counter[str] = Counter()
    results: dict[str, set[Result]] = {}
    for event in history:
        if isinstance(event, RequestEvent) and event.operation == ENQUEUE and event.value is not None:
            request_counts[event.value] += 1
        elif isinstance(event, ResponseEvent) and event.operation == ENQUEUE and event.value is not None:
            response_counts[event.value] += 1
            results.setdefault(event.value, set()).add(event.result)
    statuses: dict[str, EnqueueStatus] = {}
    for value in request_counts.keys() | results.keys():
        seen = results.get(value, set())
        if Result.SUCCESS in seen:
            statuses[value] = EnqueueStatus.SUCCESS
        elif Result.UNKNOWN in seen or request_counts[value] > response_counts[value]:
            statuses[value] = EnqueueStatus.UNKNOWN
        else:
            statuses[value] = EnqueueStatus.FAILED
    return statuses


def check_queue(history: Sequence[HistoryEvent], sample_count_max: int = SAMPLE_COUNT_MAX_DEFAULT) -> dict:
    """Loss, duplication, recovery and unexpected deliveries of a queue history (see module doc)."""
    enqueue_responses = responses(history, ENQUEUE)
    result_counts = Counter(response.result for response in enqueue_responses)
    enqueue_requests = [e for e in history if isinstance(e, RequestEvent) and e.operation == ENQUEUE]
    dequeued = [
        r.value for r in responses(history, DEQUEUE) if r.result == Result.SUCCESS and r.value is not None
    ]
    dequeue_counts = Counter(dequeued)
    statuses = enqueue_statuses(history)

    lost = [
        value
        for value, status in statuses.items()
        if status == EnqueueStatus.SUCCESS and value not in dequeue_counts
    ]
    duplicates = {value: count for value, count in dequeue_counts.items() if count > 1}
    recovered = [value for value in dequeue_counts if statuses.get(value) == EnqueueStatus.UNKNOWN]
    unexpected = {
        value: status.value
        for value in dequeue_counts
        if (status := statuses.get(value, EnqueueStatus.NEVER)) in (EnqueueStatus.FAILED, EnqueueStatus.NEVER)
    }
    answered_count = len(enqueue_responses)
    return {
        "enqueueInvokeCount": len(enqueue_requests),
        "enqueueSuccessCount": result_counts[Result.SUCCESS],
        "enqueueFailureCount": result_counts[Result.FAILURE],
        "enqueueUnknownCount": result_counts[Result.UNKNOWN] + max(0, len(enqueue_requests) - answered_count),
        "dequeueSuccessCount": len(dequeued),
        "lostMessageCount": len(lost),
        "lostMessages": sorted(lost)[:sample_count_max],
        "duplicateMessageCount": len(duplicates),
        "duplicateMessages": dict(sorted(duplicates.items())[:sample_count_max]),
        "recoveredMessageCount": len(recovered),
        "recoveredMessages": sorted(recovered)[:sample_count_max],
        "unexpectedMessageCount": len(unexpected),
        "unexpectedMessages": dict(sorted(unexpected.items())[:sample_count_max]),
        "atMostOnce": not duplicates,
        "atLeastOnce": not lost,
        "exactlyOnce": not duplicates and not lost,
        "isValid": not lost and not unexpected,
    }


def check_recovery(
    history: Sequence[HistoryEvent], operation: str = ENQUEUE, flap_gap_ms: int = FLAP_GAP_MS_DEFAULT
) -> dict:
    """Unavailability windows of `operation` and their recovery times (see module doc)."""
    windows: list[dict[str, Any]] = []
    unavailable = False
    for response in _in_time_order(responses(history, operation)):
        failed = response.result != Result.SUCCESS
        if failed and not unavailable:
            last = windows[-1] if windows else None
            if last is not None and response.timestamp_ms - last["unavailableEndTimestamp"] < flap_gap_ms:
                continue
            windows.append(
                {
                    "unavailableStartTimestamp": response.request_timestamp_ms,
                    "unavailableEndTimestamp": None,
                    "recoveryTime": None,
                    "recovered": False,
                }
            )
            unavailable = True
        elif not failed and unavailable:
            window = windows[-1]
            window["unavailableEndTimestamp"] = response.timestamp_ms
            window["recoveryTime"] = response.timestamp_ms - window["unavailableStartTimestamp"]
            window["recovered"] = True
            unavailable = False
    recovery_times_ms = [w["recoveryTime"] for w in windows if w["recovered"]]
    return {
        "results": windows,
        "unavailableCount": len(windows),
        "unrecoveredCount": sum(1 for w in windows if not w["recovered"]),
        "recoveryTimeMaxMs": max(recovery_times_ms, default=None),
        "isValid": True,
    }


def check_rto(history: Sequence[HistoryEvent], operation: str = ENQUEUE) -> dict:
    """Per fault interval: unavailable?, recovered?, RTO in ms (see module doc)."""
    records: list[dict[str, Any]] = []
    awaiting_recovery: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    unavailable = False
    unexpected_unavailable = False
    for event in _timeline(history, operation):
        if isinstance(event, FaultEvent):
            if event.phase == FaultPhase.START:
                current = _new_rto_record(event)
                records.append(current)
            elif current is not None and current["faultEndTimestamp"] is None:
                current["faultEndTimestamp"] = event.timestamp_ms
            continue
        in_fault = current is not None and current["faultEndTimestamp"] is None
        if event.result != Result.SUCCESS:
            if in_fault and current is not None and not current["isUnavailableInFaultInterval"]:
                current["isUnavailableInFaultInterval"] = True
                current["startTimestamp"] = event.request_timestamp_ms
                awaiting_recovery.append(current)
            elif not in_fault and not unavailable and event.result == Result.FAILURE:
                unexpected_unavailable = True
            unavailable = True
            continue
        for record in awaiting_recovery:
            record["endTimestamp"] = event.timestamp_ms
            record["rtoTime"] = event.timestamp_ms - record["startTimestamp"]
            record["recovered"] = True
            record["isRecoveryInFaultInterval"] = in_fault and record is current
        awaiting_recovery.clear()
        unavailable = False
    return {
        "results": records,
        "unexpectedUnavailableInNormalInterval": unexpected_unavailable,
        "isValid": True,
    }


def check_order(history: Sequence[HistoryEvent], sharding_keys: Iterable[str] | None = None) -> dict:
    """Per sharding key, dequeues must deliver the key's enqueued values in enqueue order."""
    enqueued: dict[str, list[str]] = {}
    dequeued: dict[str, list[str]] = {}
    for response in _in_time_order(responses(history)):
        if response.result != Result.SUCCESS or response.value is None or response.sharding_key is None:
            continue
        if response.operation == ENQUEUE:
            enqueued.setdefault(response.sharding_key, []).append(response.value)
        elif response.operation == DEQUEUE:
            dequeued.setdefault(response.sharding_key, []).append(response.value)
    keys = sorted(enqueued) if sharding_keys is None else list(sharding_keys)
    wrong_key, wrong_start_value = None, None
    for key in keys:
        wrong_start_value = _first_out_of_order(enqueued.get(key, []), dequeued.get(key, []))
        if wrong_start_value is not None:
            wrong_key = key
            break
    return {
        "isOrder": wrong_key is None,
        "wrongShardingKey": wrong_key,
        "wrongStartValue": wrong_start_value,
        "shardingKeyCount": len(keys),
        "isValid": True,
    }


def latency_buckets(history: Sequence[HistoryEvent]) -> dict:
    """Bucket counts of dequeue end-to-end latency and enqueue send latency (SUCCESS only)."""
    end_to_end_ms = [
        r.end_to_end_latency_ms
        for r in responses(history, DEQUEUE)
        if r.result == Result.SUCCESS and r.end_to_end_latency_ms >= 0
    ]
    send_ms = [
        r.send_latency_ms
        for r in responses(history, ENQUEUE)
        if r.result == Result.SUCCESS and r.send_latency_ms >= 0
    ]
    return {"endToEnd": _bucket_counts(end_to_end_ms), "send": _bucket_counts(send_ms)}


def check_all(history: Sequence[HistoryEvent]) -> dict:
    """Every queue checker's result, keyed by checker."""
    return {
        "queue": check_queue(history),
        "recovery": check_recovery(history),
        "rto": check_rto(history),
        "order": check_order(history),
        "latency": latency_buckets(history),
    }


def _first_out_of_order(enqueued_values: list[str], dequeued_values: list[str]) -> str | None:
    """The first enqueued value that the dequeues do not deliver in order, or None."""
    delivered = set(dequeued_values)
    expected = [value for value in enqueued_values if value in delivered]
    expected_index = 0
    for value in dequeued_values:
        if expected_index < len(expected) and value == expected[expected_index]:
            expected_index += 1
    return expected[expected_index] if expected_index < len(expected) else None


def _bucket_counts(latencies_ms: list[int]) -> dict[str, int]:
    counts = {f"le{bound}ms": 0 for bound in LATENCY_BUCKET_BOUNDS_MS}
    overflow_name = f"gt{LATENCY_BUCKET_BOUNDS_MS[-1]}ms"
    counts[overflow_name] = 0
    for latency_ms in latencies_ms:
        bucket = next((f"le{b}ms" for b in LATENCY_BUCKET_BOUNDS_MS if latency_ms <= b), overflow_name)
        counts[bucket] += 1
    counts["count"] = len(latencies_ms)
    return counts


def _new_rto_record(fault: FaultEvent) -> dict[str, Any]:
    return {
        "faultName": fault.fault_name,
        "faultStartTimestamp": fault.timestamp_ms,
        "faultEndTimestamp": None,
        "isUnavailableInFaultInterval": False,
        "isRecoveryInFaultInterval": False,
        "recovered": False,
        "startTimestamp": None,
        "endTimestamp": None,
        "rtoTime": None,
    }


def _in_time_order(events: list[ResponseEvent]) -> list[ResponseEvent]:
    return sorted(events, key=lambda event: event.timestamp_ms)  # stable: file order breaks ties


def _timeline(history: Sequence[HistoryEvent], operation: str) -> list[FaultEvent | ResponseEvent]:
    selected: list[FaultEvent | ResponseEvent] = [
        event
        for event in history
        if isinstance(event, FaultEvent)
        or (isinstance(event, ResponseEvent) and event.operation == operation)
    ]
    return sorted(selected, key=lambda event: event.timestamp_ms)


class Copy(NamedTuple):
    """One record read at a replication target: where it is stored there, where it came
    from (origin key (cluster, broker set, topic, queue) and origin offset; None when the
    record has no origin properties) and the workload value of its body."""

    queue_id: int
    queue_offset: int
    origin: tuple[str, str, str, int] | None
    origin_offset: int
    value: str


def check_replication(copies: Iterable[Copy], acknowledged: Iterable[str]) -> dict:
    """What a full read of the target says (pure): a source record (origin key and offset)
    stored at more than one target position is *duplicated*; a target queue whose copies of
    one origin queue do not have strictly increasing origin offsets breaks *origin order*;
    a record without origin properties was not replicated (*unexpected*); an acknowledged
    value absent from the read is *lost*. Re-reads of one position are not copies."""
    positions: dict[tuple, set[tuple[int, int]]] = {}
    by_queue: dict[int, list[Copy]] = {}
    values: set[str] = set()
    unexpected = 0
    for copy in copies:
        if copy.origin is None:
            unexpected += 1
            continue
        positions.setdefault((*copy.origin, copy.origin_offset), set()).add(
            (copy.queue_id, copy.queue_offset)
        )
        by_queue.setdefault(copy.queue_id, []).append(copy)
        values.add(copy.value)
    duplicated = sorted(key for key, where in positions.items() if len(where) > 1)
    order_violations = 0
    for queue_copies in by_queue.values():
        last: dict[tuple, int] = {}
        seen_offsets: set[int] = set()
        for copy in sorted(queue_copies, key=lambda c: c.queue_offset):
            if copy.queue_offset in seen_offsets:
                continue
            seen_offsets.add(copy.queue_offset)
            assert copy.origin is not None
            if copy.origin_offset <= last.get(copy.origin, -1):
                order_violations += 1
            last[copy.origin] = copy.origin_offset
    lost = sorted(set(acknowledged) - values)
    return {
        "copyCount": len(positions),
        "duplicatedByOrigin": len(duplicated),
        "duplicatedOrigins": [list(key) for key in duplicated[:SAMPLE_COUNT_MAX_DEFAULT]],
        "originOrderViolations": order_violations,
        "unexpectedCount": unexpected,
        "lostCount": len(lost),
        "lostValues": lost[:SAMPLE_COUNT_MAX_DEFAULT],
        "isValid": not duplicated and not order_violations and not unexpected and not lost,
    }
