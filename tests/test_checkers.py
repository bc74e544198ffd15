"""History format, recorder, queue-workload checkers and the latency plot, on hand-made histories."""

from __future__ import annotations

import threading

import pytest
from mqmeta.chaos.checkers import (
    Copy,
    check_all,
    check_order,
    check_queue,
    check_recovery,
    check_replication,
    check_rto,
    latency_buckets,
)
from mqmeta.chaos.history import (
    FaultEvent,
    FaultPhase,
    HistoryError,
    HistoryEvent,
    HistoryFormatError,
    HistoryFullError,
    HistoryRecorder,
    RequestEvent,
    ResponseEvent,
    Result,
    decode_cas_value,
    encode_cas_value,
    pair_operations,
    read_history,
    write_history,
)
from mqmeta.chaos.plot import latency_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def enqueue(
    value: str, result: Result, at_ms: int, latency_ms: int = 5, key: str = "k", client_id: int = 1
) -> list[HistoryEvent]:
    request = RequestEvent(client_id, "enqueue", value, key, at_ms - latency_ms)
    return [request, ResponseEvent(client_id, "enqueue", result, value, key, at_ms, latency_ms)]


def dequeue(
    value: str, at_ms: int, end_to_end_ms: int = 10, key: str = "k", client_id: int = 9
) -> list[HistoryEvent]:
    return [ResponseEvent(client_id, "dequeue", Result.SUCCESS, value, key, at_ms, 1, None, end_to_end_ms)]


def fault(phase: FaultPhase, at_ms: int) -> list[HistoryEvent]:
    return [FaultEvent("leader-kill", phase, at_ms)]


def test_history_file_round_trip(tmp_path):
    """Every event kind, absent fields and extra info survive write_history -> read_history unchanged."""
    events: list[HistoryEvent] = [
        RequestEvent(3, "enqueue", "m1", "k1", 1_700_000_000_000, "x"),
        ResponseEvent(3, "enqueue", Result.SUCCESS, "m1", "k1", 1_700_000_000_007, 7, "broker-a", -1),
        RequestEvent(4, "read", None, "key", 1_700_000_000_001),
        ResponseEvent(4, "read", Result.UNKNOWN, None, "key", 1_700_000_000_009, 8),
        ResponseEvent(5, "dequeue", Result.SUCCESS, "", None, 1_700_000_000_010, 1, None, 3),
        FaultEvent("random-partition", FaultPhase.START, 1_700_000_000_002),
        FaultEvent("random-partition", FaultPhase.END, 1_700_000_000_003, "n1,n2"),
        RequestEvent(6, "cas", encode_cas_value(None, "v"), "key", 1_700_000_000_011),
    ]
    path = tmp_path / "history.tsv"
    assert write_history(events, path) == len(events)
    assert read_history(path) == events
    assert path.read_text().splitlines()[0] == "3\tenqueue\tREQUEST\tm1\tk1\t1700000000000\tx"


@pytest.mark.parametrize(
    ("text", "line_number", "reason"),
    [
        ("1\tenqueue\tREQUEST\tv\tk\t100\tnull\n1\tenqueue\tRESPONSE\tSUCCESS\tv\tk\t105\n", 2, "10 fields"),
        ("1\tenqueue\tREQUEST\tv\tk\tsoon\tnull\n", 1, "timestamp must be an integer"),
        ("1\tenqueue\tRESPONSE\tOK\tv\tk\t105\t5\tnull\t-1\n", 1, "result must be"),
        ("\n1\tenqueue\tPUSH\tv\n", 2, "REQUEST or RESPONSE"),
        ("fault\tleader-kill\tbegin\t100\n", 1, "start or end"),
        ("x\tenqueue\tREQUEST\tv\tk\t100\tnull\n", 1, "clientId"),
        ("1\tnull\tREQUEST\tv\tk\t100\tnull\n", 1, "operation is empty"),
        ("garbage\n", 1, "at least 3"),
    ],
)
def test_malformed_lines_are_rejected_with_line_number(tmp_path, text, line_number, reason):
    """The reader rejects each kind of malformed line and names its 1-based line number."""
    path = tmp_path / "history.tsv"
    path.write_text(text)
    with pytest.raises(HistoryFormatError, match=f"line {line_number}: .*{reason}") as caught:
        read_history(path)
    assert caught.value.line_number == line_number


