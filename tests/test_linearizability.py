"""WGL linearizability checker for the read/write/cas register: verdicts, model edges and bounds."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqmeta.chaos.history import (
    HistoryEvent,
    RequestEvent,
    ResponseEvent,
    Result,
    encode_cas_value,
    read_history,
    write_history,
)
from mqmeta.chaos.linearizability import COUNTEREXAMPLE_OP_COUNT_MAX, check_linearizability

_next_client_id = iter(range(1, 10**9))


def operation(
    kind: str,
    value: str | None,
    invoke_ms: int,
    complete_ms: int | None,
    result: Result = Result.SUCCESS,
    key: str = "k",
    response_value: str | None = None,
) -> list[HistoryEvent]:
    """One client's request and response (no response when complete_ms is None)."""
    client_id = next(_next_client_id)
    request_value = None if kind == "read" else value
    events: list[HistoryEvent] = [RequestEvent(client_id, kind, request_value, key, invoke_ms)]
    if complete_ms is not None:
        answer = value if response_value is None else response_value
        latency_ms = complete_ms - invoke_ms
        events.append(ResponseEvent(client_id, kind, result, answer, key, complete_ms, latency_ms))
    return events


def write(
    value: str, invoke_ms: int, complete_ms: int | None, result: Result = Result.SUCCESS, key: str = "k"
) -> list[HistoryEvent]:
    return operation("write", value, invoke_ms, complete_ms, result, key)


def read(value: str | None, invoke_ms: int, complete_ms: int, key: str = "k") -> list[HistoryEvent]:
    return operation("read", value, invoke_ms, complete_ms, Result.SUCCESS, key)


def cas(
    old: str | None,
    new: str,
    invoke_ms: int,
    complete_ms: int | None,
    result: Result = Result.SUCCESS,
    mismatch: bool = False,
    key: str = "k",
) -> list[HistoryEvent]:
    return operation(
        "cas",
        encode_cas_value(old, new),
        invoke_ms,
        complete_ms,
        result,
        key,
        encode_cas_value(old, new, mismatch),
    )


def verdict(history: list[HistoryEvent]) -> bool | None:
    return check_linearizability(history, time_limit_s=5.0)["linearizable"]


def test_stale_read_after_completed_write_is_rejected():
    """A read that starts after a write completed but returns the older value is not linearizable."""
    history = write("1", 0, 10) + write("2", 20, 30) + read("1", 40, 50)
    result = check_linearizability(history)
    assert result["linearizable"] is False and result["failing_key"] == "k"
    assert [(op["kind"], op["value"]) for op in result["counterexample"]] == [
        ("write", "1"),
        ("write", "2"),
        ("read", "1"),
    ]


def test_a_key_read_absent_after_a_completed_write_is_rejected_among_unknown_writes():
    """A cluster that lost its state reads keys as absent after writes were acknowledged;
    hundreds of writes of unknown outcome around it must not make the answer "unknown"."""
    history = write("1", 0, 10)
    for index in range(400):
        history += write(f"u{index}", 20 + index, None, Result.UNKNOWN)
    history += read(None, 500, 510)
    result = check_linearizability(history, time_limit_s=5.0, state_count_max=1000)
    assert result["linearizable"] is False, result
    assert [(op["kind"], op["value"]) for op in result["counterexample"]] == [("write", "1"), ("read", None)]
    assert verdict(write("1", 0, 10) + read(None, 5, 20)) is True  # concurrent: may come first


def test_counterexample_keeps_the_last_operations_of_a_long_prefix():
    """A long linearizable prefix is cut to its last operations, followed by the one that fails."""
    history: list[HistoryEvent] = []
    for index in range(30):
        history += write(f"w{index}", 10 * index, 10 * index + 5)
    result = check_linearizability(history + read("w5", 400, 405))
    assert result["linearizable"] is False
    counterexample = [(op["kind"], op["value"]) for op in result["counterexample"]]
    assert len(counterexample) == COUNTEREXAMPLE_OP_COUNT_MAX == 20
    assert counterexample[0] == ("write", "w11") and counterexample[-2:] == [("write", "w29"), ("read", "w5")]


