"""The monitor's wave judge: margins, minimum samples, pause and resume, rollback with its notify hook."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from ops.monitor.rollout_controller import judge
from shared.control import read_events
from shared.keys import QueueKeys
from shared.policy import HooksPolicy, Policy, RolloutPolicy
from shared.rollout import RolloutState, RolloutStatus
from shared.rollout_stats import ArmStats, record_call
from shared.rollout_store import RolloutError, RolloutStore
from tests.fake_clock import FakeClock
from tests.monitor.conftest import MonitorFactory
from tests.monitor.support import RqQueues

POLICY = RolloutPolicy(
    min_samples=10,
    error_rate_margin=0.05,
    shed_rate_margin=0.05,
    ttft_p95_margin=0.25,
    ttft_p95_slack_seconds=0.02,
)


def arm(
    name: str, ok: int, error: int = 0, shed: int = 0, ttft: float = 0.1, client: int = 0, breaker: int = 0
) -> ArmStats:
    counts = {"ok": ok, "error": error, "shed": shed, "client": client, "breaker": breaker}
    return ArmStats(name, counts, tuple([ttft] * ok))


@pytest.mark.parametrize(
    ("candidate", "control", "action", "words"),
    [
        (arm("candidate", 9), arm("primary", 50), "hold", "9 of 10"),
        (arm("candidate", 9, client=5), arm("primary", 50), "hold", "9 of 10"),
        (arm("candidate", 20, error=2), arm("primary", 50), "rollback", "error rate 9.1%"),
        (arm("candidate", 20, error=1), arm("primary", 50, error=3), "advance", "within"),
        # Tickets its breaker kept off the candidate are its failures: 2 errors + 2 diverted of 24.
        (
            arm("candidate", 20, error=2, breaker=2),
            arm("primary", 50, error=3),
            "rollback",
            "error rate 16.7%",
        ),
        (arm("candidate", 0, breaker=10), arm("primary", 50), "rollback", "error rate 100.0%"),
        (arm("candidate", 20, shed=3), arm("primary", 50), "rollback", "shed rate"),
        (arm("candidate", 20, ttft=0.13), arm("primary", 50, ttft=0.1), "rollback", "TTFT p95 0.130"),
        (arm("candidate", 20, ttft=0.015), arm("primary", 50, ttft=0.005), "advance", "within"),
        (arm("candidate", 20, ttft=0.12), arm("primary", 50, ttft=0.1), "advance", "within"),
        (arm("candidate", 20, ttft=9.0), arm("primary", 5, ttft=0.1), "advance", "within"),
        (arm("candidate", 20, error=2), arm("primary", 3, error=5), "rollback", "against the control's 0.0%"),
    ],
)
def test_judge_compares_the_candidate_with_the_control_by_the_policys_margins(
    candidate: ArmStats, control: ArmStats, action: str, words: str
) -> None:
    verdict = judge(candidate, control, POLICY)
    assert verdict.action == action
    assert words in verdict.reason
    assert verdict.figures["candidate_calls"] == candidate.calls


def feed(
    redis_client: Redis, keys: QueueKeys, state: RolloutState, arm_name: str, outcome: str, n: int
) -> None:
    for _ in range(n):
        record_call(
            redis_client,
            keys,
            RolloutPolicy(),
            rollout_id=state.id,
            wave=state.wave,
            arm=arm_name,
            outcome=outcome,
            ttft_seconds=0.05,
        )


def steps(redis_client: Redis, keys: QueueKeys) -> list[dict[str, str]]:
    return [e for e in reversed(read_events(redis_client, keys, 100)) if e["kind"] == "rollout"]


def start(store: RolloutStore, interval: float = 60.0) -> RolloutState:
    return store.start(
        candidate_url="http://127.0.0.1:9",
        version="2026.12",
        interval_seconds=interval,
        shadow_fraction=0,
        actor="t",
    )


def test_waves_advance_after_their_interval_and_pause_holds_a_wave(
    make_monitor: MonitorFactory, fake_clock: FakeClock, redis_client: Redis, queue_name: str
) -> None:
    monitor = make_monitor()
    keys = QueueKeys(queue_name)
    store = RolloutStore(redis_client, keys)
    state = start(store)
    feed(redis_client, keys, state, "candidate", "ok", 25)
    feed(redis_client, keys, state, "primary", "ok", 25)
    fake_clock.advance(59)
    monitor.tick()
    assert (store.read() or state).wave == 0, "a wave runs its whole interval"
    fake_clock.advance(2)
    monitor.tick()
    state = store.read() or state
    assert state.wave == 1 and state.status is RolloutStatus.RUNNING

    feed(redis_client, keys, state, "candidate", "ok", 25)
    fake_clock.advance(30)
    store.pause("operator")
    fake_clock.advance(600)
    monitor.tick()
    held = store.read() or state
    assert held.wave == 1 and held.status is RolloutStatus.PAUSED, "a paused wave does not advance"
    with pytest.raises(RolloutError, match="paused, not running"):
        store.pause("operator")
    store.resume("operator")
    fake_clock.advance(29)
    monitor.tick()
    assert (store.read() or state).wave == 1, "the paused time does not count towards the interval"
    fake_clock.advance(2)
    monitor.tick()
    assert (store.read() or state).wave == 2
    assert [e["step"] for e in steps(redis_client, keys)] == [
        "start",
        "advance",
        "pause",
        "resume",
        "advance",
    ]


def test_a_wave_short_of_samples_holds_with_one_event(
    make_monitor: MonitorFactory, fake_clock: FakeClock, redis_client: Redis, queue_name: str
) -> None:
    monitor = make_monitor()
    keys = QueueKeys(queue_name)
    store = RolloutStore(redis_client, keys)
    state = start(store, interval=10)
    feed(redis_client, keys, state, "candidate", "ok", 3)
    for _ in range(3):
        fake_clock.advance(11)
        monitor.tick()
    assert (store.read() or state).wave == 0
    assert [e["step"] for e in steps(redis_client, keys)] == ["start", "hold"]


def test_a_worse_candidate_rolls_back_without_waiting_out_its_wave_and_the_hook_is_called(
    make_monitor: MonitorFactory,
    fake_clock: FakeClock,
    redis_client: Redis,
    policy: Policy,
    queue_name: str,
    rq_queues: RqQueues,
    hook_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = hook_server
    monitor = make_monitor(
        policy.model_copy(update={"hooks": HooksPolicy(notify_hook=url, timeout_seconds=5)})
    )
    keys = QueueKeys(queue_name)
    store = RolloutStore(redis_client, keys)
    state = start(store, interval=7200)
    feed(redis_client, keys, state, "candidate", "ok", 20)
    feed(redis_client, keys, state, "candidate", "error", 5)
    feed(redis_client, keys, state, "primary", "ok", 40)
    fake_clock.advance(60)
    monitor.tick()  # long before the wave is over: the evidence is in, so no more branches suffer
    rolled = store.read() or state
    assert rolled.status is RolloutStatus.ROLLED_BACK and "error rate 20.0%" in rolled.reason
    rq_queues.work()
    assert [r["event"] for r in received] == ["rollout_rollback"]
    assert received[0]["rollout"] == state.id and received[0]["wave"] == 0
    assert [(e["step"], e.get("state")) for e in steps(redis_client, keys)][-2:] == [
        ("rollback", None),
        ("notify", "done"),
    ]
    with pytest.raises(RolloutError, match="rolled_back"):
        store.resume("operator")
    again = start(store)
    assert again.id != state.id and again.wave == 0, "a new rollout may start after a rollback"
