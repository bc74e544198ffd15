"""The one retry policy (mqmeta.backoff): each pause lies in [cap / 2, cap] with the cap
doubling from the first pause up to the maximum; the jitter spreads pauses over that whole
range (seeded); no pause runs past the deadline, and none is left once it has passed; a
success, or a failure long after the previous one, starts again at the first pause; the
four retry loops use it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mqmeta.backoff import Attempts, Backoff

POLICY = Backoff(first_pause_s=0.1, pause_max_s=1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_caps_double_from_the_first_pause_up_to_the_maximum():
    assert [POLICY.cap_s(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert POLICY.cap_s(10_000) == 1.0  # no overflow however long the outage


def test_every_pause_lies_within_half_the_cap_and_the_cap():
    rng = random.Random(7)
    for failures in range(1, 40):
        cap = POLICY.cap_s(failures)
        for _ in range(50):
            assert cap / 2 <= POLICY.pause_s(failures, rng.uniform) <= cap


def test_the_jitter_spreads_pauses_over_the_whole_range():
    rng = random.Random(11)
    pauses = [POLICY.pause_s(5, rng.uniform) for _ in range(2000)]
    assert min(pauses) < 0.52 and max(pauses) > 0.98, (min(pauses), max(pauses))
    assert len({round(p, 6) for p in pauses}) > 1900, "pauses of clients that failed together must differ"


def test_no_pause_runs_past_the_deadline_and_none_is_left_after_it():
    clock = Clock()
    attempts = Attempts(POLICY, deadline=clock.now + 0.25, clock=clock, uniform=lambda low, high: high)
    assert attempts.failed() == pytest.approx(0.1)
    clock.now += 0.1
    assert attempts.failed() == pytest.approx(0.15)  # 0.2 cut to what is left
    clock.now += 0.15
    assert attempts.expired() and attempts.failed() == 0.0


def test_a_success_or_a_long_quiet_spell_starts_again_at_the_first_pause():
    clock = Clock()
    attempts = Attempts(POLICY, clock=clock, uniform=lambda low, high: high)
    assert [attempts.failed() for _ in range(4)] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    attempts.succeeded()
    assert attempts.failed() == pytest.approx(0.1)
    assert attempts.failed() == pytest.approx(0.2)
    clock.now += 2 * POLICY.pause_max_s + 0.01  # ran well in between
    assert attempts.failed() == pytest.approx(0.1)


@pytest.mark.parametrize(
    "first, most, multiplier", [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (0.1, 1.0, 0.5), (-1.0, 1.0, 2.0)]
)
def test_a_policy_that_could_spin_or_shrink_is_refused(first, most, multiplier):
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(first, most, multiplier)


def test_the_four_retry_loops_use_the_policy():
    root = Path(__file__).resolve().parent.parent
    for path in (
        "mqmeta/client.py",
        "mqmeta/broker_client.py",
        "broker_agent/ha_fetch.py",
        "replicator/task.py",
    ):
        text = (root / path).read_text()
        assert "backoff.Attempts(" in text and "RETRY_PAUSE_S" not in text, path