def test_two_cas_from_the_same_old_value_cannot_both_succeed():
    """Two successful cas 0->1 and 0->2 (concurrent) from one write of 0 are not linearizable."""
    history = write("0", 0, 10) + cas("0", "1", 20, 40) + cas("0", "2", 25, 45)
    assert verdict(history) is False


def test_read_of_a_never_written_value_is_rejected():
    """Reading a value nobody wrote is not linearizable."""
    assert verdict(write("1", 0, 10) + read("9", 5, 20)) is False


def test_read_of_a_failed_write_is_rejected():
    """A FAILURE write certainly had no effect, so observing its value is not linearizable."""
    assert verdict(write("1", 0, 10, Result.FAILURE) + read("1", 20, 30)) is False


def test_concurrent_write_and_read_may_go_either_way():
    """A read concurrent with a write may return the old or the new value."""
    for seen in (None, "1"):
        assert verdict(write("1", 0, 100) + read(seen, 10, 20)) is True


def test_unknown_write_seen_later_is_accepted():
    """An UNKNOWN write may take effect after its call, even long after it 'ended'."""
    history = write("0", 0, 5) + write("1", 10, 20, Result.UNKNOWN) + read("0", 30, 40) + read("1", 50, 60)
    assert verdict(history) is True


def test_unknown_or_unanswered_write_never_seen_is_accepted():
    """An UNKNOWN or unanswered write may never take effect."""
    history = write("0", 0, 5) + write("1", 10, 20, Result.UNKNOWN) + write("2", 12, None) + read("0", 30, 40)
    assert verdict(history) is True


def test_unknown_or_failed_read_says_nothing():
    """A read answered UNKNOWN or FAILURE is ignored whatever value its response carries."""
    history = (
        write("0", 0, 5)
        + operation("read", "zzz", 10, 20, Result.UNKNOWN)
        + operation("read", "yyy", 10, 20, Result.FAILURE)
        + read("0", 30, 40)
    )
    assert verdict(history) is True


def test_unknown_write_cannot_take_effect_before_its_call():
    """An UNKNOWN write's value cannot be read by an operation that completed before the write began."""
    assert verdict(read("1", 0, 5) + write("1", 10, 20, Result.UNKNOWN)) is False


def test_effect_of_unknown_write_cannot_be_undone():
    """Once an UNKNOWN write has been observed, a later read cannot see the value before it again."""
    history = write("0", 0, 5) + write("1", 10, None) + read("1", 30, 40) + read("0", 50, 60)
    assert verdict(history) is False


def test_cas_mismatch_is_a_read_of_another_value():
    """A ';mismatch' cas FAILURE is fine when the register held another value, wrong when it held old."""
    assert verdict(write("0", 0, 5) + cas("9", "1", 10, 20, Result.FAILURE, mismatch=True)) is True
    assert verdict(write("0", 0, 5) + cas("0", "1", 10, 20, Result.FAILURE, mismatch=True)) is False


def test_plain_cas_failure_has_no_effect_and_observes_nothing():
    """A plain cas FAILURE (e.g. not leader) is ignored: its new value must never be read."""
    history = write("0", 0, 5) + cas("0", "1", 10, 20, Result.FAILURE)
    assert verdict(history + read("0", 30, 40)) is True
    assert verdict(history + read("1", 30, 40)) is False


def test_unknown_cas_may_or_may_not_swap():
    """An UNKNOWN cas may swap (when old matches) or not; both later reads are fine, flip-flop is not."""
    base = write("0", 0, 5) + cas("0", "1", 10, 20, Result.UNKNOWN)
    assert verdict(base + read("1", 30, 40)) is True
    assert verdict(base + read("0", 30, 40)) is True
    assert verdict(base + read("1", 30, 40) + read("0", 50, 60)) is False


def test_cas_from_absent_and_initial_read():
    """Every key starts absent: a first read sees null and a cas from null succeeds once."""
    history = read(None, 0, 5) + cas(None, "a", 10, 20) + read("a", 30, 40)
    assert verdict(history) is True
    assert verdict(history + cas(None, "b", 50, 60)) is False


