"""The one wait helper (cluster/wait.py, re-exported by tests/support), no processes.

Properties checked:
- it returns the first value the condition accepts, as soon as it does (no sleep after);
- exceptions of the named kinds count as "not yet", any other ends the wait at once;
- on timeout it raises WaitTimeout (an Unavailable) naming what it waited for, how long,
  and the last value or the last error the probe gave;
- the probe runs at least once, also with a zero timeout, and once more at the deadline.
"""

from __future__ import annotations

import time

import pytest
from mqmeta.cluster.wait import SHOWN_CHARS_MAX, WaitTimeout, wait_for

from mqmeta.errors import Unavailable
from tests import support

pytestmark = pytest.mark.timeout(30)


def counter(values: list[object]):
    """A probe answering `values` in turn (the last one forever); `.calls` counts calls."""

    def probe() -> object:
        probe.calls += 1  # type: ignore[attr-defined]
        return values[min(probe.calls, len(values)) - 1]  # type: ignore[attr-defined]

    probe.calls = 0  # type: ignore[attr-defined]
    return probe


def test_returns_the_first_accepted_value_at_once():
    probe = counter([0, 0, 3, 5])
    started = time.monotonic()
    assert wait_for(probe, 5, "three", until=lambda v: v >= 3, interval_s=0.01) == 3
    assert probe.calls == 3
    assert time.monotonic() - started < 1.0
    assert wait_for(lambda: "ready", 5, "a truthy value") == "ready"


def test_named_exceptions_are_not_yet_and_others_end_the_wait():
    answers = iter([ConnectionError("refused"), ConnectionError("refused"), "up"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(flaky, 5, "the server", retry_on=(ConnectionError,), interval_s=0.01) == "up"

    def broken() -> bool:
        broken.calls += 1  # type: ignore[attr-defined]
        raise KeyError("bug")

    broken.calls = 0  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        wait_for(broken, 5, "never", retry_on=(ConnectionError,))
    assert broken.calls == 1, "an unexpected exception is not retried"


def test_timeout_names_what_how_long_and_the_last_value():
    probe = counter([1, 2, 7])
    with pytest.raises(WaitTimeout) as timed_out:
        wait_for(probe, 0.3, "the answer to reach 42", until=lambda v: v == 42, interval_s=0.05)
    message = str(timed_out.value)
    assert message.startswith("timed out after 0.3s waiting for the answer to reach 42")
    assert message.endswith("last value 7")
    assert isinstance(timed_out.value, Unavailable) and timed_out.value.code == "UNAVAILABLE"
    assert probe.calls >= 4, "polled until the deadline"


def test_timeout_reports_the_last_error_and_cuts_long_values():
    def refused() -> None:
        raise ConnectionRefusedError("connection refused by 127.0.0.1:1")

    with pytest.raises(WaitTimeout, match=r"last error ConnectionRefusedError: connection refused by"):
        wait_for(refused, 0.1, "a listener", retry_on=(OSError,))
    with pytest.raises(WaitTimeout) as long_value:
        wait_for(lambda: "x" * 10_000, 0, "never", until=lambda v: False)
    assert len(str(long_value.value)) < SHOWN_CHARS_MAX + 100


def test_zero_timeout_runs_the_probe_once_and_the_deadline_gets_a_last_look():
    once = counter([True])
    assert wait_for(once, 0, "already true") is True and once.calls == 1
    late = counter([False, True])
    assert wait_for(late, 0.05, "true at the deadline", interval_s=10) is True
    assert late.calls == 2, "a long interval is cut to the deadline, which gets one more look"
    with pytest.raises(ValueError):
        wait_for(late, -1, "a negative timeout")


def test_tests_use_the_same_helper():
    assert support.wait_for is wait_for and support.WaitTimeout is WaitTimeout
