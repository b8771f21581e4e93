"""The branch traffic player against a real stack: retries on 429 as configured, gives up after its
attempts, cancels what is still open when the drain time runs out, and its books match Redis's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.lab.stack import Stack, StackConfig
from ops.lab.traffic.accounting import check_accounting
from ops.lab.traffic.player import PlayerSettings, RetryPolicy, TrafficPlayer
from ops.lab.traffic.timeseries import Recorder
from ops.lab.traffic.workload import PlannedArrival
from shared.control import Mode, set_mode
from shared.policy import Policy
from tests.conftest import TEST_REDIS_URL, delete_queue_keys


def arrival(index: int, ticket_type: str, at: float = 0.0) -> PlannedArrival:
    return PlannedArrival(
        index=index,
        at=at,
        type=ticket_type,
        branch_id=f"branch-{index % 3:03d}",
        prompt_tokens=60,
        max_tokens=16,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir: Path = tmp_path_factory.mktemp("player-stack")
    queue = f"test-player-{run_dir.name[-6:]}"
    with Stack(StackConfig(redis_url=TEST_REDIS_URL, queue_name=queue, run_dir=run_dir, gpus=1)) as running:
        yield running
        delete_queue_keys(running.redis, queue)


def play(stack: Stack, policy: Policy, plan: list[PlannedArrival], settings: PlayerSettings) -> TrafficPlayer:
    recorder = Recorder(stack.redis, policy, stack.queue_name)
    recorder.start()
    player = TrafficPlayer(stack.api_url, stack.branch_key, plan, policy, settings, seed=1)
    player.start()
    assert player.wait(timeout=60), "the player did not finish"
    player.close()
    recorder.stop()
    check = check_accounting(recorder.counts_since_start(), player.records, policy.type_names)
    assert check.holds, check.mismatches
    return player


def test_shed_branches_retry_then_give_up_and_loans_get_through(stack: Stack, policy: Policy) -> None:
    set_mode(stack.redis, stack.queue_keys, Mode.CRITICAL_ONLY, actor="test")
    try:
        plan = [arrival(0, "complaint"), arrival(1, "loan_approval"), arrival(2, "archive_query", at=0.1)]
        settings = PlayerSettings(retry=RetryPolicy(mode="fixed", fixed_delay_s=0.2, max_attempts=3))
        player = play(stack, policy, plan, settings)
    finally:
        set_mode(stack.redis, stack.queue_keys, Mode.NORMAL, actor="test")
    complaint, loan, archive = player.records
    for shed in (complaint, archive):
        assert (shed.submissions, shed.rejections, shed.retries, shed.outcome) == (3, 3, 2, "rejected")
        assert len(shed.rejected_ids) == 3 and len(set(shed.rejected_ids)) == 1  # one record, reused
        assert shed.ticket_id is None
    assert loan.outcome == "done" and loan.submissions == 1 and loan.retries == 0
    assert loan.latency_s is not None and loan.queue_wait_s is not None and loan.ttft_s is not None
    assert loan.e2e_ttft_s is not None and loan.ttft_s <= loan.e2e_ttft_s <= loan.latency_s
    assert player.figures()["loan_approval"].e2e_ttft_p99_s == loan.e2e_ttft_s
    assert player.figures()["complaint"].gave_up == 1


def test_tickets_still_open_when_the_drain_time_ends_are_cancelled(stack: Stack, policy: Policy) -> None:
    stack.stop_worker(0)  # nothing runs any more: accepted tickets stay queued
    try:
        plan = [arrival(i, "archive_query", at=0.05 * i) for i in range(4)]
        player = play(stack, policy, plan, PlayerSettings(drain_timeout_s=1.0))
    finally:
        stack.start_worker(0)
    assert [r.outcome for r in player.records] == ["cancelled"] * 4
    assert player.cancelled_leftovers == 4
    assert all(r.submissions == 1 for r in player.records)