def test_keys_are_checked_independently():
    """Each key is its own register: interleaved keys are fine; one bad key is named as failing."""
    good = write("1", 0, 10, key="a") + write("2", 5, 15, key="b") + read("1", 20, 30, key="a")
    result = check_linearizability(good + read("1", 20, 30, key="b"))
    assert result["linearizable"] is False and result["failing_key"] == "b"
    result = check_linearizability(good + read("2", 20, 30, key="b"))
    assert result == {
        "linearizable": True,
        "keys_checked": 2,
        "failing_key": None,
        "counterexample": [],
        "unknown_keys": [],
        "explored_state_count": result["explored_state_count"],
    }


def test_equal_timestamps_count_as_concurrent():
    """With ms timestamps, a read starting in the ms a write ended may still see the old value."""
    assert verdict(write("1", 0, 10) + read(None, 10, 20)) is True


def test_check_through_history_file(tmp_path):
    """A metadata history survives history.tsv and gets the same verdict."""
    history = write("0", 0, 5) + cas("0", "1", 10, 20) + cas("5", "6", 12, 22, Result.FAILURE, mismatch=True)
    write_history(history, tmp_path / "history.tsv")
    assert verdict(read_history(tmp_path / "history.tsv")) is True


def adversarial_history(writer_count: int) -> list[HistoryEvent]:
    """Many mutually concurrent writes, then a read of a value nobody wrote: every order must be tried."""
    history: list[HistoryEvent] = []
    for index in range(writer_count):
        history += write(f"w{index}", 0, 1000)
    return history + read("never", 2000, 2001)


def test_time_bound_returns_unknown():
    """A search too large for the time limit answers null (unknown) promptly instead of running on."""
    started_s = time.monotonic()
    result = check_linearizability(adversarial_history(40), time_limit_s=1.0)
    elapsed_s = time.monotonic() - started_s
    assert result["linearizable"] is None and result["unknown_keys"] == ["k"]
    assert elapsed_s < 3.0


def test_state_bound_returns_unknown():
    """Hitting state_count_max answers null; a generous bound decides the same small history."""
    assert check_linearizability(adversarial_history(12), state_count_max=500)["linearizable"] is None
    assert check_linearizability(adversarial_history(6), state_count_max=100_000)["linearizable"] is False


@st.composite
def sequential_register_histories(draw: st.DrawFn) -> list[HistoryEvent]:
    """Run random ops on a real register in sequence, then widen each op's window around its instant."""
    state: dict[str, str | None] = {"a": None, "b": None}
    history: list[HistoryEvent] = []
    for index in range(draw(st.integers(1, 14))):
        instant_ms = 100 * index
        invoke_ms = instant_ms - draw(st.integers(0, 250))
        complete_ms = instant_ms + draw(st.integers(0, 250))
        key = draw(st.sampled_from(["a", "b"]))
        kind = draw(st.sampled_from(["read", "write", "cas"]))
        answer = draw(st.sampled_from(["answered", "answered", "unknown", "silent", "failed"]))
        result = {"unknown": Result.UNKNOWN, "failed": Result.FAILURE}.get(answer, Result.SUCCESS)
        end_ms = None if answer == "silent" else complete_ms
        value = draw(st.sampled_from(["1", "2", "3"]))
        if kind == "read":
            history += read(state[key], invoke_ms, complete_ms, key)
        elif kind == "write":
            took_effect = answer == "answered" or (answer != "failed" and draw(st.booleans()))
            if took_effect:
                state[key] = value
            history += write(value, invoke_ms, end_ms, result, key)
        else:
            old = draw(st.sampled_from([None, "1", "2", "3"]))
            if state[key] != old:
                history += cas(old, value, invoke_ms, complete_ms, Result.FAILURE, draw(st.booleans()), key)
            else:
                took_effect = answer == "answered" or (answer != "failed" and draw(st.booleans()))
                if took_effect:
                    state[key] = value
                history += cas(old, value, invoke_ms, end_ms, result, key=key)
    return history


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequential_register_histories())
def test_histories_of_a_real_register_are_linearizable(history):
    """Any history produced by a sequential register, seen through concurrency windows, is linearizable."""
    result = check_linearizability(history, time_limit_s=5.0)
    assert result["linearizable"] is True, result