def test_writer_refuses_tabs_and_reserved_null():
    """Fields with a tab/newline, or the reserved word null as a value, cannot be recorded."""
    recorder = HistoryRecorder()
    with pytest.raises(ValueError, match="tab"):
        recorder.record(RequestEvent(1, "enqueue", "a\tb", "k", 1))
    with pytest.raises(ValueError, match="reserved"):
        recorder.record(RequestEvent(1, "enqueue", "null", "k", 1))
    assert len(recorder) == 0


def test_recorder_is_thread_safe_and_bounded(tmp_path):
    """Concurrent appends all land; past event_count_max a typed error is raised, not a silent drop."""
    recorder = HistoryRecorder(event_count_max=4000)

    def append_events(client_id: int) -> None:
        for index in range(1000):
            recorder.record(RequestEvent(client_id, "enqueue", f"{client_id}-{index}", "k", index))

    threads = [threading.Thread(target=append_events, args=(client_id,)) for client_id in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(recorder) == 4000
    with pytest.raises(HistoryFullError):
        recorder.record(RequestEvent(0, "enqueue", "late", "k", 1))
    assert recorder.write(tmp_path / "history.tsv") == 4000
    assert len(read_history(tmp_path / "history.tsv")) == 4000


def test_cas_value_encoding_round_trips():
    """cas values encode old->new (null for absent) with an optional ;mismatch and decode back."""
    assert encode_cas_value("a", "b") == "a->b"
    assert encode_cas_value(None, "b", mismatch=True) == "null->b;mismatch"
    decoded = decode_cas_value("null->b;mismatch")
    assert (decoded.old, decoded.new, decoded.mismatch) == (None, "b", True)
    with pytest.raises(ValueError):
        encode_cas_value("a->x", "b")
    with pytest.raises(HistoryError):
        decode_cas_value("ab")


def test_pair_operations_follows_each_client():
    """Responses pair with their client's outstanding request; orphan or mismatched responses are errors."""
    history = [
        RequestEvent(1, "write", "a", "k", 1),
        RequestEvent(2, "read", None, "k", 2),
        ResponseEvent(2, "read", Result.SUCCESS, "a", "k", 3, 1),
        RequestEvent(1, "write", "b", "k", 4),
    ]
    pairs = pair_operations(history)
    answered = [(pair.request.value, pair.response is not None) for pair in pairs]
    assert answered == [("a", False), (None, True), ("b", False)]
    with pytest.raises(HistoryError, match="without a request"):
        pair_operations([ResponseEvent(1, "read", Result.SUCCESS, "a", "k", 3, 1)])
    with pytest.raises(HistoryError, match="does not answer"):
        pair_operations(
            [RequestEvent(1, "read", None, "k", 1), ResponseEvent(1, "read", Result.SUCCESS, "a", "j", 3, 2)]
        )
    dequeue_pair = pair_operations([RequestEvent(0, "dequeue", None, None, 1)] + dequeue("m", 2, client_id=0))
    assert dequeue_pair[0].response is not None and dequeue_pair[0].response.sharding_key == "k"


def test_clean_queue_history_is_exactly_once():
    """Every successful enqueue dequeued once: valid and exactly-once, with zero counts elsewhere."""
    history = (
        enqueue("a", Result.SUCCESS, 10)
        + enqueue("b", Result.SUCCESS, 20)
        + dequeue("a", 30)
        + dequeue("b", 40)
    )
    result = check_queue(history)
    assert result["enqueueInvokeCount"] == 2 and result["enqueueSuccessCount"] == 2
    assert result["dequeueSuccessCount"] == 2
    assert result["exactlyOnce"] and result["isValid"]
    assert result["lostMessageCount"] == result["duplicateMessageCount"] == 0
    assert result["unexpectedMessageCount"] == result["recoveredMessageCount"] == 0


def test_lost_and_duplicated_messages_are_reported():
    """A SUCCESS enqueue never dequeued is lost (invalid); a value dequeued twice is a duplicate."""
    history = (
        enqueue("a", Result.SUCCESS, 10)
        + enqueue("b", Result.SUCCESS, 20)
        + dequeue("a", 30)
        + dequeue("a", 40)
    )
    result = check_queue(history)
    assert result["lostMessages"] == ["b"] and result["lostMessageCount"] == 1
    assert result["duplicateMessages"] == {"a": 2} and result["duplicateMessageCount"] == 1
    assert not result["atLeastOnce"] and not result["atMostOnce"] and not result["exactlyOnce"]
    assert not result["isValid"]


def test_unknown_enqueue_dequeued_is_recovered_not_lost():
    """An UNKNOWN (or unanswered) enqueue later dequeued counts as recovered; undequeued it is not lost."""
    history = (
        enqueue("u", Result.UNKNOWN, 10)
        + enqueue("gone", Result.UNKNOWN, 11)
        + [RequestEvent(2, "enqueue", "silent", "k", 12)]
        + dequeue("u", 30)
        + dequeue("silent", 31)
    )
    result = check_queue(history)
    assert result["recoveredMessageCount"] == 2 and result["recoveredMessages"] == ["silent", "u"]
    assert result["enqueueUnknownCount"] == 3
    assert result["lostMessageCount"] == 0 and result["unexpectedMessageCount"] == 0
    assert result["isValid"] and result["exactlyOnce"]


def test_dequeue_of_failed_or_never_enqueued_value_is_unexpected():
    """Dequeuing a value whose enqueue FAILED, or one never enqueued, is an error, not a recovery."""
    history = enqueue("f", Result.FAILURE, 10) + dequeue("f", 30) + dequeue("ghost", 31)
    result = check_queue(history)
    assert result["enqueueFailureCount"] == 1
    assert result["unexpectedMessages"] == {"f": "failed", "ghost": "never"}
    assert result["recoveredMessageCount"] == 0 and not result["isValid"]


def test_retried_enqueue_takes_its_best_outcome():
    """A value whose enqueue FAILED and then SUCCEEDED on retry is a success, so dequeuing it is fine."""
    history = enqueue("r", Result.FAILURE, 10) + enqueue("r", Result.SUCCESS, 20) + dequeue("r", 30)
    result = check_queue(history)
    assert result["isValid"] and result["unexpectedMessageCount"] == 0 and result["enqueueInvokeCount"] == 2


def test_samples_are_capped_but_counts_are_not():
    """lostMessages holds at most sample_count_max values while lostMessageCount counts all."""
    history = [event for index in range(50) for event in enqueue(f"m{index:02}", Result.SUCCESS, index + 10)]
    result = check_queue(history, sample_count_max=5)
    assert result["lostMessageCount"] == 50 and result["lostMessages"] == ["m00", "m01", "m02", "m03", "m04"]


def test_recovery_windows_open_on_failure_and_close_on_success():
    """A window starts at the first failed request's send time and ends at the next success."""
    history = (
        enqueue("a", Result.SUCCESS, 1000)
        + enqueue("b", Result.FAILURE, 2000, latency_ms=100)
        + enqueue("c", Result.UNKNOWN, 3000)
        + enqueue("d", Result.SUCCESS, 4500)
        + enqueue("e", Result.FAILURE, 9000, latency_ms=50)
    )
    result = check_recovery(history)
    first, second = result["results"]
    assert first == {
        "unavailableStartTimestamp": 1900,
        "unavailableEndTimestamp": 4500,
        "recoveryTime": 2600,
        "recovered": True,
    }
    assert second["unavailableStartTimestamp"] == 8950 and not second["recovered"]
    assert result["unavailableCount"] == 2 and result["unrecoveredCount"] == 1
    assert result["recoveryTimeMaxMs"] == 2600


def test_recovery_ignores_flaps_within_the_gap():
    """A failure less than flap_gap_ms after recovery opens no new window (OpenChaos's 2 s rule)."""
    history = (
        enqueue("a", Result.FAILURE, 1000)
        + enqueue("b", Result.SUCCESS, 2000)
        + enqueue("c", Result.FAILURE, 3500)
        + enqueue("d", Result.SUCCESS, 3600)
    )
    assert check_recovery(history)["unavailableCount"] == 1
    assert check_recovery(history, flap_gap_ms=1000)["unavailableCount"] == 2


def test_rto_per_fault_interval():
    """Each fault interval reports unavailability, recovery (in or after the interval) and the RTO."""
    history = (
        fault(FaultPhase.START, 1000)
        + enqueue("a", Result.SUCCESS, 1100)
        + enqueue("b", Result.FAILURE, 1500, latency_ms=100)
        + enqueue("c", Result.SUCCESS, 4400)
        + fault(FaultPhase.END, 5000)
        + fault(FaultPhase.START, 10_000)
        + enqueue("d", Result.SUCCESS, 10_500)
        + fault(FaultPhase.END, 11_000)
        + fault(FaultPhase.START, 20_000)
        + enqueue("e", Result.UNKNOWN, 20_500)
        + fault(FaultPhase.END, 21_000)
        + enqueue("f", Result.SUCCESS, 23_000)
    )
    result = check_rto(history)
    first, second, third = result["results"]
    assert first["isUnavailableInFaultInterval"] and first["isRecoveryInFaultInterval"]
    assert (first["startTimestamp"], first["endTimestamp"], first["rtoTime"]) == (1400, 4400, 3000)
    assert not second["isUnavailableInFaultInterval"] and second["rtoTime"] is None
    assert third["isUnavailableInFaultInterval"] and third["recovered"]
    assert not third["isRecoveryInFaultInterval"] and third["rtoTime"] == 23_000 - 20_495
    assert not result["unexpectedUnavailableInNormalInterval"]


def test_rto_flags_failure_outside_any_fault():
    """A FAILURE while no fault is active and the service was available is flagged as unexpected."""
    history = enqueue("a", Result.SUCCESS, 100) + enqueue("b", Result.FAILURE, 200)
    assert check_rto(history)["unexpectedUnavailableInNormalInterval"]
    assert check_rto(history)["results"] == []


def test_order_accepts_in_order_delivery_with_redelivery():
    """Per-key enqueue order preserved (re-deliveries and other keys interleaved) is in order."""
    history = (
        enqueue("a1", Result.SUCCESS, 10, key="a")
        + enqueue("b1", Result.SUCCESS, 11, key="b")
        + enqueue("a2", Result.SUCCESS, 12, key="a")
        + enqueue("a3", Result.SUCCESS, 13, key="a")
        + dequeue("a1", 20, key="a")
        + dequeue("b1", 21, key="b")
        + dequeue("a2", 22, key="a")
        + dequeue("a1", 23, key="a")
        + dequeue("a2", 24, key="a")
        + dequeue("a3", 25, key="a")
    )
    result = check_order(history)
    assert result["isOrder"] and result["wrongShardingKey"] is None and result["shardingKeyCount"] == 2


def test_order_flags_reordering_within_a_key():
    """Dequeuing a key's values out of their enqueue order names the key and the first misplaced value."""
    history = (
        enqueue("b1", Result.SUCCESS, 9, key="b")
        + dequeue("b1", 19, key="b")
        + enqueue("a1", Result.SUCCESS, 10, key="a")
        + enqueue("a2", Result.SUCCESS, 11, key="a")
        + enqueue("a3", Result.SUCCESS, 12, key="a")
        + dequeue("a1", 20, key="a")
        + dequeue("a3", 21, key="a")
        + dequeue("a2", 22, key="a")
    )
    result = check_order(history)
    assert not result["isOrder"]
    assert (result["wrongShardingKey"], result["wrongStartValue"]) == ("a", "a3")


def test_order_leaves_loss_to_the_queue_checker():
    """A lost message does not make the remaining deliveries of its key out of order."""
    history = (
        enqueue("a1", Result.SUCCESS, 10, key="a")
        + enqueue("a2", Result.SUCCESS, 11, key="a")
        + enqueue("a3", Result.SUCCESS, 12, key="a")
        + dequeue("a1", 20, key="a")
        + dequeue("a3", 21, key="a")
    )
    assert check_order(history)["isOrder"]


def test_latency_buckets_include_their_upper_bound():
    """Latencies exactly on a bound land in that bound's bucket; above 3000 ms in the overflow bucket."""
    end_to_end_ms = [0, 1, 2, 5, 6, 10, 11, 100, 101, 1000, 1001, 3000, 3001, -1]
    history = [e for i, ms in enumerate(end_to_end_ms) for e in dequeue(f"d{i}", 100 + i, end_to_end_ms=ms)]
    history += enqueue("s1", Result.SUCCESS, 50, latency_ms=1)
    history += enqueue("s2", Result.SUCCESS, 60, latency_ms=5)
    history += enqueue("s3", Result.FAILURE, 70, latency_ms=5000)
    result = latency_buckets(history)
    assert result["endToEnd"] == {
        "le1ms": 2,
        "le5ms": 2,
        "le10ms": 2,
        "le100ms": 2,
        "le1000ms": 2,
        "le3000ms": 2,
        "gt3000ms": 1,
        "count": 13,
    }
    assert result["send"]["le1ms"] == 1 and result["send"]["le5ms"] == 1 and result["send"]["count"] == 2


def test_check_all_on_empty_history():
    """Every checker accepts an empty history and returns JSON-able defaults."""
    result = check_all([])
    assert result["queue"]["isValid"] and result["order"]["isOrder"]
    assert result["recovery"]["results"] == [] and result["rto"]["results"] == []


def test_latency_plot_writes_png(tmp_path):
    """The plot writes a non-empty PNG for a history with points, failures and faults, open or closed."""
    history = (
        fault(FaultPhase.START, 1000)
        + enqueue("a", Result.SUCCESS, 1100, latency_ms=0)
        + enqueue("b", Result.FAILURE, 1500, latency_ms=3000)
        + dequeue("a", 1600, end_to_end_ms=500)
        + fault(FaultPhase.END, 2000)
        + fault(FaultPhase.START, 2500)
    )
    path = latency_png(history, tmp_path / "latency.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > len(PNG_MAGIC)


@pytest.mark.parametrize("history", [[], fault(FaultPhase.START, 5)], ids=["empty", "faults-only"])
def test_latency_plot_without_data_writes_png(tmp_path, history):
    """An empty history, or one without latency points, still yields a valid PNG saying so."""
    data = latency_png(history, tmp_path / "latency.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > len(PNG_MAGIC)


A0 = ("a", "broker-a", "chaos", 0)
A1 = ("a", "broker-a", "chaos", 1)


def test_replication_clean_read_is_valid_and_rereads_are_not_copies():
    copies = [Copy(0, 0, A0, 0, "1-0"), Copy(0, 1, A0, 1, "1-1"), Copy(1, 0, A1, 0, "2-0")]
    result = check_replication([*copies, copies[0]], {"1-0", "1-1", "2-0"})
    assert result["isValid"] and result["copyCount"] == 3 and result["duplicatedByOrigin"] == 0


def test_replication_flags_a_source_record_stored_twice_at_the_target():
    copies = [Copy(0, 0, A0, 0, "1-0"), Copy(0, 1, A0, 0, "1-0"), Copy(1, 0, A1, 0, "2-0")]
    result = check_replication(copies, {"1-0", "2-0"})
    assert result["duplicatedByOrigin"] == 1 and result["duplicatedOrigins"] == [[*A0, 0]]
    assert not result["isValid"]


def test_replication_flags_origin_order_lost_and_unexpected():
    copies = [Copy(0, 0, A0, 1, "1-1"), Copy(0, 1, A0, 0, "1-0"), Copy(0, 2, None, -1, "x")]
    result = check_replication(copies, {"1-0", "1-1", "1-2"})
    assert result["originOrderViolations"] == 1
    assert result["unexpectedCount"] == 1
    assert result["lostCount"] == 1 and result["lostValues"] == ["1-2"]
    assert not result["isValid"]
