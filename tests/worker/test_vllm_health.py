"""Backing off from a failing vLLM: growing pauses, one outage counted once, reset on success."""

from __future__ import annotations

import pytest

from tests.fake_clock import FakeClock
from worker.vllm_health import VllmHealth


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return FakeClock(start=100.0).install(monkeypatch)  # monotonic: small, so pauses keep their digits


def test_pauses_grow_and_reset_on_success(fake_clock: FakeClock) -> None:
    health = VllmHealth(base_seconds=0.02, max_seconds=0.08)
    pauses = []
    for _ in range(4):
        pauses.append(health.failure())
        assert health.pause_remaining() == pytest.approx(pauses[-1])
        fake_clock.advance(pauses[-1] + 0.005)
        assert health.pause_remaining() == 0
    assert health.consecutive_failures == 4 and health.failing
    assert 0 <= pauses[0] <= 0.02 and all(0 <= p <= 0.08 for p in pauses[2:])
    health.success()
    assert not health.failing and health.pause_remaining() == 0


def test_failures_during_a_pause_are_one_outage(fake_clock: FakeClock) -> None:
    health = VllmHealth(base_seconds=1.0, max_seconds=8.0)
    first = health.failure()
    for _ in range(5):  # the rest of the batch fails with the same crash
        assert health.failure() <= first + 1e-6  # the pause left, read at a large clock value
    assert health.consecutive_failures == 1


def test_retry_after_is_honoured_up_to_the_cap(fake_clock: FakeClock) -> None:
    health = VllmHealth(base_seconds=0.01, max_seconds=5.0)
    assert health.failure(retry_after=3.0) >= 3.0
    other = VllmHealth(base_seconds=0.01, max_seconds=5.0)
    assert other.failure(retry_after=60.0) <= 5.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="base_seconds=0"):
        VllmHealth(base_seconds=0)
